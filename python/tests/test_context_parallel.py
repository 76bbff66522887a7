"""torch_npu.distributed.tensor.experimental.context_parallel: attention on DTensors sharded
along the sequence runs as ring attention over npu_fusion_attention. On 2 hccl ranks, the
outputs and gradients of F.scaled_dot_product_attention and npu_fusion_attention (full and
causal, contiguous and head-tail balanced shards, both kv rotations, grouped kv heads, the
BNSD / BSND / BSH / SBH layouts) are checked against the same attention on one process and
against float64 math on the CPU; dropout by forward/backward consistency."""

import inspect
import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import torch_npu  # noqa: F401
import torch_npu.distributed.tensor  # noqa: F401  (adds the npu handlers to torch's CP dispatcher)
from torch_npu.distributed.tensor.experimental import context_parallel

WORLD = 2
B, N, S, D = 2, 2, 16, 8  # the global sequence S: 2 ranks x 2 head-tail chunks of 4
F32_TOL = dict(atol=2e-6, rtol=1e-5)
BF16_TOL = dict(atol=2e-2, rtol=1.6e-2)


# ---- one process -------------------------------------------------------------------------

def test_signature_is_huaweis():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "torch_npu_api.json")
    with open(path, encoding="utf-8") as f:
        expected = json.load(f)["entries"]["torch_npu.distributed.tensor.experimental.context_parallel"]
    assert str(inspect.signature(context_parallel)) == expected
    assert context_parallel.__module__ == "torch_npu.distributed.tensor.experimental"


def test_torch_dispatcher_switches_the_npu_handlers():
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.experimental._context_parallel import (_disable_context_parallel_dispatcher,
                                                                         _enable_context_parallel_dispatcher)
    ops = [torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default,
           torch.ops.aten._scaled_dot_product_fused_attention_overrideable_backward.default,
           torch.ops.npu.npu_fusion_attention.default, torch.ops.npu.npu_fusion_attention_grad.default]
    before = dict(DTensor._op_dispatcher._custom_op_handlers)
    _enable_context_parallel_dispatcher()
    try:
        handlers = DTensor._op_dispatcher._custom_op_handlers
        assert all(op in handlers for op in ops)
        # torch's own (CUDA flash attention) handlers stay
        assert torch.ops.aten._scaled_dot_product_flash_attention.default in handlers
    finally:
        _disable_context_parallel_dispatcher()
    assert dict(DTensor._op_dispatcher._custom_op_handlers) == before


def test_mesh_must_be_a_device_mesh():
    with pytest.raises(TypeError, match="context_parallel: mesh must be a DeviceMesh, got str"):
        with context_parallel("npu"):
            pass


# ---- 2 ranks -------------------------------------------------------------------------------

def _spawn(fn):
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    mp.spawn(fn, args=(WORLD, store.port), nprocs=WORLD, join=True)


def _init(rank, world, port):
    import torch_npu.distributed.tensor  # noqa: F401
    from torch.distributed.device_mesh import init_device_mesh
    torch.npu.set_device(rank)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False)
    dist.init_process_group("hccl", store=store, rank=rank, world_size=world)
    return init_device_mesh("npu", (world,))


def _balancer(load_balance):
    from torch.distributed.tensor.experimental._context_parallel import _HeadTailLoadBalancer
    return _HeadTailLoadBalancer(S, WORLD, torch.device("npu")) if load_balance else None


def _unshard(mesh, tensors, dims, load_balance):
    from torch.distributed.tensor.experimental._context_parallel import context_parallel_unshard
    return context_parallel_unshard(mesh, list(tensors), list(dims), load_balancer=_balancer(load_balance))


