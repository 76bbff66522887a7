"""Automatic mixed precision on NPUs: autocast and GradScaler."""

import pytest
import torch

import torch_npu


def _mats():
    return torch.randn(8, 8, device="npu"), torch.randn(8, 8, device="npu")


def test_torch_autocast_npu_runs_mm_in_float16():
    a, b = _mats()
    with torch.autocast("npu"):
        assert torch.is_autocast_enabled("npu") and torch.npu.is_autocast_enabled()
        c = torch.mm(a, b)
        s = torch.softmax(c, dim=-1)  # a float32 op on the autocast lists
    assert c.dtype == torch.float16
    assert s.dtype == torch.float32
    assert torch.mm(a, b).dtype == torch.float32
    assert not torch.npu.is_autocast_enabled()
    torch.testing.assert_close(c.float().cpu(), a.cpu() @ b.cpu(), rtol=1e-2, atol=1e-2)


def test_npu_amp_autocast_signature_and_dtypes():
    a, b = _mats()
    assert issubclass(torch.npu.amp.autocast, torch.amp.autocast_mode.autocast)
    with torch.npu.amp.autocast():
        assert torch.mm(a, b).dtype == torch.float16
        assert torch.npu.get_autocast_dtype() == torch.float16
    with torch.npu.amp.autocast(dtype=torch.bfloat16):
        assert torch.mm(a, b).dtype == torch.bfloat16
    with torch.npu.amp.autocast(enabled=False):
        assert torch.mm(a, b).dtype == torch.float32
    with torch.npu.amp.autocast(True, torch.float16, False):
        assert torch.mm(a, b).dtype == torch.float16
    with pytest.raises(TypeError, match="'dtype'"):
        torch.npu.amp.autocast(dtype="half")


def test_autocast_as_decorator_and_linear():
    model = torch.nn.Linear(8, 4).npu()

    @torch.npu.amp.autocast()
    def forward(x):
        return model(x)

    assert forward(torch.randn(2, 8, device="npu")).dtype == torch.float16


def test_amp_supported_dtypes():
    assert torch.npu.get_amp_supported_dtype() == [torch.float16, torch.bfloat16, torch.float32]
    assert torch.npu.is_bf16_supported()
    torch.npu.set_autocast_dtype(torch.bfloat16)
    try:
        assert torch.npu.get_autocast_dtype() == torch.bfloat16
        with torch.autocast("npu"):
            assert torch.mm(*_mats()).dtype == torch.bfloat16
    finally:
        torch.npu.set_autocast_dtype(torch.float16)
    torch.npu.set_autocast_enabled(True)
    try:
        assert torch.npu.is_autocast_enabled()
    finally:
        torch.npu.set_autocast_enabled(False)


def test_custom_fwd_bwd():
    seen = {}

    class Square(torch.autograd.Function):
        @staticmethod
        @torch.npu.amp.custom_fwd(cast_inputs=torch.float32)
        def forward(ctx, x):
            seen["fwd"] = (x.dtype, torch.npu.is_autocast_enabled())
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        @torch.npu.amp.custom_bwd
        def backward(ctx, grad):
            seen["bwd"] = torch.npu.is_autocast_enabled()
            (x,) = ctx.saved_tensors
            return 2 * x * grad

    class Plain(torch.autograd.Function):
        @staticmethod
        @torch.npu.amp.custom_fwd
        def forward(ctx, x):
            seen["plain"] = torch.npu.is_autocast_enabled()
            return x.clone()

        @staticmethod
        @torch.npu.amp.custom_bwd
        def backward(ctx, grad):
            return grad

    x = torch.randn(4, device="npu", dtype=torch.float16, requires_grad=True)
    with torch.npu.amp.autocast():
        y = Square.apply(x)
        Plain.apply(x)
    assert seen["fwd"] == (torch.float32, False)
    assert seen["plain"] is True
    y.sum().backward()
    assert seen["bwd"] is False
    torch.testing.assert_close(x.grad.float().cpu(), 2 * x.detach().float().cpu(),
                               rtol=1e-3, atol=1e-3)


def _train(scaler, steps=30):
    torch.npu.manual_seed(0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 1)).npu()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(64, 16, device="npu")
    y = x.sum(dim=1, keepdim=True) * 0.1
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        with torch.npu.amp.autocast():
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    return losses


def test_grad_scaler_training_loop_decreases_loss():
    scaler = torch.npu.amp.GradScaler()
    assert isinstance(scaler, torch.amp.GradScaler)
    losses = _train(scaler)
    assert losses[-1] < 0.5 * losses[0]
    assert scaler.get_scale() > 0
    assert scaler._scale.device.type == "npu"


def test_torch_amp_grad_scaler_npu_natively():
    losses = _train(torch.amp.GradScaler("npu"))
    assert losses[-1] < 0.5 * losses[0]


def test_grad_scaler_skips_step_on_inf_and_backs_off():
    model = torch.nn.Linear(4, 1).npu()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    scaler = torch.npu.amp.GradScaler(init_scale=1024.0, growth_interval=1)
    before = [p.detach().cpu().clone() for p in model.parameters()]
    loss = model(torch.randn(2, 4, device="npu")).sum()
    scaler.scale(loss).backward()
    with torch.no_grad():
        model.weight.grad[0, 0] = float("inf")
    scaler.step(opt)
    scaler.update()
    after = [p.detach().cpu() for p in model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert scaler.get_scale() == 512.0
    # A clean step then grows the scale (growth_interval=1).
    opt.zero_grad()
    scaler.scale(model(torch.randn(2, 4, device="npu")).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 1024.0


def test_grad_scaler_static_scale():
    scaler = torch.npu.amp.GradScaler(init_scale=128.0, dynamic=False, growth_interval=1)
    assert not scaler.is_dynamic()
    losses = _train(scaler, steps=10)
    assert scaler.get_scale() == 128.0
    assert losses[-1] < losses[0]
    state = scaler.state_dict()
    assert state["dynamic"] is False and state["scale"] == 128.0
    other = torch.npu.amp.GradScaler()
    other.load_state_dict(state)
    assert not other.is_dynamic() and other.get_scale() == 128.0


def test_grad_scaler_disabled_and_validation():
    scaler = torch.npu.amp.GradScaler(enabled=False)
    t = torch.ones(2, device="npu")
    assert scaler.scale(t) is t
    assert scaler.state_dict() == {}
    with pytest.raises(ValueError, match="growth factor"):
        torch.npu.amp.GradScaler(growth_factor=0.5)
    with pytest.raises(ValueError, match="backoff factor"):
        torch.npu.amp.GradScaler(backoff_factor=2.0)
    with pytest.raises(TypeError, match="growth_interval"):
        torch.npu.amp.GradScaler(growth_interval=1.5)
    assert torch_npu.npu.amp.GradScaler is torch.npu.amp.GradScaler
