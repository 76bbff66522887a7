"""DTensor sharding of torch_npu's fused operators (norms, rotary, swiglu, fused attention,
grouped matmul add, conv2d, cross entropy, repeat_interleave) and random ops (torch_npu/distributed/tensor/_sharding.py):
results and gradients on a 2-rank mesh equal the single-device ones, in the placements the
strategies choose; the strategies are registered once torch.distributed.tensor is imported,
which `import torch_npu` does not do (it costs about 0.5 s)."""
import subprocess
import sys

import torch
import torch.distributed as dist

from conftest import init_hccl_rank, spawn_ranks


def _check(rank, world, port):
    import torch_npu
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor, init_device_mesh

    init_hccl_rank(rank, world, port)
    mesh = init_device_mesh("npu", (world,))
    torch.manual_seed(0)

    def dt(t, placement, grad=False):
        d = distribute_tensor(t.detach(), mesh, [placement])
        return d.requires_grad_() if grad else d

    # rms_norm: rows sharded, gamma whole; gamma's gradient sums the shards' partial ones
    x = torch.randn(4, 6, 8, device="npu", requires_grad=True)
    g = torch.rand(8, device="npu", requires_grad=True)
    dx, dg = dt(x, Shard(1), True), dt(g, Replicate(), True)
    y, rstd = torch_npu.npu_rms_norm(x, g)
    dy, drstd = torch_npu.npu_rms_norm(dx, dg)
    assert (dy.placements, drstd.placements) == ((Shard(1),), (Shard(1),))
    torch.testing.assert_close(dy.full_tensor(), y)
    torch.testing.assert_close(drstd.full_tensor(), rstd)
    y.sum().backward()
    dy.sum().backward()
    torch.testing.assert_close(dx.grad.full_tensor(), x.grad)
    torch.testing.assert_close(dg.grad.full_tensor(), g.grad)
    dgrad, dgamma = torch.ops.npu.npu_rms_norm_backward(dt(torch.ones_like(y), Shard(0)), dt(x, Shard(0)),
                                                         dt(g, Replicate()), dt(rstd, Shard(0)))
    assert (dgrad.placements, dgamma.placements) == ((Shard(0),), (Partial(),))
    torch.testing.assert_close(dgamma.full_tensor(), g.grad)

    # add_rms_norm: both addends sharded alike
    a, b = torch.randn(4, 6, 8, device="npu"), torch.randn(4, 6, 8, device="npu")
    got = torch_npu.npu_add_rms_norm(dt(a, Shard(0)), dt(b, Shard(0)), dt(g, Replicate()))
    for out, ref in zip(got, torch_npu.npu_add_rms_norm(a, b, g.detach())):
        assert out.placements == (Shard(0),)
        torch.testing.assert_close(out.full_tensor(), ref)

    # rotary_mul: q sharded along the sequence; the cos/sin tables follow (whole along heads)
    q = torch.randn(2, 4, 2, 8, device="npu", requires_grad=True)
    cos, sin = torch.randn(1, 4, 1, 8, device="npu"), torch.randn(1, 4, 1, 8, device="npu")
    dq = dt(q, Shard(1), True)
    out = torch_npu.npu_rotary_mul(q, cos, sin)
    dout = torch_npu.npu_rotary_mul(dq, dt(cos, Replicate()), dt(sin, Replicate()))
    assert dout.placements == (Shard(1),)
    torch.testing.assert_close(dout.full_tensor(), out)
    out.sum().backward()
    dout.sum().backward()
    torch.testing.assert_close(dq.grad.full_tensor(), q.grad)
    # heads sharded: the tables (size 1 there) stay whole, their gradients are partial sums
    _, dcos, _ = torch.ops.npu.npu_rotary_mul_backward(dt(torch.ones_like(q), Shard(2)), dt(q, Shard(2)),
                                                       dt(cos, Replicate()), dt(sin, Replicate()))
    _, ref_cos, _ = torch.ops.npu.npu_rotary_mul_backward(torch.ones_like(q), q.detach(), cos, sin)
    assert dcos.placements == (Partial(),)
    torch.testing.assert_close(dcos.full_tensor(), ref_cos)

    # swiglu: any dim but the one split into halves
    h = torch.randn(4, 6, 16, device="npu", requires_grad=True)
    dh = dt(h, Shard(0), True)
    out, dout = torch_npu.npu_swiglu(h), torch_npu.npu_swiglu(dh)
    assert dout.placements == (Shard(0),)
    torch.testing.assert_close(dout.full_tensor(), out)
    out.sum().backward()
    dout.sum().backward()
    torch.testing.assert_close(dh.grad.full_tensor(), h.grad)
    last = torch_npu.npu_swiglu(dt(h, Shard(2)))  # sharded along the halves' dim: gathered first
    torch.testing.assert_close(last.full_tensor(), torch_npu.npu_swiglu(h.detach()))
    assert last.placements != (Shard(2),)
    # fusion attention: the batch sharded (a mask shared by the batch stays whole), heads whole;
    # a mask per batch gathers the batch (the backward takes the mask as a keyword argument,
    # which DTensor does not redistribute)
    for layout, shape, mask_shape, placement in (("BNSD", (4, 2, 8, 16), (1, 1, 8, 8), Shard(0)),
                                                 ("BSH", (4, 8, 32), (8, 8), Shard(0)),
                                                 ("BNSD", (4, 2, 8, 16), (4, 1, 8, 8), Replicate())):
        q, k, v = (torch.randn(shape, device="npu", requires_grad=True) for _ in range(3))
        mask = torch.rand(mask_shape, device="npu") > 0.7
        ref = torch_npu.npu_fusion_attention(q, k, v, 2, layout, atten_mask=mask, scale=0.25)
        dq, dk, dv = (dt(t, Shard(0), True) for t in (q, k, v))
        got = torch_npu.npu_fusion_attention(dq, dk, dv, 2, layout, atten_mask=dt(mask, Replicate()), scale=0.25)
        assert got[0].placements == (placement,)
        torch.testing.assert_close(got[0].full_tensor(), ref[0])
        torch.testing.assert_close(got[1].full_tensor(), ref[1])
        ref[0].sum().backward()
        got[0].sum().backward()
        for d, t in ((dq, q), (dk, k), (dv, v)):
            torch.testing.assert_close(d.grad.full_tensor(), t.grad)
    # DTensor caches a sharding per call signature: dropout (a keyword argument) must not reuse
    # the batch sharding of the same shapes without it
    dq, dk, dv = (dt(t, Shard(0)) for t in (q, k, v))
    for keep_prob, placement in ((1.0, Shard(0)), (0.5, Replicate())):
        got = torch_npu.npu_fusion_attention(dq, dk, dv, 2, "BNSD", scale=0.25, keep_prob=keep_prob)
        assert got[0].placements == (placement,), (keep_prob, got[0].placements)
    # grouped matmul add: y and weight sharded along N (x, split by the groups along M, gathered)
    x, w = torch.randn(8, 8, device="npu").half(), torch.randn(8, 4, device="npu").half()
    y, ends = torch.randn(32, 4, device="npu"), torch.tensor([2, 4, 6, 8], device="npu")
    dy = dt(y, Shard(1))
    torch_npu.npu_grouped_matmul_add_(dy, dt(x, Shard(1)), dt(w, Shard(1)), dt(ends, Replicate()))
    torch_npu.npu_grouped_matmul_add_(y, x, w, ends)
    assert dy.placements == (Shard(1),)
    torch.testing.assert_close(dy.full_tensor(), y)

    # conv2d: over the batch, the output channels (weight and bias sharded) or the input channels
    # (a partial sum; the replicated bias added once). A sharded weight once gave a wrong shape.
    x = torch.randn(4, 4, 10, 10, device="npu", requires_grad=True)
    w = torch.randn(6, 4, 3, 3, device="npu", requires_grad=True)
    b = torch.randn(6, device="npu", requires_grad=True)
    conv = (1, 1), (1, 1), (1, 1), 1
    ref = torch_npu.npu_conv2d(x, w, b, *conv)
    ref.sum().backward()
    for xp, wp, bp, expect in ((Shard(0), Replicate(), Replicate(), Shard(0)),
                               (Replicate(), Shard(0), Shard(0), Shard(1)),
                               (Shard(1), Shard(1), Replicate(), Partial())):
        dx, dw, db = dt(x, xp, True), dt(w, wp, True), dt(b, bp, True)
        out = torch_npu.npu_conv2d(dx, dw, db, *conv)
        assert out.placements == (expect,), (xp, out.placements)
        torch.testing.assert_close(out.full_tensor(), ref)
        out.sum().backward()
        for d, t in ((dx, x), (dw, w), (db, b)):
            torch.testing.assert_close(d.grad.full_tensor(), t.grad)
    no_bias = torch_npu.npu_conv2d(dt(x, Replicate()), dt(w, Shard(0)), None, *conv)
    torch.testing.assert_close(no_bias.full_tensor(), torch_npu.npu_conv2d(x.detach(), w.detach(), None, *conv))
    grads = torch_npu.npu_conv2d_backward(dt(x, Shard(1)), dt(torch.ones_like(ref), Replicate()), dt(w, Shard(1)),
                                          *conv[:3], 1, [True, True, True])
    for got, want in zip(grads, (x.grad, w.grad, b.grad)):
        torch.testing.assert_close(got.full_tensor(), want)

    # repeat_interleave with an int count: shards stay where the repeat does not cross them
    # (an uneven shard of the repeated dim gathers first); the gradient sums each element's copies
    for shape, placement, dim, expect in (((8, 5), Shard(1), 1, Replicate()), ((8, 8), Shard(1), 1, Shard(1)),
                                          ((5, 5), Shard(0), 1, Shard(0)), ((8, 5), Shard(0), None, Shard(0)),
                                          ((5, 4), Shard(0), None, Replicate())):
        t = torch.randn(shape, device="npu", requires_grad=True)
        d = dt(t, placement, True)
        out, dout = torch.repeat_interleave(t, 3, dim), torch.repeat_interleave(d, 3, dim)
        assert dout.placements == (expect,), (shape, placement, dim, dout.placements)
        torch.testing.assert_close(dout.full_tensor(), out)
        g = torch.randn(out.shape, device="npu")
        out.backward(g)
        dout.backward(dt(g, dout.placements[0]))
        torch.testing.assert_close(d.grad.full_tensor(), t.grad)

    # cross entropy: rows sharded for "none" and "sum" (z-loss too); "mean" over uneven rows or
    # ignored targets cannot average the ranks' means, so it gathers
    target = torch.tensor([0, 3, -100, 2, 2, 1, 4], device="npu")
    for reduction, zloss, expect in (("none", True, Shard(0)), ("sum", True, Partial()), ("mean", False, Replicate())):
        logits = torch.randn(7, 5, device="npu", requires_grad=True)
        dlogits = dt(logits, Shard(0), True)
        ref = torch_npu.npu_cross_entropy_loss(logits, target, None, reduction, -100, 0.1, 0.5, zloss)
        got = torch_npu.npu_cross_entropy_loss(dlogits, dt(target, Shard(0)), None, reduction, -100, 0.1, 0.5, zloss)
        assert got[0].placements == (expect,), (reduction, got[0].placements)
        for g, r in zip(got[:3 if zloss else 2], ref):
            torch.testing.assert_close(g.full_tensor(), r)
        (ref[0].sum() + (ref[2].sum() if zloss else 0)).backward()
        (got[0].sum() + (got[2].sum() if zloss else 0)).backward()
        torch.testing.assert_close(dlogits.grad.full_tensor(), logits.grad)

    # random ops on DTensors (nn.init, dropout): the npu generator's state is torch_npu's 16 bytes
    # (seed, offset), so DTensor's offset-based RNG tracker gives each shard its own numbers
    # (it failed on the 5 KB state of a CPU engine before)
    torch.npu.manual_seed(0)
    w = distribute_tensor(torch.empty(8, 4, device="npu"), mesh, [Shard(0)])
    torch.nn.init.trunc_normal_(w, std=0.02)
    full = w.full_tensor()
    assert not torch.equal(full[:4], full[4:]) and full.abs().max() <= 0.04
    r = distribute_tensor(torch.empty(6, device="npu"), mesh, [Replicate()])
    torch.nn.init.uniform_(r)
    both = [torch.empty(6, device="npu") for _ in range(world)]
    dist.all_gather(both, r.to_local())
    assert torch.equal(both[0], both[1])  # replicated: the same numbers on every rank
    dist.destroy_process_group()


def test_fused_ops_on_dtensors_match_one_device():
    spawn_ranks(_check, 2)


def test_registered_when_dtensor_is_imported_not_before():
    code = ("import sys, torch, torch_npu\n"
            "assert 'torch.distributed.tensor' not in sys.modules\n"
            "from torch.distributed.tensor import DTensor\n"
            "funcs = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs\n"
            "assert torch.ops.npu.npu_rms_norm.default in funcs, 'not registered'\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]
