"""_DistributedMuon: the Muon optimizer (momentum, then Newton-Schulz orthogonalization of the
update of each 2-D parameter) for plain tensors and for DTensor parameters sharded over a
process group (FSDP2's ``fully_shard``, or DTensors made by hand), as torch_npu has it.

The orthogonalization of a parameter takes one of three paths:

* plain tensor, or ``process_group=None``: the quintic Newton-Schulz iteration on the whole
  matrix (in bfloat16), as ``torch.optim.Muon`` does;
* DTensor ``Shard(1)`` (each rank holds the columns ``[m, n/N]``): the Gram matrix of the
  whole matrix is the sum of the ranks' Gram matrices, ``X X^T = sum_i X_i X_i^T``, so every
  iteration all-reduces one ``[m, m]`` matrix and each rank updates its own columns (and the
  Frobenius norm is one all-reduced scalar); no rank holds the whole matrix;
* DTensor ``Shard(0)`` (or another shard dim): every rank all-gathers the matrix, the owner
  rank (the parameter's index in the step modulo the group size) orthogonalizes it and
  broadcasts the bfloat16 result, and each rank keeps its shard; the owners of consecutive
  parameters differ, so the iterations of a step are spread over the ranks.

The update is then ``p *= 1 - lr * weight_decay; p -= adjusted_lr * O`` with
``adjusted_lr = lr * sqrt(max(1, rows / cols))`` (``adjust_lr_fn=None`` or ``"original"``) or
``lr * 0.2 * sqrt(max(rows, cols))`` (``"match_rms_adamw"``). The class does not derive from
nor patch ``torch.optim.Muon``.
"""

import math
from collections.abc import MutableMapping
from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor, Shard
from torch.optim.optimizer import Optimizer

__all__: list = []

# Keller Jordan's coefficients of the quintic iteration, and its default length.
EPS = 1e-7
DEFAULT_A = 3.4445
DEFAULT_B = -4.7750
DEFAULT_C = 2.0315
DEFAULT_NS_STEPS = 5


def _to_scalar(lr):
    """A learning rate given as a one-element tensor as a Python number."""
    return lr.item() if isinstance(lr, Tensor) else lr


def _check_ns_arguments(grad: Tensor, ns_coefficients, ns_steps: int) -> None:
    if ns_steps >= 100:
        raise ValueError("Number of steps must be less than 100 for computational efficiency")
    if grad.dim() != 2:
        raise ValueError("Input tensor gradient must be a 2D matrix")
    if len(ns_coefficients) != 3:
        raise ValueError("Coefficients must be a tuple of exactly 3 values")


def _ns_iterations(x: Tensor, ns_coefficients, ns_steps: int, all_reduce=None) -> Tensor:
    """ns_steps quintic steps x <- a x + (b G + c G^2) x with G = x x^T (all_reduce(G) first
    when the columns of x are spread over ranks)."""
    a, b, c = ns_coefficients
    for _ in range(ns_steps):
        gram = x @ x.T
        if all_reduce is not None:
            all_reduce(gram)
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, poly, x, beta=a)
    return x


def _newtonschulz_orthogonalize(
    grad: Tensor,
    ns_coefficients: tuple = (DEFAULT_A, DEFAULT_B, DEFAULT_C),
    ns_steps: int = DEFAULT_NS_STEPS,
    eps: float = EPS,
) -> Tensor:
    """The (approximate) orthogonal factor U V^T of grad = U S V^T by the quintic
    Newton-Schulz iteration, computed in bfloat16 (the result is bfloat16). A tall matrix is
    iterated transposed, so the Gram matrix is the smaller one."""
    _check_ns_arguments(grad, ns_coefficients, ns_steps)
    tall = grad.size(0) > grad.size(1)
    x = grad.bfloat16()
    if tall:
        x = x.T
    # Frobenius norm >= spectral norm: after this the singular values are <= 1.
    x = x / x.norm().clamp(min=eps)
    x = _ns_iterations(x, ns_coefficients, ns_steps)
    return x.T if tall else x


