"""The benchmark cases: each builds its state on one device and returns a ``run(n)``.

``run(n)`` performs ``n`` iterations of the measured work and, on npu, ends with
``torch.npu.synchronize()`` so that queued kernels are part of the time (on cpu there
is nothing to wait for). The harness divides the elapsed time by ``n``.

Every case is built from the same seed on both devices, so cpu and npu do the same
arithmetic on the same data.
"""
import copy
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import torch


def _sync(device: str) -> Callable[[], None]:
    if device == "npu":
        return torch.npu.synchronize
    return lambda: None


@dataclass
class Case:
    name: str            # short id, also used on the command line (--only)
    title: str           # what the table shows
    target: Optional[float]  # subject/baseline ratio to stay at or under; None: reported, no target
    n: int               # iterations per timed measurement
    repeats: int         # timed measurements per device (interleaved cpu/npu)
    warmup: int          # untimed iterations per device before the first measurement
    build: Callable[[str], Callable[[int], None]]
    prewarm: int = 0     # untimed iterations right before every measurement (cache re-warm)
    unit: str = "us"     # how the per-iteration time is shown: "us" or "ms"
    note: str = ""
    sides: Tuple[str, str] = ("cpu", "npu")  # (baseline, subject): build() gets one; ratio = subject / baseline

    def met(self, ratio: float) -> Optional[bool]:
        """Whether ``ratio`` meets the target; None for a case without one."""
        return None if self.target is None else ratio <= self.target

    def target_text(self, ratio: float) -> str:
        """'target <= 1.10: met' / 'NOT met', or 'no target', for one-line reports."""
        if self.target is None:
            return "no target"
        return f"target <= {self.target:.2f}: {'met' if self.met(ratio) else 'NOT met'}"


# ---- 1. large elementwise ------------------------------------------------------------
N_LARGE = 4 * 1024 * 1024


def _build_add(device: str):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(N_LARGE, generator=g).to(device)
    b = torch.randn(N_LARGE, generator=g).to(device)
    sync = _sync(device)

    def run(n: int) -> None:
        for _ in range(n):
            a + b
        sync()
    return run


def _build_add_inplace(device: str):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(N_LARGE, generator=g).to(device)
    b = torch.randn(N_LARGE, generator=g).mul_(1e-6).to(device)
    sync = _sync(device)

    def run(n: int) -> None:
        for _ in range(n):
            a.add_(b)
        sync()
    return run


# ---- 2. matmul ------------------------------------------------------------------------
def _build_matmul(device: str):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(1024, 1024, generator=g).to(device)
    b = torch.randn(1024, 1024, generator=g).to(device)
    sync = _sync(device)

    def run(n: int) -> None:
        for _ in range(n):
            a @ b
        sync()
    return run


# ---- 3. tiny ops (host-side cost per op) ------------------------------------------------
def _build_tiny_add_(device: str):
    x = torch.zeros(1, device=device)
    sync = _sync(device)

    def run(n: int) -> None:
        for _ in range(n):
            x.add_(1)
        sync()
    return run


def _build_tiny_add(device: str):
    x = torch.ones(1, device=device)
    y = torch.ones(1, device=device)
    sync = _sync(device)

    def run(n: int) -> None:
        for _ in range(n):
            x + y
        sync()
    return run


# ---- 4. empty of a cached size ------------------------------------------------------------
def _build_empty(device: str):
    sync = _sync(device)
    empty = torch.empty
    f32 = torch.float32
    dev = torch.device(device)

    def run(n: int) -> None:
        for _ in range(n):
            empty((1024,), dtype=f32, device=dev)  # freed at once: the cached block is reused
        sync()
    return run


# ---- 5. transformer training step ----------------------------------------------------------
D_MODEL, HEADS, FF, LAYERS, BATCH, SEQ = 256, 4, 1024, 2, 8, 128


def _build_transformer(device: str):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(D_MODEL, HEADS, FF, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, SEQ, D_MODEL, generator=g).to(device)
    target = torch.randn(BATCH, SEQ, D_MODEL, generator=g).to(device)
    mse = torch.nn.functional.mse_loss

    def run(n: int) -> None:
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            loss = mse(model(x), target)
            loss.backward()
            opt.step()
            loss.item()  # synchronises the npu every step, as a training loop logging the loss does
    return run


# ---- 3. fused operators vs their unfused composition (both on npu) ---------------------
TOKENS, HIDDEN = 1024, 4096


def _fused_or_unfused(fused, unfused, make_args):
    """build(side) for a fused-op case: the same arguments, on npu, for both sides."""
    def build(side: str):
        import torch_npu  # noqa: F401  (the fused ops live in torch.ops.npu)

        g = torch.Generator().manual_seed(0)
        args = [a.npu() for a in make_args(g)]
        fn = fused if side == "fused" else unfused

        def run(n: int) -> None:
            for _ in range(n):
                fn(*args)
            torch.npu.synchronize()
        return run
    return build


