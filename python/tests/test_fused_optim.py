"""torch_npu.optim: the fused optimizers against torch.optim (or a reference written here
for the optimizers torch has not), step for step, on npu; combined buffers, zero_grad,
clip_grad_norm_fused_, state_dict, bad hyper-parameters, AMP; the fused kernels' ops."""
import copy
import math

import pytest
import torch

import torch_npu
from torch_npu.optim import (NpuFusedAdadelta, NpuFusedAdam, NpuFusedAdamP, NpuFusedAdamW, NpuFusedBertAdam,
                             NpuFusedLamb, NpuFusedOptimizerBase, NpuFusedRMSprop, NpuFusedRMSpropTF,
                             NpuFusedSGD)
from torch_npu.utils import get_part_combined_tensor, is_combined_tensor_valid, npu_combine_tensors

STEPS = 6


# ---- references for the optimizers torch.optim has not (per parameter, plain torch ops) --------

class RefLamb(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0, adam=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.adam = adam

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                st = self.state[p]
                if not st:
                    st["step"], st["exp_avg"], st["exp_avg_sq"] = 0, torch.zeros_like(p), torch.zeros_like(p)
                st["step"] += 1
                g = p.grad
                st["exp_avg"].mul_(b1).add_(g, alpha=1 - b1)
                st["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
                u = st["exp_avg"] / (st["exp_avg_sq"].sqrt() + group["eps"]) + group["weight_decay"] * p
                wn, un = p.norm().clamp(0, 10), u.norm()
                trust = 1.0 if self.adam or wn == 0 or un == 0 else float(wn / un)
                p.add_(u * trust, alpha=-group["lr"])


class RefBertAdam(torch.optim.Optimizer):
    def __init__(self, params, lr, warmup=-1, t_total=-1, b1=0.9, b2=0.999, e=1e-6, weight_decay=0.01,
                 max_grad_norm=1.0):
        super().__init__(params, dict(lr=lr, warmup=warmup, t_total=t_total, b1=b1, b2=b2, e=e,
                                      weight_decay=weight_decay))
        self.max_grad_norm = max_grad_norm

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if self.max_grad_norm > 0:  # clipped over the group, as the fused one does per group
                total = torch.stack([p.grad.float().norm() for p in params]).norm()
                coef = self.max_grad_norm / (total + 1e-6)
                if coef < 1:
                    for p in params:
                        p.grad.mul_(coef)
            for p in params:
                st = self.state[p]
                if not st:
                    st["step"], st["exp_avg"], st["exp_avg_sq"] = 0, torch.zeros_like(p), torch.zeros_like(p)
                x = st["step"] / group["t_total"]
                w = group["warmup"]
                lr = group["lr"] * (x / w if x < w else max((x - 1.) / (w - 1.), 0.)) if group["t_total"] != -1 \
                    else group["lr"]
                g = p.grad
                st["exp_avg"].mul_(group["b1"]).add_(g, alpha=1 - group["b1"])
                st["exp_avg_sq"].mul_(group["b2"]).addcmul_(g, g, value=1 - group["b2"])
                u = st["exp_avg"] / (st["exp_avg_sq"].sqrt() + group["e"])
                if group["weight_decay"] > 0:
                    u = u + group["weight_decay"] * p
                p.add_(-lr * u)
                st["step"] += 1


class RefAdamP(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, delta=0.1, wd_ratio=0.1,
                 nesterov=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, delta=delta,
                                      wd_ratio=wd_ratio, nesterov=nesterov))

    @staticmethod
    def _projection(p, grad, perturb, delta, wd_ratio, eps):
        expand = [-1] + [1] * (p.dim() - 1)
        for view in (lambda x: x.reshape(x.size(0), -1), lambda x: x.reshape(1, -1)):
            cos = (view(grad) * view(p)).sum(1).abs() / (view(grad).norm(dim=1) + eps) / (view(p).norm(dim=1) + eps)
            if cos.max() < delta / math.sqrt(view(p).size(1)):
                p_n = p / (view(p).norm(dim=1).view(expand) + eps)
                perturb = perturb - p_n * view(p_n * perturb).sum(1).view(expand)
                return perturb, wd_ratio
        return perturb, 1.0

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                st = self.state[p]
                if not st:
                    st["step"], st["exp_avg"], st["exp_avg_sq"] = 0, torch.zeros_like(p), torch.zeros_like(p)
                st["step"] += 1
                g = p.grad
                st["exp_avg"].mul_(b1).add_(g, alpha=1 - b1)
                st["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
                bc1, bc2 = 1 - b1 ** st["step"], 1 - b2 ** st["step"]
                denom = st["exp_avg_sq"].sqrt() / math.sqrt(bc2) + group["eps"]
                m = b1 * st["exp_avg"] + (1 - b1) * g if group["nesterov"] else st["exp_avg"]
                perturb = m / denom
                wd = 1.0
                if p.dim() > 1:
                    perturb, wd = self._projection(p, g, perturb, group["delta"], group["wd_ratio"], group["eps"])
                if group["weight_decay"] > 0:
                    p.mul_(1 - group["lr"] * group["weight_decay"] * wd)
                p.add_(perturb, alpha=-group["lr"] / bc1)


class RefRMSpropTF(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-2, alpha=0.9, eps=1e-10, weight_decay=0, momentum=0., centered=False,
                 decoupled_decay=False, lr_in_momentum=True):
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                                      centered=centered, decoupled_decay=decoupled_decay,
                                      lr_in_momentum=lr_in_momentum))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                st = self.state[p]
                if not st:
                    st["step"], st["square_avg"] = 0, torch.ones_like(p)
                    if group["momentum"] > 0:
                        st["momentum_buffer"] = torch.zeros_like(p)
                    if group["centered"]:
                        st["grad_avg"] = torch.zeros_like(p)
                st["step"] += 1
                g = p.grad
                if group["weight_decay"] != 0:
                    if group["decoupled_decay"]:
                        p.mul_(1 - group["weight_decay"])
                    else:
                        g = g + group["weight_decay"] * p
                sq = st["square_avg"]
                sq.add_((g * g - sq) * (1 - group["alpha"]))
                if group["centered"]:
                    ga = st["grad_avg"]
                    ga.add_((g - ga) * (1 - group["alpha"]))
                    avg = (sq - ga * ga + group["eps"]).sqrt()
                else:
                    avg = (sq + group["eps"]).sqrt()
                if group["momentum"] > 0:
                    buf = st["momentum_buffer"]
                    if group["lr_in_momentum"]:
                        buf.mul_(group["momentum"]).add_(group["lr"] * g / avg)
                        p.sub_(buf)
                    else:
                        buf.mul_(group["momentum"]).add_(g / avg)
                        p.sub_(group["lr"] * buf)
                else:
                    p.sub_(group["lr"] * g / avg)


