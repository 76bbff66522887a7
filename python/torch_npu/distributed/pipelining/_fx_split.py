"""Pipeline splitting of a module traced with torch.fx (``pipeline(..., mode="fx")``).

The module is traced with ``torch.fx``; standard ``torch.nn`` layers and the user's *atomic
units* stay whole (``call_module`` nodes), everything else is traced through. ``split_spec``
entries become split markers at the named module's call, or ``split_policy`` inserts them
into the traced graph. The graph is then cut at the markers into stage ``GraphModule``s
that keep the model's parameter names, and the result is a
``torch.distributed.pipelining.Pipe`` whose stages run with torch's pipeline schedules.

Shapes and dtypes of the values crossing stage boundaries come from one forward of the
example microbatch (without autograd; the model's buffers and the random number
generators are left as they were). Non-tensor values that cross a boundary (sizes, flags)
are fixed to their value for that microbatch, as ``torch.export`` fixes static shapes.
"""
from __future__ import annotations

import copy
import inspect
import operator
from typing import Any, Callable, Optional

import torch
import torch.fx as fx
from torch.distributed.pipelining._IR import (
    Pipe,
    SplitPoint,
    aten_pipe_split_alias,
    get_submod_name,
    pipe_split,
)
from torch.distributed.pipelining.stage import _PipelineStage
from torch.utils._pytree import tree_flatten, tree_map_only

__all__: list[str] = []

_SPLIT_MARKERS = (aten_pipe_split_alias, pipe_split, torch.ops.pippy._pipe_split)
_CONSTANT_TYPES = (type(None), bool, int, float, complex, str, torch.dtype, torch.device,
                   torch.layout, torch.memory_format, slice, type(Ellipsis))