def _rms_norm_unfused(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _swiglu_unfused(x):
    a, b = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(a) * b


def _rotary_unfused(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def _fused(name):
    return lambda *args: getattr(torch.ops.npu, name)(*args)


FUSED_SIDES = ("unfused", "fused")


# ---- 4. fused attention: causal S=4096, D=128, 8 heads, f32 ------------------------------
ATT_HEADS, ATT_SEQ, ATT_DIM = 8, 4096, 128


def _attention_inputs(device: str):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, ATT_HEADS, ATT_SEQ, ATT_DIM, generator=g).to(device) for _ in range(3))
    return q, k, v, ATT_DIM ** -0.5


def _attention_fused(q, k, v, scale):
    import torch_npu
    mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1).npu()  # the compressed causal mask
    return lambda: torch_npu.npu_fusion_attention(q, k, v, ATT_HEADS, "BNSD", atten_mask=mask, scale=scale,
                                                  sparse_mode=2)[0]


def _attention_naive(q, k, v, scale):
    mask = torch.triu(torch.ones(ATT_SEQ, ATT_SEQ, dtype=torch.bool), 1).to(q.device)
    return lambda: torch.softmax((q @ k.transpose(-1, -2) * scale).masked_fill(mask, float("-inf")), -1) @ v


def _attention_sdpa(q, k, v, scale):
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return lambda: sdpa(q, k, v, is_causal=True, scale=scale)


def _build_attention(side: str):
    """npu: npu_fusion_attention; naive: the unfused composition on npu; cpu: SDPA on cpu;
    npu_sdpa: SDPA on npu (which runs the fused kernel)."""
    q, k, v, scale = _attention_inputs("cpu" if side == "cpu" else "npu")
    fn = {"cpu": _attention_sdpa, "npu": _attention_fused, "fused": _attention_fused,
          "naive": _attention_naive, "npu_sdpa": _attention_sdpa}[side](q, k, v, scale)
    sync = _sync("cpu" if side == "cpu" else "npu")

    def run(n: int) -> None:
        for _ in range(n):
            fn()
        sync()
    return run


def attention_peak_memory() -> dict:
    """Peak npu memory (bytes) one forward of each npu variant adds to what its inputs hold
    (outputs included): ``python -c "import cases; print(cases.attention_peak_memory())"``."""
    import torch_npu  # noqa: F401
    q, k, v, scale = _attention_inputs("npu")
    peaks = {}
    for name, make in (("npu_fusion_attention", _attention_fused), ("sdpa", _attention_sdpa),
                       ("naive", _attention_naive)):
        fn = make(q, k, v, scale)
        torch.npu.synchronize()
        base = torch.npu.memory_allocated()
        torch.npu.reset_peak_memory_stats()
        out = fn()
        torch.npu.synchronize()
        peaks[name] = torch.npu.max_memory_allocated() - base
        del out
    return peaks