def _math_sdpa(q, k, v, causal, scale=None):
    """Attention in float64 on the CPU, from its definition."""
    q, k, v = (t.detach().double().cpu() for t in (q, k, v))
    k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
    v = v.repeat_interleave(q.size(1) // v.size(1), dim=1)
    scores = q @ k.transpose(-1, -2) * (scale if scale is not None else q.size(-1) ** -0.5)
    if causal:
        scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


def _sdpa_case(mesh, causal, load_balance, rotate, dtype=torch.float32, kv_heads=N, bsnd=False, scale=None):
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.experimental._context_parallel import _cp_options, set_rotate_method

    torch.manual_seed(0)  # the same tensors on both ranks
    q = torch.randn(B, N, S, D, device="npu", dtype=dtype)
    k, v = (torch.randn(B, kv_heads, S, D, device="npu", dtype=dtype) for _ in range(2))
    grad = torch.randn(B, N, S, D, device="npu", dtype=dtype)
    gqa = kv_heads != N
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*ref_in, is_causal=causal, scale=scale, enable_gqa=gqa)
    ref.backward(grad)

    buffers = [t.clone() for t in (q, k, v, grad)]
    set_rotate_method(rotate)
    _cp_options.enable_load_balance = load_balance
    sdpa = F.scaled_dot_product_attention
    with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2] * 4):
        assert F.scaled_dot_product_attention is not sdpa  # torch's CP wrapper
        assert buffers[0].shape == (B, N, S // WORLD, D)
        local = [t.clone() for t in buffers[:3]]
        if bsnd:  # [B, S, N, D] memory, as models make q from a [B, S, H] projection
            local = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in local]
        local = [t.requires_grad_() for t in local]
        with CommDebugMode() as comm:
            out = F.scaled_dot_product_attention(*local, is_causal=causal, scale=scale, enable_gqa=gqa)
            out.backward(buffers[3])
        if rotate == "alltoall":  # kv: W - 1 steps forward and backward, dk / dv: W
            assert comm.get_comm_counts() == {torch.ops.c10d_functional.all_to_all_single: 3 * WORLD - 2}
        results = _unshard(mesh, [out] + [t.grad for t in local], [2] * 4, load_balance)
    assert F.scaled_dot_product_attention is sdpa
    assert all(torch.equal(a, b) for a, b in zip(buffers, (q, k, v, grad)))  # restored

    tol = F32_TOL if dtype == torch.float32 else BF16_TOL
    for got, want in zip(results, [ref] + [t.grad for t in ref_in]):
        torch.testing.assert_close(got, want, **tol)
    if dtype == torch.float32:
        torch.testing.assert_close(results[0].double().cpu(), _math_sdpa(q, k, v, causal, scale),
                                   atol=1e-5, rtol=1e-5)


def _w_sdpa(rank, world, port):
    mesh = _init(rank, world, port)
    try:
        _sdpa_case(mesh, causal=False, load_balance=False, rotate="alltoall")
        _sdpa_case(mesh, causal=True, load_balance=False, rotate="alltoall")
        _sdpa_case(mesh, causal=True, load_balance=False, rotate="allgather", scale=0.25)
        _sdpa_case(mesh, causal=True, load_balance=True, rotate="alltoall")
        _sdpa_case(mesh, causal=True, load_balance=True, rotate="allgather", bsnd=True)
        # full attention does not depend on the order of the keys: balanced shards work too
        _sdpa_case(mesh, causal=False, load_balance=True, rotate="allgather")
        _sdpa_case(mesh, causal=True, load_balance=True, rotate="alltoall", kv_heads=1)
        _sdpa_case(mesh, causal=False, load_balance=False, rotate="alltoall", kv_heads=1, bsnd=True)
        _sdpa_case(mesh, causal=True, load_balance=True, rotate="alltoall", dtype=torch.bfloat16)
        _sdpa_case(mesh, causal=False, load_balance=False, rotate="allgather", dtype=torch.float16)
    finally:
        dist.destroy_process_group()


def test_sdpa_matches_one_process():
    _spawn(_w_sdpa)


def _to_layout(t, layout):  # [B, N, S, D] -> layout
    if layout == "BSND":
        return t.transpose(1, 2).contiguous()
    if layout == "BSH":
        return t.transpose(1, 2).reshape(t.size(0), t.size(2), -1)
    if layout == "SBH":
        return t.permute(2, 0, 1, 3).reshape(t.size(2), t.size(0), -1)
    return t