# ---- harness ----------------------------------------------------------------------------------

def _model(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(2, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 24), torch.nn.Tanh(),
        torch.nn.Linear(24, 5))
    return model.to(dtype=dtype).npu()


def _batch(step, dtype=torch.float32):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(6, 2, 8, 8, generator=g).to(dtype).npu(), torch.randn(6, 5, generator=g).to(dtype).npu()


def _loss(model, x, y):
    return ((model(x).float() - y.float()) ** 2).mean()


def _groups(model, kwargs_a, kwargs_b):
    params = list(model.parameters())
    return [dict(params=params[:2], **kwargs_a), dict(params=params[2:], **kwargs_b)]


def _compare(ref_model, fused_model, ref_opt, fused_opt, rtol, atol):
    for (name, p_ref), p in zip(ref_model.named_parameters(), fused_model.parameters()):
        torch.testing.assert_close(p.cpu(), p_ref.cpu(), rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")
        torch.testing.assert_close(p.grad.cpu(), p_ref.grad.cpu(), rtol=rtol, atol=atol)
        st_ref, st = ref_opt.state[p_ref], fused_opt.state[p]
        for key, value in st_ref.items():
            if key == "step":
                assert int(float(st[key])) == int(float(value)), key
            elif torch.is_tensor(value):
                torch.testing.assert_close(st[key].cpu(), value.cpu(), rtol=rtol, atol=atol,
                                           msg=lambda m: f"{name} state {key}: {m}")


def _run(ref_factory, fused_factory, steps=STEPS, dtype=torch.float32, rtol=2e-5, atol=2e-6, groups=None,
         clip=None, module_zero_grad=False):
    ref_model = _model(dtype)
    fused_model = copy.deepcopy(ref_model)
    if groups is None:
        ref_opt, fused_opt = ref_factory(ref_model.parameters()), fused_factory(fused_model.parameters())
    else:
        ref_opt, fused_opt = ref_factory(_groups(ref_model, *groups)), fused_factory(_groups(fused_model, *groups))
    for step in range(steps):
        x, y = _batch(step, dtype)
        if module_zero_grad:  # Module.zero_grad(): set_to_none=True, as transformers' Trainer calls it
            ref_model.zero_grad()
            fused_model.zero_grad()
        else:
            ref_opt.zero_grad()
            fused_opt.zero_grad()
        _loss(ref_model, x, y).backward()
        _loss(fused_model, x, y).backward()
        if clip is not None:
            n_ref = torch.nn.utils.clip_grad_norm_(ref_model.parameters(), clip)
            n = fused_opt.clip_grad_norm_fused_(clip)
            torch.testing.assert_close(n.cpu().float(), n_ref.cpu().float(), rtol=1e-5, atol=1e-6)
        ref_opt.step()
        fused_opt.step()
        _compare(ref_model, fused_model, ref_opt, fused_opt, rtol, atol)
    return ref_model, fused_model, ref_opt, fused_opt


def _torch(cls, **kw):
    return lambda params: cls(params, foreach=False, **kw)


def _fused(cls, **kw):
    return lambda params: cls(params, **kw)


# ---- step for step against torch.optim -------------------------------------------------------

TORCH_CASES = [
    ("sgd", torch.optim.SGD, NpuFusedSGD, dict(lr=0.05)),
    ("sgd_momentum_wd", torch.optim.SGD, NpuFusedSGD, dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-2)),
    ("sgd_nesterov", torch.optim.SGD, NpuFusedSGD, dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)),
    ("adam", torch.optim.Adam, NpuFusedAdam, dict(lr=2e-3)),
    ("adam_wd_amsgrad", torch.optim.Adam, NpuFusedAdam, dict(lr=2e-3, weight_decay=0.05, amsgrad=True)),
    ("adamw", torch.optim.AdamW, NpuFusedAdamW, dict(lr=2e-3)),
    ("adamw_amsgrad", torch.optim.AdamW, NpuFusedAdamW, dict(lr=2e-3, betas=(0.8, 0.99), weight_decay=0.1,
                                                               amsgrad=True)),
    ("adadelta", torch.optim.Adadelta, NpuFusedAdadelta, dict(lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.05)),
    ("rmsprop", torch.optim.RMSprop, NpuFusedRMSprop, dict(lr=0.01, eps=1e-3, weight_decay=1e-5)),
    ("rmsprop_centered_momentum", torch.optim.RMSprop, NpuFusedRMSprop,
     dict(lr=0.01, alpha=0.9, momentum=0.5, centered=True, eps=1e-3, weight_decay=1e-3)),
]


