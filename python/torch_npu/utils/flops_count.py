"""torch_npu.utils.FlopsCounter: the floating-point operations of the matmul, convolution and
fused-attention operators run on npu.

torch_npu counts in its operator kernels (a global counter; ``get_flops()`` returns
``[recorded, traversed]``: flops counted while not paused, and all flops since ``start()``).
Here a ``TorchDispatchMode`` entered by ``start()`` (on the calling thread; autograd's
backward threads inherit it) sees every operator and counts those with an npu tensor input,
with torch_npu's formulas: ``mm``/``addmm``/``bmm``/``baddbmm`` (``matmul`` and ``linear``
run through them) 2*M*N*K per product, ``convolution`` and ``convolution_backward``
(the grads asked for), ``npu_fusion_attention`` (Q@K^T + P@V, B*N*Sq*Skv*D each, GQA/MQA
counted at the query's heads) and ``npu_fusion_attention_grad`` (the four products of its
backward).
"""
import math
import threading
import warnings

import torch

__all__ = []


def _prod(xs):
    return math.prod(int(x) for x in xs)


def _mm(a, b):
    # A(..., m, k) @ B(..., k, n): 2 * k * prod(broadcast batch, m, n)
    batch = torch.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2])) if a.dim() > 2 or b.dim() > 2 else ()
    out = list(batch)
    if a.dim() >= 2:
        out.append(a.shape[-2])
    if b.dim() >= 2:
        out.append(b.shape[-1])
    return 2 * int(a.shape[-1]) * _prod(out)


def _bmm(a, b):
    return 2 * int(a.shape[0]) * int(a.shape[1]) * int(b.shape[2]) * int(a.shape[2])


def _conv_count(x_shape, w_shape, out_shape, transposed):
    conv_shape = out_shape if transposed else out_shape[2:]
    return _prod(conv_shape) * _prod(w_shape[2:]) * int(x_shape[0]) * int(w_shape[0]) * int(w_shape[1]) * 2


def _conv(args, kwargs, out):
    x, w = args[0], args[1]
    transposed = bool(args[6]) if len(args) > 6 else bool(kwargs.get("transposed", False))
    return _conv_count(list(x.shape), list(w.shape), list(out.shape), transposed)


def _t(shape):
    return [shape[1], shape[0]] + list(shape[2:])


def _conv_backward(args, kwargs, out):
    grad_output, x, w = args[0], args[1], args[2]
    transposed = bool(args[6]) if len(args) > 6 else bool(kwargs.get("transposed", False))
    mask = args[10] if len(args) > 10 else kwargs.get("output_mask", [True, True, True])
    grad_input, grad_weight = out[0], out[1]
    go, xs, ws = list(grad_output.shape), list(x.shape), list(w.shape)
    flops = 0
    if mask[0] and grad_input is not None:
        flops += _conv_count(go, ws, list(grad_input.shape), not transposed)
    if mask[1] and grad_weight is not None:
        gw = list(grad_weight.shape)
        if transposed:
            flops += _conv_count(_t(go), _t(xs), _t(gw), False)
        else:
            flops += _conv_count(_t(xs), _t(go), _t(gw), False)
    return flops


