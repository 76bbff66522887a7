"""Turns one profiling run into torch_npu's result files.

Input (``raw``, also saved in a result directory, ``FRAMEWORK/torch_npu_raw.json`` and the
device records under ``PROF_*/device_{d}/data/``, so that ``analyse`` can redo this
offline): torch.profiler's chrome trace of the host side,
the simulator's task records (core/acl/src/profiler.cpp: kernels, copies and graph
launches with their launching thread and time, start and end on their stream) and the
clock offset between the two. Output, in ``ASCEND_PROFILER_OUTPUT/``:

* ``trace_view.json``: the host trace plus an "Ascend Hardware" process with one row per
  stream, and flow arrows from each host operator to the tasks it launched;
* ``kernel_details.csv``, ``operator_details.csv``, ``op_statistic.csv``,
  ``step_trace_time.csv``, ``task_time.csv`` with torch_npu's columns (the device views
  only when NPU activity was recorded, operator_details only with CPU activity);
* with ``profile_memory=True``: ``memory_record.csv`` (the npu allocator's totals after every
  allocation and free) and ``operator_memory.csv`` (each npu allocation, the operator that made
  it, when it was freed), from the allocator's reports in the host trace.
"""
import bisect
import csv
import json
import os
from collections import defaultdict

from .analysis.prof_common_func._constant import convert_ns2us_str
from .analysis.prof_common_func._csv_headers import CsvHeaders

NPU_PID_BASE = 10_000_000  # chrome-trace pid of device d: NPU_PID_BASE + d
_TASK_NAMES = {"memcpy": "MEMCPY_ASYNC", "memset": "MEMSET_ASYNC", "callback": "HOST_CALLBACK",
               "graph": "MODEL_EXECUTE"}
_COMMUNICATION_PREFIXES = ("hccl:", "hcom")


class Task:
    """One record of the simulator, with times in the host trace's microseconds."""

    __slots__ = ("name", "kind", "device", "stream", "correlation", "launch_tid", "launch", "start", "end",
                 "bytes", "host_op", "op")

    def __init__(self, rec, to_us):
        name, self.kind, self.device, self.stream, self.correlation, self.launch_tid, launch_ns, start_ns, end_ns, \
            self.bytes, self.host_op = rec
        self.name = name if self.kind in ("kernel", "graph") and name else _TASK_NAMES.get(self.kind, self.kind)
        self.launch, self.start, self.end = to_us(launch_ns), to_us(start_ns), to_us(end_ns)
        self.op = None  # the innermost host operator that launched it

    @property
    def dur(self):
        return self.end - self.start

    @property
    def type(self):
        """The operator type: "Mm" for aten::mm, "MEMCPY_ASYNC" for copies."""
        if self.kind != "kernel":
            return self.name
        base = self.name.split("::")[-1].split(".")[0].split("(")[0]
        return "".join(part[:1].upper() + part[1:] for part in base.split("_") if part) or self.name

    @property
    def communication(self):
        return self.name.startswith(_COMMUNICATION_PREFIXES)


def _host_ops(trace):
    """cpu_op events by thread, sorted by start (for finding the launching operator)."""
    by_tid = defaultdict(list)
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation"):
            by_tid[e.get("tid")].append(e)
    for events in by_tid.values():
        events.sort(key=lambda e: e["ts"])
    return by_tid


def _innermost(events, starts, t):
    """The shortest event of a thread containing time t, or None."""
    best = None
    i = bisect.bisect_right(starts, t)
    for e in reversed(events[:i]):
        if e["ts"] <= t <= e["ts"] + e.get("dur", 0):
            if best is None or e.get("dur", 0) < best.get("dur", 0):
                best = e
            if e.get("cat") == "cpu_op" and best is e:
                break
    return best


def link_tasks(raw, by_tid=None):
    """Tasks of a raw run (sorted by start), each with the host operator that launched it.
    by_tid: _host_ops of the run's trace, if the caller has it already."""
    trace = raw["trace"]
    base_ns = int(trace.get("baseTimeNanoseconds", 0))
    offset = int(raw["epoch_minus_steady_ns"])
    tasks = [Task(r, lambda ns: (ns + offset - base_ns) / 1000.0) for r in raw["records"]]
    if by_tid is None:
        by_tid = _host_ops(trace)
    by_id = {e["args"]["Record function id"]: e for events in by_tid.values() for e in events
             if e.get("cat") == "cpu_op" and "Record function id" in e.get("args", {})}
    starts = {tid: [e["ts"] for e in events] for tid, events in by_tid.items()}
    for task in tasks:
        # The operator the launching thread was in (tagged at launch); by time if untagged.
        op = by_id.get(task.host_op) if task.host_op else None
        if op is None and task.launch_tid in by_tid:
            op = _innermost(by_tid[task.launch_tid], starts[task.launch_tid], task.launch)
        task.op = op if op is not None and op.get("cat") == "cpu_op" else None
    tasks.sort(key=lambda t: (t.start, t.correlation))
    return tasks