@pytest.mark.parametrize("name,ref_cls,fused_cls,kw", TORCH_CASES, ids=[c[0] for c in TORCH_CASES])
def test_matches_torch_optim(name, ref_cls, fused_cls, kw):
    # centered RMSprop divides by sqrt(square_avg - grad_avg**2 + eps): the subtraction cancels, so float32
    # rounding differences between torch's per-tensor foreach kernels and the fused flat buffers (summation
    # order, which the CPU's vector width decides) grow to ~1e-5 in the momentum buffer after a few steps
    atol = 2e-5 if kw.get("centered") else 2e-6
    _run(_torch(ref_cls, **kw), _fused(fused_cls, **kw), atol=atol)


@pytest.mark.parametrize("name,ref_cls,fused_cls,kw", TORCH_CASES[::2], ids=[c[0] for c in TORCH_CASES[::2]])
def test_param_groups_with_different_hyper_parameters(name, ref_cls, fused_cls, kw):
    lr = kw["lr"]
    groups = (dict(lr=lr * 2, weight_decay=0.0), dict(lr=lr / 2, weight_decay=0.02))
    _run(_torch(ref_cls, **kw), _fused(fused_cls, **kw), groups=groups)


REF_CASES = [
    ("lamb", RefLamb, NpuFusedLamb, dict(lr=0.01, eps=1e-5, weight_decay=0.01)),
    ("lamb_adam", RefLamb, NpuFusedLamb, dict(lr=0.01, adam=True)),
    ("bert_adam", RefBertAdam, NpuFusedBertAdam, dict(lr=0.01, warmup=0.1, t_total=20, max_grad_norm=-1)),
    ("bert_adam_clip", RefBertAdam, NpuFusedBertAdam, dict(lr=0.01, max_grad_norm=0.05, weight_decay=0.01)),
    ("adamp", RefAdamP, NpuFusedAdamP, dict(lr=2e-3, eps=1e-5, weight_decay=0.05)),
    ("adamp_nesterov_projected", RefAdamP, NpuFusedAdamP, dict(lr=2e-3, weight_decay=0.05, delta=1.0,
                                                                nesterov=True)),
    ("rmsprop_tf", RefRMSpropTF, NpuFusedRMSpropTF, dict(lr=0.01, eps=1e-3, weight_decay=1e-5)),
    ("rmsprop_tf_momentum", RefRMSpropTF, NpuFusedRMSpropTF,
     dict(lr=0.01, momentum=0.9, centered=True, weight_decay=1e-3, decoupled_decay=True)),
    ("rmsprop_tf_momentum_pt", RefRMSpropTF, NpuFusedRMSpropTF,
     dict(lr=0.01, momentum=0.9, lr_in_momentum=False, weight_decay=1e-3)),
]


