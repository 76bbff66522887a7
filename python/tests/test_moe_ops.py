"""MoE routing operators (custom_ops/src/moe.cpp) against references written here."""
import pytest
import torch
import torch.nn.functional as F

import torch_npu


def ref_gating(x, finished, k):
    p = x.float().softmax(-1)
    y, idx = p.topk(k, dim=-1)
    if finished is not None:
        idx = torch.where(finished.unsqueeze(-1), torch.full_like(idx, x.shape[-1]), idx)
    rows = x.numel() // x.shape[-1]
    row_idx = torch.arange(rows * k).reshape(k, rows).t().reshape(list(x.shape[:-1]) + [k])
    return y.to(x.dtype), idx.int(), row_idx.int()


def ref_init_routing(x, row_idx, expert_idx, active_num):
    n, k = expert_idx.shape
    order = torch.sort(expert_idx.reshape(-1).long(), stable=True).indices
    expanded_expert_idx = expert_idx.reshape(-1)[order]
    sorted_row = row_idx.reshape(-1)[order].long()
    expanded_row_idx = torch.empty(n * k, dtype=torch.int32)
    expanded_row_idx[sorted_row] = torch.arange(n * k, dtype=torch.int32)
    active = min(active_num, n) * k
    return x[sorted_row[:active] % n], expanded_row_idx, expanded_expert_idx


