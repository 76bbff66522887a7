"""npu_ring_attention_update and npu_nsa_select_attention (python/torch_npu/_attention_ops.py)
against straightforward float32 references written here from the documented formulas."""
import math

import pytest
import torch

import torch_npu

_TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=1e-3, atol=1e-3),
        torch.bfloat16: dict(rtol=1e-2, atol=1e-2)}


def _close(actual, expected, dtype=torch.float32):
    torch.testing.assert_close(actual.cpu(), expected, **_TOL[dtype])


# ---- npu_ring_attention_update ------------------------------------------------------------

def _merge(pm, ps, cm, cs):
    """One (token, head)'s merged statistics and the weights of the two outputs, from the formula."""
    m = max(pm, cm)
    s = ps * math.exp(pm - m) + cs * math.exp(cm - m)
    return m, s, math.exp(pm - m) * ps / s, math.exp(cm - m) * cs / s


def _stats(*shape):
    # positive statistics, the value repeated over a last dimension of 8
    return [(torch.rand(*shape) + 0.2).unsqueeze(-1).repeat_interleave(8, -1) for _ in range(4)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_ring_attention_update_sbh(dtype):
    s, b, n, d = 3, 2, 2, 4
    prev, cur = torch.randn(s, b, n * d).to(dtype), torch.randn(s, b, n * d).to(dtype)
    pm, ps, cm, cs = _stats(b, n, s)
    attn, smax, ssum = torch_npu.npu_ring_attention_update(prev.npu(), pm.npu(), ps.npu(), cur.npu(), cm.npu(),
                                                           cs.npu())
    expected = torch.empty(s, b, n * d)
    emax, esum = torch.empty(b, n, s, 8), torch.empty(b, n, s, 8)
    for si in range(s):
        for bi in range(b):
            for ni in range(n):
                m, sm, wp, wc = _merge(pm[bi, ni, si, 0].item(), ps[bi, ni, si, 0].item(),
                                       cm[bi, ni, si, 0].item(), cs[bi, ni, si, 0].item())
                emax[bi, ni, si], esum[bi, ni, si] = m, sm
                cols = slice(ni * d, (ni + 1) * d)
                expected[si, bi, cols] = prev[si, bi, cols].float() * wp + cur[si, bi, cols].float() * wc
    assert attn.dtype == dtype and smax.dtype == ssum.dtype == torch.float32
    _close(attn, expected.to(dtype), dtype)
    _close(smax, emax)
    _close(ssum, esum)


def _merged_per_token(prev, cur, pm, ps, cm, cs):
    """The TND reference, token by token and head by head: the merged attention (float32) and the
    merged softmax max and sum ([T, N, 8]), from statistics in (token, head) order."""
    t, n, d = prev.shape
    expected = torch.empty(t, n, d)
    emax, esum = torch.empty(t, n, 8), torch.empty(t, n, 8)
    for ti in range(t):
        for ni in range(n):
            m, sm, wp, wc = _merge(pm[ti, ni, 0].item(), ps[ti, ni, 0].item(), cm[ti, ni, 0].item(),
                                   cs[ti, ni, 0].item())
            emax[ti, ni], esum[ti, ni] = m, sm
            expected[ti, ni] = prev[ti, ni].float() * wp + cur[ti, ni].float() * wc
    return expected, emax, esum

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_ring_attention_update_tnd_softmax_tnd(dtype):
    t, n, d = 5, 2, 64
    prev, cur = torch.randn(t, n, d).to(dtype), torch.randn(t, n, d).to(dtype)
    pm, ps, cm, cs = _stats(t, n)
    attn, smax, ssum = torch_npu.npu_ring_attention_update(
        prev.npu(), pm.npu(), ps.npu(), cur.npu(), cm.npu(), cs.npu(),
        actual_seq_qlen=torch.tensor([0, 2, 5]).npu(), input_layout="TND", input_softmax_layout="TND")
    expected, emax, esum = _merged_per_token(prev, cur, pm, ps, cm, cs)
    _close(attn, expected.to(dtype), dtype)
    _close(smax, emax)
    _close(ssum, esum)


def _pack_bns(x, cu):
    """[T, N, 8] statistics -> the batch-major layout: batch b's [N, S_b, 8] blocks one after another."""
    blocks = [x[a:b].transpose(0, 1).reshape(-1, 8) for a, b in zip([0] + cu[:-1], cu)]
    return torch.cat(blocks).reshape(x.shape)


@pytest.mark.parametrize("softmax_layout", ["", "SBH"])
def test_ring_attention_update_tnd_batch_major_softmax(softmax_layout):
    t, n, d, cu = 7, 3, 64, [3, 3, 7]  # batches of 3, 0 and 4 tokens
    prev, cur = torch.randn(t, n, d), torch.randn(t, n, d)
    pm, ps, cm, cs = _stats(t, n)  # in (token, head) order
    expected, emax, esum = _merged_per_token(prev, cur, pm, ps, cm, cs)
    packed = [_pack_bns(x, cu).npu() for x in (pm, ps, cm, cs)]
    for seqlen in (cu, [0] + cu):  # the leading 0 is optional
        attn, smax, ssum = torch_npu.npu_ring_attention_update(
            prev.npu(), packed[0], packed[1], cur.npu(), packed[2], packed[3],
            actual_seq_qlen=torch.tensor(seqlen).npu(), input_layout="TND", input_softmax_layout=softmax_layout)
        _close(attn, expected)
        # the statistics come back in the layout they came in
        _close(smax, _pack_bns(emax, cu))
        _close(ssum, _pack_bns(esum, cu))


def test_ring_attention_update_meta_and_autograd():
    t, n, d = 4, 2, 64
    args = [torch.empty(t, n, d, device="meta")] + [torch.empty(t, n, 8, device="meta")] * 2
    out = torch.ops.npu.npu_ring_attention_update(*args, *args, actual_seq_qlen=torch.empty(2, dtype=torch.int64,
                                                                                             device="meta"),
                                                  input_layout="TND")
    assert [tuple(o.shape) for o in out] == [(t, n, d), (t, n, 8), (t, n, 8)]
    # weights: prev gets 1 when its max dominates by far
    prev = torch.randn(2, 1, 4, requires_grad=True)
    stats = torch.ones(1, 2, 2, 8)
    attn, _, _ = torch_npu.npu_ring_attention_update(prev.npu(), stats.npu() * 50, stats.npu(),
                                                     torch.randn(2, 1, 4).npu(), stats.npu(), stats.npu())
    attn.sum().backward()
    _close(prev.grad, torch.ones(2, 1, 4))


def test_ring_attention_update_bad_inputs():
    a, s4 = torch.randn(2, 1, 8).npu(), torch.ones(1, 2, 2, 8).npu()
    tnd, s3 = torch.randn(3, 2, 64).npu(), torch.ones(3, 2, 8).npu()
    seq = torch.tensor([3]).npu()
    f = torch_npu.npu_ring_attention_update
    with pytest.raises(RuntimeError, match="input_layout only supports 'SBH' or 'TND', but got BSH"):
        f(a, s4, s4, a, s4, s4, input_layout="BSH")
    with pytest.raises(RuntimeError, match="input_softmax_layout only supports"):
        f(tnd, s3, s3, tnd, s3, s3, actual_seq_qlen=seq, input_layout="TND", input_softmax_layout="BNSD")
    with pytest.raises(RuntimeError, match="prev_attn_out and cur_attn_out must have the same shape"):
        f(a, s4, s4, a[:1], s4, s4)
    with pytest.raises(RuntimeError, match="prev_attn_out and cur_attn_out must have the same dtype"):
        f(a, s4, s4, a.half(), s4, s4)
    with pytest.raises(RuntimeError, match="attn_out dtype only supports float16, float32 or bfloat16"):
        f(a.double(), s4, s4, a.double(), s4, s4)
    with pytest.raises(RuntimeError, match="softmax tensors must keep the same shape"):
        f(a, s4, s4, a, s4[:, :1], s4)
    with pytest.raises(RuntimeError, match="softmax tensors must use float32"):
        f(a, s4, s4.half(), a, s4, s4)
    with pytest.raises(RuntimeError, match="softmax tensors require the last dimension to be 8"):
        s = torch.ones(1, 2, 2, 4).npu()
        f(a, s, s, a, s, s)
    with pytest.raises(RuntimeError, match="prev_attn_out must be a 3D tensor, but got 2D"):
        f(a[0], s4, s4, a[0], s4, s4)
    with pytest.raises(RuntimeError, match="softmax tensors must be 4D when input_layout is 'SBH'"):
        f(a, s4[0], s4[0], a, s4[0], s4[0])
    with pytest.raises(RuntimeError, match="actual_seq_qlen is required when input_layout is 'TND'"):
        f(tnd, s3, s3, tnd, s3, s3, input_layout="TND")
    with pytest.raises(RuntimeError, match="softmax tensors must be 3D when input_layout is 'TND'"):
        f(tnd, s4, s4, tnd, s4, s4, actual_seq_qlen=seq, input_layout="TND")
    with pytest.raises(RuntimeError, match="actual_seq_qlen must use int64 dtype"):
        f(tnd, s3, s3, tnd, s3, s3, actual_seq_qlen=seq.int(), input_layout="TND")
    with pytest.raises(RuntimeError, match=r"softmax tensors must be \[B, N, S, 8\]"):
        s = torch.ones(2, 2, 2, 8).npu()
        f(a, s, s, a, s, s)
    with pytest.raises(RuntimeError, match="H=8 of attn_out must be a multiple of the head number N=3"):
        s = torch.ones(1, 3, 2, 8).npu()
        f(a, s, s, a, s, s)
    with pytest.raises(RuntimeError, match="head dim D of attn_out must be a multiple of 64"):
        x = torch.randn(3, 2, 32).npu()
        f(x, s3, s3, x, s3, s3, actual_seq_qlen=seq, input_layout="TND")
    with pytest.raises(RuntimeError, match=r"softmax tensors must be \[T, N, 8\]"):
        s = torch.ones(3, 1, 8).npu()
        f(tnd, s, s, tnd, s, s, actual_seq_qlen=seq, input_layout="TND")
    with pytest.raises(RuntimeError, match="actual_seq_qlen must be the non-decreasing cumulative sequence lengths "
                                           "ending at T=3"):
        f(tnd, s3, s3, tnd, s3, s3, actual_seq_qlen=torch.tensor([2, 4]).npu(), input_layout="TND")


# ---- npu_nsa_select_attention -------------------------------------------------------------

def _nsa_reference(q, k, v, topk, scale, bs, qlen, kvlen, causal=False):
    """Token by token and head by head: gather the selected blocks, softmax in float32, the
    probabilities rounded to the input dtype, then the weighted sum of the values."""
    t1, n1, _ = q.shape
    n2, dv = k.size(1), v.size(2)
    g = n1 // n2
    out = torch.zeros(t1, n1, dv)
    smax, ssum = torch.zeros(t1, n1, 8), torch.zeros(t1, n1, 8)
    for b, (qs, qe) in enumerate(zip([0] + qlen[:-1], qlen)):
        kv_start = ([0] + kvlen)[b]
        for t in range(qs, qe):
            for h in range(n1):
                kh = h // g
                positions = [int(i) * bs + j for i in topk[t, kh] for j in range(bs)]
                keys = torch.stack([k[kv_start + p, kh].float() for p in positions])
                vals = torch.stack([v[kv_start + p, kh].float() for p in positions])
                scores = keys @ q[t, h].float() * scale
                if causal:
                    hidden = torch.tensor([p > t - qs for p in positions])
                    scores = scores.masked_fill(hidden, torch.finfo(torch.float32).min)
                m = scores.max()
                e = torch.exp(scores - m)
                p = (e / e.sum()).to(q.dtype).float()
                out[t, h] = p @ vals
                smax[t, h], ssum[t, h] = m, e.sum()
    return out.to(q.dtype), smax, ssum


def _nsa_inputs(dtype, qlen=(3, 5), kvlen=(48, 80), n1=4, n2=2, d=32, dv=16, bs=16, count=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(qlen[-1], n1, d, generator=gen).to(dtype)
    k = torch.randn(kvlen[-1], n2, d, generator=gen).to(dtype)
    v = torch.randn(kvlen[-1], n2, dv, generator=gen).to(dtype)
    topk = torch.empty(qlen[-1], n2, count, dtype=torch.int32)
    for b, (qs, qe) in enumerate(zip((0,) + qlen[:-1], qlen)):
        blocks = (kvlen[b] - ((0,) + kvlen)[b]) // bs
        for t in range(qs, qe):
            for h in range(n2):
                topk[t, h] = torch.randperm(blocks, generator=gen)[:count].int()
    return q, k, v, topk


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_nsa_select_attention(dtype):
    q, k, v, topk = _nsa_inputs(dtype)
    topk[1, 0] = torch.tensor([2, 2], dtype=torch.int32)  # a block selected twice counts twice
    scale = 0.25
    out, smax, ssum = torch_npu.npu_nsa_select_attention(q.npu(), k.npu(), v.npu(), topk.npu(), scale, 4, 16, 2,
                                                         actual_seq_qlen=[3, 5], actual_seq_kvlen=[48, 80])
    eout, emax, esum = _nsa_reference(q, k, v, topk, scale, 16, [3, 5], [48, 80])
    assert out.dtype == dtype and out.shape == (5, 4, 16)
    assert smax.dtype == ssum.dtype == torch.float32 and smax.shape == ssum.shape == (5, 4, 8)
    _close(out, eout, dtype)
    _close(smax, emax)
    _close(ssum, esum)


def test_nsa_select_attention_causal_mask():
    q, k, v, topk = _nsa_inputs(torch.float16, seed=1)
    topk[0] = torch.tensor([1, 2], dtype=torch.int32)  # every selected key after query 0: a fully hidden row
    topk[4] = torch.tensor([0, 1], dtype=torch.int32)  # batch 1, position 1: block 0 partly visible
    mask = torch.ones(2048, 2048, dtype=torch.bool).triu(1).npu()
    out, smax, ssum = torch_npu.npu_nsa_select_attention(q.npu(), k.npu(), v.npu(), topk.npu(), 0.5, 4, 16, 2,
                                                         atten_mask=mask, actual_seq_qlen=[3, 5],
                                                         actual_seq_kvlen=[48, 80])
    eout, emax, esum = _nsa_reference(q, k, v, topk, 0.5, 16, [3, 5], [48, 80], causal=True)
    _close(out, eout, torch.float16)
    _close(smax, emax)
    _close(ssum, esum)
    # query 1 of batch 1 sees keys 0 and 1 of its batch only
    assert torch.equal(ssum[4].cpu() <= 2.0, torch.ones(4, 8, dtype=torch.bool))


def test_nsa_select_attention_backward():
    q, k, v, topk = _nsa_inputs(torch.float16, qlen=(2, 3), kvlen=(32, 64), seed=2)
    leaves = [x.npu().requires_grad_() for x in (q, k, v)]
    out, _, _ = torch_npu.npu_nsa_select_attention(*leaves, topk.npu(), 0.3, 4, 16, 2,
                                                   actual_seq_qlen=[2, 3], actual_seq_kvlen=[32, 64])
    grad = torch.randn(out.shape).half()
    out.backward(grad.npu())
    # float32 reference: dP = dO V^T, dS = P * (dP - rowsum(dO * O)), dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO
    dq, dk, dv = torch.zeros(q.shape), torch.zeros(k.shape), torch.zeros(v.shape)
    for b, (qs, qe) in enumerate([(0, 2), (2, 3)]):
        kv_start = [0, 32][b]
        for t in range(qs, qe):
            for h in range(4):
                kh = h // 2
                rows = [kv_start + int(i) * 16 + j for i in topk[t, kh] for j in range(16)]
                keys, vals = k[rows, kh].float(), v[rows, kh].float()
                p = torch.softmax(keys @ q[t, h].float() * 0.3, -1)
                o = p @ vals
                dp = vals @ grad[t, h].float()
                ds = p * (dp - (grad[t, h].float() * o).sum())
                dq[t, h] = 0.3 * ds @ keys
                dk[rows, kh] += 0.3 * ds[:, None] * q[t, h].float()
                dv[rows, kh] += p[:, None] * grad[t, h].float()
    for leaf, expected in zip(leaves, (dq, dk, dv)):
        torch.testing.assert_close(leaf.grad.cpu().float(), expected, rtol=2e-2, atol=2e-2)


def test_nsa_select_attention_bad_inputs():
    q, k, v, topk = (x.npu() for x in _nsa_inputs(torch.float16))
    kw = dict(actual_seq_qlen=[3, 5], actual_seq_kvlen=[48, 80])
    f = torch_npu.npu_nsa_select_attention
    with pytest.raises(RuntimeError, match="query must be float16 or bfloat16"):
        f(q.float(), k.float(), v.float(), topk, 1.0, 4, 16, 2, **kw)
    with pytest.raises(RuntimeError, match="query, key and value must have the same dtype"):
        f(q, k.bfloat16(), v, topk, 1.0, 4, 16, 2, **kw)
    with pytest.raises(RuntimeError, match="query must be 3-D in the TND layout"):
        f(q[None], k, v, topk, 1.0, 4, 16, 2, **kw)
    with pytest.raises(RuntimeError, match=r"head_num \(3\) must be the N axis of query \(4\)"):
        f(q, k, v, topk, 1.0, 3, 16, 2, **kw)
    with pytest.raises(RuntimeError, match="query and key must have the same head dim"):
        f(q[..., :16], k, v, topk, 1.0, 4, 16, 2, **kw)
    with pytest.raises(RuntimeError, match=r"head dim of key \(32\) must be at least that of value \(48\)"):
        f(q, k, torch.cat([v, v, v], -1), topk, 1.0, 4, 16, 2, **kw)
    with pytest.raises(RuntimeError, match="head number of query .3. must be 1 to 32 times"):
        f(q[:, :3], k, v, topk, 1.0, 3, 16, 2, **kw)
    with pytest.raises(RuntimeError, match="select_block_size must be a multiple of 16"):
        f(q, k, v, topk, 1.0, 4, 24, 2, **kw)
    with pytest.raises(RuntimeError, match=r"select_block_count must be in \[1, 32\]"):
        f(q, k, v, topk.repeat(1, 1, 17), 1.0, 4, 16, 34, **kw)
    with pytest.raises(RuntimeError, match="topk_indices must be int32"):
        f(q, k, v, topk.long(), 1.0, 4, 16, 2, **kw)
    with pytest.raises(RuntimeError, match=r"topk_indices must be \[T1, N2, select_block_count\]"):
        f(q, k, v, topk[..., :1], 1.0, 4, 16, 2, **kw)
    with pytest.raises(RuntimeError, match="atten_mask must be a 2-D bool or uint8 tensor"):
        f(q, k, v, topk, 1.0, 4, 16, 2, atten_mask=torch.zeros(4, 4).npu(), **kw)
    with pytest.raises(RuntimeError, match="actual_seq_qlen is required"):
        f(q, k, v, topk, 1.0, 4, 16, 2, actual_seq_kvlen=[48, 80])
    with pytest.raises(RuntimeError, match="actual_seq_qlen must be non-decreasing cumulative token "
                                           "counts of at most 5"):
        f(q, k, v, topk, 1.0, 4, 16, 2, actual_seq_qlen=[3, 6], actual_seq_kvlen=[48, 80])
    with pytest.raises(RuntimeError, match="must have one entry per batch each, got 1 and 2"):
        f(q, k, v, topk, 1.0, 4, 16, 2, actual_seq_qlen=[5], actual_seq_kvlen=[48, 80])
    with pytest.raises(RuntimeError, match=r"key/value length of batch 1 \(24\) must be a multiple"):
        f(q, k, v, topk, 1.0, 4, 16, 2, actual_seq_qlen=[3, 5], actual_seq_kvlen=[48, 72])
    bad = topk.clone()
    bad[4, 1, 0] = 2  # batch 1 has 32 keys: blocks 0 and 1
    with pytest.raises(RuntimeError, match=r"topk_indices of batch 1 must be block indices in \[0, 2\)"):
        f(q, k, v, bad, 1.0, 4, 16, 2, **kw)