@pytest.mark.parametrize("name,ref_cls,fused_cls,kw", REF_CASES, ids=[c[0] for c in REF_CASES])
def test_matches_reference(name, ref_cls, fused_cls, kw):
    _run(_fused(ref_cls, **kw), _fused(fused_cls, **kw), rtol=2e-5, atol=5e-6)


def test_adamp_projects_some_weights():
    """delta=1.0 makes the channel-wise test pass: the projected branch is exercised."""
    _, model, _, opt = _run(_fused(RefAdamP, lr=1e-2, delta=1.0, weight_decay=0.1),
                            _fused(NpuFusedAdamP, lr=1e-2, delta=1.0, weight_decay=0.1), steps=3,
                            rtol=2e-5, atol=5e-6)


@pytest.mark.parametrize("ref_cls,fused_cls,kw", [
    (torch.optim.AdamW, NpuFusedAdamW, dict(lr=1e-3, weight_decay=0.01, eps=1e-3)),
    (torch.optim.Adam, NpuFusedAdam, dict(lr=1e-3, amsgrad=True, eps=1e-3)),
    (torch.optim.SGD, NpuFusedSGD, dict(lr=0.05, momentum=0.9)),
    (torch.optim.RMSprop, NpuFusedRMSprop, dict(lr=1e-3, eps=1e-3)),
], ids=["adamw", "adam_amsgrad", "sgd", "rmsprop"])
def test_float16_params(ref_cls, fused_cls, kw):
    # torch.optim rounds to float16 after every op, the fused kernel computes in float32:
    # they agree to float16 precision.
    _run(_torch(ref_cls, **kw), _fused(fused_cls, **kw), dtype=torch.float16, rtol=2e-2, atol=1e-2, steps=4)


def test_mixed_dtypes_are_combined_per_dtype():
    a = torch.nn.Parameter(torch.randn(4, 3).npu())
    b = torch.nn.Parameter(torch.randn(5).half().npu())
    c = torch.nn.Parameter(torch.randn(2, 2).npu())
    ref = [torch.nn.Parameter(t.detach().clone()) for t in (a, b, c)]
    opt = NpuFusedAdamW([a, b, c], lr=0.01)
    ref_opt = torch.optim.AdamW(ref, lr=0.01, foreach=False)
    for _ in range(3):
        for p, q in zip((a, b, c), ref):
            p.grad = (p.detach().float() * 0.1 + 0.01).to(p.dtype)
            q.grad = p.grad.clone()
        opt.step()
        ref_opt.step()
    fp32, fp16 = opt.get_combined_params()
    assert fp32.numel() == 16 and fp32.dtype == torch.float32
    assert fp16.numel() == 5 and fp16.dtype == torch.float16
    for p, q in zip((a, b, c), ref):
        torch.testing.assert_close(p.float().cpu(), q.float().cpu(), rtol=1e-2, atol=1e-3)


def test_bfloat16_params_are_rejected():
    p = torch.nn.Parameter(torch.randn(3).bfloat16().npu())
    p.grad = torch.ones_like(p)
    with pytest.raises(TypeError, match="float32 or float16"):
        NpuFusedAdamW([p]).step()


# ---- combined buffers ---------------------------------------------------------------------

def test_params_keep_identity_and_live_in_the_combined_buffers():
    model = _model()
    params = list(model.parameters())
    ids = [id(p) for p in params]
    opt = NpuFusedAdamW(model.parameters(), lr=1e-3)
    x, y = _batch(0)
    _loss(model, x, y).backward()
    grads = [p.grad for p in params]
    opt.step()
    assert [id(p) for p in model.parameters()] == ids
    assert all(p.grad is g for p, g in zip(params, grads))
    (combined_params, _), (combined_grads, _) = opt.get_combined_params(), opt.get_combined_grads()
    assert combined_params.numel() == sum(p.numel() for p in params)
    assert is_combined_tensor_valid(combined_params, params)
    assert is_combined_tensor_valid(combined_grads, [p.grad for p in params])
    # A write through the buffer is seen by the parameter and the other way round.
    with torch.no_grad():
        combined_params.add_(1.0)
    before = params[0].detach().clone()
    with torch.no_grad():
        params[0].sub_(1.0)
    torch.testing.assert_close(params[0].cpu(), (before - 1).cpu())
    # The states are views into the combined state buffers.
    exp_avg = opt.combined_param_states_indexed_by_group[0][0]["exp_avg"]
    assert is_combined_tensor_valid(exp_avg, [opt.state[p]["exp_avg"] for p in params])
    # Backward accumulates into the combined grads.
    opt.zero_grad()
    assert float(combined_grads.abs().sum()) == 0
    _loss(model, x, y).backward()
    assert float(combined_grads.abs().sum()) > 0
    assert all(p.grad is g for p, g in zip(params, grads))