def trace_view(raw, tasks, with_cpu=True):
    trace = dict(raw["trace"])
    events = [e for e in trace.get("traceEvents", []) if with_cpu or e.get("cat") not in ("cpu_op", "python_function")]
    host_pid = next((e["pid"] for e in events if e.get("cat") == "cpu_op"), os.getpid())
    seen = set()
    for t in tasks:
        pid = NPU_PID_BASE + t.device
        if t.device not in seen:
            seen.add(t.device)
            events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                           "args": {"name": f"Ascend Hardware (npu:{t.device})"}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                           "args": {"sort_index": pid}})
        if (t.device, t.stream) not in seen:
            seen.add((t.device, t.stream))
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": t.stream,
                           "args": {"name": f"Stream {t.stream}"}})
        args = {"Task Type": t.kind.upper(), "Stream Id": t.stream, "correlation": t.correlation}
        if t.bytes:
            args["bytes"] = t.bytes
        if t.op is not None:
            args["External id"] = t.op.get("args", {}).get("External id")
        events.append({"ph": "X", "cat": t.kind, "name": t.name, "pid": pid, "tid": t.stream, "ts": t.start,
                       "dur": max(t.dur, 0.001), "args": args})
        if with_cpu and t.launch_tid:
            # Host launch -> device execution, as torch draws cuda launches.
            flow = {"id": t.correlation, "cat": "async_npu", "name": "async_npu"}
            events.append(dict(flow, ph="s", pid=host_pid, tid=t.launch_tid, ts=t.launch))
            events.append(dict(flow, ph="f", bp="e", pid=pid, tid=t.stream, ts=t.start))
    if with_cpu and raw.get("gc"):
        # Python garbage collections longer than gc_detect_threshold (see _profiler_gc_detect.py),
        # in the system counter's clock (the npu tasks' steady clock).
        base_ns = int(trace.get("baseTimeNanoseconds", 0))
        offset = int(raw.get("epoch_minus_steady_ns", 0))
        for pid, start, end in raw["gc"]:
            events.append({"ph": "X", "cat": "GC", "name": "GC", "pid": pid, "tid": pid,
                           "ts": (start + offset - base_ns) / 1000.0, "dur": (end - start) / 1000.0, "args": {}})
    trace["traceEvents"] = events
    return trace


def _steps(trace):
    """ProfilerStep#N spans of the host trace: [(N, start, end)]."""
    steps = []
    for e in trace.get("traceEvents", []):
        name = e.get("name", "")
        if e.get("ph") == "X" and name.startswith("ProfilerStep#"):
            steps.append((int(name.split("#")[1]), e["ts"], e["ts"] + e.get("dur", 0)))
    return sorted(steps, key=lambda s: s[1])


def _step_of(steps, t):
    for n, start, end in steps:
        if start <= t <= end:
            return n
    return None


def _union(intervals):
    total, cur_start, cur_end = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_end is None or s > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = s, e
        else:
            cur_end = max(cur_end, e)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


class _Stamp:
    """Trace time (µs since the trace's base) -> absolute µs since the epoch as text with
    ns digits. In integers: as a float, an epoch time in µs keeps only ~0.25 µs."""

    def __init__(self, base_ns):
        self.base_ns = base_ns

    def __call__(self, us):
        return convert_ns2us_str(self.base_ns + int(round(us * 1000)))


