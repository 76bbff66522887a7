"""Differential fuzzing of the asynchronous execution path.

``generate(seed)`` builds a random short op program: a list of ``Step(target, op, args, kwargs)``
that ``render`` prints as Python. ``run_program(program, device)`` runs it on npu (with the
process's TASK_QUEUE_ENABLE) or on cpu and returns its trace: every host read, the exception
that stopped the program if any, and every tensor alive at the end (a tensor of more than
4096 elements by digest). The npu traces of the three modes of MODES (the default, every
launch queued, the task queue off) must equal the cpu trace exactly, shapes, dtypes and values (nan equal to nan), with no tolerance: the simulator
runs the same CPU kernels, and generated values are multiples of 1/4, so that most sums do not
depend on their order anyway. On cpu, stream, event and record_stream steps do nothing, the
second device ``dev1`` is the cpu too, and an NPUGraph runs its body once per replay.

Programs are correct for an asynchronous device, as CUDA requires: a side stream waits for the
current stream before using its tensors and is joined before its results are used; a tensor
used on a side stream is deleted during that use only after ``record_stream``; a non-blocking
copy to the host is read after a synchronisation; pinned host memory is not written once a copy
used it; indices are in range (a kernel's own error surfaces at the next synchronisation when
the stream is busy, by design); matmuls are float32, as the NPU's op table requires.

  python async_fuzz.py --programs N --start S   seeds [S, S+N): npu async, queued and sync vs cpu
  python async_fuzz.py --show SEED              print one program
"""
import argparse
import copy
import gc
import hashlib
import math
import os
import random
import subprocess
import sys
import tempfile
import time
import warnings
from typing import NamedTuple

import torch

FULL_VALUES = 4096          # larger tensors are compared by digest
SMALL_DIMS = (1, 2, 3, 4, 5, 8)
SLEEP_CYCLES = 1_800_000    # 1 ms of the simulated AI Core
BIG_SHAPES = ((40000,), (33000,), (200, 200), (2, 130, 130), (181, 182))
MAX_NEW_ELEMENTS = 1 << 18     # above every shape the generator draws itself
DTYPES = (torch.float32, torch.float32, torch.float64, torch.int64, torch.bool)


# ----------------------------------------------------------------------------- values

def make(shape, dtype, seed, device="cpu", requires_grad=False, special=False):
    """A deterministic tensor: integers in [-9, 9], multiples of 1/4 in [-4, 4] (with
    ``special``, some nan, inf, -inf and -0.0), or booleans."""
    g = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        t = torch.randint(0, 2, shape, generator=g).bool()
    elif dtype.is_floating_point:
        t = torch.randint(-16, 17, shape, generator=g).to(dtype) / 4
        if special:
            odd = torch.tensor([math.nan, math.inf, -math.inf, -0.0], dtype=dtype)
            pick = torch.randint(0, 4, shape, generator=g)
            t = torch.where(torch.rand(shape, generator=g) < 0.2, odd[pick], t)
    else:
        t = torch.randint(-9, 10, shape, generator=g, dtype=dtype)
    t = t.to(device, copy=True)
    return t.requires_grad_() if requires_grad else t


def randidx(shape, high, seed, device="cpu", unique=False):
    """A deterministic int64 index tensor with values in [0, high) (distinct with ``unique``)."""
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    if unique:
        idx = torch.randperm(high, generator=g)[:n].reshape(shape)
    elif high > 0:
        idx = torch.randint(0, high, shape, generator=g)
    else:
        idx = torch.zeros(shape, dtype=torch.long)
    return idx.to(device, copy=True)


def kind(x):
    """'f', 'i' or 'b' for a tensor, dtype or Python number."""
    dtype = x.dtype if isinstance(x, torch.Tensor) else x
    if dtype is bool or dtype is torch.bool:
        return "b"
    if dtype is int or dtype is torch.int64:
        return "i"
    return "f"


# ----------------------------------------------------------------------------- programs

class Ref(str):
    """The name of a value of a program."""


class Sym:
    """A value that depends on the target: the device, the host, the current stream."""

    def __init__(self, code):
        self.code = code

    def __repr__(self):
        return self.code


DEV, DEV1, HOST, CUR = Sym("dev"), Sym("dev1"), Sym('"cpu"'), Sym("torch.npu.current_stream()")


class Step(NamedTuple):
    target: object      # None, a name, or a tuple of names
    op: str             # "torch.add", ".add_" (a method of args[0]), "make", or a special op
    args: tuple
    kwargs: dict


def _fmt(x):
    if isinstance(x, Ref):
        return str(x)
    if isinstance(x, Sym):
        return x.code
    if isinstance(x, torch.dtype):
        return str(x)
    if isinstance(x, float) and not math.isfinite(x):
        return f'float("{x}")'
    if isinstance(x, slice):
        text = ("" if x.start is None else _fmt(x.start)) + ":" + ("" if x.stop is None else _fmt(x.stop))
        return text if x.step is None else f"{text}:{_fmt(x.step)}"
    if isinstance(x, tuple):
        return "(" + ", ".join(map(_fmt, x)) + ("," if len(x) == 1 else "") + ")"
    if isinstance(x, list):
        return "[" + ", ".join(map(_fmt, x)) + "]"
    return repr(x)


def _fmt_index(idx):
    return ", ".join(map(_fmt, idx)) if isinstance(idx, tuple) and idx else _fmt(idx)


def _call_code(op, args, kwargs):
    parts = [_fmt(a) for a in args] + [f"{k}={_fmt(v)}" for k, v in kwargs.items()]
    if op.startswith("."):
        return f"{parts[0]}{op}({', '.join(parts[1:])})"
    return f"{op}({', '.join(parts)})"


SPECIAL_CODE = {
    "getitem": lambda a, idx: f"{_fmt(a)}[{_fmt_index(idx)}]",
    "setitem": lambda a, idx, v: f"{_fmt(a)}[{_fmt_index(idx)}] = {_fmt(v)}",
    "getattr": lambda a, attr: f"{_fmt(a)}.{attr}",
    "del": lambda name: f"del {name}",
    "item": lambda a: f"{_fmt(a)}.item()",
    "tolist": lambda a: f"{_fmt(a)}.tolist()",
    "shape": lambda a: f"list({_fmt(a)}.shape)",
    "host": lambda a: f"{_fmt(a)}.cpu()",
    "stream": lambda: "torch.npu.Stream()",
    "event": lambda: "torch.npu.Event()",
    "graph": lambda: "torch.npu.NPUGraph()",
    "enter_stream": lambda s: f"with torch.npu.stream({_fmt(s)}):",
    "enter_graph": lambda g: f"with torch.npu.graph({_fmt(g)}):",
    "exit": lambda: None,
    "exit_graph": lambda g: None,
    "replay": lambda g: f"{_fmt(g)}.replay()",
    "sync": lambda: "torch.npu.synchronize()",
    "sleep": lambda: f"torch.npu._sleep({SLEEP_CYCLES})",
    "empty_cache": lambda: "torch.npu.empty_cache()",
    "record_stream": lambda t, s: f"{_fmt(t)}.record_stream({_fmt(s)})",
    "pin": lambda h: f"{_fmt(h)}.pin_memory()",
    "to_device": lambda h, non_blocking: f"{_fmt(h)}.to(dev, non_blocking={non_blocking})",
    "to_device1": lambda h, non_blocking: f"{_fmt(h)}.to(dev1, non_blocking={non_blocking})",
    "generator": lambda seed: f"torch.Generator(device=dev).manual_seed({seed})",
    "random": lambda op, *args, **kwargs: _call_code(op, args, kwargs),
    "empty_pinned": lambda shape, dtype: f"torch.empty({_fmt(shape)}, dtype={_fmt(dtype)}, pin_memory=True)",
    "fill_tail": lambda t, k, v: f"{_fmt(t)}.view(-1)[{k}:].fill_({_fmt(v)})",
}


def step_code(step):
    """One step as a line of Python (None for the end of a ``with`` block)."""
    if step.op in SPECIAL_CODE:
        code = SPECIAL_CODE[step.op](*step.args, **step.kwargs)
    else:
        code = _call_code(step.op, step.args, step.kwargs)
    if code is None or step.target is None:
        return code
    target = ", ".join(step.target) if isinstance(step.target, tuple) else step.target
    return f"{target} = {code}"


def render(program, seed=None):
    """The program as runnable Python, each line ending with its step number."""
    lines = [] if seed is None else [f"# seed {seed}"]
    lines += ["import torch, torch_npu", "from async_fuzz import make, randidx", 'dev, dev1 = "npu", "npu:1"']
    depth, opened = 0, False
    for i, step in enumerate(program):
        code = step_code(step)
        if code is None:
            if opened:
                lines.append("    " * depth + "pass")
            depth, opened = depth - 1, False
            continue
        lines.append(f"{'    ' * depth}{code}  # {i}")
        opened = code.startswith("with ")
        depth += opened
    return "\n".join(lines)


# ----------------------------------------------------------------------------- execution

class NullStream:
    """torch.npu.Stream on the cpu target."""

    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass

    def synchronize(self):
        pass


class NullEvent:
    """torch.npu.Event on the cpu target."""

    def record(self, stream=None):
        pass

    def wait(self, stream=None):
        pass

    def synchronize(self):
        pass


NULL_STREAM = NullStream()