def _attention_shapes(q, k, v, head_num, layout, seq_q):
    """[B, N, S, D] shapes of q, k, v in torch_npu's layouts (kv heads taken as q's)."""
    q, k, v = list(q), list(k), list(v)
    if layout in ("SBH", "BSH", "BSND"):
        if q[2] != k[2] and q[2] != v[2]:
            k[2] = v[2] = q[2]
    elif q[1] != k[1] and q[1] != v[1]:
        k[1] = v[1] = q[1]
    if layout == "BSH":
        return ([q[0], head_num, q[1], q[2] // head_num], [k[0], head_num, k[1], k[2] // head_num],
                [v[0], head_num, v[1], v[2] // head_num])
    if layout == "SBH":
        return ([q[1], head_num, q[0], q[2] // head_num], [k[1], head_num, k[0], k[2] // head_num],
                [v[1], head_num, v[0], v[2] // head_num])
    if layout == "BNSD":
        return q, k, v
    if layout == "BSND":
        return [q[0], q[2], q[1], q[3]], [k[0], k[2], k[1], k[3]], [v[0], v[2], v[1], v[3]]
    if layout == "TND":
        b = len(seq_q or ())
        if b == 0:
            raise ValueError("FlopsCounter: actual_seq_qlen must not be empty for the TND layout")
        return [b, q[1], q[0] // b, q[2]], [b, k[1], k[0] // b, k[2]], [b, v[1], v[0] // b, v[2]]
    return None


def _fa_args(args, kwargs):
    q, k, v = args[0], args[1], args[2]
    return q, k, v, args[3], args[4], kwargs.get("actual_seq_qlen")


def _flash_forward(args, kwargs, out):
    q, k, v, head_num, layout, seq_q = _fa_args(args, kwargs)
    shapes = _attention_shapes(q.shape, k.shape, v.shape, int(head_num), layout, seq_q)
    if shapes is None:
        return 0
    (b, h, sq, dq), (_, _, sk, _), (_, _, _, dv) = shapes
    return b * h * sq * dq * sk + b * h * sq * sk * dv


def _flash_backward(args, kwargs, out):
    q, k, v = args[0], args[1], args[2]
    head_num, layout = args[4], args[5]
    shapes = _attention_shapes(q.shape, k.shape, v.shape, int(head_num), layout, kwargs.get("actual_seq_qlen"))
    if shapes is None:
        return 0
    (b, h, sq, dq), (_, _, sk, _), (_, _, _, dv) = shapes
    return b * h * sq * dv * sk + b * h * sk * sq * dv + b * h * sq * sk * dq + b * h * dq * sq * sk


def _formulas():
    aten = torch.ops.aten
    table = {
        aten.mm.default: lambda a, kw, out: _mm(a[0], a[1]),
        aten.addmm.default: lambda a, kw, out: _mm(a[1], a[2]),
        aten.bmm.default: lambda a, kw, out: _bmm(a[0], a[1]),
        aten.baddbmm.default: lambda a, kw, out: _bmm(a[1], a[2]),
        aten.convolution.default: _conv,
        aten.convolution_backward.default: _conv_backward,
    }
    npu = torch.ops.npu
    if hasattr(npu, "npu_fusion_attention"):
        table[npu.npu_fusion_attention.default] = _flash_forward
    if hasattr(npu, "npu_fusion_attention_grad"):
        table[npu.npu_fusion_attention_grad.default] = _flash_backward
    return table


def _is_npu(args, kwargs):
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor) and a.device.type == "npu":
            return True
    return False


def _make_mode(counter):
    from torch.utils._python_dispatch import TorchDispatchMode

    formulas = _formulas()

    class _FlopCountMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            formula = formulas.get(func)
            if formula is not None and _is_npu(args, kwargs):
                counter._add(formula(args, kwargs, out))
            return out

    return _FlopCountMode()


class _FlopsCounter:
    """Count the flops of the npu matmul / convolution / attention operators between
    ``start()`` and ``stop()``. ``get_flops()`` returns ``[recorded, traversed]``: flops
    counted outside ``pause()``/``resume()`` and all flops since ``start()``. ``stop()``
    ends counting and resets both counts."""

    def __init__(self, ):
        self.recorded_count = 0
        self.traversed_count = 0
        self._enabled = False
        self._paused = False
        self._mode = None
        self._lock = threading.Lock()  # backward's flops are counted on autograd's threads

    def _add(self, flops):
        with self._lock:
            if not self._enabled:
                return
            self.traversed_count += flops
            if not self._paused:
                self.recorded_count += flops

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self):
        if self._mode is None:
            self._mode = _make_mode(self)
            self._mode.__enter__()
        self._enabled = True

    def stop(self):
        self._enabled = False
        self._paused = False
        self.recorded_count = 0
        self.traversed_count = 0
        if self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(None, None, None)

    def pause(self):
        self._paused = True

    def resume(self):
        self._paused = False

    def get_flops(self):
        return [self.recorded_count, self.traversed_count]


class FlopsCounter(_FlopsCounter):
    def __init__(self):
        super().__init__()
        warnings.warn("torch_npu.utils.flops_count.FlopsCounter() will be deprecated. "
                      "If necessary, please use torch_npu.utils.FlopsCounter().", FutureWarning)