@pytest.mark.parametrize("name,ref_cls,fused_cls,kw", TORCH_CASES[::2], ids=[c[0] for c in TORCH_CASES[::2]])
def test_module_zero_grad_sets_grads_to_none(name, ref_cls, fused_cls, kw):
    """model.zero_grad() drops the combined grads; the new ones must still be stepped on
    (they used to be ignored: every step after the first reused the first step's grads)."""
    _run(_torch(ref_cls, **kw), _fused(fused_cls, **kw), module_zero_grad=True)
    _run(_torch(ref_cls, **kw), _fused(fused_cls, **kw), module_zero_grad=True, clip=0.05)


def test_parameter_left_without_a_grad_steps_with_zero_grad():
    model = _model()
    opt = NpuFusedSGD(model.parameters(), lr=0.1)
    x, y = _batch(0)
    _loss(model, x, y).backward()
    opt.step()
    combined = opt.get_combined_grads()[0]
    model.zero_grad()
    first = next(model.parameters())
    _loss(model, x, y).backward()
    first.grad = None  # not used by this step's loss
    before = first.detach().clone()
    opt.step()
    torch.testing.assert_close(first.detach(), before)  # plain SGD: a zero grad leaves it
    assert first.grad is not None and float(first.grad.abs().sum()) == 0
    assert first.grad.data_ptr() == combined.data_ptr()  # the first slice of the buffer again


def test_zero_grad():
    model = _model()
    opt = NpuFusedSGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="set_to_none"):
        opt.zero_grad(set_to_none=True)
    opt.zero_grad()  # nothing combined yet (no grads): falls back to Optimizer.zero_grad
    x, y = _batch(0)
    _loss(model, x, y).backward()
    opt.zero_grad()
    assert opt.is_params_grads_combined
    assert all(float(p.grad.abs().sum()) == 0 for p in model.parameters())
    assert float(opt.get_combined_grads()[0].abs().sum()) == 0


@pytest.mark.parametrize("norm_type,max_norm", [(2, 0.05), (2, 1e6), (1, 0.1), (float("inf"), 0.01)])
def test_clip_grad_norm_fused(norm_type, max_norm):
    model = _model()
    ref = copy.deepcopy(model)
    opt = NpuFusedAdamW(model.parameters())
    x, y = _batch(0)
    _loss(model, x, y).backward()
    _loss(ref, x, y).backward()
    n = opt.clip_grad_norm_fused_(max_norm, norm_type)
    n_ref = torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm, norm_type)
    torch.testing.assert_close(n.cpu(), n_ref.cpu(), rtol=1e-5, atol=1e-7)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad.cpu(), rtol=1e-5, atol=1e-7)


def test_clip_in_a_training_loop():
    kw = dict(lr=2e-3, weight_decay=0.05)
    _run(_torch(torch.optim.AdamW, **kw), _fused(NpuFusedAdamW, **kw), clip=0.05)


# ---- state_dict -------------------------------------------------------------------------

@pytest.mark.parametrize("ref_cls,fused_cls,kw", [
    (torch.optim.AdamW, NpuFusedAdamW, dict(lr=2e-3, amsgrad=True)),
    (torch.optim.SGD, NpuFusedSGD, dict(lr=0.05, momentum=0.9)),
    (torch.optim.RMSprop, NpuFusedRMSprop, dict(lr=0.01, momentum=0.5, eps=1e-3)),
], ids=["adamw", "sgd", "rmsprop"])
def test_state_dict_round_trip(ref_cls, fused_cls, kw):
    ref_model, fused_model, ref_opt, fused_opt = _run(_torch(ref_cls, **kw), _fused(fused_cls, **kw), steps=3,
                                                        rtol=1e-4, atol=5e-5)
    # fused -> torch.optim and torch.optim -> a fresh fused optimizer: both continue in step.
    sd = copy.deepcopy(fused_opt.state_dict())
    ref2 = ref_cls(ref_model.parameters(), foreach=False, **kw)
    # torch.optim's groups carry keys torch_npu's have not (foreach, decoupled_weight_decay, ...):
    # load the per-parameter state with torch.optim's own group settings.
    groups = [dict(g, params=s["params"]) for g, s in zip(ref2.state_dict()["param_groups"], sd["param_groups"])]
    ref2.load_state_dict({"state": copy.deepcopy(sd["state"]), "param_groups": groups})
    model3 = copy.deepcopy(fused_model)
    fused3 = fused_cls(model3.parameters(), **kw)
    fused3.load_state_dict(copy.deepcopy(ref_opt.state_dict()))
    # and a state dict loaded into the same, already combined, optimizer
    fused_opt.load_state_dict(sd)
    for step in range(3, 6):
        x, y = _batch(step)
        for model, opt in ((ref_model, ref2), (fused_model, fused_opt), (model3, fused3)):
            opt.zero_grad()
            _loss(model, x, y).backward()
            opt.step()
        _compare(ref_model, fused_model, ref2, fused_opt, 1e-4, 5e-5)
        _compare(ref_model, model3, ref2, fused3, 1e-4, 5e-5)
    # The fused optimizer's state dict has the per-parameter layout of torch.optim's.
    sd = fused_opt.state_dict()
    assert sorted(sd["state"]) == sorted(ref2.state_dict()["state"])
    for k, st in sd["state"].items():
        for key, value in st.items():
            if torch.is_tensor(value) and key != "step":
                assert value.shape == ref2.state_dict()["state"][k][key].shape


