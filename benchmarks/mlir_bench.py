#!/usr/bin/env python3
"""torch.compile(options={"npu_backend": "mlir"}) on npu: IREE-compiled graphs vs eager npu.

    python benchmarks/mlir_bench.py            # these cases, then the warm-compile time
    python benchmarks/run_all.py --only mlir_norm,mlir_mlp,mlir_inductor

Cases (inference, f32):

* ``mlir_norm``: LayerNorm + GELU + bias + residual add on [2048, 1024], MLIR vs eager npu
  (target: no slower, ratio <= 1);
* ``mlir_mlp``: Linear(1024->4096) + GELU + Linear(4096->1024) + residual on [64, 1024],
  MLIR vs eager npu (target: no slower);
* ``mlir_mlp_dynamic``: the ``mlir_mlp`` block compiled with ``dynamic=True`` (one module
  for every token count) vs static (reported; no target);
* ``mlir_inductor``: the ``mlir_norm`` block, MLIR vs the default backend (Inductor) on npu
  (reported; no target).

``main()`` also times a warm compile: a fresh process compiling the MLP with the disk cache
already filled (torch.compile + first call, target < 1 s), after the one-time import of
Dynamo and Inductor that every backend's first compile pays (reported apart).
"""
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cases import Case, _sync  # noqa: E402

TOKENS, HIDDEN = 2048, 1024
MLP_TOKENS, MLP_HIDDEN = 64, 4096


def norm_block(x, residual, ln_weight, ln_bias, bias):
    return residual + (F.gelu(F.layer_norm(x, (HIDDEN,), ln_weight, ln_bias)) + bias)


def _norm_args(g):
    return [torch.randn(TOKENS, HIDDEN, generator=g), torch.randn(TOKENS, HIDDEN, generator=g),
            torch.rand(HIDDEN, generator=g) + 0.5, torch.randn(HIDDEN, generator=g),
            torch.randn(HIDDEN, generator=g)]


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(HIDDEN, MLP_HIDDEN)
        self.fc2 = torch.nn.Linear(MLP_HIDDEN, HIDDEN)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x))) + x


def _compiled(fn, side: str):
    if side == "eager":
        return fn
    if side == "inductor":
        return torch.compile(fn)
    return torch.compile(fn, options={"npu_backend": "mlir"}, dynamic=True if side == "mlir_dynamic" else None)


def _build_norm(side: str):
    """side: "eager", "mlir", "mlir_dynamic" or "inductor", all on npu."""
    import torch_npu  # noqa: F401

    g = torch.Generator().manual_seed(0)
    args = [a.npu() for a in _norm_args(g)]
    fn = _compiled(norm_block, side)
    sync = _sync("npu")

    def run(n: int) -> None:
        with torch.no_grad():
            for _ in range(n):
                fn(*args)
        sync()
    return run


def _build_mlp(side: str):
    import torch_npu  # noqa: F401

    torch.manual_seed(0)
    model = MLP().npu().eval()
    x = torch.randn(MLP_TOKENS, HIDDEN).npu()
    fn = _compiled(model, side)
    sync = _sync("npu")

    def run(n: int) -> None:
        with torch.no_grad():
            for _ in range(n):
                fn(x)
        sync()
    return run


COMMON = dict(n=10, repeats=11, warmup=3, prewarm=2, unit="ms")

CASES = [
    Case("mlir_norm", f"MLIR (IREE) LayerNorm + GELU + bias + residual [{TOKENS}, {HIDDEN}] f32: vs eager npu", 1.0,
         build=_build_norm, sides=("eager", "mlir"), **COMMON,
         note="one IREE dispatch: both LayerNorm reductions (vectorized at -O2) and the elementwise ops"),
    Case("mlir_mlp", f"MLIR (IREE) MLP {HIDDEN}->{MLP_HIDDEN}->{HIDDEN} + GELU + residual, {MLP_TOKENS} tokens: "
         f"vs eager npu", 1.0, build=_build_mlp, sides=("eager", "mlir"), **COMMON,
         note="matmul-bound; weights are arguments read in place (zero-copy, no data-tiling re-pack per call)"),
    Case("mlir_mlp_dynamic", f"MLIR (IREE) MLP {HIDDEN}->{MLP_HIDDEN}->{HIDDEN}, {MLP_TOKENS} tokens: "
         f"dynamic=True (symbolic token count) vs static", None, build=_build_mlp, sides=("mlir", "mlir_dynamic"),
         **COMMON, note="reported, no target: one module for all token counts; its matmuls have a dynamic row count"),
    Case("mlir_inductor", f"MLIR (IREE) vs Inductor, LayerNorm + GELU + bias + residual [{TOKENS}, {HIDDEN}] f32",
         None, build=_build_norm, sides=("inductor", "mlir"), **COMMON, note="reported, no target"),
]

_WARM_SCRIPT = """
import time, warnings
warnings.filterwarnings("ignore")
import torch, torch_npu
import mlir_bench
from torch_npu._inductor.mlir import compiler
torch.manual_seed(0)
model = mlir_bench.MLP().npu().eval()
x = torch.randn(mlir_bench.MLP_TOKENS, mlir_bench.HIDDEN).npu()
# What any first torch.compile of a process pays, whatever the backend: importing Dynamo
# and Inductor's entry module (torch.compile does). Timed apart from the compile itself.
t0 = time.perf_counter()
import torch._dynamo, torch._inductor.compile_fx
t1 = time.perf_counter()
with torch.no_grad():
    torch.compile(model, options={"npu_backend": "mlir"})(x)
torch.npu.synchronize()
print("COMPILE", time.perf_counter() - t1, compiler.stats["compiled"], compiler.stats["cache_hits"], t1 - t0)
"""


def warm_compile_seconds() -> dict:
    """Cold then warm compile of the MLP, each in a fresh process sharing one cache dir."""
    here = os.path.dirname(os.path.abspath(__file__))
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache,
                   PYTHONPATH=os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p))
        for label in ("cold", "warm"):
            res = subprocess.run([sys.executable, "-c", _WARM_SCRIPT], env=env, capture_output=True, text=True)
            line = next((l for l in res.stdout.splitlines() if l.startswith("COMPILE")), None)
            if line is None:
                raise RuntimeError(f"warm-compile probe failed:\n{res.stderr[-2000:]}")
            seconds, compiled, hits, imports = line.split()[1:]
            out[label] = (float(seconds), int(compiled), int(hits), float(imports))
    return out


def main() -> None:
    import warnings

    warnings.filterwarnings("ignore")
    import torch_npu  # noqa: F401
    from harness import measure

    only = set(sys.argv[1].split(",")) if len(sys.argv) > 1 else None
    for case in CASES:
        if only and case.name not in only:
            continue
        r = measure(case)
        base, subject = case.sides
        print(f"{case.name:<14} {base} {r['base_s'] * 1e3:7.2f} ms  {subject} {r['subject_s'] * 1e3:7.2f} ms  "
              f"ratio {r['ratio']:.2f} ({case.target_text(r['ratio'])})",
              flush=True)
    if not only or "warm" in only:
        t = warm_compile_seconds()
        print(f"mlir compile of the MLP in a fresh process: cold {t['cold'][0]:.2f} s (compiled {t['cold'][1]}), "
              f"warm {t['warm'][0]:.2f} s (cache hits {t['warm'][2]}, compiled {t['warm'][1]}; "
              f"target < 1 s: {'met' if t['warm'][0] < 1 else 'NOT met'}); before that, importing "
              f"Dynamo + Inductor (any backend's first compile) took {t['warm'][3]:.2f} s", flush=True)


if __name__ == "__main__":
    main()
