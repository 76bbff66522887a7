"""op-plugin operators with Python kernels: torch_npu.batch_norm_reduce, dropout_with_byte_mask,
npu_fused_cross_entropy_loss_with_max_sum, npu_bert_apply_adam (torch.ops.npu) and the ATB
operators (torch.ops.atb: torch_npu._npu_paged_attention, ...), against references computed
here on the CPU."""
import math

import pytest
import torch
import torch.nn.functional as F

import torch_npu


def _close(npu_result, expected, **tol):
    torch.testing.assert_close(npu_result.cpu(), expected, **tol)


# ---- torch.ops.npu --------------------------------------------------------------------------

def test_batch_norm_reduce_sums_per_channel():
    x = torch.randn(2, 3, 4, 5)
    s, sq = torch_npu.batch_norm_reduce(x.half().npu(), 1e-5)
    assert s.dtype == sq.dtype == torch.float32 and s.shape == (3,)
    xh = x.half().double()
    _close(s, torch.stack([xh[:, c].sum() for c in range(3)]).float(), rtol=1e-5, atol=1e-4)
    _close(sq, torch.stack([(xh[:, c] ** 2).sum() for c in range(3)]).float(), rtol=1e-5, atol=1e-4)
    with pytest.raises(RuntimeError, match="more than 1 dimension"):
        torch_npu.batch_norm_reduce(torch.ones(3).npu(), 1e-5)


def test_dropout_with_byte_mask_keeps_and_scales():
    torch.manual_seed(0)
    x = torch.ones(200, 50).npu()
    out, mask = torch.ops.npu._dropout_with_byte_mask(x, 0.25)
    assert mask.dtype == torch.uint8 and mask.shape == x.shape
    assert set(mask.unique().tolist()) == {0, 1}
    assert 0.7 < mask.float().mean().item() < 0.8
    _close(out, mask.cpu().float() / 0.75)
    grad = torch.ops.npu._dropout_with_byte_mask_backward(torch.full_like(x, 2.0), mask, 0.25)
    _close(grad, mask.cpu().float() * 2 / 0.75)
    y = torch_npu.dropout_with_byte_mask(x, 0.25, True)
    assert ((y == 0) | (y == 1 / 0.75)).all()
    assert torch_npu.dropout_with_byte_mask(x, 0.25, False) is x
    _close(torch_npu.dropout_with_byte_mask(x, 1.0, True), torch.zeros(200, 50))
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        torch_npu.dropout_with_byte_mask(x, 1.5, True)
    with pytest.raises(RuntimeError, match="must be an npu tensor"):
        torch_npu.dropout_with_byte_mask(torch.ones(3), 0.5, True)
    # autograd: the gradient is masked and scaled like the output
    xg = torch.randn(8, 8).npu().requires_grad_()
    yg = torch_npu.contrib.function.dropout_with_byte_mask(xg, 0.5)
    yg.sum().backward()
    _close(xg.grad, (yg.detach() != 0).cpu().float() * 2)


def test_fused_cross_entropy_loss_with_max_sum_matches_cross_entropy():
    logits = torch.randn(6, 10)
    target = torch.randint(0, 10, (6,))
    logits_max = logits.max(-1).values
    sum_exp = (logits - logits_max[:, None]).exp().sum(-1)
    predicted = logits.gather(1, target[:, None]).squeeze(1) - logits_max
    loss, softmax = torch_npu.npu_fused_cross_entropy_loss_with_max_sum(
        logits_max.npu(), sum_exp.npu(), predicted.npu(), vocab_parallel_logits=logits.half().npu())
    _close(loss, F.cross_entropy(logits, target, reduction="none"), rtol=1e-5, atol=1e-5)
    assert softmax.dtype == torch.float32
    _close(softmax, torch.softmax(logits.half().float(), -1), rtol=2e-3, atol=2e-3)
    loss, softmax = torch_npu.npu_fused_cross_entropy_loss_with_max_sum(logits_max.npu(), sum_exp.npu(),
                                                                          predicted.npu())
    assert softmax is None
    with pytest.raises(RuntimeError, match="label_smoothing"):
        torch_npu.npu_fused_cross_entropy_loss_with_max_sum(logits_max.npu(), sum_exp.npu(), predicted.npu(),
                                                            label_smoothing=0.1)


def _bert_adam_reference(var, m, v, grad, lr, b1, b2, eps, max_norm, global_norm, wd, step_size, mode):
    var, m, v, g = var.double(), m.double(), v.double(), grad.double()
    if mode == 0 and max_norm > 0 and global_norm > 1:
        g = g / global_norm
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    u = m / (v.sqrt() + eps)
    if mode == 0:
        var = var - lr * (u + (wd * var if wd > 0 else 0))
    else:
        var = var - (u * step_size + (wd * lr * var if wd > 0 else 0))
    return var.float(), m.float(), v.float()


@pytest.mark.parametrize("mode,max_norm,global_norm,wd,step_size",
                         [(0, 1.0, 4.0, 0.01, None), (0, -1.0, 4.0, 0.0, None), (1, 1.0, 4.0, 0.01, 0.5)])
def test_bert_apply_adam_updates_state_in_place(mode, max_norm, global_norm, wd, step_size):
    var, m, v, grad = torch.randn(64), torch.randn(64) * 0.1, torch.rand(64) * 0.1, torch.randn(64)
    expected = _bert_adam_reference(var, m, v, grad, 1e-2, 0.9, 0.99, 1e-6, max_norm, global_norm, wd,
                                    step_size, mode)
    state = (var.npu(), m.npu(), v.npu())
    out = torch_npu.npu_bert_apply_adam(1e-2, 0.9, 0.99, 1e-6, grad.npu(), max_norm, global_norm, wd,
                                        step_size, mode, out=state)
    for o, s, e in zip(out, state, expected):
        assert o is s
        _close(s, e, rtol=1e-5, atol=1e-6)


