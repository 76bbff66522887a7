"""nn.LSTM / nn.GRU / LSTMCell / GRUCell on npu (the fused cell kernels of
custom_ops/src/rnn_cells.cpp) against the same modules on cpu, forward and backward."""
import copy

import pytest
import torch
import torch.nn as nn

import torch_npu  # noqa: F401


def _compare(module, inputs, atol=2e-5, rtol=1e-4, dtype=torch.float32):
    torch.manual_seed(0)
    cpu = module.to(dtype)
    npu = copy.deepcopy(cpu).npu()
    cpu_in = [t.to(dtype).requires_grad_() if t.is_floating_point() else t for t in inputs]
    npu_in = [t.detach().npu().requires_grad_() if t.is_floating_point() else t.npu() for t in cpu_in]
    out_c, out_n = cpu(*cpu_in), npu(*npu_in)
    flat_c = [t for t in torch.utils._pytree.tree_leaves(out_c)]
    flat_n = [t for t in torch.utils._pytree.tree_leaves(out_n)]
    sum(t.float().square().sum() for t in flat_c).backward()
    sum(t.float().square().sum() for t in flat_n).backward()
    for a, e in zip(flat_n, flat_c):
        torch.testing.assert_close(a.detach().cpu(), e.detach(), atol=atol, rtol=rtol)
    for a, e in zip(npu_in, cpu_in):
        if e.requires_grad:
            torch.testing.assert_close(a.grad.cpu(), e.grad, atol=atol, rtol=rtol)
    for (name, p_n), p_c in zip(npu.named_parameters(), cpu.parameters()):
        torch.testing.assert_close(p_n.grad.cpu(), p_c.grad, atol=atol, rtol=rtol, msg=name)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_recurrent_layers_match_cpu(kind, bidirectional):
    torch.manual_seed(0)
    module = getattr(nn, kind)(12, 16, num_layers=2, batch_first=True, bidirectional=bidirectional)
    _compare(module, [torch.randn(3, 7, 12)])


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_initial_state_and_no_bias(kind):
    torch.manual_seed(1)
    module = getattr(nn, kind)(8, 10, num_layers=1, bias=False)
    x = torch.randn(5, 2, 8)
    if kind == "LSTM":
        h0, c0 = torch.randn(1, 2, 10), torch.randn(1, 2, 10)
        _compare(_WithState(module, 2), [x, h0, c0])
    else:
        _compare(_WithState(module, 1), [x, torch.randn(1, 2, 10)])


class _WithState(nn.Module):
    def __init__(self, rnn, n_state):
        super().__init__()
        self.rnn, self.n_state = rnn, n_state

    def forward(self, x, *state):
        return self.rnn(x, state if self.n_state == 2 else state[0])


@pytest.mark.parametrize("kind", ["LSTMCell", "GRUCell"])
def test_cells(kind):
    torch.manual_seed(2)
    _compare(getattr(nn, kind)(6, 9), [torch.randn(4, 6)])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(dtype):
    torch.manual_seed(3)
    module = nn.LSTM(8, 8, batch_first=True)
    x = torch.randn(2, 5, 8)
    expected, _ = copy.deepcopy(module)(x)
    actual, _ = module.to(dtype).npu()(x.to(dtype).npu())
    assert actual.dtype == dtype
    torch.testing.assert_close(actual.float().cpu(), expected.detach(), atol=3e-2, rtol=3e-2)


def test_gradcheck_cell_kernels_float64():
    g = torch.Generator().manual_seed(4)
    B, H = 3, 4
    ig, hg = (torch.randn(B, 4 * H, generator=g, dtype=torch.float64).npu().requires_grad_() for _ in range(2))
    cx = torch.randn(B, H, generator=g, dtype=torch.float64).npu().requires_grad_()
    bi, bh = (torch.randn(4 * H, generator=g, dtype=torch.float64).npu().requires_grad_() for _ in range(2))
    assert torch.autograd.gradcheck(lambda *a: torch.ops.aten._thnn_fused_lstm_cell(*a)[:2], (ig, hg, cx, bi, bh))
    ig, hg = (torch.randn(B, 3 * H, generator=g, dtype=torch.float64).npu().requires_grad_() for _ in range(2))
    hx = torch.randn(B, H, generator=g, dtype=torch.float64).npu().requires_grad_()
    bi, bh = (torch.randn(3 * H, generator=g, dtype=torch.float64).npu().requires_grad_() for _ in range(2))
    assert torch.autograd.gradcheck(lambda *a: torch.ops.aten._thnn_fused_gru_cell(*a)[0], (ig, hg, hx, bi, bh))


def test_bad_arguments_name_the_argument():
    gates = torch.randn(2, 8).npu()
    with pytest.raises(RuntimeError, match="cx"):
        torch.ops.aten._thnn_fused_lstm_cell(gates, gates, torch.randn(3, 2).npu())
    with pytest.raises(RuntimeError, match="input_gates"):
        torch.ops.aten._thnn_fused_lstm_cell(torch.randn(2, 7).npu(), torch.randn(2, 7).npu(), torch.randn(2, 1).npu())
    with pytest.raises(RuntimeError, match="hidden_bias"):
        torch.ops.aten._thnn_fused_gru_cell(torch.randn(2, 6).npu(), torch.randn(2, 6).npu(), torch.randn(2, 2).npu(),
                                   torch.randn(6).npu(), None)