# ---- bad hyper-parameters -------------------------------------------------------------------

BAD = [
    (NpuFusedAdam, dict(lr=-1)), (NpuFusedAdam, dict(eps=-1)), (NpuFusedAdam, dict(betas=(1.0, 0.9))),
    (NpuFusedAdam, dict(betas=(0.9, -0.1))), (NpuFusedAdam, dict(weight_decay=-1)),
    (NpuFusedAdamW, dict(lr=-1e-3)), (NpuFusedAdamW, dict(betas=(0.9, 1.0))), (NpuFusedAdamW, dict(weight_decay=-1)),
    (NpuFusedSGD, dict(lr=-0.1)), (NpuFusedSGD, dict(lr=0.1, momentum=-1)), (NpuFusedSGD, dict(lr=0.1, weight_decay=-1)),
    (NpuFusedSGD, dict(lr=0.1, nesterov=True)), (NpuFusedSGD, dict(lr=0.1, momentum=0.9, dampening=0.5, nesterov=True)),
    (NpuFusedRMSprop, dict(lr=-1)), (NpuFusedRMSprop, dict(alpha=-1)), (NpuFusedRMSprop, dict(momentum=-1)),
    (NpuFusedRMSpropTF, dict(eps=-1)), (NpuFusedRMSpropTF, dict(weight_decay=-1)),
    (NpuFusedAdadelta, dict(rho=1.5)), (NpuFusedAdadelta, dict(lr=-1)), (NpuFusedAdadelta, dict(eps=-1)),
    (NpuFusedLamb, dict(lr=-1)), (NpuFusedLamb, dict(betas=(0.9, 1.5))), (NpuFusedLamb, dict(eps=-1)),
    (NpuFusedBertAdam, dict(lr=-1)), (NpuFusedBertAdam, dict(lr=0.1, warmup=1.5)),
    (NpuFusedBertAdam, dict(lr=0.1, schedule="nope")), (NpuFusedBertAdam, dict(lr=0.1, b1=1.0)),
    (NpuFusedBertAdam, dict(lr=0.1, b2=-0.1)), (NpuFusedBertAdam, dict(lr=0.1, e=-1)),
]


@pytest.mark.parametrize("cls,kw", BAD, ids=[f"{c.__name__}-{k}" for c, k in BAD])
def test_bad_hyper_parameters(cls, kw):
    p = torch.nn.Parameter(torch.zeros(2).npu())
    with pytest.raises(ValueError, match="Invalid|Nesterov"):
        cls([p], **kw)


def test_signatures_and_defaults():
    import inspect
    sig = inspect.signature(NpuFusedAdamW)
    assert str(sig) == "(params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.01, amsgrad=False)"
    assert inspect.signature(NpuFusedAdam).parameters["weight_decay"].default == 0
    assert inspect.signature(NpuFusedLamb).parameters["eps"].default == 1e-6
    assert inspect.signature(NpuFusedRMSpropTF).parameters["alpha"].default == 0.9
    assert inspect.signature(NpuFusedBertAdam).parameters["schedule"].default == "warmup_linear"
    assert inspect.signature(NpuFusedOptimizerBase).parameters.keys() == {"params", "default"}
    assert issubclass(NpuFusedSGD, torch.optim.Optimizer)


# ---- AMP ------------------------------------------------------------------------------------

def test_training_loop_with_grad_scaler():
    from torch_npu.npu.amp import GradScaler, autocast

    model = _model()
    opt = NpuFusedAdamW(model.parameters(), lr=1e-2)
    scaler = GradScaler(init_scale=2.0 ** 10)
    losses = []
    for step in range(15):
        x, y = _batch(step % 3)
        opt.zero_grad()
        with autocast():
            loss = _loss(model, x, y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        opt.clip_grad_norm_fused_(1.0)
        scaler.step(opt)
        scaler.update()
        losses.append(float(loss.detach()))
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0]
    assert opt.is_params_grads_combined