class CpuGraph:
    """torch.npu.NPUGraph on the cpu target: capture runs the body and undoes its writes to
    existing memory; a replay runs the body again and copies new outputs into the captured ones."""

    def begin(self, run):
        storages = {}
        for v in run.env.values():
            if isinstance(v, torch.Tensor):
                st = v.untyped_storage()
                storages.setdefault(st._cdata, st)
        self.saved = [(st, st.clone()) for st in storages.values()]
        self.before, self.body = set(run.env), []
        run.capture = self

    def end(self, run):
        for st, old in self.saved:
            st.copy_(old)
        self.created = [n for n in run.env if n not in self.before]
        self.saved, run.capture = None, None

    def replay(self, run):
        scratch = Run(run.device)
        scratch.env = dict(run.env)
        for step in self.body:
            execute(step, scratch)
        for name in self.created:
            t = run.env.get(name)
            if isinstance(t, torch.Tensor) and t._base is None:
                t.copy_(scratch.env[name])


class Run:
    """The state of one run of a program on one target."""

    def __init__(self, device):
        self.device = device
        self.npu = device != "cpu"
        self.device1 = "npu:1" if self.npu else "cpu"
        self.env = {}
        self.trace = []
        self.contexts = []
        self.capture = None
        self.step = 0

    def read(self, value):
        self.trace.append((self.step, "read", snapshot(value), None))
        return value


def _resolve(x, run):
    if isinstance(x, Ref):
        return run.env[x]
    if x is DEV:
        return run.device
    if x is DEV1:
        return run.device1
    if x is HOST:
        return "cpu"
    if x is CUR:
        return torch.npu.current_stream() if run.npu else NULL_STREAM
    if isinstance(x, (list, tuple)):
        return type(x)(_resolve(v, run) for v in x)
    if isinstance(x, dict):
        return {k: _resolve(v, run) for k, v in x.items()}
    return x


def _enter(run, manager):
    if manager is not None:
        manager.__enter__()
    run.contexts.append(manager)


def _exit(run):
    manager = run.contexts.pop()
    if manager is not None:
        manager.__exit__(None, None, None)


def _enter_graph(run, g):
    if run.npu:
        _enter(run, torch.npu.graph(g))
    else:
        g.begin(run)
        run.contexts.append(g)


def _exit_graph(run, g):
    if run.npu:
        run.contexts.pop().__exit__(None, None, None)
    else:
        run.contexts.pop()
        g.end(run)


def _random(run, op, *args, **kwargs):
    """A random op (``torch.<name>`` or ``.<method>``). The cpu target runs it on npu copies of
    its tensors with its npu generators and takes the results back: the npu's numbers are the
    oracle of themselves, the rest of the program checks how they flow."""
    fn = (lambda a, *rest, **kw: getattr(a, op[1:])(*rest, **kw)) if op.startswith(".") else _function(op)
    if run.npu:
        return fn(*args, **kwargs)
    on_npu = [a.to("npu") if isinstance(a, torch.Tensor) else a for a in args]
    out = fn(*on_npu, **{k: "npu" if k == "device" else v for k, v in kwargs.items()})
    if op.startswith("."):  # in place: the cpu tensor takes the numbers
        args[0].copy_(on_npu[0].cpu())
        return args[0]
    return out.cpu()


def _setitem(run, a, idx, v):
    a[idx] = v


def _record_stream(run, t, s):
    if run.npu:
        t.record_stream(s)


SPECIAL = {
    "getitem": lambda run, a, idx: a[idx],
    "setitem": _setitem,
    "getattr": lambda run, a, attr: getattr(a, attr),
    "item": lambda run, a: run.read(a.item()),
    "tolist": lambda run, a: run.read(a.tolist()),
    "shape": lambda run, a: run.read(list(a.shape)),
    "host": lambda run, a: run.read(a.cpu() if run.npu else a.clone()),
    "stream": lambda run: torch.npu.Stream() if run.npu else NullStream(),
    "event": lambda run: torch.npu.Event() if run.npu else NullEvent(),
    "graph": lambda run: torch.npu.NPUGraph() if run.npu else CpuGraph(),
    "enter_stream": lambda run, s: _enter(run, torch.npu.stream(s) if run.npu else None),
    "enter_graph": _enter_graph,
    "exit": _exit,
    "exit_graph": _exit_graph,
    "replay": lambda run, g: g.replay() if run.npu else g.replay(run),
    "sync": lambda run: run.npu and torch.npu.synchronize(),
    "sleep": lambda run: run.npu and torch.npu._sleep(SLEEP_CYCLES),
    "empty_cache": lambda run: run.npu and torch.npu.empty_cache(),
    "record_stream": _record_stream,
    "pin": lambda run, h: h.pin_memory() if run.npu else h.clone(),
    "to_device": lambda run, h, non_blocking: h.to(run.device, non_blocking=non_blocking, copy=True),
    "to_device1": lambda run, h, non_blocking: h.to(run.device1, non_blocking=non_blocking, copy=True),
    "generator": lambda run, seed: torch.Generator(device=run.device if run.npu else "npu").manual_seed(seed),
    "random": _random,
    "empty_pinned": lambda run, shape, dtype: torch.empty(shape, dtype=dtype, pin_memory=run.npu),
    "fill_tail": lambda run, t, k, v: t.view(-1)[k:].fill_(v),
}
FUNCTIONS = {"make": make, "randidx": randidx}


def _function(op):
    if op in FUNCTIONS:
        return FUNCTIONS[op]
    fn = torch
    for part in op.split(".")[1:]:
        fn = getattr(fn, part)
    return fn


def call(step, run):
    """The value of ``step`` on ``run`` (not bound to its target)."""
    op, args, kwargs = step.op, _resolve(step.args, run), _resolve(step.kwargs, run)
    if op in SPECIAL:
        return SPECIAL[op](run, *args, **kwargs)
    if op.startswith("."):
        return getattr(args[0], op[1:])(*args[1:], **kwargs)
    return _function(op)(*args, **kwargs)


def execute(step, run):
    """Runs ``step`` on ``run`` and binds its result."""
    if run.capture is not None and step.op != "exit_graph":
        run.capture.body.append(step)
    if step.op == "del":
        del run.env[step.args[0]]
        return
    value = call(step, run)
    if isinstance(step.target, tuple):
        for name, v in zip(step.target, value):
            run.env[str(name)] = v
    elif step.target is not None:
        run.env[str(step.target)] = value


def snapshot(value):
    """A plain cpu copy of a read value (a digest for a large tensor)."""
    if not isinstance(value, torch.Tensor):
        return value
    t = value.detach().to("cpu", copy=True)
    if t.numel() <= FULL_VALUES:
        return t
    if t.is_floating_point():
        t = torch.where(t.isnan(), math.nan, t) + 0  # one nan, and -0.0 as 0.0
    data = hashlib.sha1(t.contiguous().numpy().tobytes()).hexdigest()
    return ("digest", tuple(t.shape), str(t.dtype), data)


def _unwind(run, error):
    while run.contexts:
        manager = run.contexts.pop()
        try:
            if isinstance(manager, CpuGraph):
                manager.end(run)
            elif manager is not None:
                manager.__exit__(type(error), error, error.__traceback__)
        except Exception:
            pass


def _record_final(run):
    for name, v in run.env.items():
        if not isinstance(v, torch.Tensor):
            continue
        expected = torch.device({"t": run.device, "u": run.device1, "h": "cpu"}[name[0]])
        on_expected = v.device.type == expected.type and (v.device.index or 0) == (expected.index or 0)
        run.trace.append((run.step, name, (on_expected, v.requires_grad, snapshot(v)), None))
        if v.is_leaf and v.grad is not None:
            run.trace.append((run.step, f"{name}.grad", snapshot(v.grad), None))