def _adjust_lr(lr: float, adjust_lr_fn, param_shape) -> float:
    """The learning rate of a [rows, cols] matrix: lr * sqrt(max(1, rows/cols)) for None or
    "original" (Keller Jordan), lr * 0.2 * sqrt(max(rows, cols)) for "match_rms_adamw"
    (Moonshot: the update RMS of AdamW)."""
    rows, cols = param_shape[0], param_shape[1]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return lr * math.sqrt(max(1, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    return lr


def _shard_placements(param):
    if not isinstance(param, DTensor):
        return []
    return [pl for pl in param._spec.placements if isinstance(pl, Shard)]


def _is_dtensor_shard(param) -> bool:
    """Whether param is a DTensor with a Shard placement."""
    return bool(_shard_placements(param))


def _is_dtensor_shard1(param) -> bool:
    """Whether param is a DTensor sharded on dim 1."""
    return any(pl.dim == 1 for pl in _shard_placements(param))


def _get_shard_dim(param) -> int:
    """The dim of param's first Shard placement (0 when it has none)."""
    shards = _shard_placements(param)
    return shards[0].dim if shards else 0


def _distributed_zeropower_via_newtonschulz(
    local_grad: Tensor,
    ns_coefficients: tuple,
    ns_steps: int,
    eps: float,
    process_group,
) -> Tensor:
    """Newton-Schulz orthogonalization of a matrix whose columns are spread over the ranks
    of process_group (local_grad: this rank's [m, n_i] columns); returns this rank's columns
    of the result (bfloat16). Per call: one all-reduce of a scalar (the squared Frobenius
    norm) and ns_steps all-reduces of the [m, m] Gram matrix. The matrix is never
    transposed (X X^T X = X (X^T X)), so a tall matrix gives the same result as
    _newtonschulz_orthogonalize up to rounding."""
    _check_ns_arguments(local_grad, ns_coefficients, ns_steps)

    def all_reduce(t):
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=process_group)

    x = local_grad.bfloat16()
    norm_sq = x.pow(2).sum()
    all_reduce(norm_sq)
    x = x / norm_sq.sqrt().clamp(min=eps)
    return _ns_iterations(x, ns_coefficients, ns_steps, all_reduce)


def _local(t):
    return t._local_tensor if isinstance(t, DTensor) else t


def _owner_orthogonalize(update: Tensor, param: DTensor, owner: int, ns_coefficients,
                         ns_steps: int, eps: float, process_group) -> DTensor:
    """Shard(0) path: all-gather the update (every rank), orthogonalize on the owner rank,
    broadcast the bfloat16 result, keep this rank's shard in the update's dtype."""
    rank = dist.get_rank(process_group)
    world_size = dist.get_world_size(process_group)
    # shape and stride: the shards may be uneven (33 rows over 2 ranks).
    full = DTensor.from_local(update, param.device_mesh, param.placements, shape=param.shape,
                              stride=param.stride()).full_tensor()
    if rank == owner:
        ortho = _newtonschulz_orthogonalize(full, ns_coefficients, ns_steps, eps).contiguous()
    else:
        ortho = torch.empty(full.shape, dtype=torch.bfloat16, device=full.device)
    dist.broadcast(ortho, group=process_group, group_src=owner)
    dim = _get_shard_dim(param)
    pieces = ortho.chunk(world_size, dim=dim)
    if rank < len(pieces):
        mine = pieces[rank]
    else:  # more ranks than rows: this rank's shard is empty (DTensor's Shard does the same)
        mine = ortho.narrow(dim, 0, 0)
    return DTensor.from_local(mine.to(update.dtype).contiguous(), param.device_mesh,
                              param.placements, shape=param.shape, stride=param.stride())


class _DistributedMuon(Optimizer):
    """Muon for 2-D parameters, plain tensors or DTensors sharded over process_group.

    Args:
        params: the parameters (2-D) or parameter groups.
        lr: learning rate (default 1e-3).
        weight_decay: decoupled weight decay (default 0.1).
        momentum: momentum factor (default 0.95).
        nesterov: Nesterov momentum (default True).
        ns_coefficients: (a, b, c) of the quintic Newton-Schulz iteration.
        eps: floor of the norm the matrix is divided by (default 1e-7).
        ns_steps: Newton-Schulz steps (default 5).
        adjust_lr_fn: None or "original" (lr * sqrt(max(1, rows/cols))) or "match_rms_adamw"
            (lr * 0.2 * sqrt(max(rows, cols))).
        process_group: the group the DTensor parameters are sharded over; None: every
            parameter takes the single-matrix path.
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple = (DEFAULT_A, DEFAULT_B, DEFAULT_C),
        eps: float = EPS,
        ns_steps: int = DEFAULT_NS_STEPS,
        adjust_lr_fn: Optional[str] = None,
        process_group=None,
    ) -> None:
        if isinstance(lr, Tensor) and lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
        if not 0.0 <= lr:
            raise ValueError(f"Learning rate should be >= 0 but is: {lr}")
        if not 0.0 <= momentum:
            raise ValueError(f"momentum should be >= 0 but is: {momentum}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"weight decay should be >= 0 but is: {weight_decay}")
        if adjust_lr_fn is not None and adjust_lr_fn not in ("original", "match_rms_adamw"):
            raise ValueError(f"Adjust learning rate function {adjust_lr_fn} is not supported")
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_coefficients=ns_coefficients, eps=eps, ns_steps=ns_steps,
                        adjust_lr_fn=adjust_lr_fn, process_group=process_group)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError("_DistributedMuon only supports 2D parameters whereas "
                                     f"we found a parameter with size: {p.size()}")

    def _init_group(self, group: MutableMapping, params_with_grad: list, grads: list,
                    momentum_bufs: list) -> bool:
        """The parameters of group that have a grad, their grads and momentum buffers (the
        local shards for a sharded DTensor; the buffers are created at the first step)."""
        for p in group["params"]:
            if p.grad is None:
                continue
            if torch.is_complex(p):
                raise RuntimeError("_DistributedMuon does not support complex parameters")
            if p.grad.is_sparse:
                raise RuntimeError("_DistributedMuon does not support sparse gradients")
            sharded = _is_dtensor_shard(p)
            grad = _local(p.grad) if sharded else p.grad
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(grad,
                                                            memory_format=torch.preserve_format)
            buf = state["momentum_buffer"]
            params_with_grad.append(p)
            grads.append(grad)
            momentum_bufs.append(_local(buf) if sharded else buf)
        return False

    @torch.no_grad()
    def step(self, closure=None):
        """One optimization step (closure: re-evaluates the model and returns the loss)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, bufs = [], [], []
            has_complex = self._init_group(group, params, grads, bufs)
            _distributed_muon_single_tensor(
                params, grads, bufs, lr=group["lr"], weight_decay=group["weight_decay"],
                momentum=group["momentum"], nesterov=group["nesterov"],
                ns_coefficients=group["ns_coefficients"], ns_steps=group["ns_steps"],
                eps=group["eps"], adjust_lr_fn=group["adjust_lr_fn"], has_complex=has_complex,
                process_group=group["process_group"])
        return loss


def _distributed_muon_single_tensor(
    params: list,
    grads: list,
    momentum_bufs: list,
    *,
    lr,
    weight_decay: float,
    momentum: float,
    nesterov: bool,
    ns_coefficients: tuple,
    ns_steps: int,
    eps: float,
    adjust_lr_fn,
    has_complex: bool,
    process_group=None,
) -> None:
    """The update of each parameter: momentum, orthogonalization by the parameter's path,
    decoupled weight decay, step of the adjusted learning rate."""
    lr = _to_scalar(lr)
    if has_complex:
        raise ValueError("Complex parameters are not supported")
    for i, param in enumerate(params):
        grad, buf = grads[i], momentum_bufs[i]
        if grad.ndim != 2:
            raise ValueError("Param gradient must be a 2D matrix")
        buf.lerp_(grad, 1 - momentum)
        update = grad.lerp(buf, momentum) if nesterov else buf

        if process_group is not None and _is_dtensor_shard(param):
            if _is_dtensor_shard1(param):
                ortho = _distributed_zeropower_via_newtonschulz(
                    update, ns_coefficients, ns_steps, eps, process_group)
                update = DTensor.from_local(ortho, param.device_mesh, param.placements,
                                            shape=param.shape, stride=param.stride())
            else:
                owner = i % dist.get_world_size(process_group)
                update = _owner_orthogonalize(update, param, owner, ns_coefficients, ns_steps,
                                              eps, process_group)
        else:
            update = _newtonschulz_orthogonalize(update, ns_coefficients, ns_steps, eps)

        param.mul_(1 - lr * weight_decay)
        param.add_(update, alpha=-_adjust_lr(lr, adjust_lr_fn, param.shape))