def _is_split_marker(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target in _SPLIT_MARKERS


def _holds_tensor(value: Any) -> bool:
    return any(isinstance(leaf, torch.Tensor) for leaf in tree_flatten(value)[0])


def _is_constant(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_is_constant(v) for v in value)
    return isinstance(value, _CONSTANT_TYPES)


def _to_meta(value: Any, keep_requires_grad: bool = False) -> Any:
    """``value`` with every tensor replaced by a meta tensor of the same shape, stride, dtype."""
    def convert(t: torch.Tensor) -> torch.Tensor:
        meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
        return meta.requires_grad_(keep_requires_grad and t.requires_grad)
    return tree_map_only(torch.Tensor, convert, value)


# ---- arguments ------------------------------------------------------------------------------

def check_atomic_units(module: torch.nn.Module, atomic_units) -> list[torch.nn.Module]:
    """The submodules named by ``atomic_units``; ValueError/TypeError naming a bad entry."""
    if atomic_units is None:
        return []
    if isinstance(atomic_units, str) or not isinstance(atomic_units, (list, tuple)):
        raise TypeError(f"pipeline: atomic_units must be a list of submodule names, got "
                        f"{type(atomic_units).__name__}")
    modules = dict(module.named_modules())
    units = []
    for name in atomic_units:
        if not isinstance(name, str):
            raise TypeError(f"pipeline: atomic_units entries must be str, got {name!r}")
        if name == "" or name not in modules:
            raise ValueError(f"pipeline: atomic_units entry '{name}' is not a submodule of "
                             f"{type(module).__name__}")
        units.append(modules[name])
    return units


def check_split_spec(module: torch.nn.Module, split_spec, atomic_units) -> dict[int, tuple]:
    """``{id(submodule): (name, SplitPoint)}`` for ``split_spec``; errors name the bad entry."""
    if split_spec is None:
        return {}
    if not isinstance(split_spec, dict):
        raise TypeError(f"pipeline: split_spec must be a dict of submodule name -> SplitPoint, "
                        f"got {type(split_spec).__name__}")
    modules = dict(module.named_modules())
    points = {}
    for name, point in split_spec.items():
        if not isinstance(name, str) or name == "" or name not in modules:
            raise ValueError(f"pipeline: split_spec key {name!r} is not a submodule of "
                             f"{type(module).__name__}")
        if not isinstance(point, SplitPoint):
            raise ValueError(f"pipeline: split_spec['{name}'] must be a SplitPoint, got {point!r}")
        for unit in atomic_units or ():
            if name.startswith(unit + "."):
                raise ValueError(f"pipeline: split_spec key '{name}' lies inside atomic unit "
                                 f"'{unit}', which is never split")
        points[id(modules[name])] = (name, point)
    return points


def bind_inputs(module: torch.nn.Module, mb_args: tuple, mb_kwargs: dict):
    """``mb_args``/``mb_kwargs`` bound to ``forward`` (defaults applied) and the names of the
    arguments that are tensors: these become the pipeline's inputs, the others are constants."""
    forward = type(module).forward
    signature = inspect.signature(forward)
    try:
        bound = signature.bind(module, *mb_args, **mb_kwargs)
    except TypeError as e:
        raise TypeError(f"pipeline: mb_args/mb_kwargs do not match "
                        f"{type(module).__name__}.forward{inspect.signature(module.forward)}: {e}") from e
    bound.apply_defaults()
    tensor_names = []
    for name, value in list(bound.arguments.items())[1:]:
        if isinstance(value, torch.Tensor):
            kind = signature.parameters[name].kind
            if kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                raise ValueError(f"pipeline: mode='fx' needs tensor inputs as named forward "
                                 f"arguments, but '{name}' is a *args/**kwargs argument")
            tensor_names.append(name)
        elif _holds_tensor(value):
            raise ValueError(f"pipeline: mode='fx' needs each tensor input to be its own forward "
                             f"argument, but '{name}' is a {type(value).__name__} holding tensors")
    return bound, tensor_names


# ---- tracing --------------------------------------------------------------------------------

class _PipelineTracer(fx.Tracer):
    """An FX tracer that keeps atomic units whole and marks split points at module calls."""

    def __init__(self, bound: inspect.BoundArguments, tensor_names: list[str],
                 atomic_units: list[torch.nn.Module], split_points: dict[int, tuple]):
        super().__init__()
        self._bound = bound
        self._tensor_names = tensor_names
        self._atomic = {id(m) for m in atomic_units}
        self._split_points = split_points
        self.split_points_hit: set[int] = set()

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return id(m) in self._atomic or super().is_leaf_module(m, module_qualified_name)

    def call_module(self, m, forward, args, kwargs):
        entry = self._split_points.get(id(m))
        if entry is None:
            return super().call_module(m, forward, args, kwargs)
        self.split_points_hit.add(id(m))
        if entry[1] is SplitPoint.BEGINNING:
            self.create_node("call_function", aten_pipe_split_alias, (), {})
        out = super().call_module(m, forward, args, kwargs)
        if entry[1] is SplitPoint.END:
            self.create_node("call_function", aten_pipe_split_alias, (), {})
        return out

    def create_args_for_root(self, root_fn, is_module, concrete_args=None):
        # Tensor arguments become placeholders named after the argument; all others are
        # passed as the constants they were in the example.
        arguments = dict(self._bound.arguments)
        proxies = []
        for name in self._tensor_names:
            arguments[name] = self.create_proxy("placeholder", name, (), {})
            proxies.append(arguments[name])
        bound = inspect.BoundArguments(self._bound.signature, arguments)

        def traced(*_):
            return root_fn(*bound.args, **bound.kwargs)

        return traced, proxies


def trace(module, bound, tensor_names, atomic_units, split_points) -> fx.GraphModule:
    tracer = _PipelineTracer(bound, tensor_names, atomic_units, split_points)
    graph = tracer.trace(module)
    for key, (name, _) in split_points.items():
        if key not in tracer.split_points_hit:
            raise ValueError(f"pipeline: split_spec key '{name}' names a module that forward "
                             f"never calls, so it gives no split point")
    return fx.GraphModule(module, graph)


# ---- example values -------------------------------------------------------------------------

class _ValueRecorder(fx.Interpreter):
    """Runs the graph once, storing each node's value (tensors as meta tensors) in meta['val']."""

    def run_node(self, n: fx.Node) -> Any:
        if _is_split_marker(n):
            return None
        result = super().run_node(n)
        n.meta["val"] = _to_meta(result, keep_requires_grad=n.op == "placeholder")
        return result


def record_values(gm: fx.GraphModule, module: torch.nn.Module, inputs: list[torch.Tensor]):
    """One forward of the example inputs through ``gm``, leaving buffers and RNGs unchanged."""
    state = list(module.parameters()) + list(module.buffers())
    if any(t.is_meta for t in state):
        inputs = [t.to("meta") for t in inputs]
    devices = {(t.device.type, t.device.index) for t in state + inputs
               if t.device.type not in ("cpu", "meta")}
    devices = {(kind, torch.get_device_module(kind).current_device() if index is None else index)
               for kind, index in devices}
    cpu_rng = torch.get_rng_state()
    device_rngs = [(kind, index, torch.get_device_module(kind).get_rng_state(index))
                   for kind, index in devices]
    saved_buffers = [(b, b.detach().clone()) for b in module.buffers() if not b.is_meta]
    try:
        with torch.no_grad():
            _ValueRecorder(gm).run(*inputs)
    finally:
        with torch.no_grad():
            for b, saved in saved_buffers:
                b.copy_(saved)
        torch.set_rng_state(cpu_rng)
        for kind, index, rng in device_rngs:
            torch.get_device_module(kind).set_rng_state(rng, index)


# ---- partitioning ---------------------------------------------------------------------------

def _assign_stages(graph: fx.Graph) -> tuple[dict[fx.Node, int], int]:
    """Stage of every computing node (split markers count up; empty stages are dropped)."""
    stage_of: dict[fx.Node, int] = {}
    part = 0
    for node in graph.nodes:
        if node.op in ("placeholder", "get_attr", "output"):
            continue
        if _is_split_marker(node):
            part += 1
            continue
        source = node.args[0] if node.args else None
        if (node.op == "call_function" and node.target in (operator.getitem, getattr)
                and isinstance(source, fx.Node) and source in stage_of
                and not isinstance(source.meta.get("val"), torch.Tensor)):
            # Taking an item of a module's tuple (or an attribute of its output object)
            # stays with the module: the container itself is not a tensor to transmit.
            stage_of[node] = stage_of[source]
        else:
            stage_of[node] = part
    used = sorted(set(stage_of.values()))
    renumber = {old: new for new, old in enumerate(used)}
    return {n: renumber[s] for n, s in stage_of.items()}, len(used)


def _fetch(root: torch.nn.Module, target: str) -> Any:
    obj = root
    for atom in target.split("."):
        obj = getattr(obj, atom)
    return obj


def _clone_module(m: torch.nn.Module, memo: dict) -> torch.nn.Module:
    """A new module tree with the same parameters and buffers (the same tensor objects)."""
    if id(m) in memo:
        return memo[id(m)]
    new = copy.copy(m)
    for key, value in vars(m).items():
        if isinstance(value, (dict, set)):
            new.__dict__[key] = copy.copy(value)
    memo[id(m)] = new
    for name, child in m._modules.items():
        new._modules[name] = None if child is None else _clone_module(child, memo)
    return new


def _install(gm: torch.nn.Module, target: str, obj: Any, persistent: bool) -> None:
    *prefix, field = target.split(".")
    parent = gm
    for atom in prefix:
        child = parent._modules.get(atom)
        if child is None:
            child = torch.nn.Module()
            parent.add_module(atom, child)
        parent = child
    if hasattr(parent, field):
        return  # already there (a module installed earlier holds it)
    if isinstance(obj, torch.nn.Module):
        parent.add_module(field, obj)
    elif isinstance(obj, torch.nn.Parameter):
        parent.register_parameter(field, obj)
    elif isinstance(obj, torch.Tensor):
        parent.register_buffer(field, obj, persistent=persistent)
    else:
        setattr(parent, field, obj)


def _is_persistent(root: torch.nn.Module, target: str) -> bool:
    *prefix, field = target.split(".")
    try:
        parent = _fetch(root, ".".join(prefix)) if prefix else root
    except AttributeError:
        return True
    return field not in getattr(parent, "_non_persistent_buffers_set", ())


def _stage_module(graph: fx.Graph, gm: fx.GraphModule, module: torch.nn.Module) -> fx.GraphModule:
    """A GraphModule running ``graph`` that holds the modules and tensors it uses under their
    names in the model (modules as new objects sharing the model's tensors)."""
    stage = fx.GraphModule(torch.nn.Module(), fx.Graph())
    memo: dict = {}
    targets = sorted(dict.fromkeys(n.target for n in graph.nodes if n.op in ("call_module", "get_attr")),
                     key=lambda t: t.count("."))
    for target in targets:
        obj = _fetch(gm, target)
        if isinstance(obj, torch.nn.Module):
            obj = _clone_module(obj, memo)
        _install(stage, target, obj, _is_persistent(module, target))
    stage.graph = graph
    return stage


def split_graph(gm: fx.GraphModule, module: torch.nn.Module) -> "FxPipe":
    """Cut ``gm`` (values recorded) at its split markers into the stages of a Pipe."""
    stage_of, num_stages = _assign_stages(gm.graph)
    if num_stages == 0:
        raise ValueError(f"pipeline: {type(module).__name__}.forward computes nothing to split")
    last = num_stages - 1
    roots = [n for n in gm.graph.nodes if n.op == "placeholder"]
    output = next(n for n in gm.graph.nodes if n.op == "output")
    members: list[list[fx.Node]] = [[] for _ in range(num_stages)]
    for node, s in stage_of.items():
        members[s].append(node)

    def producer(node: fx.Node) -> Optional[int]:
        """Stage that holds ``node``'s value (root inputs enter at stage 0)."""
        if node.op == "get_attr":
            return None
        return 0 if node.op == "placeholder" else stage_of[node]

    # What each stage receives and sends. Root inputs enter the first stage; later stages
    # that use them get them from it. Non-tensor values are folded into their users.
    inputs: list[dict[fx.Node, None]] = [dict.fromkeys(roots)] + [{} for _ in range(last)]
    sends: list[dict[fx.Node, None]] = [{} for _ in range(num_stages)]
    folded: dict[fx.Node, Any] = {}

    def use(value: fx.Node, s: int) -> None:
        src = producer(value)
        if src is None or src == s or value in folded or value in inputs[s]:
            return
        val = value.meta.get("val")
        if not isinstance(val, torch.Tensor):
            if _holds_tensor(val) or not _is_constant(val):
                raise ValueError(
                    f"pipeline: value '{value.name}' ({type(val).__name__}) of stage {src} is used "
                    f"by stage {s}; only tensors and constants can cross a stage boundary "
                    f"(move the split point)")
            folded[value] = val
            return
        inputs[s][value] = None
        sends[src][value] = None

    for s in range(num_stages):
        for node in members[s]:
            for value in node.all_input_nodes:
                use(value, s)
    for value in output.all_input_nodes:
        use(value, last)

    # A stage receives from each earlier stage in the order that stage sends (P2P messages
    # between two ranks match in order): both follow the order of the values in the graph.
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    inputs = [inputs[0]] + [dict.fromkeys(sorted(i, key=order.__getitem__)) for i in inputs[1:]]
    stage_graphs = []
    for s in range(num_stages):
        graph = fx.Graph()
        env: dict[fx.Node, Any] = {}
        for value in inputs[s]:
            env[value] = graph.placeholder(value.target if value.op == "placeholder" else value.name)
            env[value].meta = dict(value.meta)

        def lookup(n: fx.Node, graph=graph, env=env):
            if n in env:
                return env[n]
            if n in folded:
                return folded[n]
            if n.op == "get_attr":
                env[n] = graph.get_attr(n.target)
                env[n].meta = dict(n.meta)
                return env[n]
            raise AssertionError(f"value {n.name} is not available in stage {s}")

        for node in members[s]:
            env[node] = graph.node_copy(node, lookup)
        if s == last:
            graph.output(fx.node.map_arg(output.args[0], lookup))
        else:
            outs = [env[v] for v in sorted(sends[s], key=order.__getitem__)]
            graph.output(outs[0] if len(outs) == 1 else tuple(outs))
        graph.lint()
        stage_graphs.append(graph)

    # The root graph: root inputs -> stage calls (tuples unpacked with getitem) -> output.
    root = fx.Graph()
    produced: dict[fx.Node, fx.Node] = {}
    root_env = {}
    for ph in roots:
        root_env[ph] = root.placeholder(ph.target)
        root_env[ph].meta = dict(ph.meta)
    stages = {}
    for s in range(num_stages):
        name = get_submod_name(s)
        stages[name] = _stage_module(stage_graphs[s], gm, module)
        args = tuple(root_env[v] if s == 0 else produced[v] for v in inputs[s])
        call = root.call_module(name, args)
        if s == last:
            root.output(call)
            break
        outs = sorted(sends[s], key=order.__getitem__)
        if len(outs) == 1:
            produced[outs[0]] = call
        else:
            for i, value in enumerate(outs):
                produced[value] = root.call_function(operator.getitem, (call, i))
    split_gm = fx.GraphModule(stages, root)
    return FxPipe(split_gm, num_stages, False, None)


class FxPipe(Pipe):
    """A Pipe whose stages come from the FX splitter (their graphs call whole modules)."""

    def build_stage(self, stage_index: int, device: torch.device, group=None) -> _PipelineStage:
        stage_module = self.get_stage_module(stage_index)
        device = torch.device(device)
        changed = False
        for node in stage_module.graph.nodes:
            # Factory calls with a fixed device (torch.ones(..., device="npu:0")) follow the stage.
            value = node.kwargs.get("device") if node.op == "call_function" else None
            if isinstance(value, (str, torch.device)) and torch.device(value) != device:
                node.update_kwarg("device", device)
                changed = True
        if changed:
            stage_module.recompile()
        return _PipelineStage(stage_module, stage_index, self.info(), device, group)


def pipeline_fx(module, mb_args, mb_kwargs, split_spec, split_policy: Optional[Callable],
                atomic_units) -> FxPipe:
    units = check_atomic_units(module, atomic_units)
    split_points = check_split_spec(module, split_spec, atomic_units)
    if split_policy is not None and not callable(split_policy):
        raise TypeError(f"pipeline: split_policy must be callable (GraphModule -> GraphModule), "
                        f"got {type(split_policy).__name__}")
    bound, tensor_names = bind_inputs(module, mb_args, mb_kwargs)
    gm = trace(module, bound, tensor_names, units, split_points)
    if split_policy is not None:
        gm = split_policy(gm)
        if not isinstance(gm, fx.GraphModule):
            raise TypeError(f"pipeline: split_policy must return a torch.fx.GraphModule, got "
                            f"{type(gm).__name__}")
    record_values(gm, module, [bound.arguments[name] for name in tensor_names])
    return split_graph(gm, module)