def run_program(program, device):
    """Runs ``program`` on "npu" or "cpu"; returns its trace, a list of
    ``(step, label, value, message)``: host reads, the exception, the tensors alive at the end."""
    if device != "cpu":
        import torch_npu  # noqa: F401
    run = Run(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            for run.step, step in enumerate(program):
                execute(step, run)
        except Exception as error:
            run.trace.append((run.step, "raises", type(error).__name__, str(error)[:500]))
            _unwind(run, error)
        run.step = len(program)
        try:
            if run.npu:
                torch.npu.synchronize()
            _record_final(run)
        except Exception as error:
            run.trace.append((run.step, "raises", type(error).__name__, str(error)[:500]))
        finally:
            if run.npu:
                try:
                    torch.npu.synchronize()
                except Exception:
                    pass
                torch.npu.set_stream(torch.npu.default_stream())
    return run.trace


# ----------------------------------------------------------------------------- generation

UNARY = {   # op: input kinds (ops of float results promote integer inputs)
    "neg": "fi", "abs": "fi", "square": "fi", "sign": "fi", "relu": "fi",
    "exp": "fi", "sin": "fi", "cos": "fi", "tanh": "fi", "sigmoid": "fi", "sqrt": "fi",
    "rsqrt": "fi", "log": "fi", "reciprocal": "fi", "erf": "fi", "expm1": "fi", "log1p": "fi",
    "atan": "fi", "exp2": "fi", "floor": "f", "ceil": "f", "round": "f", "trunc": "f",
    "frac": "f", "nan_to_num": "f", "isnan": "fib", "isfinite": "fib", "signbit": "fi",
    "logical_not": "fib", "bitwise_not": "ib",
}
BINARY = {  # op: operand kinds
    "add": "fib", "sub": "fi", "mul": "fib", "div": "fi", "maximum": "fib", "minimum": "fib",
    "atan2": "fi", "fmod": "f", "remainder": "f", "hypot": "f", "copysign": "f",
    "eq": "fib", "ne": "fib", "lt": "fib", "le": "fib", "gt": "fib", "ge": "fib",
    "logical_and": "fib", "logical_or": "fib", "logical_xor": "fib",
    "bitwise_and": "ib", "bitwise_or": "ib", "bitwise_xor": "ib",
}
REDUCE = {  # op: input kinds
    "sum": "fib", "mean": "f", "prod": "fi", "amax": "fi", "amin": "fi", "max": "fi", "min": "fi",
    "argmax": "fi", "argmin": "fi", "all": "fib", "any": "fib", "std": "f", "var": "f",
    "norm": "f", "logsumexp": "f", "count_nonzero": "fib", "nansum": "f",
}
CONVERSIONS = {torch.float32: ".float", torch.float64: ".double", torch.int64: ".long", torch.bool: ".bool"}
NO_OUT = {"torch.relu", "torch.count_nonzero", "torch.isnan", "torch.isfinite", "torch.unique", "torch.roll",
          "torch.flip"}
NUMBER_OK = {"add", "sub", "mul", "div", "fmod", "remainder", "copysign", "eq", "ne", "lt", "le", "gt", "ge",
             "bitwise_and", "bitwise_or", "bitwise_xor"}   # binary ops that take a Python number


class Book:
    """What the generator knows beyond the shadow run: stream and graph rules."""

    def __init__(self):
        self.counter = 0
        self.streams = []
        self.frozen = set()       # names used by a captured graph
        self.graphs = {}          # graph -> its names
        self.pending = {}         # host tensor -> stream of its non-blocking copy
        self.fork = None          # {"stream", "touched", "created", "recorded"} while a side stream runs
        self.side = False         # inside ``with torch.npu.stream(side)``
        self.capturing = None     # the set of names a capture uses
        self.current = None       # the side stream while inside it
        self.pinned = set()       # pinned host tensors (written by the host only before use)


def falls_back(op):
    """Whether an op of the program ("torch.hypot", ".copysign_") has an ATen overload that
    runs through torch_npu's CPU fallback in this build."""
    from torch_npu import _op_table
    base = op.rsplit(".", 1)[-1].rstrip("_")
    return any(name.split(".")[0] == base for name in _op_table.UNSUPPORTED)


class Skip(Exception):
    """The family does not apply here."""


class Builder:
    """Grows a random program step by step. Each step runs on a cpu shadow right away, which
    gives shapes, dtypes and values; a step that raises is taken back, unless the family
    expected the error (the program then ends there)."""

    def __init__(self, seed):
        self.seed = seed
        self.rng = random.Random(seed)
        self.steps = []
        self.shadow = Run("cpu")
        self.book = Book()
        self.may_fail = False     # the next step may raise: the program then ends there
        self.fragile = False      # the call being built may raise

    # --- bookkeeping

    def name(self, prefix):
        self.book.counter += 1
        return Ref(f"{prefix}{self.book.counter - 1}")

    def emit(self, target, op, *args, **kwargs):
        if self.book.capturing is not None and falls_back(op):
            raise Skip  # a CPU fallback copies to the host: a capturing stream refuses it, as on torch_npu
        step = Step(target, op, args, kwargs)
        self.steps.append(step)
        self.shadow.step = len(self.steps) - 1
        execute(step, self.shadow)
        self.may_fail = False
        if op in ("pin", "empty_pinned") or (op == ".to" and HOST in args):
            self.book.pinned.add(str(target))
        names = _names(step)
        if self.book.side:
            self.book.fork["touched"].update(names)
            if target is not None:
                self.book.fork["created"].update(target if isinstance(target, tuple) else [target])
        if self.book.capturing is not None:
            self.book.capturing.update(names)
        return target

    def value(self, name):
        return self.shadow.env[name]

    def group(self, name):
        return self.shadow.env[name].untyped_storage()._cdata

    def groups(self, names):
        return {self.group(n) for n in names if isinstance(self.shadow.env.get(n), torch.Tensor)}

    def try_family(self, family):
        """Runs a family; takes its steps back if it raises unexpectedly."""
        mark, book = len(self.steps), copy.deepcopy(self.book)
        self.may_fail = self.fragile = False
        try:
            family()
            return True
        except Exception as error:
            if self.may_fail and not isinstance(error, Skip) and not self.strict():
                raise Finished from error
            self.rollback(mark, book)
            return False

    def rollback(self, mark, book):
        del self.steps[mark:]
        self.book = book
        self.shadow = Run("cpu")
        for i, step in enumerate(self.steps):
            self.shadow.step = i
            execute(step, self.shadow)

    def strict(self):
        return self.book.fork is not None or self.book.capturing is not None

    def tensors(self, kinds="fib", write=False, host=False, numel=None, rank=None, grad=True):
        """Names of tensors usable by the next step."""
        book, env = self.book, self.shadow.env
        avoid = set()
        if book.fork is not None and not book.side:
            avoid = self.groups(book.fork["touched"])
        if book.side:
            avoid = self.groups(book.frozen)
        names = []
        for n, v in env.items():
            if not isinstance(v, torch.Tensor) or n[0] != ("h" if host else "t") or kind(v) not in kinds:
                continue
            if n in book.pending or (v.requires_grad and (write or not grad or self.strict())):
                continue
            if numel is not None and not numel(v.numel()):
                continue
            if rank is not None and v.dim() not in rank:
                continue
            if avoid and self.group(n) in avoid:
                continue
            names.append(Ref(n))
        return names

    def pick(self, names):
        if not names:
            raise Skip
        return self.rng.choice(names)

    # --- values

    def shape(self, rank=None):
        rng = self.rng
        rank = rng.choice((0, 1, 1, 2, 2, 2, 3, 3, 4)) if rank is None else rank
        return tuple(0 if rng.random() < 0.04 else rng.choice(SMALL_DIMS) for _ in range(rank))

    def dtype(self, kinds="fib"):
        return self.rng.choice([d for d in DTYPES if kind(d) in kinds])

    def scalar(self, k):
        rng = self.rng
        if k == "b":
            return rng.random() < 0.5
        if k == "i":
            return rng.randint(-3, 4)
        return rng.choice((0.5, -1.25, 2.0, 3.0, -0.75, 0.25))

    def seed_arg(self):
        return self.rng.randrange(1 << 30)

    def new(self, shape=None, dtype=None, big=False, host=False):
        """A new tensor on the device (or the host); returns its name."""
        if self.book.capturing is not None:
            raise Skip
        rng = self.rng
        if shape is None:
            shape = rng.choice(BIG_SHAPES) if big else self.shape()
        if math.prod(shape) > MAX_NEW_ELEMENTS:
            raise Skip  # the shape of an expanded view (stride 0): a copy could take gigabytes
        dtype = dtype or self.dtype()
        style = rng.random()
        if host or style < 0.6 or math.prod(shape) == 0:
            special = dtype.is_floating_point and rng.random() < 0.1
            extra = {"special": True} if special else {}
            device = HOST if host else DEV
            return self.emit(self.name("h" if host else "t"), "make", shape, dtype, seed=self.seed_arg(),
                             device=device, **extra)
        if style < 0.7 and dtype is not torch.bool:
            flat = self.emit(self.name("t"), "torch.arange", math.prod(shape), dtype=dtype, device=DEV)
            return self.emit(self.name("t"), ".reshape", Ref(flat), shape)
        if style < 0.85:
            return self.emit(self.name("t"), "torch.full", shape, self.scalar(kind(dtype)), dtype=dtype, device=DEV)
        if style < 0.92:
            return self.emit(self.name("t"), rng.choice(("torch.zeros", "torch.ones")), shape, dtype=dtype,
                             device=DEV)
        h = self.emit(self.name("h"), "make", shape, dtype, seed=self.seed_arg(), device=HOST)
        pinned = self.emit(self.name("h"), "pin", Ref(h))
        return self.emit(self.name("t"), "to_device", Ref(pinned), non_blocking=True)

    def operand(self, shape, kinds, numbers=True, host=True):
        """A second operand for an elementwise op whose result has ``shape``: a Python number, a
        0-dim host tensor, or a device tensor that broadcasts."""
        rng = self.rng
        r = rng.random()
        if numbers and r < 0.2:
            scalars = [Ref(n) for n, v in self.shadow.env.items()
                       if n[0] == "x" and type(v) in (bool, int, float) and kind(type(v)) in kinds]
            if scalars and rng.random() < 0.3:
                return rng.choice(scalars)
            return self.scalar(rng.choice(kinds))
        if host and 0.2 <= r < 0.27 and self.book.capturing is None:
            return Ref(self.new((), self.dtype(kinds), host=True))
        fits = [n for n in self.tensors(kinds) if _broadcasts_to(self.value(n).shape, shape)]
        if fits and (rng.random() < 0.6 or self.book.capturing is not None):
            n = rng.choice(fits)
            if rng.random() < 0.1 and self.value(n).dim() >= 1 and len(shape) > self.value(n).dim():
                return Ref(self.emit(self.name("t"), ".expand", n, shape))
            return n
        sub = list(shape[rng.randint(0, len(shape)):]) if shape else []
        for d in range(len(sub)):
            if rng.random() < 0.3:
                sub[d] = 1
        return Ref(self.new(tuple(sub), self.dtype(kinds)))

    # --- calls: (op, args, kwargs, number of outputs) of functional ops

    def call_unary(self):
        a = self.pick(self.tensors())
        ops = [op for op, kinds in UNARY.items() if kind(self.value(a)) in kinds]
        op = self.rng.choice(ops)
        if self.rng.random() < 0.3:
            return "." + op, (a,), {}, 1
        return "torch." + op, (a,), {}, 1

    def call_binary(self):
        rng = self.rng
        a = self.pick(self.tensors())
        ops = [op for op, kinds in BINARY.items() if kind(self.value(a)) in kinds]
        op = rng.choice(ops)
        b = self.operand(tuple(self.value(a).shape), BINARY[op], numbers=op in NUMBER_OK)
        kinds = self.kinds(a, b)
        kwargs = {}
        if op in ("add", "sub") and rng.random() < 0.2:
            kwargs["alpha"] = 0.5 if "f" in kinds else rng.choice((2, -1))
        if op == "div" and rng.random() < 0.3 and kinds == {"f"}:
            kwargs["rounding_mode"] = rng.choice(("trunc", "floor"))
        if rng.random() < 0.5 and isinstance(b, Ref) and b[0] == "t":
            a, b = b, a
        return "torch." + op, (a, b), kwargs, 1

    def kinds(self, *operands):
        values = [self.shadow.env[o] if isinstance(o, Ref) else o for o in operands]
        return {kind(v if isinstance(v, torch.Tensor) else type(v)) for v in values}

    def call_reduce(self):
        rng = self.rng
        a = self.pick(self.tensors())
        t = self.value(a)
        op = rng.choice([op for op, kinds in REDUCE.items() if kind(t) in kinds])
        self.fragile = t.numel() == 0
        r = max(t.dim(), 1)
        kwargs = {}
        if op in ("max", "min", "prod", "logsumexp", "argmax", "argmin") or rng.random() < 0.6:
            dim = rng.randrange(-r, r)
            if op in ("sum", "mean", "amax", "amin", "std", "var", "all", "any", "nansum") \
                    and t.dim() >= 2 and rng.random() < 0.3:
                dim = tuple(sorted(rng.sample(range(t.dim()), 2)))
            kwargs["dim"] = dim
            if op != "count_nonzero":
                kwargs["keepdim"] = rng.random() < 0.3
        if op in ("std", "var") and rng.random() < 0.5:
            kwargs["correction"] = 0
        if op == "sum" and rng.random() < 0.15:
            kwargs["dtype"] = rng.choice((torch.float64, torch.int64)) if kind(t) != "f" else torch.float64
        if op in ("argmax", "argmin") and rng.random() < 0.3:
            kwargs = {}
        nout = 2 if op in ("max", "min") and "dim" in kwargs else 1
        if rng.random() < 0.3:
            return "." + op, (a,), kwargs, nout
        return "torch." + op, (a,), kwargs, nout

    def call_matmul(self):
        rng = self.rng
        form = rng.choice(("mm", "mm", "bmm", "matmul", "addmm", "dot", "outer"))
        dtype = self.dtype("fi") if form in ("dot", "outer") else torch.float32   # the NPU's matmuls
        big = rng.random() < 0.08 and dtype is torch.float32
        n, m, p = (200, 200, 200) if big else (rng.choice(SMALL_DIMS + (0,)) for _ in range(3))
        pairs = {"mm": ((n, m), (m, p)), "addmm": ((n, m), (m, p)), "dot": ((m,), (m,)),
                 "outer": ((n,), (p,)), "bmm": ((2, n, m), (2, m, p))}
        if form == "matmul":
            pairs[form] = rng.choice((((m,), (m, p)), ((n, m), (m,)), ((3, n, m), (m, p)), ((n, m), (2, m, p))))
        sa, sb = pairs[form]
        a = self.existing_or_new(sa, dtype)
        b = self.existing_or_new(sb, dtype)
        if form == "addmm":
            bias = self.existing_or_new(rng.choice(((p,), (n, p), (1, p))), dtype)
            scale = {"beta": rng.choice((1, 2)), "alpha": rng.choice((1, -1))} if rng.random() < 0.5 else {}
            return "torch.addmm", (bias, a, b), scale, 1
        return "torch." + form, (a, b), {}, 1

    def existing_or_new(self, shape, dtype):
        fits = [n for n in self.tensors() if tuple(self.value(n).shape) == shape and self.value(n).dtype == dtype]
        if fits and (self.rng.random() < 0.5 or self.book.capturing is not None):
            return self.rng.choice(fits)
        return Ref(self.new(shape, dtype))

    def call_index(self):
        rng = self.rng
        capturing = self.book.capturing is not None
        form = rng.choice(("cat", "stack", "where") if capturing else
                          ("cat", "stack", "where", "index_select", "gather", "take", "getitem",
                           "getitem_host", "masked_select", "nonzero", "getitem_mask", "unique"))
        a = self.pick(self.tensors(rank=None if form in ("cat", "stack", "where", "nonzero") else (1, 2, 3)))
        t = self.value(a)
        shape = tuple(t.shape)
        if form in ("cat", "stack"):
            if form == "cat" and t.dim() == 0:
                raise Skip
            dim = rng.randrange(t.dim() + (form == "stack")) if t.dim() or form == "stack" else 0
            others = []
            for _ in range(rng.randint(1, 2)):
                s = list(shape)
                if form == "cat":
                    s[dim] = rng.choice((0, 1, 2, 3))
                others.append(self.existing_or_new(tuple(s), t.dtype if rng.random() < 0.8 else self.dtype()))
            return "torch." + form, ([a] + others, dim), {}, 1
        if form == "where":
            cond = self.operand(shape, "b", numbers=False, host=False)
            return "torch.where", (cond, a, self.operand(shape, "fib")), {}, 1
        if form == "masked_select":
            return "torch.masked_select", (a, Ref(self.new(shape, torch.bool))), {}, 1
        if form == "nonzero":
            return "torch.nonzero", (a,), {}, 1
        if form == "unique":
            return "torch.unique", (a,), {"sorted": True, "return_counts": rng.random() < 0.5}, 1
        if form == "getitem_mask":
            return "getitem", (a, Ref(self.new(shape, torch.bool))), {}, 1
        dim = rng.randrange(t.dim())
        size = shape[dim]
        if form == "take":
            if t.numel() == 0:
                raise Skip
            idx = self.emit(self.name("t"), "randidx", (rng.randint(0, 6),), t.numel(), seed=self.seed_arg(),
                            device=DEV)
            return "torch.take", (a, Ref(idx)), {}, 1
        if size == 0:
            raise Skip
        if form == "gather":
            ishape = tuple(rng.randint(0, s) if d != dim else rng.randint(0, 4) for d, s in enumerate(shape))
            idx = self.emit(self.name("t"), "randidx", ishape, size, seed=self.seed_arg(), device=DEV)
            return "torch.gather", (a, dim, Ref(idx)), {}, 1
        device = HOST if form == "getitem_host" else DEV
        idx = self.emit(self.name("h" if device is HOST else "t"), "randidx", (rng.randint(0, 5),), size,
                        seed=self.seed_arg(), device=device)
        if form == "index_select":
            return "torch.index_select", (a, dim, Ref(idx)), {}, 1
        return "getitem", (a, (slice(None),) * dim + (Ref(idx),)), {}, 1

    def call_scan(self):
        rng = self.rng
        a = self.pick(self.tensors("fi"))
        t = self.value(a)
        r = max(t.dim(), 1)
        dim = rng.randrange(-r, r)
        size = t.shape[dim] if t.dim() else 1
        form = rng.choice(("cumsum", "cumprod", "sort", "argsort", "topk", "kthvalue", "cummax", "flip", "roll",
                           "msort"))
        if form in ("cumsum", "cumprod", "cummax"):
            return "torch." + form, (a, dim), {}, 2 if form == "cummax" else 1
        if form in ("sort", "argsort"):
            kw = {"dim": dim, "descending": rng.random() < 0.5, "stable": rng.random() < 0.5}
            return "torch." + form, (a,), kw, 2 if form == "sort" else 1
        if form == "topk":
            kw = {"dim": dim, "largest": rng.random() < 0.5, "sorted": True}
            return "torch.topk", (a, rng.randint(0, size)), kw, 2
        if form == "kthvalue":
            if size == 0:
                raise Skip
            return "torch.kthvalue", (a, rng.randint(1, size), dim), {}, 2
        if form == "flip":
            return "torch.flip", (a, (dim,)), {}, 1
        if form == "roll":
            return "torch.roll", (a, rng.randint(-3, 3), dim), {}, 1
        return "torch.msort", (a,), {}, 1

    # --- families

    def fam_create(self):
        self.new(big=self.rng.random() < 0.15)

    def fam_compute(self):
        rng = self.rng
        builder = rng.choice((self.call_unary, self.call_binary, self.call_binary, self.call_reduce,
                              self.call_matmul, self.call_index, self.call_scan))
        op, args, kwargs, nout = builder()
        grad = any(isinstance(self.shadow.env.get(n), torch.Tensor) and self.value(n).requires_grad
                   for n in _names(Step(None, op, args, kwargs)))
        if rng.random() < 0.25 and op.startswith("torch.") and op not in NO_OUT and not grad \
                and self.book.capturing is None:
            return self.compute_out(op, args, kwargs, nout)
        target = tuple(self.name("t") for _ in range(nout)) if nout > 1 else self.name("t")
        self.may_fail = self.fragile
        self.emit(target, op, *args, **kwargs)

    def compute_out(self, op, args, kwargs, nout):
        """The op with out= tensors: of the right shape, of a wrong shape, empty, or of a wrong dtype."""
        rng = self.rng
        result = call(Step(None, op, args, kwargs), self.shadow)
        results = result if nout > 1 else (result,)
        inputs = self.groups(n for n in _names(Step(None, op, args, kwargs)))
        expect_error = self.fragile
        outs = []
        for r in results:
            choice = rng.random()
            shape, dtype = tuple(r.shape), r.dtype
            if choice < 0.3:
                fits = [n for n in self.tensors(write=True) if tuple(self.value(n).shape) == shape
                        and self.value(n).dtype == dtype and self.group(n) not in inputs]
                outs.append(Ref(self.pick(fits)) if fits else
                            Ref(self.emit(self.name("t"), "torch.zeros" if expect_error else "torch.empty",
                                          shape, dtype=dtype, device=DEV)))
            elif choice < 0.4 and len(shape) == 2:
                base = self.emit(self.name("t"), "torch.zeros", shape[::-1], dtype=dtype, device=DEV)
                outs.append(Ref(self.emit(self.name("t"), ".t", Ref(base))))
            elif choice < 0.75:
                wrong = rng.choice(((1,), (r.numel() + 3,), self.shape()))
                outs.append(Ref(self.emit(self.name("t"), "torch.zeros", wrong, dtype=dtype, device=DEV)))
            elif choice < 0.93 or nout > 1:
                outs.append(Ref(self.emit(self.name("t"), "torch.empty", (0,), dtype=dtype, device=DEV)))
            else:
                wrong = {"f": torch.int64, "i": torch.bool, "b": torch.bool}[kind(dtype)]
                expect_error = expect_error or wrong is not dtype
                outs.append(Ref(self.emit(self.name("t"), "torch.zeros", shape, dtype=wrong, device=DEV)))
        self.may_fail = expect_error
        self.emit(None, op, *args, **kwargs, out=outs[0] if nout == 1 else tuple(outs))
        if rng.random() < 0.5:
            self.emit(self.name("x"), "shape", outs[0])

    def view(self, a):
        """A view (or reshaped copy) of ``a``; returns its name."""
        rng = self.rng
        t = self.value(a)
        r, shape = t.dim(), tuple(t.shape)
        options = [("unsqueeze", rng.randint(-r - 1, r))]
        if r >= 1 and shape[0] > 1:
            lo = rng.randrange(shape[0])
            options.append(("getitem", (slice(lo, rng.randint(lo + 1, shape[0])),)))
            options.append(("getitem", (slice(None, None, 2),)))
            options.append(("narrow", 0, lo, shape[0] - lo))
        if r >= 1 and shape[0] > 0:
            options.append(("select", 0, rng.randrange(shape[0])))
        if r >= 2:
            options += [("transpose", 0, r - 1), ("diagonal",), ("permute", tuple(reversed(range(r))))]
            if shape[1] > 0:
                options.append(("getitem", (slice(None), rng.randrange(shape[1]))))
            if r == 2:
                options.append(("t",))
        if r >= 1:
            options += [("view", (-1,)), ("reshape", (-1,)), ("flatten",), ("squeeze",), ("detach",)]
            if t.numel() and t.numel() % 2 == 0:
                options.append(("view", (2, -1)))
            if t.numel() >= 2 and t.is_contiguous():
                options.append(("as_strided", (t.numel() // 2,), (2,), t.storage_offset()))
        op, *args = rng.choice(options)
        if op == "view":
            self.may_fail = not self.strict()
        if op == "getitem":
            return self.emit(self.name("t"), "getitem", a, args[0])
        return self.emit(self.name("t"), "." + op, a, *args)

    def fam_inplace(self):
        """An in-place op on a tensor or on a view of it, or an indexed assignment."""
        rng = self.rng
        a = self.pick(self.tensors(write=True))
        for _ in range(rng.choice((0, 1, 1, 2))):
            a = Ref(self.view(a))
        t = self.value(a)
        k, shape = kind(t), tuple(t.shape)
        form = rng.choice(("unary", "binary", "binary", "fill", "clamp", "copy", "masked_fill",
                           "setitem", "index", "index"))
        if form == "unary":
            op = rng.choice([op for op, kinds in UNARY.items() if k in kinds and op not in
                             ("isnan", "isfinite", "signbit")])
            self.may_fail = op in UNARY and k == "i" and op not in ("neg", "abs", "square", "sign", "relu")
            self.emit(None, f".{op}_", a)
        elif form == "binary":
            op = rng.choice([op for op, kinds in BINARY.items() if k in kinds and op not in ("maximum", "minimum")])
            self.emit(None, f".{op}_", a, self.operand(shape, BINARY[op], numbers=op in NUMBER_OK))
        elif form == "fill":
            if rng.random() < 0.3:
                self.emit(None, ".zero_", a)
            else:
                self.emit(None, ".fill_", a, self.scalar(k))
        elif form == "clamp":
            if k == "b":
                raise Skip
            lo = self.scalar(k)
            self.emit(None, ".clamp_", a, lo, lo + 2)
        elif form == "copy":
            src = self.operand(shape, "fib", numbers=False)
            self.check_conversion(src, t.dtype)
            self.emit(None, ".copy_", a, src)
        elif form == "masked_fill":
            self.emit(None, ".masked_fill_", a, self.operand(shape, "b", numbers=False, host=False), self.scalar(k))
        elif form == "setitem":
            if not shape or shape[0] == 0:
                raise Skip
            idx = rng.choice(((rng.randrange(shape[0]),), (slice(0, rng.randint(1, shape[0])),), (Ellipsis,)))
            sub = tuple(t[idx].shape)
            value = self.scalar(k) if rng.random() < 0.5 else self.operand(sub, k, numbers=False)
            if isinstance(value, Ref) and self.group(value) == self.group(a):
                raise Skip  # a 0-dim cpu value is filled in, a device one copied (which checks overlap)
            self.emit(None, "setitem", a, idx, value)
        else:
            self.index_inplace(a)

    def index_inplace(self, a):
        rng = self.rng
        t = self.value(a)
        shape = tuple(t.shape)
        if t.dim() == 0 or shape[0] == 0 or self.book.capturing is not None:
            raise Skip
        form = rng.choice(("scatter", "scatter_value", "scatter_add", "index_add", "index_copy", "index_fill",
                           "index_put", "setitem_mask"))
        dim = rng.randrange(t.dim())
        size = shape[dim]
        if size == 0:
            raise Skip
        if form in ("scatter", "scatter_value", "scatter_add"):
            ishape = tuple(rng.randint(0, s) for s in shape)
            idx = Ref(self.emit(self.name("t"), "randidx", ishape, size, seed=self.seed_arg(), device=DEV))
            if form == "scatter_value":
                return self.emit(None, ".scatter_", a, dim, idx, self.scalar(kind(t)))
            src = Ref(self.new(ishape, t.dtype))
            return self.emit(None, "." + form + "_", a, dim, idx, src)
        n = rng.randint(0, size)
        unique = form in ("index_copy", "index_put") and rng.random() < 0.9 or form == "index_copy"
        idx = Ref(self.emit(self.name("t"), "randidx", (n,), size, seed=self.seed_arg(), device=DEV, unique=unique))
        sub = list(shape)
        sub[dim] = n
        if form == "index_fill":
            return self.emit(None, ".index_fill_", a, dim, idx, self.scalar(kind(t)))
        if form == "index_put":
            sub = [n] + list(shape[1:])
            accumulate = not unique or rng.random() < 0.3
            values = self.operand(tuple(sub), kind(t), numbers=False, host=False)
            return self.emit(None, ".index_put_", a, (idx,), values, accumulate=accumulate)
        if form == "setitem_mask":
            return self.emit(None, "setitem", a, Ref(self.new(shape, torch.bool)), self.scalar(kind(t)))
        src = Ref(self.new(tuple(sub), t.dtype))
        if form == "index_add":
            return self.emit(None, ".index_add_", a, dim, idx, src)
        return self.emit(None, ".index_copy_", a, dim, idx, src)

    def check_conversion(self, src, dtype):
        """Float-to-integer conversion of nan, inf or huge values is undefined behaviour."""
        if kind(dtype) != "i" or not isinstance(src, Ref):
            return
        s = self.value(src)
        if s.is_floating_point() and not (s.isfinite() & (s.abs() < 2 ** 52)).all():
            raise Skip

    def fam_resize(self):
        """resize_ / resize_as_, then values for memory that has none; metadata-only in-place ops."""
        rng = self.rng
        frozen = self.groups(self.book.frozen)
        a = self.pick([n for n in self.tensors(write=True) if self.group(n) not in frozen])
        t = self.value(a)
        form = rng.choice(("resize", "resize", "resize_as", "set_", "t_", "unsqueeze_", "squeeze_"))
        if form == "set_":
            other = self.pick([n for n in self.tensors(write=True) if self.value(n).dtype == t.dtype
                               and self.group(n) not in frozen])
            return self.emit(None, ".set_", a, other)
        if form in ("t_", "unsqueeze_", "squeeze_"):
            if form == "t_" and t.dim() > 2:
                raise Skip
            return self.emit(None, "." + form, a, *((0,) if form == "unsqueeze_" else ()))
        storage_elems = t.untyped_storage().nbytes() // t.element_size()
        defined = storage_elems - t.storage_offset()
        if form == "resize":
            shape = rng.choice((self.shape(), self.shape(), (rng.randint(0, 3 * t.numel() + 4),),
                                rng.choice(BIG_SHAPES)))
            self.emit(None, ".resize_", a, shape)
        else:
            self.emit(None, ".resize_as_", a, self.pick(self.tensors()))
        if max(defined, 0) < self.value(a).numel():
            self.emit(None, "fill_tail", a, max(defined, 0), self.scalar(kind(t)))

    def fam_copy(self):
        """copy_ between dtypes, layouts and devices; conversions."""
        rng = self.rng
        a = self.pick(self.tensors(write=True))
        t = self.value(a)
        shape = tuple(t.shape)
        form = rng.choice(("device", "strided", "host", "convert"))
        if form == "convert" and t.dim() == 4 and rng.random() < 0.5:
            # Not .contiguous(memory_format=...): on npu it raises ERR01007 for channels_last, as
            # torch_npu's does; .to copies into the layout on every device.
            return self.emit(self.name("t"), ".to", a, memory_format=torch.channels_last)
        if form == "convert":
            dtype = self.dtype()
            self.check_conversion(a, dtype)
            if rng.random() < 0.5:
                return self.emit(self.name("t"), ".to", a, dtype)
            return self.emit(self.name("t"), CONVERSIONS[dtype], a)
        if form == "device":
            src = self.operand(shape, "fib", numbers=False, host=False)
        elif form == "strided":
            if t.dim() < 2:
                raise Skip
            base = Ref(self.new(shape[:-2] + (shape[-1], shape[-2]), self.dtype()))
            src = Ref(self.emit(self.name("t"), ".transpose", base, -1, -2))
        else:
            hosts = [h for h in self.tensors(host=True) if tuple(self.value(h).shape) == shape]
            src = rng.choice(hosts) if hosts and rng.random() < 0.5 else Ref(self.new(shape, self.dtype(), host=True))
            if rng.random() < 0.5:
                src = Ref(self.emit(self.name("h"), "pin", src))
        if isinstance(src, Ref) and self.group(src) == self.group(a):
            raise Skip
        self.check_conversion(src, t.dtype)
        self.emit(None, ".copy_", a, src, non_blocking=rng.random() < 0.5)

    def fam_transfer(self):
        """Copies between device and host, blocking and not."""
        rng = self.rng
        form = rng.choice(("d2h", "d2h_async", "d2h_pinned", "d2h_pageable", "h2d", "h2d", "host_read"))
        if form == "h2d":
            hosts = self.tensors(host=True)
            h = rng.choice(hosts) if hosts and rng.random() < 0.5 else Ref(self.new(host=True))
            if rng.random() < 0.6:
                h = Ref(self.emit(self.name("h"), "pin", h))
            return self.emit(self.name("t"), "to_device", h, non_blocking=rng.random() < 0.7)
        if form == "host_read":
            h = self.pick(self.tensors(host=True, numel=lambda n: n <= 64))
            return self.emit(self.name("x"), "tolist", h)
        a = self.pick(self.tensors(grad=False))
        if form == "d2h":
            return self.emit(self.name("h"), "host", a)
        if form == "d2h_pageable":
            t = self.value(a)
            h = self.emit(self.name("h"), "torch.zeros", tuple(t.shape), dtype=t.dtype, device=HOST)
            return self.emit(None, ".copy_", Ref(h), a, non_blocking=True)
        if form == "d2h_async":
            h = self.emit(self.name("h"), ".to", a, HOST, non_blocking=True, copy=True)
        else:
            t = self.value(a)
            h = self.emit(self.name("h"), "empty_pinned", tuple(t.shape), t.dtype)
            self.emit(None, ".copy_", Ref(h), a, non_blocking=True)
        self.book.pending[h] = self.book.current

    def fam_read(self):
        """A host read in the middle: item, tolist, a copy, a shape."""
        rng = self.rng
        form = rng.choice(("item", "item", "tolist", "host", "shape"))
        if form == "item":
            ones = self.tensors(numel=lambda n: n == 1)
            if ones and rng.random() < 0.97:
                return self.emit(self.name("x"), "item", rng.choice(ones))
            if rng.random() > 0.1:
                raise Skip
            self.may_fail = True
            return self.emit(self.name("x"), "item", self.pick(self.tensors()))
        if form == "tolist":
            return self.emit(self.name("x"), "tolist", self.pick(self.tensors(numel=lambda n: n <= 64)))
        a = self.pick(self.tensors())
        return self.emit(self.name("x" if form == "shape" else "h"), form, a)

    def fam_host_write(self):
        """A write to pageable host memory that queued work may have used (a scalar operand, the
        source of a copy): the work took its values at the call."""
        rng = self.rng
        h = self.pick([n for n in self.tensors(host=True) if n not in self.book.pinned])
        t = self.value(h)
        form = rng.choice(("fill_", "add_", "zero_", "copy_"))
        if form == "copy_":
            self.emit(None, ".copy_", h, Ref(self.new(tuple(t.shape), t.dtype, host=True)))
        elif form == "add_" and kind(t) != "b":
            self.emit(None, ".add_", h, 1)
        elif form == "zero_":
            self.emit(None, ".zero_", h)
        else:
            self.emit(None, ".fill_", h, self.scalar(kind(t)))

    def fam_random(self):
        """Random numbers from an explicit generator. The npu's numbers come from its generator's
        (seed, offset), not from the CPU's engine: the cpu target draws them on the npu too
        ("random" steps), from generators of its own with the same seeds."""
        rng = self.rng
        gens = [Ref(n) for n in self.shadow.env if n[0] == "r"]
        if gens and rng.random() < 0.7:
            r = rng.choice(gens)
        else:
            r = Ref(self.emit(self.name("r"), "generator", self.seed_arg()))
        form = rng.choice(("randn", "rand", "randint", "randperm", "uniform_", "normal_", "bernoulli_", "bernoulli",
                           "random_", "exponential_", "multinomial"))
        if form in ("randn", "rand"):
            return self.emit(self.name("t"), "random", "torch." + form, self.shape(), generator=r, device=DEV)
        if form == "randint":
            return self.emit(self.name("t"), "random", "torch.randint", -5, 5, self.shape(), generator=r, device=DEV)
        if form == "randperm":
            return self.emit(self.name("t"), "random", "torch.randperm", rng.randint(0, 40), generator=r, device=DEV)
        if form == "bernoulli":
            p = self.emit(self.name("t"), "random", "torch.rand", self.shape(), generator=r, device=DEV)
            return self.emit(self.name("t"), "random", "torch.bernoulli", Ref(p), generator=r)
        if form == "multinomial":
            p = self.emit(self.name("t"), "random", "torch.rand", (rng.randint(1, 3), rng.randint(1, 6)), generator=r,
                          device=DEV)
            n = rng.randint(1, self.value(p).shape[1])
            return self.emit(self.name("t"), "random", "torch.multinomial", Ref(p), n, generator=r)
        a = self.pick(self.tensors("f" if form != "random_" else "fi", write=True))
        args = {"uniform_": (-2, 2), "normal_": (0, 1), "bernoulli_": (0.5,), "random_": (0, 7),
                "exponential_": ()}[form]
        self.emit(None, "random", "." + form, a, *args, generator=r)

    def fam_device1(self):
        """Tensors on a second device: copies both ways, ops there."""
        rng = self.rng
        if self.strict():
            raise Skip
        others = [Ref(n) for n, v in self.shadow.env.items() if n[0] == "u" and isinstance(v, torch.Tensor)]
        form = rng.choice(("to", "to", "back", "compute", "copy", "read"))
        if form == "to" or not others:
            return self.emit(self.name("u"), "to_device1", self.pick(self.tensors(grad=False)),
                             non_blocking=rng.random() < 0.5)
        u = rng.choice(others)
        shape = tuple(self.value(u).shape)
        if form == "back":
            return self.emit(self.name("t"), "to_device", u, non_blocking=rng.random() < 0.5)
        if form == "read":
            return self.emit(self.name("x"), "tolist" if self.value(u).numel() <= 64 else "shape", u)
        if form == "copy":
            fits = [n for n in self.tensors(write=True) if tuple(self.value(n).shape) == shape]
            t = self.pick(fits)
            self.check_conversion(u, self.value(t).dtype)
            self.check_conversion(t, self.value(u).dtype)
            dst, src = (t, u) if rng.random() < 0.5 else (u, t)
            return self.emit(None, ".copy_", dst, src, non_blocking=rng.random() < 0.5)
        k = kind(self.value(u))
        partners = [n for n in others if _broadcasts_to(self.value(n).shape, shape) and kind(self.value(n)) in "fi"]
        if k != "b" and partners and rng.random() < 0.6:
            op = rng.choice(("torch.add", "torch.mul", "torch.maximum"))
            return self.emit(self.name("u"), op, u, rng.choice(partners))
        op = rng.choice([op for op, kinds in UNARY.items() if k in kinds])
        if rng.random() < 0.3 and op in ("neg", "abs", "exp", "sin", "relu", "floor") and k == "f":
            return self.emit(None, f".{op}_", u)
        return self.emit(self.name("u"), "torch." + op, u)

    def fam_sync(self):
        rng = self.rng
        form = rng.choice(("device", "stream", "event", "empty_cache"))
        if form == "device":
            self.emit(None, "sync")
            self.book.pending.clear()
        elif form == "stream":
            self.emit(None, ".synchronize", CUR)
            self.clear_pending(self.book.current)
        elif form == "event":
            e = self.emit(self.name("e"), "event")
            self.emit(None, ".record", Ref(e))
            self.emit(None, ".synchronize", Ref(e))
            self.clear_pending(self.book.current)
        else:
            self.emit(None, "empty_cache")

    def clear_pending(self, stream):
        self.book.pending = {h: s for h, s in self.book.pending.items() if s != stream}

    def fam_del(self):
        """del of a tensor, then new allocations that may reuse its memory."""
        rng = self.rng
        book = self.book
        frozen = self.groups(book.frozen)
        n = self.pick([Ref(n) for n, v in self.shadow.env.items() if isinstance(v, torch.Tensor)
                       and self.group(n) not in frozen and self.deletable(n)])
        t = self.value(n)
        self.emit(None, "del", str(n))
        book.pending.pop(n, None)
        if rng.random() < 0.2:
            self.emit(None, "empty_cache")
        if n[0] == "t" and rng.random() < 0.7:
            self.emit(self.name("t"), "torch.full", tuple(t.shape), self.scalar(kind(t)), dtype=t.dtype, device=DEV)
        elif n[0] == "h" and rng.random() < 0.7:
            h = self.new(tuple(t.shape), t.dtype, host=True)
            self.emit(self.name("t"), "to_device", Ref(self.emit(self.name("h"), "pin", Ref(h))), non_blocking=True)

    def deletable(self, n):
        """While a side stream runs, a tensor it uses is deleted only if nothing else holds its
        memory and it was made there or record_stream was called."""
        fork = self.book.fork
        if fork is None or self.group(n) not in self.groups(fork["touched"]):
            return True
        holders = [m for m, v in self.shadow.env.items()
                   if isinstance(v, torch.Tensor) and self.group(m) == self.group(n)]
        return holders == [n] and (n in fork["created"] or n in fork["recorded"])

    def fam_fork(self):
        """Work on a side stream, ordered by wait_stream or events, joined back later."""
        rng = self.rng
        book = self.book
        if book.fork is not None or book.capturing is not None:
            raise Skip
        if not book.streams or (len(book.streams) < 2 and rng.random() < 0.3):
            book.streams.append(self.emit(self.name("s"), "stream"))
        s = Ref(rng.choice(book.streams))
        start = rng.choice(("wait_stream", "event_wait", "wait_event"))
        if start == "wait_stream":
            self.emit(None, ".wait_stream", s, CUR)
        else:
            e = Ref(self.emit(self.name("e"), "event"))
            self.emit(None, ".record", e)
            if start == "wait_event":
                self.emit(None, ".wait_event", s, e)
        book.fork = {"stream": s, "touched": set(), "created": set(), "recorded": set()}
        self.emit(None, "enter_stream", s)
        book.side, book.current = True, s
        if start == "event_wait":
            self.emit(None, ".wait", e)
        done = sum(self.try_family(self.family(self.SIDE)) for _ in range(rng.randint(1, 4)))
        if not done:
            raise Skip
        for n in sorted(self.book.fork["touched"]):
            v = self.shadow.env.get(n)
            if isinstance(v, torch.Tensor) and n[0] == "t" and n not in self.book.fork["created"] \
                    and rng.random() < 0.5:
                self.emit(None, "record_stream", Ref(n), s)
                self.book.fork["recorded"].add(n)
        join = rng.choice(("wait_stream", "event_wait", "event_sync", "wait_event", "record_on", "stream_sync",
                           "device_sync"))
        if join in ("event_wait", "event_sync", "wait_event"):
            e2 = Ref(self.emit(self.name("e"), "event"))
            self.emit(None, ".record", e2)
        self.emit(None, "exit")
        self.book.side, self.book.current = False, None
        for _ in range(rng.randint(0, 3)):
            self.try_family(self.family(self.SIDE))
        if join == "wait_stream":
            self.emit(None, ".wait_stream", CUR, s)
        elif join == "event_wait":
            self.emit(None, ".wait", e2)
        elif join == "event_sync":
            self.emit(None, ".synchronize", e2)
        elif join == "wait_event":
            self.emit(None, ".wait_event", CUR, e2)
        elif join == "record_on":
            e2 = Ref(self.emit(self.name("e"), "event"))
            self.emit(None, ".record", e2, s)
            self.emit(None, ".wait", e2)
        elif join == "stream_sync":
            self.emit(None, ".synchronize", s)
        else:
            self.emit(None, "sync")
            self.book.pending.clear()
        if join in ("event_sync", "stream_sync"):
            self.clear_pending(s)
        self.book.fork = None

    def fam_autograd(self):
        """A small graph, backward, and the gradient."""
        rng = self.rng
        if self.strict():
            raise Skip
        dtype = self.dtype("f")
        n, k = rng.choice(SMALL_DIMS), rng.choice(SMALL_DIMS)
        w = Ref(self.emit(self.name("t"), "make", (n, k), dtype, seed=self.seed_arg(), device=DEV, requires_grad=True))
        y = w
        side = rng.random() < 0.3
        if side:
            if not self.book.streams or rng.random() < 0.3:
                self.book.streams.append(self.emit(self.name("s"), "stream"))
            s = Ref(rng.choice(self.book.streams))
            self.emit(None, ".wait_stream", s, CUR)
            self.emit(None, "enter_stream", s)
        for _ in range(rng.randint(1, 3)):
            shape = tuple(self.value(y).shape)
            form = rng.choice(("mul", "add", "sin", "tanh", "relu", "pow", "mm", "softmax", "cat", "index_select",
                               "sum"))
            if form in ("mul", "add"):
                y = Ref(self.emit(self.name("t"), "torch." + form, y, self.operand(shape, "f")))
            elif form in ("sin", "tanh", "relu"):
                y = Ref(self.emit(self.name("t"), "torch." + form, y))
            elif form == "pow":
                y = Ref(self.emit(self.name("t"), ".pow", y, 2))
            elif form == "mm" and len(shape) == 2 and dtype is torch.float32:
                other = Ref(self.new((shape[1], rng.choice(SMALL_DIMS)), dtype))
                y = Ref(self.emit(self.name("t"), "torch.mm", y, other))
            elif form == "softmax" and shape:
                y = Ref(self.emit(self.name("t"), "torch.softmax", y, -1))
            elif form == "cat" and shape:
                y = Ref(self.emit(self.name("t"), "torch.cat", [y, y], 0))
            elif form == "index_select" and shape:
                idx = self.emit(self.name("t"), "randidx", (rng.randint(1, 4),), shape[0], seed=self.seed_arg(),
                                device=DEV)
                y = Ref(self.emit(self.name("t"), "torch.index_select", y, 0, Ref(idx)))
            elif form == "sum" and shape:
                y = Ref(self.emit(self.name("t"), ".sum", y, 0))
        loss = Ref(self.emit(self.name("t"), rng.choice((".sum", ".mean")), y))
        if side:
            self.emit(None, "exit")
            self.emit(None, ".wait_stream", CUR, s)
        self.emit(None, ".backward", loss)
        self.emit(self.name("t"), "getattr", w, "grad")

    def fam_graph(self):
        """An NPUGraph: capture a few ops, replay."""
        rng = self.rng
        book = self.book
        if self.strict() or not self.tensors(grad=False):
            raise Skip
        g = Ref(self.emit(self.name("g"), "graph"))
        self.emit(None, "enter_graph", g)
        book.capturing = set()
        done = sum(self.try_family(rng.choice((self.fam_compute, self.fam_compute, self.fam_inplace)))
                   for _ in range(rng.randint(1, 4)))
        if not done:
            raise Skip
        self.emit(None, "exit_graph", g)
        names = self.book.capturing - {str(g)}
        self.book.capturing = None
        self.book.frozen |= names
        self.book.graphs[str(g)] = names
        self.emit(None, "replay", g)

    def fam_replay(self):
        """New values into a graph's input, then replay."""
        rng = self.rng
        if self.strict() or not self.book.graphs:
            raise Skip
        g = rng.choice(sorted(self.book.graphs))
        inputs = [Ref(n) for n in sorted(self.book.graphs[g]) if n in self.shadow.env and n[0] == "t"
                  and not self.value(n).requires_grad]
        if inputs and rng.random() < 0.7:
            a = rng.choice(inputs)
            t = self.value(a)
            if rng.random() < 0.5:
                self.emit(None, ".copy_", a, Ref(self.new(tuple(t.shape), t.dtype)))
            else:
                self.emit(None, ".fill_", a, self.scalar(kind(t)))
        self.emit(None, "replay", Ref(g))

    def fam_busy(self):
        """A busy stream, so that what follows is queued: a long kernel behind a sleep task."""
        a = self.existing_or_new((256, 256), torch.float32)
        self.emit(None, "sleep")
        self.emit(self.name("t"), "torch.mm", a, a)

    FAMILIES = {"fam_create": 10, "fam_compute": 30, "fam_inplace": 16, "fam_resize": 4, "fam_copy": 8,
                "fam_transfer": 7, "fam_read": 8, "fam_sync": 3, "fam_del": 6, "fam_fork": 6,
                "fam_autograd": 3, "fam_graph": 3, "fam_replay": 2, "fam_busy": 5, "fam_host_write": 4,
                "fam_random": 4, "fam_device1": 4}
    SIDE = ("fam_create", "fam_compute", "fam_inplace", "fam_copy", "fam_transfer", "fam_read", "fam_del",
            "fam_busy", "fam_host_write", "fam_random")

    def family(self, names):
        weights = [self.FAMILIES[n] for n in names]
        return getattr(self, self.rng.choices(names, weights)[0])

    def build(self):
        length = self.rng.randint(5, 25)
        attempts = 0
        try:
            if self.rng.random() < 0.5:
                self.try_family(self.fam_busy)
            while len(self.steps) < length and attempts < 200:
                if not self.tensors():
                    family = self.fam_create
                else:
                    family = self.family(tuple(self.FAMILIES))
                attempts += not self.try_family(family)
        except Finished:
            pass
        return self.steps


class Finished(Exception):
    """The last step raised as its family expected: the program ends there."""


def _names(step):
    found = set()

    def walk(x):
        if isinstance(x, Ref):
            found.add(str(x))
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
    walk(step.args)
    walk(step.kwargs)
    if isinstance(step.target, tuple):
        found.update(step.target)
    elif step.target is not None:
        found.add(str(step.target))
    return found


def _broadcasts_to(shape, target):
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target)))


def generate(seed):
    """The program of ``seed``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Builder(seed).build()


# ----------------------------------------------------------------------------- comparison

# npu runs: the environment of each. "async" is the default (a small kernel launched on an
# idle stream runs on the caller, others are queued), "queued" queues every kernel the task
# queue can take (full asynchrony), "sync" runs every kernel on the caller.
MODES = {
    "async": {"TASK_QUEUE_ENABLE": "1", "ASCEND_SIM_INLINE": "1"},
    "queued": {"TASK_QUEUE_ENABLE": "1", "ASCEND_SIM_INLINE": "0"},
    "sync": {"TASK_QUEUE_ENABLE": "0", "ASCEND_SIM_INLINE": "1"},
}


def same(a, b):
    """Equality of trace values: type, shape, dtype and values (nan equals nan)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.is_floating_point():
            return bool(((a == b) | (a.isnan() & b.isnan())).all())
        return torch.equal(a, b)
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


class Mismatch(NamedTuple):
    seed: int
    step: object          # the step index, or None for a crashed or hung worker
    detail: str
    program: str

    def __str__(self):
        lines = []
        for line in self.program.splitlines():
            marked = self.step is not None and line.endswith(f"  # {self.step}")
            lines.append(f"{line}   <-- first difference" if marked else line)
        where = "a worker" if self.step is None else f"step {self.step}"
        return f"seed {self.seed}: {where}\n{self.detail}\nprogram:\n" + "\n".join(lines)


def _describe(item):
    if item is None:
        return "(trace ends)"
    step, label, value, message = item
    if label == "raises":
        return f"step {step} raises {value}: {message}"
    if label not in ("read",) and isinstance(value, tuple) and len(value) == 3:
        on_device, requires_grad, value = value
        label = f"{label}{'' if on_device else ' (on the wrong device)'}"
    if isinstance(value, torch.Tensor):
        value = f"{value.dtype} {list(value.shape)} {value.flatten()[:24].tolist()}"
    return f"step {step} {label}: {value}"


def compare(seed, program, traces):
    """The first difference of the npu traces (``traces[mode]``, e.g. for each of MODES) from
    ``traces["cpu"]``, as a Mismatch, or None."""
    for k in range(max(len(t) for t in traces.values())):
        items = {mode: trace[k] if k < len(trace) else None for mode, trace in traces.items()}
        cpu = items["cpu"]
        if all(_same_item(cpu, item) for mode, item in items.items() if mode != "cpu"):
            continue
        step = min(item[0] for item in items.values() if item is not None)
        detail = "\n".join(f"  {mode:>5}: {_describe(item)}" for mode, item in items.items())
        return Mismatch(seed, step, detail, program)
    return None


def _same_item(a, b):
    if a is None or b is None:
        return a is b
    return a[0] == b[0] and a[1] == b[1] and same(a[2], b[2])


# ----------------------------------------------------------------------------- batches

class Batch(NamedTuple):
    start: int
    count: int
    compared: int
    mismatches: list
    seconds: float

    def summary(self):
        seeds = ", ".join(str(m.seed) for m in self.mismatches)
        return (f"{self.compared} of {self.count} programs (seeds {self.start}..{self.start + self.count - 1}) "
                f"compared in {self.seconds:.0f}s, {len(self.mismatches)} mismatch(es)"
                + (f": seeds {seeds}" if seeds else ""))

    def report(self, limit=3):
        """The summary and the first ``limit`` mismatches with their programs."""
        return "\n\n".join([self.summary()] + [str(m) for m in self.mismatches[:limit]])


def worker(start, count, path, with_cpu, threads):
    """Runs seeds [start, start+count) on npu (and cpu) in this process; saves the traces to
    ``path`` every few programs and at the end. Prints each seed before running it."""
    import torch_npu  # noqa: F401
    warnings.simplefilter("ignore")
    torch.set_num_threads(threads)
    results = {}
    for i, seed in enumerate(range(start, start + count)):
        print(seed, flush=True)
        program = generate(seed)
        entry = {"program": render(program, seed), "npu": run_program(program, "npu")}
        if with_cpu:
            entry["cpu"] = run_program(program, "cpu")
        results[seed] = entry
        gc.freeze()  # the gc.collect of each graph capture then sees new objects only
        if i % 25 == 24 or seed == start + count - 1:
            torch.save(results, path + ".tmp")
            os.replace(path + ".tmp", path)


def _package_path():
    import torch_npu
    return os.path.dirname(os.path.dirname(os.path.abspath(torch_npu.__file__)))


def _spawn(mode, start, count, path, log, threads):
    env = dict(os.environ, **MODES[mode])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_path(), os.environ.get("PYTHONPATH")) if p)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--start", str(start),
           "--programs", str(count), "--out", path, "--threads", str(threads)] + \
        (["--with-cpu"] if mode == "sync" else [])
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _last_seed(log_path):
    with open(log_path) as f:
        lines = f.read().splitlines()
    seeds = [int(line) for line in lines if line.isdigit()]
    return (seeds[-1] if seeds else None), "\n".join(lines[-30:])