def test_bert_apply_adam_needs_out():
    with pytest.raises(RuntimeError, match="out=\\(var, m, v\\)"):
        torch_npu.npu_bert_apply_adam(0.1, 0.9, 0.99, 1e-6, torch.ones(3).npu(), -1., 0., 0.)
    with pytest.raises(RuntimeError, match="needs step_size"):
        state = tuple(torch.zeros(3).npu() for _ in range(3))
        torch_npu.npu_bert_apply_adam(0.1, 0.9, 0.99, 1e-6, torch.ones(3).npu(), -1., 0., 0., adam_mode=1, out=state)


def test_bert_apply_adam_is_the_operator_with_a_tensor_list_out():
    # torch_npu registers the state as one Tensor[] out: torch.ops.npu's packet takes out=(var, m, v)
    assert torch_npu.npu_bert_apply_adam is torch.ops.npu.npu_bert_apply_adam
    out_arg = torch.ops.npu.npu_bert_apply_adam.out._schema.arguments[-1]
    assert out_arg.name == "out" and out_arg.kwarg_only and str(out_arg.type) == "List[Tensor]"
    with pytest.raises(RuntimeError, match="out must hold the state"):
        torch_npu.npu_bert_apply_adam(0.1, 0.9, 0.99, 1e-6, torch.ones(3).npu(), -1., 0., 0.,
                                      out=(torch.zeros(3).npu(), torch.zeros(3).npu()))


def test_bert_apply_adam_out_under_torch_jit_script():
    def step(grad, var, m, v):
        return torch_npu.npu_bert_apply_adam(1e-2, 0.9, 0.99, 1e-6, grad, -1., 0., 0.01, out=(var, m, v))

    scripted = torch.jit.script(step)
    assert "npu::npu_bert_apply_adam" in str(scripted.graph)
    var, m, v, grad = torch.randn(32), torch.randn(32) * 0.1, torch.rand(32) * 0.1, torch.randn(32)
    expected = _bert_adam_reference(var, m, v, grad, 1e-2, 0.9, 0.99, 1e-6, -1., 0., 0.01, None, 0)
    state = (var.npu(), m.npu(), v.npu())
    out = scripted(grad.npu(), *state)
    for o, s, e in zip(out, state, expected):
        assert o.data_ptr() == s.data_ptr()
        _close(s, e, rtol=1e-5, atol=1e-6)


# ---- torch.ops.atb ---------------------------------------------------------------------------

def test_atb_ops_are_exposed_as_in_torch_npu():
    assert torch_npu._npu_paged_attention is torch.ops.atb._npu_paged_attention
    assert torch_npu._npu_quantize_per_tensor is torch.ops.atb._npu_quantize_per_tensor
    # the newer ATB operators are attributes of the module torch_npu.atb
    from torch_npu import _atb_ops
    assert all(getattr(torch_npu.atb, n) is getattr(torch.ops.atb, n) for n in _atb_ops.ATB_NAMES)
    import importlib
    assert importlib.import_module("torch_npu.atb") is torch_npu.atb  # a module object, not a file (as op-plugin's)


def test_quantize_per_tensor_rounds_half_to_even_and_saturates():
    x = torch.tensor([[0.5, 1.5, 2.5, -0.5], [100.0, -100.0, 3.0, 0.0]])
    scale = torch.tensor([1.0, 1.0, 1.0, 0.5])
    offset = torch.tensor([0, 0, 1, 2], dtype=torch.int8)
    y = torch.zeros(2, 4, dtype=torch.int8).npu()
    torch_npu._npu_quantize_per_tensor(x.npu(), scale.npu(), offset.npu(), y)
    _close(y, torch.tensor([[0, 2, 3, 1], [100, -100, 4, 2]], dtype=torch.int8))
    y = torch.zeros(1, 2, dtype=torch.int8).npu()
    torch_npu._npu_quantize_per_tensor(torch.tensor([[300.0, -300.0]]).npu(), torch.ones(2).npu(),
                                       torch.empty(0, dtype=torch.int8).npu(), y)
    _close(y, torch.tensor([[127, -128]], dtype=torch.int8))
    with pytest.raises(RuntimeError, match="at most 8 dimensions, but got 9"):
        torch_npu._npu_quantize_per_tensor(x.npu(), torch.ones((1,) * 9), offset.npu(), y)