@pytest.mark.parametrize("shape,k", [((7, 8), 2), ((2, 3, 16), 4), ((5, 4), 4), ((1, 1), 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gating_top_k_softmax(shape, k, dtype):
    x = torch.randn(shape).to(dtype)
    y, ei, ri = torch_npu.npu_moe_gating_top_k_softmax(x.npu(), None, k=k)
    ry, rei, rri = ref_gating(x, None, k)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(y.cpu(), ry, atol=tol, rtol=tol)
    assert ei.dtype == torch.int32 and ri.dtype == torch.int32
    torch.testing.assert_close(ri.cpu(), rri)
    # Experts may differ only where two probabilities tie within rounding.
    picked = x.float().softmax(-1).gather(-1, ei.cpu().long())
    torch.testing.assert_close(picked, ry.float(), atol=tol, rtol=tol)


def test_gating_finished_rows_get_no_expert():
    x = torch.randn(6, 5)
    finished = torch.tensor([False, True, False, False, True, False])
    y, ei, ri = torch_npu.npu_moe_gating_top_k_softmax(x.npu(), finished.npu(), k=2)
    ry, rei, _ = ref_gating(x, finished, 2)
    torch.testing.assert_close(y.cpu(), ry)
    assert torch.equal(ei.cpu(), rei)


@pytest.mark.parametrize("n,k,experts,active_num", [(10, 2, 8, 10), (9, 3, 4, 4), (5, 1, 3, 100), (6, 2, 2, 0)])
def test_init_routing_matches_reference(n, k, experts, active_num):
    x = torch.randn(n, 16)
    _, expert_idx, row_idx = ref_gating(torch.randn(n, experts), None, k)
    got = torch_npu.npu_moe_init_routing(x.npu(), row_idx.npu(), expert_idx.npu(), active_num)
    for g, r in zip(got, ref_init_routing(x, row_idx, expert_idx, active_num)):
        assert g.shape == r.shape and g.dtype == r.dtype
        torch.testing.assert_close(g.cpu(), r)


def test_gating_then_routing_pipeline():
    tokens, experts, k = 32, 8, 2
    logits = torch.randn(tokens, experts).npu()
    x = torch.randn(tokens, 64).npu()
    _, expert_idx, row_idx = torch_npu.npu_moe_gating_top_k_softmax(logits, k=k)
    expanded_x, expanded_row_idx, expanded_expert_idx = torch_npu.npu_moe_init_routing(x, row_idx, expert_idx, tokens)
    assert torch.all(expanded_expert_idx.cpu()[1:] >= expanded_expert_idx.cpu()[:-1])
    # Each token's k copies sit where expanded_row_idx says.
    back = expanded_x.cpu()[expanded_row_idx.cpu().long()].reshape(k, tokens, 64)
    for j in range(k):
        torch.testing.assert_close(back[j], x.cpu())


def ref_grouped(xs, ws, bs, act):
    outs = []
    for i, (x, w) in enumerate(zip(xs, ws)):
        y = x @ w + (bs[i] if bs else 0)
        outs.append({0: y, 1: F.relu(y), 2: F.gelu(y, approximate="tanh"), 4: y * torch.sigmoid(1.702 * y),
                     5: F.silu(y)}[act])
    return outs


@pytest.mark.parametrize("act", [0, 1, 2, 4, 5])
def test_grouped_matmul_one_x_per_group(act):
    xs = [torch.randn(3, 8), torch.randn(5, 8), torch.randn(2, 4, 6)]
    ws = [torch.randn(8, 4), torch.randn(8, 7), torch.randn(6, 2)]
    bs = [torch.randn(4), torch.randn(7), torch.randn(2)]
    out = torch_npu.npu_grouped_matmul([x.npu() for x in xs], [w.npu() for w in ws], bias=[b.npu() for b in bs],
                                       act_type=act, group_type=-1)
    for o, r in zip(out, ref_grouped(xs, ws, bs, act)):
        torch.testing.assert_close(o.cpu(), r, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("group_list_type", [0, 1])
@pytest.mark.parametrize("split_item", [0, 3])
def test_grouped_matmul_split_rows(group_list_type, split_item):
    sizes = [4, 0, 3, 5]
    x = torch.randn(sum(sizes), 8)
    w = torch.randn(len(sizes), 8, 6)  # one [g, K, N] tensor
    values = torch.tensor(sizes).cumsum(0) if group_list_type == 0 else torch.tensor(sizes)
    out = torch_npu.npu_grouped_matmul([x.npu()], [w.npu()], group_list=values.npu(), split_item=split_item,
                                       group_type=0, group_list_type=group_list_type)
    parts = ref_grouped(list(x.split(sizes)), list(w.unbind(0)), None, 0)
    if split_item >= 2:
        assert len(out) == 1
        torch.testing.assert_close(out[0].cpu(), torch.cat(parts), atol=1e-5, rtol=1e-5)
    else:
        assert [o.shape[0] for o in out] == sizes
        for o, r in zip(out, parts):
            torch.testing.assert_close(o.cpu(), r, atol=1e-5, rtol=1e-5)


def test_grouped_matmul_stacked_weight_and_bias():
    # one [g, K, N] weight and one [g, N] bias (torch_npu's "single-multi-single" form)
    sizes = [2, 3, 1]
    x, w, b = torch.randn(6, 8), torch.randn(3, 8, 5), torch.randn(3, 5)
    (out,) = torch_npu.npu_grouped_matmul([x.npu()], [w.npu()], bias=[b.npu()], group_list=torch.tensor(sizes).cumsum(0)
                                          .npu(), split_item=3, group_type=0)
    ref = torch.cat(ref_grouped(list(x.split(sizes)), list(w.unbind(0)), list(b.unbind(0)), 0))
    torch.testing.assert_close(out.cpu(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("split_item", [0, 3])
def test_grouped_matmul_k_split(split_item):
    # group_type 2: group i multiplies x's columns and weight's rows of its K range (MoE's weight
    # gradients: x^T of each expert's tokens times their output gradients)
    sizes = [3, 0, 5]
    x, w = torch.randn(4, 8), torch.randn(8, 6)
    out = torch_npu.npu_grouped_matmul([x.npu()], [w.npu()], group_list=torch.tensor(sizes).cumsum(0).npu(),
                                       split_item=split_item, group_type=2)
    parts = [xc @ wc for xc, wc in zip(x.split(sizes, 1), w.split(sizes, 0))]
    if split_item == 3:
        assert len(out) == 1 and out[0].shape == (3, 4, 6)
        torch.testing.assert_close(out[0].cpu(), torch.stack(parts), atol=1e-5, rtol=1e-5)
    else:
        for o, r in zip(out, parts):
            torch.testing.assert_close(o.cpu(), r, atol=1e-5, rtol=1e-5)


def test_grouped_matmul_int_list_overload_and_half():
    x = torch.randn(6, 8, dtype=torch.float16)
    ws = [torch.randn(8, 4, dtype=torch.float16) for _ in range(2)]
    out = torch.ops.npu.npu_grouped_matmul.List([x.npu()], [w.npu() for w in ws], group_list=[2, 6], split_item=2)
    ref = torch.cat([x[:2].float() @ ws[0].float(), x[2:].float() @ ws[1].float()])
    torch.testing.assert_close(out[0].cpu().float(), ref, atol=2e-2, rtol=2e-2)


def test_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, w = torch.randn(6, 8).npu(), torch.randn(2, 8, 4).npu()
    gl = torch.tensor([2, 6]).npu()
    with FakeTensorMode() as mode:
        fx, fw, fgl = mode.from_tensor(x), mode.from_tensor(w), mode.from_tensor(gl)
        (out,) = torch_npu.npu_grouped_matmul([fx], [fw], group_list=fgl, split_item=3, group_type=0)
        assert out.shape == (6, 4)
        y, ei, ri = torch_npu.npu_moe_gating_top_k_softmax(mode.from_tensor(torch.randn(3, 5).npu()), k=2)
        assert y.shape == ei.shape == ri.shape == (3, 2) and ei.dtype == torch.int32


@pytest.mark.parametrize("call,message", [
    (lambda: torch_npu.npu_moe_gating_top_k_softmax(torch.randn(3, 4).npu(), k=5), "k"),
    (lambda: torch_npu.npu_moe_gating_top_k_softmax(torch.randn(3, 4).npu(), torch.ones(2).bool().npu()),
     "finished"),
    (lambda: torch_npu.npu_moe_init_routing(torch.randn(3, 4).npu(), torch.zeros(3, 2).int().npu(),
                                            torch.zeros(4, 2).int().npu(), 3), "expert_idx"),
    (lambda: torch_npu.npu_grouped_matmul([torch.randn(4, 8).npu()], [torch.randn(2, 8, 3).npu()],
                                          group_list=[1, 3], split_item=2), "group_list covers"),
    (lambda: torch_npu.npu_grouped_matmul([torch.randn(4, 8).npu()], [torch.randn(7, 3).npu()], group_type=-1),
     "cannot be multiplied"),
    (lambda: torch_npu.npu_grouped_matmul([torch.randn(4, 8).npu()], [torch.randn(8, 3).npu()]),
     "Requires manual passing group_type"),
    (lambda: torch_npu.npu_grouped_matmul([torch.randn(4, 8).npu()], [torch.randn(8, 3).npu()], group_type=1),
     r"The group type must be -1, 0 or 2, but now is \[1\]"),
    (lambda: torch_npu.npu_grouped_matmul([torch.randn(4, 8).npu()], [torch.randn(8, 3).npu()],
                                          scale=[torch.ones(3).npu()], group_type=-1), "scale"),
    (lambda: torch_npu.npu_grouped_matmul([torch.randn(4, 8).npu()], [torch.randn(8, 3).npu()], act_type=3,
                                          group_type=-1),
     "act_type"),
])
def test_bad_arguments(call, message):
    with pytest.raises(RuntimeError, match=message):
        call()  # checked at the call, before anything is queued