def run_batch(start, count, threads=1, timeout=1800):
    """Runs seeds [start, start+count) on npu in each mode of MODES (one process
    each, concurrently, with ``threads`` intra-op threads) and on cpu; compares. A worker that
    crashes or hangs at a seed is a mismatch of that seed; the batch goes on after it."""
    began = time.monotonic()
    mismatches, compared = [], 0
    end = start + count
    with tempfile.TemporaryDirectory() as tmp:
        while start < end:
            procs, logs = {}, {}
            for mode in MODES:
                logs[mode] = os.path.join(tmp, f"{mode}.log")
                with open(logs[mode], "w") as log:
                    procs[mode] = _spawn(mode, start, end - start, os.path.join(tmp, f"{mode}.pt"), log, threads)
            deadline = time.monotonic() + timeout
            failed = {}
            for mode, proc in procs.items():
                try:
                    proc.wait(timeout=max(deadline - time.monotonic(), 1))
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, 9)
                    proc.wait()
                    failed[mode] = "hangs (killed after the batch timeout)"
                    continue
                if proc.returncode != 0:
                    failed[mode] = f"exits with {proc.returncode}"
            results = {}
            for mode in MODES:
                path = os.path.join(tmp, f"{mode}.pt")
                results[mode] = torch.load(path, weights_only=False) if os.path.exists(path) else {}
                if os.path.exists(path):
                    os.remove(path)
            for seed in range(start, end):
                if not all(seed in results[mode] for mode in MODES):
                    break
                entry = results["sync"][seed]
                traces = {"cpu": entry["cpu"], **{mode: results[mode][seed]["npu"] for mode in MODES}}
                compared += 1
                mismatch = compare(seed, entry["program"], traces)
                if mismatch:
                    mismatches.append(mismatch)
            if not failed:
                break
            crashes = {}
            for mode, what in failed.items():
                seed, tail = _last_seed(logs[mode])
                crashes.setdefault(seed, []).append(f"  {mode} worker {what} at seed {seed}:\n{tail}")
            seed = min(s for s in crashes if s is not None) if any(s is not None for s in crashes) else start
            mismatches.append(Mismatch(seed, None, "\n".join(crashes.get(seed, [])), render(generate(seed), seed)))
            start = seed + 1
    return Batch(end - count, count, compared, mismatches, time.monotonic() - began)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--programs", type=int, default=1000)
    parser.add_argument("--start", "--seed", dest="start", type=int, default=0)
    parser.add_argument("--chunk", type=int, default=500, help="programs per pair of worker processes")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of each worker")
    parser.add_argument("--show", type=int, metavar="SEED", help="print the program of SEED")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--with-cpu", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.show is not None:
        print(render(generate(args.show), args.show))
        return 0
    if args.worker:
        worker(args.start, args.programs, args.out, args.with_cpu, args.threads)
        return 0
    began, compared, mismatches = time.monotonic(), 0, []
    for first in range(args.start, args.start + args.programs, args.chunk):
        count = min(args.chunk, args.start + args.programs - first)
        batch = run_batch(first, count, args.threads)
        compared += batch.compared
        mismatches += batch.mismatches
        print(batch.summary(), flush=True)
        for m in batch.mismatches:
            print(m, "\n", flush=True)
    seeds = ", ".join(str(m.seed) for m in mismatches)
    print(f"fuzz: {compared} of {args.programs} programs compared (seeds {args.start}.."
          f"{args.start + args.programs - 1}), {len(mismatches)} mismatch(es){': seeds ' + seeds if seeds else ''}, "
          f"{time.monotonic() - began:.0f}s")
    return 1 if mismatches or compared < args.programs else 0


if __name__ == "__main__":
    sys.exit(main())