def _write_csv(path, headers, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(headers)
        w.writerows(rows)


def _shapes(op):
    if op is None:
        return ""
    dims = op.get("args", {}).get("Input Dims")
    return ";".join(",".join(str(d) for d in dim) for dim in dims) if dims else ""


def write_results(raw, out_dir, with_cpu=True, export_type=None, rank=None):
    """Writes ASCEND_PROFILER_OUTPUT/ into out_dir; returns its path. export_type: "text"
    (the json and csv views) and/or "db" (see _db.py); default: the run's config."""
    out = os.path.join(out_dir, "ASCEND_PROFILER_OUTPUT")
    os.makedirs(out, exist_ok=True)
    trace = raw["trace"]
    host = _host_ops(trace)
    tasks = link_tasks(raw, host)
    steps = _steps(trace)
    export = export_type or raw.get("config", {}).get("export_type") or ["text"]
    if "db" in export:
        from . import _db

        _db.write_db(raw, tasks, host, steps, out, rank)
    if "text" not in export:
        return out
    with open(os.path.join(out, "trace_view.json"), "w") as f:
        json.dump(trace_view(raw, tasks, with_cpu), f)
    stamp = _Stamp(int(trace.get("baseTimeNanoseconds", 0)))
    if raw.get("with_npu", True):  # the device views (only the host ones for activities=[CPU])
        _write_device_views(tasks, steps, out, stamp)
    if with_cpu:
        _write_operator_details(host, tasks, out)
    _write_memory_views(trace, host, out, stamp)
    return out


def _write_device_views(tasks, steps, out, stamp):
    # kernel_details.csv: every task, with its wait since the previous one on its stream.
    # Start times are absolute (µs since the epoch), as torch_npu writes them.
    headers = CsvHeaders.OP_SUMMARY_KERNEL_BASE_HEADERS + ["Input Shapes"]
    rows, last_end = [], {}
    for t in tasks:
        key = (t.device, t.stream)
        wait = max(0.0, t.start - last_end[key]) if key in last_end else 0.0
        last_end[key] = t.end
        core = "AI_CORE" if t.kind == "kernel" and not t.communication else ("HCCL" if t.communication else t.kind.upper())
        row = [t.device, t.name, t.type, core, stamp(t.start), f"{t.dur:.3f}", f"{wait:.3f}", 0, _shapes(t.op)]
        rows.append(([_step_of(steps, t.launch)] if steps else []) + row)
    _write_csv(os.path.join(out, "kernel_details.csv"), (["Step Id"] if steps else []) + headers, rows)

    # op_statistic.csv: per operator type.
    by_type = defaultdict(list)
    for t in tasks:
        by_type[(t.type, "AI_CORE" if t.kind == "kernel" else t.kind.upper())].append(t.dur)
    total = sum(sum(d) for d in by_type.values()) or 1.0
    rows = [[ty, core, len(d), f"{sum(d):.3f}", f"{min(d):.3f}", f"{sum(d) / len(d):.3f}", f"{max(d):.3f}",
             f"{100.0 * sum(d) / total:.2f}"] for (ty, core), d in sorted(by_type.items(), key=lambda kv: -sum(kv[1]))]
    _write_csv(os.path.join(out, "op_statistic.csv"),
               ["OP Type", "Core Type", "Count", "Total Time(us)", "Min Time(us)", "Avg Time(us)", "Max Time(us)",
                "Ratio(%)"], rows)

    # task_time.csv: msprof's task_time summary (every task with its stream, start and end).
    _write_csv(os.path.join(out, "task_time.csv"),
               ["Device_id", "kernel_name", "kernel_type", "stream_id", "task_id", "task_time(us)", "task_start(us)",
                "task_stop(us)"],
               [[t.device, t.name, t.kind.upper(), t.stream, t.correlation, f"{t.dur:.3f}", stamp(t.start),
                 stamp(t.end)] for t in tasks])
    _write_step_trace(tasks, steps, out)


def _write_operator_details(host, tasks, out):
    # operator_details.csv: host operators, with the device time of what they launched
    # (self: launched directly; total: by them or the operators they called).
    device_self = defaultdict(float)
    by_tid = defaultdict(list)
    for t in tasks:
        by_tid[t.launch_tid].append(t)
        if t.op is not None:
            device_self[id(t.op)] += t.dur
    agg = {}
    for tid, events in host.items():
        ops = [e for e in events if e.get("cat") == "cpu_op"]
        child_total = defaultdict(float)  # host time of direct children (for self time)
        stack = []
        for e in ops:
            while stack and stack[-1]["ts"] + stack[-1].get("dur", 0) < e["ts"]:
                stack.pop()
            if stack:
                child_total[id(stack[-1])] += e.get("dur", 0)
            stack.append(e)
        for e in ops:
            end = e["ts"] + e.get("dur", 0)
            dev_total = sum(t.dur for t in by_tid.get(tid, []) if e["ts"] <= t.launch <= end)
            key = (e["name"], _shapes(e), e.get("args", {}).get("Call stack", ""))
            a = agg.setdefault(key, [0.0, 0.0, 0.0, 0.0])
            a[0] += e.get("dur", 0) - child_total[id(e)]
            a[1] += e.get("dur", 0)
            a[2] += device_self[id(e)]
            a[3] += dev_total
    rows = [[name, shapes, stack, f"{a[0]:.3f}", f"{a[1]:.3f}", f"{a[2]:.3f}", f"{a[3]:.3f}", f"{a[2]:.3f}",
             f"{a[3]:.3f}"] for (name, shapes, stack), a in agg.items()]
    _write_csv(os.path.join(out, "operator_details.csv"),
               ["Name", "Input Shapes", "Call Stack", "Host Self Duration(us)", "Host Total Duration(us)",
                "Device Self Duration(us)", "Device Total Duration(us)", "Device Self Duration With AICore(us)",
                "Device Total Duration With AICore(us)"], rows)


def _write_step_trace(tasks, steps, out):
    # step_trace_time.csv: per device and step, compute / communication / idle time.
    rows = []
    spans = steps or ([(None, min(min(t.launch, t.start) for t in tasks), max(t.end for t in tasks))] if tasks else [])
    for device in sorted({t.device for t in tasks}):
        for n, start, end in spans:
            inside = [t for t in tasks if t.device == device and start <= t.launch <= end]
            compute = [(t.start, t.end) for t in inside if not t.communication]
            comm = [(t.start, t.end) for t in inside if t.communication]
            c, m = _union(compute), _union(comm)
            both = _union(compute + comm)
            overlapped = c + m - both
            first = min((t.start for t in inside), default=start)
            stage = max((t.end for t in inside), default=end) - start
            rows.append([device, "" if n is None else n, f"{c:.3f}", f"{m - overlapped:.3f}", f"{overlapped:.3f}",
                         f"{m:.3f}", f"{max(0.0, stage - both):.3f}", f"{stage:.3f}", "0.000",
                         f"{m - overlapped:.3f}", f"{max(0.0, first - start):.3f}"])
    _write_csv(os.path.join(out, "step_trace_time.csv"), CsvHeaders.STEP_TRACE_TIME, rows)


_NPU_DEVICE_TYPE = 20  # c10::DeviceType::PrivateUse1 in the allocator's reports
_MB = 1024.0 * 1024.0


def memory_events(trace):
    """The npu allocator's reports ("[memory]" events), by time."""
    return sorted((e for e in trace.get("traceEvents", []) if e.get("name") == "[memory]"
                   and e.get("args", {}).get("Device Type") == _NPU_DEVICE_TYPE), key=lambda e: e["ts"])


def memory_blocks(events, by_tid):
    """Each allocation as (operator name, alloc event, free event or None)."""
    starts = {tid: [e["ts"] for e in evs] for tid, evs in by_tid.items()}
    live, blocks = {}, []

    def op_name(alloc):
        op = _innermost(by_tid[alloc["tid"]], starts[alloc["tid"]], alloc["ts"]) if alloc["tid"] in by_tid else None
        return op["name"] if op else ""

    for e in events:
        key = (e["args"]["Device Id"], e["args"]["Addr"])
        if e["args"]["Bytes"] > 0:
            live[key] = e
        elif key in live:
            alloc = live.pop(key)
            blocks.append((op_name(alloc), alloc, e))
    blocks += [(op_name(alloc), alloc, None) for alloc in live.values()]  # still allocated at the end
    return blocks


def _write_memory_views(trace, by_tid, out, stamp):
    events = memory_events(trace)
    if not events:
        return
    rows = [["PTA", stamp(e['ts']), f"{e['args']['Total Allocated'] / _MB:.3f}",
             f"{e['args']['Total Reserved'] / _MB:.3f}", f"{e['args']['Total Allocated'] / _MB:.3f}", "",
             f"NPU:{e['args']['Device Id']}"] for e in events]
    _write_csv(os.path.join(out, "memory_record.csv"), CsvHeaders.MEMORY_RECORD, rows)

    def row(name, alloc, free):
        a = alloc["args"]
        f = free["args"] if free else None
        end = stamp(free["ts"]) if free else ""
        cells = [name, f"{a['Bytes'] / 1024.0:.3f}", stamp(alloc["ts"]), end, end,
                 f"{free['ts'] - alloc['ts']:.3f}" if free else "", f"{free['ts'] - alloc['ts']:.3f}" if free else "",
                 f"{a['Total Allocated'] / _MB:.3f}", f"{a['Total Reserved'] / _MB:.3f}",
                 f"{a['Total Allocated'] / _MB:.3f}"]
        cells += [f"{f['Total Allocated'] / _MB:.3f}", f"{f['Total Reserved'] / _MB:.3f}",
                  f"{f['Total Allocated'] / _MB:.3f}"] if f else ["", "", ""]
        return cells + ["", f"NPU:{a['Device Id']}"]

    _write_csv(os.path.join(out, "operator_memory.csv"), CsvHeaders.OPERATOR_MEMORY,
               [row(*block) for block in memory_blocks(events, by_tid)])