def _fusion_attention_case(mesh, layout, causal, load_balance, kv_heads=N, version="v1", dtensor_sum=False):
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.experimental._context_parallel import (_context_parallel_shard,
                                                                         _disable_context_parallel_dispatcher,
                                                                         _enable_context_parallel_dispatcher)
    seq_dim = {"BNSD": 2, "BSND": 1, "BSH": 1, "SBH": 0}[layout]
    mask = torch.ones(2048, 2048, dtype=torch.bool, device="npu").triu(1) if causal else None
    kwargs = dict(atten_mask=mask, scale=0.3, sparse_mode=2 if causal else 0)
    op = torch_npu.npu_fusion_attention_v3 if version == "v3" else torch_npu.npu_fusion_attention

    torch.manual_seed(1)
    q = _to_layout(torch.randn(B, N, S, D, device="npu"), layout)
    k, v = (_to_layout(torch.randn(B, kv_heads, S, D, device="npu"), layout) for _ in range(2))
    grad = _to_layout(torch.randn(B, N, S, D, device="npu"), layout)
    if dtensor_sum:  # the loss out.sum() of the DTensor: its gradient arrives replicated
        grad = torch.ones_like(grad)
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_out, ref_max, ref_sum = op(*ref_in, N, layout, **kwargs)[:3]
    ref_out.backward(grad)

    shards = _context_parallel_shard(mesh, [q, k, v, grad], [seq_dim] * 4, load_balancer=_balancer(load_balance))
    local = [t.clone().requires_grad_() for t in shards[:3]]
    _enable_context_parallel_dispatcher()
    try:
        out, smax, ssum = op(*(DTensor.from_local(t, mesh, [Shard(seq_dim)]) for t in local), N, layout,
                             **kwargs)[:3]
        assert out.placements == (Shard(seq_dim),) and smax.placements == (Shard(2),)
        loss = out.sum() if dtensor_sum else (out.to_local() * shards[3]).sum()
        loss.backward()
    finally:
        _disable_context_parallel_dispatcher()
    got = _unshard(mesh, [out.to_local()] + [t.grad for t in local], [seq_dim] * 4, load_balance)
    stats = _unshard(mesh, [smax.to_local(), ssum.to_local()], [2, 2], load_balance)
    for a, b in zip(got + stats, [ref_out] + [t.grad for t in ref_in] + [ref_max, ref_sum]):
        torch.testing.assert_close(a, b, **F32_TOL)
    # the softmax statistics: the row max and the sum of exp(score - max) over the whole sequence
    qd, kd = (t.double().cpu() for t in (q, k))
    if layout != "BNSD":
        qd = qd.reshape(*qd.shape[:2], N, -1)
        kd = kd.reshape(*kd.shape[:2], kv_heads, -1)
        perm = (0, 2, 1, 3) if layout in ("BSND", "BSH") else (1, 2, 0, 3)
        qd, kd = qd.permute(*perm), kd.permute(*perm)
    scores = 0.3 * qd @ kd.repeat_interleave(N // kv_heads, dim=1).transpose(-1, -2)
    if causal:
        scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    row_max = scores.amax(-1)
    torch.testing.assert_close(stats[0][..., 0].double().cpu(), row_max, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(stats[1][..., 0].double().cpu(), (scores - row_max[..., None]).exp().sum(-1),
                               atol=1e-4, rtol=1e-5)


def _w_fusion_attention(rank, world, port):
    mesh = _init(rank, world, port)
    try:
        _fusion_attention_case(mesh, "BNSD", causal=True, load_balance=True)
        _fusion_attention_case(mesh, "BNSD", causal=False, load_balance=False, version="v3")
        _fusion_attention_case(mesh, "BSND", causal=True, load_balance=False, kv_heads=1)
        _fusion_attention_case(mesh, "BSH", causal=True, load_balance=True, kv_heads=1, version="v3")
        _fusion_attention_case(mesh, "SBH", causal=True, load_balance=False, dtensor_sum=True)
        _fusion_attention_case(mesh, "SBH", causal=False, load_balance=False, kv_heads=1)
    finally:
        dist.destroy_process_group()


def test_npu_fusion_attention_matches_one_process():
    _spawn(_w_fusion_attention)


def _dropout_case(mesh, causal, load_balance):
    """With fixed dropout masks (the generator reseeded), the gradients are those of the
    computed function: out is linear in v, and a central difference in q gives dq."""
    from torch.distributed.tensor.experimental._context_parallel import _cp_options

    torch.manual_seed(2)
    q, k, v, grad = (torch.randn(B, N, S, D, device="npu") for _ in range(4))
    dirs = [torch.randn(B, N, S, D, device="npu") for _ in range(2)]
    buffers = [q, k, v, grad] + dirs
    _cp_options.enable_load_balance = load_balance
    with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2] * len(buffers)):
        def loss(q_, v_, dropout_p=0.5):
            torch.npu.manual_seed(7)
            return (F.scaled_dot_product_attention(q_, k, v_, dropout_p=dropout_p, is_causal=causal) * grad).sum()

        def total(x):  # a sum over the whole sequence
            x = x.detach().double().reshape(1)
            dist.all_reduce(x)
            return x.item()

        leaves = [q.clone().requires_grad_(), v.clone().requires_grad_()]
        value = loss(*leaves)
        value.backward()
        assert total(value) == pytest.approx(total(loss(q, v)), rel=1e-6)  # the same masks again
        assert total(value) != pytest.approx(total(loss(q, v, dropout_p=0.0)), rel=1e-3)  # dropped
        dq, dv = (t.grad for t in leaves)
        # v: exact, out being linear in v
        assert total(loss(q, v + dirs[1])) - total(value) == pytest.approx(total((dv * dirs[1]).sum()), rel=1e-4)
        eps = 1e-2
        difference = (total(loss(q + eps * dirs[0], v)) - total(loss(q - eps * dirs[0], v))) / (2 * eps)
        assert difference == pytest.approx(total((dq * dirs[0]).sum()), rel=2e-3)