CASES: List[Case] = [
    Case("add", "add 4M f32 (a + b)", 1.10, n=10, repeats=41, warmup=5, prewarm=5, build=_build_add,
         note="out-of-place: includes allocating (cpu: malloc; npu: caching allocator) the 16 MiB result"),
    Case("add_", "add_ 4M f32 (a.add_(b))", 1.10, n=10, repeats=41, warmup=5, prewarm=5, build=_build_add_inplace),
    Case("matmul", "matmul 1024x1024 f32", 1.10, n=2, repeats=15, warmup=2, prewarm=1, build=_build_matmul, unit="ms"),
    Case("tiny_add_", "tiny x.add_(1) (1 elem)", 2.0, n=10000, repeats=21, warmup=2000, prewarm=200, build=_build_tiny_add_),
    Case("tiny_add", "tiny x + y (1 elem)", 2.0, n=10000, repeats=21, warmup=2000, prewarm=200, build=_build_tiny_add),
    Case("empty", "torch.empty((1024,)) cached", 2.0, n=10000, repeats=21, warmup=2000, prewarm=200, build=_build_empty),
    Case("transformer", "transformer train step", 1.15, n=1, repeats=21, warmup=3, build=_build_transformer,
         unit="ms",
         note=f"TransformerEncoder {LAYERS} layers, d_model={D_MODEL}, {HEADS} heads, ff={FF}, "
              f"batch {BATCH} x seq {SEQ}, AdamW defaults, MSE loss, loss.item() each step. With the "
              f"defaults AdamW takes its foreach implementation on npu (npu is a foreach device) and "
              f"the per-parameter loop on cpu"),
    Case("rms_norm", f"npu_rms_norm [{TOKENS}, {HIDDEN}] f32", 1 / 1.5, n=5, repeats=15, warmup=2, prewarm=1,
         sides=FUSED_SIDES, unit="ms",
         build=_fused_or_unfused(_fused("npu_rms_norm"), _rms_norm_unfused,
                                 lambda g: [torch.randn(TOKENS, HIDDEN, generator=g), torch.randn(HIDDEN, generator=g)]),
         note="unfused: x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w, as Hugging Face models write it"),
    Case("swiglu", f"npu_swiglu [{TOKENS}, 2x{HIDDEN}] f32", 1 / 1.5, n=5, repeats=15, warmup=2, prewarm=1,
         sides=FUSED_SIDES, unit="ms",
         build=_fused_or_unfused(_fused("npu_swiglu"), _swiglu_unfused,
                                 lambda g: [torch.randn(TOKENS, 2 * HIDDEN, generator=g)]),
         note="unfused: a, b = x.chunk(2, -1); silu(a) * b"),
    Case("rotary_mul", "npu_rotary_mul [4, 1024, 8, 128] f32", 1 / 1.5, n=5, repeats=15, warmup=2, prewarm=1,
         sides=FUSED_SIDES, unit="ms",
         build=_fused_or_unfused(_fused("npu_rotary_mul"), _rotary_unfused,
                                 lambda g: [torch.randn(4, 1024, 8, 128, generator=g),
                                            torch.randn(1, 1024, 1, 128, generator=g),
                                            torch.randn(1, 1024, 1, 128, generator=g)]),
         note="unfused: x * cos + cat(-x2, x1) * sin (rotate_half), cos/sin broadcast over batch and heads"),
    Case("attention", f"npu_fusion_attention causal S={ATT_SEQ} D={ATT_DIM} {ATT_HEADS} heads f32 vs cpu SDPA", 1.2,
         n=1, repeats=5, warmup=1, build=_build_attention, unit="ms",
         note="npu_fusion_attention (BNSD, sparse_mode=2 with the compressed 2048x2048 mask) against "
              "torch.nn.functional.scaled_dot_product_attention(is_causal=True) on cpu"),
    Case("sdpa", f"F.scaled_dot_product_attention causal S={ATT_SEQ} D={ATT_DIM} {ATT_HEADS} heads f32", 1.2,
         n=1, repeats=5, warmup=1, build=_build_attention, unit="ms", sides=("cpu", "npu_sdpa"),
         note="the same call on both sides: on cpu PyTorch's flash kernel, on npu the overrideable SDPA "
              "backend, i.e. npu_fusion_attention (custom_ops/src/sdpa.cpp)"),
    Case("attention_naive", f"npu_fusion_attention causal S={ATT_SEQ} vs naive on npu", 1.0,
         n=1, repeats=5, warmup=1, build=_build_attention, unit="ms", sides=("naive", "fused"),
         note="naive: softmax((q @ k^T * scale).masked_fill(causal, -inf)) @ v on npu, which holds three "
              "[8, 4096, 4096] f32 matrices (512 MiB each); peak memory of both: cases.attention_peak_memory(), "
              "measured in the hand-written section below"),
]

BY_NAME = {c.name: c for c in CASES}


# ---- 5. fused optimizer: NpuFusedAdamW vs torch.optim.AdamW (for-loop) step on npu ------------
OPT_LAYERS, OPT_WIDTH = 6, 4096  # 6 x Linear(4096, 4096): 100.7M parameters


def _build_adamw_step(side: str):
    """One optimizer step over a ~100M-parameter model whose grads are set once."""
    import torch_npu  # noqa: F401
    from torch_npu.optim import NpuFusedAdamW

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(OPT_WIDTH, OPT_WIDTH) for _ in range(OPT_LAYERS)]).npu()
    for p in model.parameters():
        p.grad = torch.randn_like(p).mul_(1e-3)
    if side == "fused":
        opt = NpuFusedAdamW(model.parameters(), lr=1e-4)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-2, foreach=False)

    def run(n: int) -> None:
        for _ in range(n):
            opt.step()
        torch.npu.synchronize()
    return run


CASES.append(
    Case("fused_adamw", f"AdamW step, {OPT_LAYERS}x Linear({OPT_WIDTH}) (100.7M params) f32", 1 / 1.5, n=2,
         repeats=7, warmup=2, sides=("torch", "fused"), unit="ms", build=_build_adamw_step,
         note="torch: torch.optim.AdamW(foreach=False), the per-parameter loop; fused: "
              "torch_npu.optim.NpuFusedAdamW, one npu_apply_adam_w-style kernel over the combined buffers"))
BY_NAME = {c.name: c for c in CASES}
