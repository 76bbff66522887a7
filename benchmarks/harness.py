"""Timing: warm up both sides of a case, then interleave their measurements.

A case compares two sides: by default the same work on cpu and on npu; fused-operator
cases compare the fused op with its unfused composition, both on npu. Below, "cpu" and
"npu" stand for the two sides.

The machine is small and shared, so a single measurement means little. For each case:

* build the state on cpu and on npu (same seed), collect garbage once and disable the
  collector until the case is done (as ``timeit`` does), run ``warmup`` untimed
  iterations on each device;
* take ``repeats`` pairs of measurements, alternating the order inside the pair
  (cpu, npu), (npu, cpu), ... so that slow drifts of the machine hit both devices;
* each measurement is ``run(prewarm)`` untimed, then ``run(n)`` timed (n iterations,
  then a synchronize on npu), divided by ``n``. The untimed prefix matters for the
  large cases: their working set (32-48 MiB) is about the size of the L3 cache, so
  without it a measurement that follows one of the other device is partly cold, and
  with the alternating order (c n | n c | c n ...) the second of each pair was up to
  1.8x slower than the first;
* report the median per-iteration time of each device and the median of the per-pair
  ratios npu/cpu (a pair's two halves run back to back, so their ratio is less noisy
  than the ratio of two medians taken at different moments).
"""
import gc
import statistics
import time
from typing import Dict, List

from cases import Case


def _timed(run, n: int, prewarm: int) -> float:
    if prewarm:
        run(prewarm)  # untimed: bring this device's data back into the caches
    t0 = time.perf_counter()
    run(n)
    return (time.perf_counter() - t0) / n


def measure(case: Case, scale: float = 1.0) -> Dict:
    n = max(1, int(round(case.n * scale)))
    repeats = max(3, int(round(case.repeats * min(1.0, scale))) | 1)  # odd, for a true median
    base, subject = case.sides
    runs = {side: case.build(side) for side in case.sides}
    times: Dict[str, List[float]] = {side: [] for side in case.sides}
    ratios: List[float] = []
    # One collection up front, then none while timing. A gc.collect() (~80 ms of
    # pointer chasing on the main thread) right before each measurement made the
    # following short npu measurement of large elementwise ops 1.4-1.6x slower (the
    # worker's OpenMP team lands on other cores than its data's cache; see
    # docs/BENCHMARKS.md), which is an artefact of the harness, not of the op.
    gc.collect()
    gc.disable()
    try:
        for side in case.sides:
            runs[side](max(1, int(round(case.warmup * scale))))
        _measure_pairs(runs, case.sides, n, case.prewarm, repeats, times, ratios)
    finally:
        gc.enable()
    del runs
    gc.collect()
    return {
        "name": case.name,
        "n": n,
        "repeats": repeats,
        "base_s": statistics.median(times[base]),
        "subject_s": statistics.median(times[subject]),
        "ratio": statistics.median(ratios),
        "base_all": times[base],
        "subject_all": times[subject],
        "ratios": ratios,
    }


def _measure_pairs(runs, sides, n, prewarm, repeats, times, ratios) -> None:
    base, subject = sides
    for r in range(repeats):
        order = sides if r % 2 == 0 else sides[::-1]
        pair = {}
        for side in order:
            pair[side] = _timed(runs[side], n, prewarm)
            times[side].append(pair[side])
        ratios.append(pair[subject] / pair[base])


def measure_cpu_only(case: Case, scale: float = 1.0) -> Dict:
    """The cpu side of a case alone, for a process in which no npu kernel ran yet.

    Used as a reference for the async mode: once the npu stream worker has run an
    OpenMP-parallel kernel, the process holds two OpenMP teams (4 threads on this
    2-core machine) and libgomp stops spin-waiting between parallel regions, which
    slows the cpu side of the interleaved measurement too.
    """
    n = max(1, int(round(case.n * scale)))
    repeats = max(3, int(round(case.repeats * min(1.0, scale)) // 2) | 1)
    run = case.build("cpu")
    times: List[float] = []
    gc.collect()
    gc.disable()
    try:
        run(max(1, int(round(case.warmup * scale))))
        for _ in range(repeats):
            times.append(_timed(run, n, case.prewarm))
    finally:
        gc.enable()
    del run
    gc.collect()
    return {"name": case.name, "cpu_clean_s": statistics.median(times), "cpu_clean_all": times}