def _module_plan_case(mesh):
    """torch's _ContextParallel plan (a module's SDPA) with _context_parallel_shard."""
    from torch.distributed.tensor.experimental._context_parallel import (_context_parallel_shard, _ContextParallel,
                                                                         _disable_context_parallel_dispatcher,
                                                                         _enable_context_parallel_dispatcher)
    from torch.distributed.tensor.parallel import parallelize_module

    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    torch.manual_seed(3)
    q, k, v, grad = (torch.randn(B, N, S, D, device="npu") for _ in range(4))
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    Attention()(*ref_in).backward(grad)
    plan = _ContextParallel(seq_dim=2, attention_type=_ContextParallel.AttentionType.SDPA)
    module = parallelize_module(Attention(), mesh, plan)
    shards = _context_parallel_shard(mesh, [q, k, v, grad], [2] * 4, load_balancer=_balancer(True))
    local = [t.requires_grad_() for t in shards[:3]]
    _enable_context_parallel_dispatcher()
    try:
        out = module(*local)
        out.backward(shards[3])
    finally:
        _disable_context_parallel_dispatcher()
    got = _unshard(mesh, [out] + [t.grad for t in local], [2] * 4, True)
    for a, b in zip(got, [Attention()(q, k, v)] + [t.grad for t in ref_in]):
        torch.testing.assert_close(a, b, **F32_TOL)


def _presharded_case(mesh, rank):
    """context_parallel without buffers: the inputs are this rank's contiguous shards."""
    from torch.distributed.tensor.experimental._context_parallel import _cp_options

    torch.manual_seed(4)
    q, k, v = (torch.randn(B, N, S, D, device="npu") for _ in range(3))
    _cp_options.enable_load_balance = False
    with context_parallel(mesh):
        out = F.scaled_dot_product_attention(*(t.chunk(WORLD, dim=2)[rank] for t in (q, k, v)), is_causal=True)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True).chunk(WORLD, 2)[rank],
                               **F32_TOL)