def test_grad_scaler_skips_step_on_inf():
    from torch_npu.npu.amp import GradScaler

    model = _model()
    opt = NpuFusedAdam(model.parameters())
    scaler = GradScaler()
    x, y = _batch(0)
    scaler.scale(_loss(model, x, y)).backward()
    scaler.step(opt)
    scaler.update()
    before = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    scaler.scale(_loss(model, x, y)).backward()
    next(model.parameters()).grad[0].fill_(float("inf"))
    scaler.step(opt)
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p.detach().cpu(), b.cpu())


# ---- utils and the kernels' ops ----------------------------------------------------------------

def test_npu_combine_tensors():
    ts = [torch.randn(3, 2).npu(), torch.randn(4).npu()]
    values = [t.clone() for t in ts]
    ids = [id(t) for t in ts]
    combined = npu_combine_tensors(ts)
    assert combined.shape == (10,) and [id(t) for t in ts] == ids
    for t, v in zip(ts, values):
        assert torch.equal(t.cpu(), v.cpu())
    torch.testing.assert_close(combined.cpu(), torch.cat([v.reshape(-1) for v in values]).cpu())
    part = get_part_combined_tensor(combined, 6, 4)
    part.fill_(7)
    assert torch.equal(ts[1].cpu(), torch.full((4,), 7.0))
    assert get_part_combined_tensor(combined, 0, 0) is None
    assert npu_combine_tensors([]) is None
    with pytest.raises(RuntimeError, match="same dtype"):
        npu_combine_tensors([torch.zeros(2).npu(), torch.zeros(2).half().npu()])
    with pytest.raises(RuntimeError, match="on NPU"):
        npu_combine_tensors([torch.zeros(2)])
    with pytest.raises(RuntimeError, match="contiguous"):
        npu_combine_tensors([torch.zeros(3, 3).npu().t()])


def _apply_adam_w_reference(var, m, v, b1p, b2p, lr, wd, b1, b2, eps, grad, max_grad_norm, amsgrad, maximize):
    g = -grad if maximize else grad
    m = m * b1 + (1 - b1) * g
    v = v * b2 + (1 - b2) * g * g
    var = var * (1 - lr * wd)
    vm = torch.maximum(max_grad_norm, v) if amsgrad else v
    denom = (vm / (1 - b2p * b2)).sqrt() + eps
    return var - lr * m / (1 - b1p * b1) / denom, m, v


@pytest.mark.parametrize("amsgrad,maximize", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_npu_apply_adam_w(amsgrad, maximize, dtype):
    g = torch.Generator().manual_seed(0)
    var, m, grad = (torch.randn(5, 7, generator=g) for _ in range(3))
    v, mgn = torch.rand(5, 7, generator=g), torch.rand(5, 7, generator=g)
    args = (0.9 ** 3, 0.999 ** 3, 0.01, 0.05, 0.9, 0.999, 1e-8)
    exp = _apply_adam_w_reference(var, m, v, *args, grad, mgn, amsgrad, maximize)
    var_n, m_n, v_n = (t.to(dtype).npu() for t in (var, m, v))
    out = torch_npu.npu_apply_adam_w(*args, grad.to(dtype).npu(), mgn.to(dtype).npu() if amsgrad else None,
                                     amsgrad, maximize, var=var_n, m=m_n, v=v_n)
    assert out[0] is var_n and out[1] is m_n and out[2] is v_n
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=2e-3, atol=2e-3)
    for got, want in zip((var_n, m_n, v_n), exp):
        torch.testing.assert_close(got.float().cpu(), want.to(dtype).float(), **tol)
    # functional form: var = m = v = 0 to start from
    fv, fm, fvv = torch_npu.npu_apply_adam_w(*args, grad.npu(), None, False, False)
    exp0 = _apply_adam_w_reference(torch.zeros(5, 7), torch.zeros(5, 7), torch.zeros(5, 7), *args, grad,
                                   None, False, False)
    for got, want in zip((fv, fm, fvv), exp0):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)


def test_npu_apply_adam():
    g = torch.Generator().manual_seed(1)
    var, m, grad = (torch.randn(64, generator=g) for _ in range(3))
    v = torch.rand(64, generator=g)
    b1p, b2p, lr, b1, b2, eps = 0.9 ** 2, 0.999 ** 2, 0.01, 0.9, 0.999, 1e-8
    for nesterov in (False, True):
        lr_t = lr * math.sqrt(1 - b2p) / (1 - b1p)
        m_e = m + (grad - m) * (1 - b1)
        v_e = v + (grad * grad - v) * (1 - b2)
        num = grad * (1 - b1) + b1 * m_e if nesterov else m_e
        var_e = var - lr_t * num / (v_e.sqrt() + eps)
        var_n, m_n, v_n = var.npu(), m.npu(), v.npu()
        torch_npu.npu_apply_adam(b1p, b2p, lr, b1, b2, eps, grad.npu(), False, nesterov, var=var_n, m=m_n, v=v_n)
        for got, want in zip((var_n, m_n, v_n), (var_e, m_e, v_e)):
            torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)