def test_quant_rms_norm():
    x, gamma, beta = torch.randn(3, 2, 16), torch.randn(16), torch.randn(16)
    scale, offset = torch.tensor([0.05]), torch.tensor([3], dtype=torch.int8)
    out = torch.empty(3, 2, 16, dtype=torch.int8).npu()
    torch_npu._npu_quant_rms_norm(x.npu(), gamma.npu(), beta.npu(), scale.npu(), offset.npu(), out, eps=1e-6)
    rms = (x.double().pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()
    y = x.double() / rms * gamma.double() + beta.double()
    expected = torch.round(y / 0.05 + 3).clamp(-128, 127).to(torch.int8)
    assert (out.cpu().int() - expected.int()).abs().max() <= 1  # a tie may round either way in float32
    assert (out.cpu() == expected).float().mean() > 0.95


def test_matmul_add_fp32_accumulates_transposed_product():
    x, w, c = torch.randn(8, 5).half(), torch.randn(8, 7).half(), torch.randn(5, 7)
    cn = c.npu()
    torch_npu._npu_matmul_add_fp32(x.npu(), w.npu(), cn)
    _close(cn, c + x.double().t().mm(w.double()).float(), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="C must be float32"):
        torch_npu._npu_matmul_add_fp32(x.npu(), w.npu(), torch.zeros(5, 7).half().npu())


def test_reshape_and_cache_nd_and_nz():
    key, value = torch.randn(3, 2, 8), torch.randn(3, 2, 16)
    key_cache, value_cache = torch.zeros(4, 4, 2, 8), torch.zeros(4, 4, 2, 16)
    slots = torch.tensor([5, -1, 14], dtype=torch.int32)
    kc, vc = key_cache.npu(), value_cache.npu()
    torch_npu._npu_reshape_and_cache(key.npu(), value.npu(), kc, vc, slots.npu())
    key_cache[1, 1], key_cache[3, 2] = key[0], key[2]
    value_cache[1, 1], value_cache[3, 2] = value[0], value[2]
    _close(kc, key_cache)
    _close(vc, value_cache)
    # FRACTAL_NZ cache [blocks, heads * head_size / 16, block_size, 16]
    nz = torch_npu.npu_format_cast(torch.zeros(4, 2, 4, 16).npu(), 29)
    torch_npu._npu_reshape_and_cache_siso(value.npu(), nz, slots.npu())
    expected = torch.zeros(4, 2, 4, 16)
    expected[1, :, 1], expected[3, :, 2] = value[0].reshape(2, 16), value[2].reshape(2, 16)
    _close(nz, expected)


def _paged(cache_tokens, block_size, num_blocks, perm):
    """A paged cache holding each sequence's tokens [B, L, ...] in blocks perm[b] (a block table)."""
    b, length = cache_tokens.shape[:2]
    per_seq = math.ceil(length / block_size)
    cache = torch.zeros((num_blocks, block_size) + cache_tokens.shape[2:])
    table = perm[:b * per_seq].reshape(b, per_seq)
    for i in range(b):
        for t in range(length):
            cache[table[i, t // block_size], t % block_size] = cache_tokens[i, t]
    return cache, table.to(torch.int32)


def _sdpa_reference(q, k, v, scale):
    # q [H, D], k [L, KVH, D], v [L, KVH, Dv] with query head h reading KV head h // (H / KVH)
    group = q.size(0) // k.size(1)
    k, v = k.repeat_interleave(group, 1).double(), v.repeat_interleave(group, 1).double()
    out = F.scaled_dot_product_attention(q.double()[:, None], k.transpose(0, 1), v.transpose(0, 1), scale=scale)
    return out[:, 0].float()


def test_paged_attention_matches_sdpa_over_gathered_tokens():
    torch.manual_seed(0)
    b, h, kvh, d, dv, bs = 3, 4, 2, 8, 6, 4
    keys, values = torch.randn(b, 10, kvh, d), torch.randn(b, 10, kvh, dv)
    key_cache, table = _paged(keys, bs, 12, torch.randperm(12))
    value_cache, _ = _paged(values, bs, 12, torch.cat([table.flatten().long(), torch.arange(0)]))
    lens = torch.tensor([10, 3, 7], dtype=torch.int32)
    q = torch.randn(b, h, d)
    out = torch.zeros(b, h, dv).npu()
    torch_npu._npu_paged_attention(q.npu(), key_cache.npu(), value_cache.npu(), kvh, h, 0.3, table.npu(), lens, out)
    for i in range(b):
        n = int(lens[i])
        _close(out[i], _sdpa_reference(q[i], keys[i, :n], values[i, :n], 0.3), rtol=1e-5, atol=1e-5)
    ws = torch_npu._npu_paged_attention_get_workspace(q.npu(), key_cache.npu(), value_cache.npu(), kvh, h, 0.3,
                                                      table.npu(), lens, out)
    assert ws.numel() == 0
    with pytest.raises(RuntimeError, match="num_kv_heads"):
        torch_npu._npu_paged_attention(q.npu(), key_cache.npu(), value_cache.npu(), 3, h, 0.3, table.npu(), lens, out)


class _PagedDecoder:
    """As Huawei's test_compile_aclgraph_update: the lengths and the output are attributes."""

    def __init__(self, lens, out, kvh, h):
        self.lens, self.out, self.kvh, self.h = lens, out, kvh, h

    def __call__(self, q, key_cache, value_cache, table):
        torch_npu._npu_paged_attention(query=q, key_cache=key_cache, value_cache=value_cache, num_kv_heads=self.kvh,
                                       num_heads=self.h, scale_value=0.3, block_table=table, context_lens=self.lens,
                                       out=self.out)


def test_paged_attention_under_torch_compile():
    """An ATB kernel reached from a compiled frame runs as it is: Dynamo traced it (a graph break
    left it to the frame evaluation) and failed on get_npu_format of a fake tensor."""
    torch.manual_seed(0)
    b, h, kvh, d, bs = 2, 4, 2, 8, 4
    keys, values = torch.randn(b, 8, kvh, d), torch.randn(b, 8, kvh, d)
    key_cache, table = _paged(keys, bs, 8, torch.randperm(8))
    value_cache, _ = _paged(values, bs, 8, table.flatten().long())
    lens = torch.tensor([8, 5], dtype=torch.int32)
    q = torch.randn(b, h, d)
    eager, compiled = torch.zeros(b, h, d).npu(), torch.zeros(b, h, d).npu()
    args = (q.npu(), key_cache.npu(), value_cache.npu(), table.npu())
    _PagedDecoder(lens, eager, kvh, h)(*args)
    torch.compile(_PagedDecoder(lens, compiled, kvh, h), backend="inductor", dynamic=False)(*args)
    _close(compiled, eager.cpu(), rtol=0, atol=0)


def test_paged_attention_mla_reads_values_from_the_key_cache():
    torch.manual_seed(1)
    b, h, d, dv, bs = 2, 4, 12, 8, 4
    keys = torch.randn(b, 6, 1, d)
    key_cache, table = _paged(keys, bs, 6, torch.randperm(6))
    lens = torch.tensor([6, 2], dtype=torch.int32)
    q = torch.randn(b, h, d)
    out = torch.zeros(b, h, dv).npu()
    torch_npu._npu_paged_attention_mla(q.npu(), key_cache.npu(), 1, h, 0.25, table.npu(), lens.npu(), dv, out)
    for i in range(b):
        n = int(lens[i])
        _close(out[i], _sdpa_reference(q[i], keys[i, :n], keys[i, :n, :, :dv], 0.25), rtol=1e-5, atol=1e-5)


def test_atb_ops_trace_under_torch_compile():
    def f(x, scale, offset, y):
        torch_npu._npu_quantize_per_tensor(x, scale, offset, y)
        return y.float() * 2

    x = torch.randn(4, 8)
    y = torch.zeros(4, 8, dtype=torch.int8).npu()
    out = torch.compile(f, backend="aot_eager", fullgraph=True)(x.npu(), torch.full((8,), 0.1).npu(),
                                                                  torch.zeros(8, dtype=torch.int8).npu(), y)
    expected = torch.round(x / 0.1).clamp(-128, 127)
    _close(out, expected * 2)
    _close(y, expected.to(torch.int8))


def test_paged_cache_load_gathers_sequences_from_their_start_block():
    torch.manual_seed(2)
    key_cache, value_cache = torch.randn(6, 2, 1, 3), torch.randn(6, 2, 1, 5)
    table = torch.tensor([[4, 1, 0, 5], [2, 3, 5, 0]], dtype=torch.int32)
    lens, starts = torch.tensor([3, 2], dtype=torch.int32), torch.tensor([2, 0], dtype=torch.int32)
    # sequence 0 starts at its block 1 (seq_starts 2 // block_size 2): blocks 1, 0; sequence 1: block 2
    rows = [(1, 0), (1, 1), (0, 0), (2, 0), (2, 1)]
    expected_k = torch.stack([key_cache[b, o] for b, o in rows])
    expected_v = torch.stack([value_cache[b, o] for b, o in rows])
    k, v = torch_npu.atb.npu_paged_cache_load(key_cache.npu(), value_cache.npu(), table.npu(), lens.npu(),
                                              seq_starts=starts.npu())
    _close(k, expected_k)
    _close(v, expected_v)
    k_out, v_out = torch.empty(5, 1, 3).npu(), torch.empty(5, 1, 5).npu()
    torch_npu.atb.npu_paged_cache_load(key_cache.npu(), value_cache.npu(), table.npu(),
                                       torch.tensor([3, 5], dtype=torch.int32).npu(), seq_starts=starts.npu(),
                                       cumsum=True, key=k_out, value=v_out)
    _close(k_out, expected_k)
    _close(v_out, expected_v)


@pytest.mark.parametrize("neox", [True, False])
def test_rotary_embedding_in_place(neox):
    torch.manual_seed(3)
    heads, head_size, rot = 2, 8, 4
    positions = torch.tensor([0, 3, 1])
    freqs = torch.arange(10.)[:, None] * torch.tensor([1.0, 0.1])
    cache = torch.cat([freqs.cos(), freqs.sin()], -1)
    q, k = torch.randn(3, heads * head_size), torch.randn(3, heads, head_size)

    def reference(x):
        x = x.reshape(3, heads, head_size).clone()
        cos, sin = cache[positions].chunk(2, -1)
        cos, sin = cos[:, None], sin[:, None]
        r = x[..., :rot]
        if neox:
            x1, x2 = r[..., :rot // 2], r[..., rot // 2:]
            x[..., :rot] = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
        else:
            x1, x2 = r[..., 0::2], r[..., 1::2]
            x[..., 0:rot:2], x[..., 1:rot:2] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
        return x

    qn, kn = q.npu(), k.npu()
    torch_npu._npu_rotary_embedding(positions.npu(), qn, kn, head_size, cache.npu(), neox)
    _close(qn, reference(q).reshape(3, -1), rtol=1e-5, atol=1e-5)
    _close(kn, reference(k), rtol=1e-5, atol=1e-5)


def test_flash_attention_unpad_attends_within_each_sequence():
    torch.manual_seed(4)
    h, kvh, d, dv = 4, 2, 8, 5
    lens = [3, 5]
    q, k, v = torch.randn(8, h, d), torch.randn(8, kvh, d), torch.randn(8, kvh, dv)
    for op, kwargs in ((torch_npu._npu_flash_attention_unpad, {}),
                       (torch_npu._npu_flash_attention_unpad_v2, {"kernel_type": 2})):
        out = torch.zeros(8, h, dv).npu()
        op(q.npu(), k.npu(), v.npu(), torch.tensor(lens, dtype=torch.int32), 0.4, h, kvh, out=out, **kwargs)
        start = 0
        for n in lens:
            rows = slice(start, start + n)
            for t in range(start, start + n):
                _close(out[t], _sdpa_reference(q[t], k[rows], v[rows], 0.4), rtol=1e-5, atol=1e-5)
            start += n
    with pytest.raises(RuntimeError, match="kernel_type only supports"):
        torch_npu._npu_flash_attention_unpad_v2(q.npu(), k.npu(), v.npu(), torch.tensor(lens), 0.4, h, kvh,
                                                kernel_type=1, out=out)


def _attention_reference(q, k, v, scale, bias=None):
    """q [Sq, H, D], k [Skv, KVH, D], v [Skv, KVH, Dv], bias added to the scores [H, Sq, Skv]:
    (out [Sq, H, Dv], log-sum-exp [H, Sq]) in float64."""
    group = q.size(1) // k.size(1)
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    if bias is not None:
        scores = scores + bias.double()
    out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    return out.float(), scores.logsumexp(-1).float()


def _causal_bias(q_len, kv_len, top_left=False):
    first = 0 if top_left else kv_len - q_len
    hidden = torch.arange(kv_len) > torch.arange(first, first + q_len)[:, None]
    return torch.zeros(q_len, kv_len).masked_fill(hidden, float("-inf"))


def test_flash_attention_full_compressed_and_alibi_masks():
    torch.manual_seed(5)
    h, kvh, d, dv = 4, 2, 8, 6
    lens = [3, 5]
    q, k, v = torch.randn(8, h, d), torch.randn(8, kvh, d), torch.randn(8, kvh, dv)
    lens_t = torch.tensor(lens, dtype=torch.int32)

    def check(out, bias_of):
        start = 0
        for b, n in enumerate(lens):
            rows = slice(start, start + n)
            _close(out.reshape(8, h, dv)[rows], _attention_reference(q[rows], k[rows], v[rows], 0.3, bias_of(n))[0],
                   rtol=1e-5, atol=1e-5)
            start += n

    # a full mask [S, S] (rows and columns of each sequence from 0) and ATB's compressed causal mask
    full = torch.randn(6, 6)
    out = torch.zeros(8, h, dv).npu()
    torch_npu._npu_flash_attention(q.npu(), k.npu(), v.npu(), full.npu(), lens_t, 0.3, h, kvh, out)
    check(out, lambda n: full[:n, :n])
    torch_npu._npu_flash_attention_v3(q.npu(), k.npu(), v.npu(), torch.ones(128, 128).triu(1).npu(), lens_t, 0.3, h,
                                      kvh, out=out)
    check(out, lambda n: _causal_bias(n, n))
    with pytest.raises(RuntimeError, match="mask_type only supports MASK_TYPE_NORM_COMPRESS"):
        torch_npu._npu_flash_attention_v3(q.npu(), k.npu(), v.npu(), full.npu(), lens_t, 0.3, h, kvh, mask_type=1,
                                          out=out)

    # v2 takes [tokens, hidden] tensors; compressed ALiBi: slopes[h] * (i - j), or its square root
    slopes = torch.tensor([-0.5, -0.25, -0.125, -0.0625])
    out2 = torch.zeros(8, h * dv).npu()
    for mask_type, law in ((4, lambda dist: dist), (5, torch.sqrt)):
        res = torch_npu.atb._npu_flash_attention_v2(q.reshape(8, -1).npu(), k.reshape(8, -1).npu(),
                                                    v.reshape(8, -1).npu(), lens, mask=torch.zeros(256, 256).npu(),
                                                    slopes=slopes.npu(), mask_type=mask_type, scale_value=0.3,
                                                    num_heads=h, num_kv_heads=kvh, out=out2)
        assert res is out2

        def alibi(n):
            dist = (torch.arange(n)[:, None] - torch.arange(n)).float().clamp(min=0)
            return slopes[:, None, None] * law(dist) + _causal_bias(n, n)
        check(out2, alibi)
    # an ALiBi mask in full, [batch, heads, S, S]
    alibi_full = torch.randn(2, h, 5, 5)
    torch_npu.atb._npu_flash_attention_v2(q.npu(), k.npu(), v.npu(), lens, mask=alibi_full.npu(), mask_type=2,
                                          scale_value=0.3, num_heads=h, num_kv_heads=kvh, out=out)
    start = 0
    for b, n in enumerate(lens):
        rows = slice(start, start + n)
        _close(out[rows], _attention_reference(q[rows], k[rows], v[rows], 0.3, alibi_full[b, :, :n, :n])[0],
               rtol=1e-5, atol=1e-5)
        start += n
    with pytest.raises(RuntimeError, match="slopes"):
        torch_npu.atb._npu_flash_attention_v2(q.npu(), k.npu(), v.npu(), lens, mask_type=4, num_heads=h,
                                              num_kv_heads=kvh, out=out)
    with pytest.raises(RuntimeError, match="mask_type must be one of"):
        torch_npu.atb._npu_flash_attention_v2(q.npu(), k.npu(), v.npu(), lens, mask_type=3, num_heads=h,
                                              num_kv_heads=kvh, out=out)


def _prefix_case(seed):
    """Two sequences in paged caches: 5 and 7 tokens, whose last 2 and 3 are the queries."""
    torch.manual_seed(seed)
    h, kvh, d, bs = 4, 2, 8, 4
    kv_lens, q_lens = [5, 7], [2, 3]
    keys, values = torch.randn(2, 8, kvh, d), torch.randn(2, 8, kvh, d)
    key_cache, table = _paged(keys, bs, 6, torch.randperm(6))
    value_cache, _ = _paged(values, bs, 6, table.flatten().long())
    q = torch.randn(5, h, d)
    return h, kvh, d, kv_lens, q_lens, keys, values, key_cache, value_cache, table, q


def _check_prefix(out, q, keys, values, q_lens, kv_lens, bias_of, scale):
    start = 0
    for b, (nq, nk) in enumerate(zip(q_lens, kv_lens)):
        rows = slice(start, start + nq)
        _close(out[rows], _attention_reference(q[rows], keys[b, :nk], values[b, :nk], scale, bias_of(nq, nk))[0],
               rtol=1e-5, atol=1e-5)
        start += nq


def test_prefill_over_a_cached_prefix_is_causal():
    h, kvh, d, kv_lens, q_lens, keys, values, key_cache, value_cache, table, q = _prefix_case(6)
    args = (q.npu(), key_cache.npu(), value_cache.npu(), table.npu())
    out = torch.zeros(5, h, d).npu()
    torch_npu._npu_flash_attention_qlens(*args, torch.ones(128, 128).triu(1).npu(), torch.tensor(q_lens),
                                         torch.tensor(kv_lens), kvh, h, 0.3, out)
    _check_prefix(out, q, keys, values, q_lens, kv_lens, _causal_bias, 0.3)
    out.zero_()
    # [blocks, block_size, hidden] caches
    torch_npu.atb._npu_flash_attention_prefix_v2(q.npu(), key_cache.flatten(2).npu(), value_cache.flatten(2).npu(),
                                                 table.npu(), torch.zeros(128, 128).npu(), q_lens, kv_lens,
                                                 num_kv_heads=kvh, num_heads=h, scale_value=0.3, out=out)
    _check_prefix(out, q, keys, values, q_lens, kv_lens, _causal_bias, 0.3)
    res = torch_npu.atb.npu_self_attention_prefix_encoder(*args, q_lens, kv_lens, h, 0.3, kvh)
    _check_prefix(res, q, keys, values, q_lens, kv_lens, _causal_bias, 0.3)
    # causal plus square-root ALiBi distances from the query's position in its sequence
    slopes = torch.tensor([-0.5, -0.25, -0.125, -0.0625])

    def alibi(nq, nk):
        dist = (torch.arange(nk - nq, nk)[:, None] - torch.arange(nk)).float().clamp(min=0)
        return slopes[:, None, None] * dist.sqrt() + _causal_bias(nq, nk)
    torch_npu.atb.npu_self_attention_prefix_encoder(*args, q_lens, kv_lens, h, 0.3, kvh, slopes=slopes.npu(),
                                                    mask_type="mask_type_alibi_compress_sort", output=res)
    _check_prefix(res, q, keys, values, q_lens, kv_lens, alibi, 0.3)
    with pytest.raises(RuntimeError, match="Unsupported mask_type value: 'triu'"):
        torch_npu.atb.npu_self_attention_prefix_encoder(*args, q_lens, kv_lens, h, 0.3, kvh, mask_type="triu")
    with pytest.raises(RuntimeError, match="kernel_type must be 1"):
        torch_npu.atb._npu_flash_attention_prefix_v2(*args, torch.zeros(128, 128).npu(), q_lens, kv_lens,
                                                     kernel_type=0, num_kv_heads=kvh, num_heads=h, out=out)


def test_paged_attention_splitfuse_masks_and_nz_caches():
    h, kvh, d, kv_lens, q_lens, keys, values, key_cache, value_cache, table, q = _prefix_case(7)
    # the mask rows of all 5 queries, over the longest sequence's 7 positions
    rows = torch.randn(5, 7)
    out = torch.zeros(5, h, d).npu()
    torch_npu._npu_paged_attention_splitfuse(q.npu(), key_cache.npu(), value_cache.npu(), table.npu(),
                                             torch.tensor(kv_lens), rows.npu(), torch.tensor(q_lens), kvh, h, 0.3, out)
    starts = [0, 2]
    _check_prefix(out, q, keys, values, q_lens, kv_lens,
                  lambda nq, nk: rows[starts[q_lens.index(nq)]:starts[q_lens.index(nq)] + nq, :nk], 0.3)
    # FRACTAL_NZ caches [blocks, hidden / 16, block_size, 16], under ATB's compressed causal mask
    key_nz = key_cache.flatten(2).unflatten(2, (-1, 16)).transpose(1, 2).contiguous()
    value_nz = value_cache.flatten(2).unflatten(2, (-1, 16)).transpose(1, 2).contiguous()
    torch_npu._npu_paged_attention_splitfuse_v2(q.npu(), torch_npu.npu_format_cast(key_nz.npu(), 29),
                                                torch_npu.npu_format_cast(value_nz.npu(), 29), table.npu(),
                                                torch.tensor(kv_lens), torch.zeros(1).npu(), torch.tensor(q_lens),
                                                kvh, h, 0.3, out=out)
    _check_prefix(out, q, keys, values, q_lens, kv_lens, _causal_bias, 0.3)
    with pytest.raises(RuntimeError, match=r"MASK_TYPE_NORM_COMPRESS\(5\), but got: 1"):
        torch_npu._npu_paged_attention_splitfuse_v2(q.npu(), key_nz.npu(), value_nz.npu(), table.npu(),
                                                    torch.tensor(kv_lens), torch.zeros(1).npu(), torch.tensor(q_lens),
                                                    kvh, h, 0.3, mask_type=1, out=out)


def test_paged_attention_v2_alibi_and_quant():
    torch.manual_seed(8)
    b, h, kvh, d, bs = 2, 4, 2, 8, 4
    keys, values = torch.randn(b, 6, kvh, d), torch.randn(b, 6, kvh, d)
    key_cache, table = _paged(keys, bs, 4, torch.randperm(4))
    value_cache, _ = _paged(values, bs, 4, table.flatten().long())
    lens, q = [6, 4], torch.randn(b, h, d)
    mask = torch.randn(b, h, 1, 6)
    out = torch.zeros(b, h, d).npu()
    kwargs = dict(value_cache=value_cache.npu(), mask=mask.npu(), num_kv_heads=kvh, num_heads=h, scale_value=0.3,
                  mask_type=2)
    ws = torch_npu.atb._npu_paged_attention_v2_get_workspace(q.npu(), key_cache.npu(), table.npu(), lens, out=out,
                                                             **kwargs)
    assert ws.numel() == 0
    torch_npu.atb._npu_paged_attention_v2(q.npu(), key_cache.npu(), table.npu(), lens, workspace=ws, out=out,
                                          **kwargs)
    for i, n in enumerate(lens):
        _close(out[i], _attention_reference(q[i:i + 1], keys[i, :n], values[i, :n], 0.3, mask[i, :, :, :n])[0][0],
               rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="mask_type must be 0"):
        torch_npu.atb._npu_paged_attention_v2(q.npu(), key_cache.npu(), table.npu(), lens, out=out,
                                              **{**kwargs, "mask_type": 1})
    # int8 queries and caches, dequantized per query head
    q8, k8, v8 = (torch.randint(-5, 6, t.shape, dtype=torch.int8) for t in (q, key_cache, value_cache))
    k_descale, v_descale = torch.rand(h) / 10, torch.rand(h) / 10
    out16 = torch.zeros(b, h, d, dtype=torch.bfloat16).npu()
    torch_npu._npu_paged_attention_quant(q8.npu(), k8.npu(), v8.npu(), kvh, h, 0.3, table.npu(),
                                         torch.tensor(lens), 3, 27, k_descale.npu(), v_descale.npu(), out16)
    for i, n in enumerate(lens):
        gathered_k = torch.stack([k8[table[i, t // bs], t % bs] for t in range(n)])
        gathered_v = torch.stack([v8[table[i, t // bs], t % bs] for t in range(n)])
        ref, _ = _attention_reference(q8[i:i + 1].float() * k_descale[:, None], gathered_k.float(),
                                      gathered_v.float(), 0.3)
        _close(out16[i].float(), ref[0] * v_descale[:, None], rtol=1e-2, atol=1e-2)
    with pytest.raises(RuntimeError, match="outdata_type"):
        torch_npu._npu_paged_attention_quant(q8.npu(), k8.npu(), v8.npu(), kvh, h, 0.3, table.npu(),
                                             torch.tensor(lens), 3, 1, k_descale.npu(), v_descale.npu(), out16)


def test_multi_head_latent_attention_with_lse_and_nz_caches():
    torch.manual_seed(9)
    b, h, bs = 3, 4, 4
    ctkv_tokens, rope_tokens = torch.randn(b, 6, 1, 32), torch.randn(b, 6, 1, 16)
    ctkv, table = _paged(ctkv_tokens, bs, 6, torch.randperm(6))
    k_rope, _ = _paged(rope_tokens, bs, 6, table.flatten().long())
    q_nope, q_rope = torch.randn(b, h, 32), torch.randn(b, h, 16)
    lens = [6, 3, 5]
    args = (q_nope.npu(), q_rope.npu(), ctkv.npu(), k_rope.npu(), table.npu(), torch.tensor(lens))
    expected = [_attention_reference(torch.cat([q_nope[i:i + 1], q_rope[i:i + 1]], -1),
                                     torch.cat([ctkv_tokens[i, :n], rope_tokens[i, :n]], -1), ctkv_tokens[i, :n], 0.2)
                for i, n in enumerate(lens)]
    out = torch_npu.atb.npu_multi_head_latent_attention(*args, h, 0.2, 1)
    assert out.shape == (b, h, 32)
    for i in range(b):
        _close(out[i], expected[i][0][0], rtol=1e-5, atol=1e-5)
    out, lse = torch_npu.atb.npu_multi_head_latent_attention(*args, h, 0.2, 1, True, calc_type="calc_type_ring")
    assert lse.shape == (b, h, 1)
    for i in range(b):
        _close(lse[i, :, 0], expected[i][1][:, 0], rtol=1e-5, atol=1e-5)
    # the simulator computes lse for every calc_type; return_lse=False returns None
    _close(torch_npu.atb.npu_multi_head_latent_attention(*args, h, 0.2, 1, True)[1], lse.cpu())
    assert torch_npu.atb.npu_multi_head_latent_attention(*args, h, 0.2, 1, False)[1] is None
    # FakeTensorMode (torch.compile's tracing) runs the same kernels on fake tensors: shapes only
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fake_args = (torch.empty(b, h, 32).npu(), torch.empty(b, h, 16).npu(), torch.empty(6, bs, 1, 32).npu(),
                     torch.empty(6, bs, 1, 16).npu(), torch.zeros(b, 2, dtype=torch.int32).npu(), lens)
        fake_out, fake_lse = torch_npu.atb.npu_multi_head_latent_attention(*fake_args, h, 0.2, 1, True)
        assert fake_out.shape == (b, h, 32) and fake_lse.shape == (b, h, 1)
    ws = torch_npu.atb._npu_multi_head_latent_attention_get_workspace(*args, h, 0.2, 1, True)
    assert ws.numel() == 0
    # FRACTAL_NZ caches [blocks, hidden / 16, block_size, 16], into out=
    nz = [c.flatten(2).unflatten(2, (-1, 16)).transpose(1, 2).contiguous().npu() for c in (ctkv, k_rope)]
    out_nz = torch.zeros(b, h, 32).npu()
    torch_npu.atb.npu_multi_head_latent_attention(q_nope.npu(), q_rope.npu(), *nz, table.npu(), lens, h, 0.2, 1,
                                                  cache_mode="nzcache", output=out_nz)
    _close(out_nz, out.cpu(), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="Unsupported cache_mode value: 'nd'"):
        torch_npu.atb.npu_multi_head_latent_attention(*args, h, 0.2, 1, cache_mode="nd")


def test_ring_mla_merges_chunks_into_attention_over_all_keys():
    torch.manual_seed(10)
    h, tokens = 2, 5
    q_nope, q_rope = torch.randn(tokens, h, 8), torch.randn(tokens, h, 4)
    k_nope, k_rope, value = torch.randn(2 * tokens, h, 8), torch.randn(2 * tokens, h, 4), torch.randn(2 * tokens, h, 6)
    seqlen = torch.tensor([tokens], dtype=torch.int32)
    common = dict(qk_scale=0.3, kernel_type="kernel_type_default")
    first = [t[:tokens].npu() for t in (k_nope, k_rope, value)]
    out1, lse1 = torch_npu.atb.npu_ring_mla(q_nope.npu(), q_rope.npu(), *first, torch.zeros(512, 512).npu(), seqlen,
                                            h, h, mask_type="mask_type_triu", **common)
    q, k = torch.cat([q_nope, q_rope], -1), torch.cat([k_nope, k_rope], -1)
    ref1, ref_lse1 = _attention_reference(q, k[:tokens], value[:tokens], 0.3, _causal_bias(tokens, tokens, True))
    _close(out1, ref1, rtol=1e-5, atol=1e-5)
    assert lse1.shape == (h, tokens) and lse1.dtype == torch.float32
    _close(lse1, ref_lse1, rtol=1e-5, atol=1e-5)
    # the next chunk of keys, merged with the first: attention over both
    second = [t[tokens:].npu() for t in (k_nope, k_rope, value)]
    out2, lse2 = torch.empty(tokens, h, 6).npu(), torch.empty(h, tokens).npu()
    torch_npu.atb.npu_ring_mla(q_nope.npu(), q_rope.npu(), *second, torch.zeros(512, 512).npu(), seqlen, h, h,
                               pre_out=out1, prev_lse=lse1, calc_type="calc_type_default", output=out2,
                               softmax_lse=lse2, **common)
    bias = torch.cat([_causal_bias(tokens, tokens, True), torch.zeros(tokens, tokens)], -1)
    ref2, ref_lse2 = _attention_reference(q, k, value, 0.3, bias)
    _close(out2, ref2, rtol=1e-5, atol=1e-5)
    _close(lse2, ref_lse2, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="Expected CPU tensor"):
        torch_npu.atb.npu_ring_mla(q_nope.npu(), q_rope.npu(), *first, torch.zeros(1).npu(), seqlen.npu(), h, h)
    with pytest.raises(RuntimeError, match="needs pre_out and prev_lse"):
        torch_npu.atb.npu_ring_mla(q_nope.npu(), q_rope.npu(), *first, torch.zeros(1).npu(), seqlen, h, h,
                                   calc_type="calc_type_default")


def test_group_topk_and_fused_add_topk_div():
    x = torch.tensor([[1., 5., 2., 2., 0.5, 4., 3., 3.],
                      [9., 0., 1., 1., 1., 1., 2., 2.]])
    # groups of 2; group scores (top-1 sums) row 0: 5, 2, 4, 3 -> keep groups 0, 2
    grouped = x.half().npu()
    torch_npu._npu_group_topk(grouped, k=2, group_num=4, n=1)
    _close(grouped.float(), torch.tensor([[1., 5., 0., 0., 0.5, 4., 0., 0.],
                                          [9., 0., 0., 0., 0., 0., 2., 2.]]))
    with pytest.raises(RuntimeError, match="group_num"):
        torch_npu._npu_group_topk(x.npu(), k=1, group_num=3, n=1)

    add = torch.zeros(8)
    y, idx = torch_npu.atb.npu_fused_add_topk_div(x.npu(), add.npu(), group_num=4, group_topk=2, n=1, k=3)
    sig = torch.sigmoid(x)
    expected_idx = torch.tensor([[1, 5, 0], [0, 6, 7]])
    assert idx.dtype == torch.int32 and y.dtype == torch.float32
    _close(idx, expected_idx.int())
    picked = sig.gather(1, expected_idx)
    _close(y, picked / picked.sum(-1, keepdim=True), rtol=1e-6, atol=1e-6)
    # logical experts: expert e of token t -> mapping_table[e, t % mapping_num[e]]
    mapping_num = torch.full((8,), 2, dtype=torch.int32)
    mapping_table = torch.arange(16, dtype=torch.int32).reshape(8, 2) + 100
    y2, idx2 = torch.empty(2, 3).npu(), torch.empty(2, 3, dtype=torch.int32).npu()
    torch_npu.atb.npu_fused_add_topk_div(x.npu(), add.npu(), mapping_num=mapping_num.npu(),
                                         mapping_table=mapping_table.npu(), group_num=4, group_topk=2, n=1, k=3,
                                         is_norm=False, enable_expert_mapping=True, y=y2, indices=idx2)
    _close(idx2, mapping_table[expected_idx, torch.tensor([[0], [1]])])
    _close(y2, picked)
    with pytest.raises(RuntimeError, match="Unsupported activation_type value: 'relu'"):
        torch_npu.atb.npu_fused_add_topk_div(x.npu(), add.npu(), activation_type="relu", group_num=4)