def _bad_inputs(mesh):
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.experimental._context_parallel import (_cp_options,
                                                                         _disable_context_parallel_dispatcher,
                                                                         _enable_context_parallel_dispatcher)

    def t(*shape, **kw):
        return torch.randn(*shape, device="npu", **kw)

    def cp(**kw):
        with context_parallel(mesh, **kw):
            pass

    with pytest.raises(ValueError, match="buffer_seq_dims must give one sequence dimension per buffer: "
                                         "1 buffers, 2 buffer_seq_dims"):
        cp(buffers=[t(B, N, S, D)], buffer_seq_dims=[2, 2])
    with pytest.raises(ValueError, match=r"buffer_seq_dims\[0\]=4 is not a dimension of buffers\[0\]"):
        cp(buffers=[t(B, N, S, D)], buffer_seq_dims=[4])
    with pytest.raises(ValueError, match=r"buffers\[1\] requires grad"):
        cp(buffers=[t(B, N, S, D), t(B, N, S, D, requires_grad=True)], buffer_seq_dims=[2, 2])
    with pytest.raises(ValueError, match="sequence length 15 of the buffers must split evenly over the 2 ranks"):
        cp(buffers=[t(B, N, 15, D)], buffer_seq_dims=[2])
    with pytest.raises(ValueError, match="must have one sequence length, got \\[16, 8\\]"):
        cp(buffers=[t(B, N, S, D), t(B, N, 8, D)], buffer_seq_dims=[2, 2])
    with pytest.raises(ValueError, match=r"buffers\[0\] is on cpu, the mesh on npu"):
        cp(buffers=[torch.randn(B, N, S, D)], buffer_seq_dims=[2])
    with pytest.raises(ValueError, match="no_restore_buffers must be a subset of buffers"):
        cp(buffers=[t(B, N, S, D)], buffer_seq_dims=[2], no_restore_buffers={t(B, N, S, D)})
    with pytest.raises(TypeError, match=r"buffers\[0\] must be a Tensor, got list"):
        cp(buffers=[[1.0]], buffer_seq_dims=[0])

    _cp_options.enable_load_balance = False
    local = [t(B, N, S // WORLD, D) for _ in range(3)]
    with context_parallel(mesh):
        mask = torch.ones(B, N, S // WORLD, S, dtype=torch.bool, device="npu")
        with pytest.raises(NotImplementedError, match="scaled_dot_product_attention with context parallel: "
                                                      "attn_mask cannot be given"):
            F.scaled_dot_product_attention(*local, attn_mask=mask)
        with pytest.raises(ValueError, match="causal attention needs query and key of the same sequence "
                                             "length, got 16 and 8"):
            F.scaled_dot_product_attention(local[0], t(B, N, 4, D), t(B, N, 4, D), is_causal=True)
        with pytest.raises(TypeError, match="query must be float16, bfloat16 or float32"):
            F.scaled_dot_product_attention(*(x.double() for x in local))
    _cp_options.enable_load_balance = True
    with context_parallel(mesh):
        with pytest.raises(ValueError, match=r"head-tail balanced shards \(_cp_options.enable_load_balance\) hold "
                                             "two chunks of one length, got a local sequence of 3"):
            F.scaled_dot_product_attention(*(t(B, N, 3, D) for _ in range(3)), is_causal=True)
    assert torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default not in \
        DTensor._op_dispatcher._custom_op_handlers

    dq, dk, dv = (DTensor.from_local(x, mesh, [Shard(2)]) for x in local)
    mask = torch.ones(2048, 2048, dtype=torch.bool, device="npu").triu(1)
    _enable_context_parallel_dispatcher()
    try:
        with pytest.raises(NotImplementedError, match="npu_fusion_attention with context parallel: pse cannot "
                                                      "be given"):
            torch_npu.npu_fusion_attention(dq, dk, dv, N, "BNSD", pse=t(B, N, S, S))
        with pytest.raises(NotImplementedError, match="compressed causal mask of sparse_mode 2 or 3 only .*"
                                                      "got sparse_mode=0"):
            torch_npu.npu_fusion_attention(dq, dk, dv, N, "BNSD", atten_mask=mask)
        with pytest.raises(ValueError, match=r"query must be placed \(Shard\(2\),\) \(sharded along the sequence\), "
                                             r"got \(Replicate\(\),\)"):
            torch_npu.npu_fusion_attention(DTensor.from_local(t(B, N, S, D), mesh, [Replicate()]), dk, dv, N, "BNSD")
        with pytest.raises(ValueError, match=r"with sparse_mode 3 atten_mask must be the compressed causal mask "
                                             r"\[2048, 2048\], got \[16, 16\]"):
            torch_npu.npu_fusion_attention(dq, dk, dv, N, "BNSD", atten_mask=mask[:S, :S], sparse_mode=3)
        with pytest.raises(ValueError, match=r"head_num=4 is not the number of heads of query \[2, 2, 16, 8\]"):
            torch_npu.npu_fusion_attention(dq, dk, dv, 4, "BNSD")
        with pytest.raises(ValueError, match="input_layout must be one of BNSD, BSND, BSH, SBH .* got 'TND'"):
            torch_npu.npu_fusion_attention(dq, dk, dv, N, "TND")
        with pytest.raises(TypeError, match="npu_fusion_attention with context parallel: key must be a DTensor "
                                            r"sharded along the sequence \(Shard\(2\)\), got Tensor"):
            torch_npu.npu_fusion_attention(dq, local[1], dv, N, "BNSD")
        bsh = [DTensor.from_local(x.transpose(1, 2).reshape(B, S // WORLD, -1), mesh, [Shard(1)]) for x in local]
        with pytest.raises(ValueError, match="hidden size 16 of query must be a multiple of head_num=3"):
            torch_npu.npu_fusion_attention(*bsh, 3, "BSH")
    finally:
        _disable_context_parallel_dispatcher()


def _w_dropout_module_errors(rank, world, port):
    mesh = _init(rank, world, port)
    try:
        _dropout_case(mesh, causal=False, load_balance=False)
        _dropout_case(mesh, causal=True, load_balance=True)
        _module_plan_case(mesh)
        _presharded_case(mesh, rank)
        _bad_inputs(mesh)
    finally:
        dist.destroy_process_group()


def test_dropout_module_plan_presharded_inputs_and_bad_inputs():
    _spawn(_w_dropout_module_errors)