def test_npu_apply_adam_takes_an_out_tuple_and_computes_degenerate_powers():
    # torch_npu's binding takes out=(var, m, v) as well as var=, m=, v= (op-plugin's test_apply_adam);
    # beta1_power 1 (no step yet) gives a NaN/inf var, as on Ascend, and the moments as usual
    g = torch.Generator().manual_seed(2)
    var, m, v, grad = (torch.rand(8, generator=g) for _ in range(4))
    out = (var.npu(), m.npu(), v.npu())
    result = torch_npu.npu_apply_adam(1, 1, 0.2, 0.2, 0.2, 0.2, grad.npu(), False, False, out=out)
    assert all(r is o for r, o in zip(result, out))
    torch.testing.assert_close(out[2].cpu(), 0.2 * v + 0.8 * grad * grad)
    assert not torch.isfinite(out[0].cpu()).any()
    with pytest.raises(TypeError, match="out must be a tuple of 3 tensors"):
        torch_npu.npu_apply_adam(0.9, 0.9, 0.2, 0.2, 0.2, 0.2, grad.npu(), False, False, out=(out[0],))


def test_kernel_argument_errors():
    p, g = torch.zeros(4).npu(), torch.zeros(4).npu()
    with pytest.raises(RuntimeError, match="exp_avg"):
        torch.ops.npu._npu_fused_adam_step(p, g, torch.zeros(3).npu(), torch.zeros(4).npu(), None, 0.1, 0.9, 0.99,
                                           1e-8, 0.0, 1)
    with pytest.raises(RuntimeError, match="grad"):
        torch.ops.npu._npu_fused_sgd_step(p, torch.zeros(4).half().npu(), None, 0.1, 0.0, 0.0, 0.0, False, False)
    with pytest.raises(RuntimeError, match="max_exp_avg_sq"):
        torch.ops.npu._npu_fused_adam_step(p, g, g.clone(), g.clone(), None, 0.1, 0.9, 0.99, 1e-8, 0.0, 1, True)
    with pytest.raises(RuntimeError, match="numels"):
        torch.ops.npu._npu_fused_lamb_step(p, g, g.clone(), g.clone(), [3], 0.1, 0.9, 0.99, 1e-6, 0.0, 1.0, False)
    with pytest.raises(RuntimeError, match="npu tensor"):
        torch.ops.npu._npu_fused_adam_step(p, torch.zeros(4), g.clone(), g.clone(), None, 0.1, 0.9, 0.99, 1e-8,
                                           0.0, 1)


def test_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        grad = torch.empty(3, 4, device="npu")
        var, m, v = torch.ops.npu.npu_apply_adam_w(0.9, 0.99, 1e-3, 0.0, 0.9, 0.99, 1e-8, grad, None, False, False)
        assert var.shape == (3, 4) and m.shape == (3, 4) and v.shape == (3, 4)


@pytest.mark.parametrize("cls", [NpuFusedRMSprop, NpuFusedRMSpropTF])
def test_rmsprop_init_param_state_takes_torch_npus_arguments(cls):
    p = torch.tensor([1.0, 2.0])
    opt = cls([p], momentum=0.9, centered=True)
    opt._init_param_state(p, momentum=0.9, centered=True)
    state = opt.state[p]
    assert set(state) == {"step", "square_avg", "momentum_buffer", "grad_avg"} and state["step"] == 0
    start = 1.0 if cls is NpuFusedRMSpropTF else 0.0  # TensorFlow's square_avg starts at 1
    torch.testing.assert_close(state["square_avg"], torch.full_like(p, start))
    q = torch.tensor([3.0])
    opt._init_param_state(q, 0, False)
    assert set(opt.state[q]) == {"step", "square_avg"}
    # no grads: nothing is combined, the (empty) combined states exist
    opt.params_lists_indexed_by_group = [[p]]
    opt._maybe_init_combined_states()
    assert opt.is_states_combined and opt.combined_param_states_indexed_by_group[0] is not None
    assert opt.combined_param_states_indexed_by_group[0][0]["square_avg"] is None
    # a training step still combines the states of the parameters that have grads
    w = torch.nn.Parameter(torch.randn(4, device="npu"))
    opt = cls([w], lr=0.1, momentum=0.9, centered=True)
    (w * w).sum().backward()
    opt.step()
    assert opt.state[w]["step"] == 1 and opt.combined_param_states_indexed_by_group[0][0]["grad_avg"].numel() == 4
