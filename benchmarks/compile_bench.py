#!/usr/bin/env python3
"""torch.compile (Inductor) on npu: elementwise/normalisation-heavy blocks.

    python benchmarks/compile_bench.py            # these cases alone (async mode)
    python benchmarks/run_all.py --only compile_eager,compile_cpu,compile_eval,compile_eval_cpu,compile_rmsnorm

The block is what transformer layers do around their matmuls, on [TOKENS, HIDDEN] f32:
LayerNorm, GELU, then bias + dropout + residual add. Eager npu runs it as five or six
kernels over the whole tensor; Inductor fuses it into one C++ kernel (the LayerNorm
reduction with its pointwise epilogue and the dropout's random numbers; for npu graphs the
random numbers come from torch_npu's vectorized form of Inductor's Philox, see
``torch_npu._inductor.codegen.vectorized_rand``). Cases:

* ``compile_eager``: the block in training mode (dropout p=0.1), compiled npu vs eager npu
  (target: >= 1.5x faster, ratio <= 0.67);
* ``compile_cpu``: the same, compiled npu vs torch.compile on cpu tensors (target: within 1.1x);
* ``compile_eval``: the block in eval mode (no dropout), compiled vs eager npu (reported, no
  target: the compiled npu graph runs Inductor's cpu kernel, which for this block is no faster
  than ATen's eager kernels on a caching allocator's memory, 0.88-1.04 from run to run; the
  npu path's own cost is ``compile_eval_cpu``'s, see docs/BENCHMARKS.md);
* ``compile_eval_cpu``: the same, compiled npu vs torch.compile on cpu tensors (the bound:
  the npu graph's kernel is the cpu graph's; target: within 1.1x);
* ``compile_rmsnorm``: RMSNorm written as Hugging Face models do (pow, mean, rsqrt, two
  muls) times SiLU gate, compiled vs eager npu: a chain of cheap ops, where fusion pays most.

Both sides of a case are built (and compiled, during the harness's warm-up) in one process.
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cases import Case, _sync  # noqa: E402

TOKENS, HIDDEN, DROPOUT = 2048, 1024, 0.1


def norm_block(x, residual, ln_weight, ln_bias, bias):
    h = F.gelu(F.layer_norm(x, (HIDDEN,), ln_weight, ln_bias))
    return residual + F.dropout(h + bias, p=DROPOUT, training=True)


def norm_block_eval(x, residual, ln_weight, ln_bias, bias):
    return residual + (F.gelu(F.layer_norm(x, (HIDDEN,), ln_weight, ln_bias)) + bias)


def rmsnorm_gate(x, gate, weight, _bias, _bias2):
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight
    return normed * F.silu(gate)


def _builder(block):
    def build(side: str):
        """side: "eager" (npu), "compiled" (npu), "cpu" (compiled on cpu)."""
        import torch_npu  # noqa: F401  (registers npu with Dynamo/Inductor)

        device = "cpu" if side == "cpu" else "npu"
        g = torch.Generator().manual_seed(0)
        args = [torch.randn(TOKENS, HIDDEN, generator=g), torch.randn(TOKENS, HIDDEN, generator=g),
                torch.rand(HIDDEN, generator=g) + 0.5, torch.randn(HIDDEN, generator=g),
                torch.randn(HIDDEN, generator=g)]
        args = [a.to(device) for a in args]
        # Dynamo caches graphs per code object and guards on the device: the cpu and npu
        # sides get their own graph, two cases compiling the same block on npu share one.
        fn = block if side == "eager" else torch.compile(block)
        sync = _sync(device)

        def run(n: int) -> None:
            for _ in range(n):
                fn(*args)
            sync()
        return run
    return build


SHAPE = f"[{TOKENS}, {HIDDEN}] f32"
BLOCK = f"LayerNorm + GELU + bias-dropout(p={DROPOUT})-residual add"
COMMON = dict(n=10, repeats=15, warmup=3, prewarm=2, unit="ms")

CASES = [
    Case("compile_eager", f"torch.compile {BLOCK} {SHAPE}: compiled vs eager npu", 1 / 1.5,
         build=_builder(norm_block), sides=("eager", "compiled"), **COMMON,
         note="training mode: eager npu draws dropout's random numbers with ATen's bernoulli, the compiled npu "
              "kernel with Inductor's Philox, 16 lanes at a time (torch_npu's AVX-512/AVX2 form, same numbers)"),
    Case("compile_cpu", f"torch.compile {BLOCK} {SHAPE}: npu vs cpu, both compiled", 1.1,
         build=_builder(norm_block), sides=("cpu", "compiled"), **COMMON,
         note="the same fused Inductor C++ kernel on cpu tensors and on npu memory, except for dropout's random "
              "numbers: Inductor's cpu kernel computes Philox lane by lane, torch_npu's 16 lanes at a time "
              "(bit-identical numbers)"),
    Case("compile_eval", f"torch.compile LayerNorm + GELU + bias + residual {SHAPE}: compiled vs eager npu", None,
         build=_builder(norm_block_eval), sides=("eager", "compiled"), **COMMON,
         note="the block in eval mode (no dropout): LayerNorm and GELU are single ATen kernels in eager too; "
              "reported, no target: the compiled graph's kernel is Inductor's cpu kernel (the next row), no "
              "faster than ATen's here"),
    Case("compile_eval_cpu", f"torch.compile LayerNorm + GELU + bias + residual {SHAPE}: npu vs cpu, both compiled",
         1.1, build=_builder(norm_block_eval), sides=("cpu", "compiled"), **COMMON,
         note="the same C++ kernel: on cpu called by the wrapper, on npu launched on the npu stream "
              "(run on the calling thread once the stream has drained: runs_on_caller)"),
    Case("compile_rmsnorm", f"torch.compile HF-style RMSNorm * SiLU(gate) {SHAPE}: compiled vs eager npu", 1 / 1.5,
         build=_builder(rmsnorm_gate), sides=("eager", "compiled"), **COMMON,
         note="x * rsqrt(x.pow(2).mean(-1) + eps) * w * silu(gate): six eager kernels, one compiled"),
]


def main() -> None:
    import warnings

    warnings.filterwarnings("ignore")
    import torch_npu  # noqa: F401
    from harness import measure

    for case in CASES:
        r = measure(case)
        base, subject = case.sides
        print(f"{case.name:<16} {base} {r['base_s'] * 1e3:7.2f} ms  {subject} {r['subject_s'] * 1e3:7.2f} ms  "
              f"ratio {r['ratio']:.2f} ({case.target_text(r['ratio'])})", flush=True)


if __name__ == "__main__":
    main()
