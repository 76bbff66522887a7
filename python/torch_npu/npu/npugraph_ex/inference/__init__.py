"""``torch.npu.npugraph_ex.inference``: the compile cache.

``cache_compile(self.method)`` returns a callable that compiles the method with
``torch.compile(backend="npugraph_ex", fullgraph=True)`` at its first call and writes the
Dynamo graph to ``${cache_dir}/${model_info}/${func}/compiled_module`` (``cache_dir``
default ``.torchair_cache`` under the working directory; ``model_info`` is
``<Module class>_<dynamic|static>_aclgraphcache_<md5>``, the md5 of the module's structure,
the method's code and the torch / torch_npu versions; with several ranks a
``world<N>global_rank<R>`` directory sits between ``model_info`` and ``func``). A later
process (or another ``cache_compile`` of the same method) finds the file and skips Dynamo
and its guards: the graph is loaded, its inputs are taken from the call's arguments by the
recorded expressions (``L['x'].data``, ``L['self']._modules['linear']._parameters['weight']``)
and it runs through the ``npugraph_ex`` backend (AOTAutograd, NPU graph capture and replay).
As documented for torch_npu, the script that loads a cache must be the one that wrote it,
and random operators are not supported.

``readable_cache(path)`` returns (and prints, and writes to ``file``) the text of a
``compiled_module``: the function, the input expressions and the graph's Python code.
"""
__all__ = ["cache_compile", "readable_cache"]

import functools
import hashlib
import inspect
import os
import warnings

import torch

_FORMAT = 1
CACHE_FILE = "compiled_module"


def _model_info(module, func, dynamic) -> str:
    import torch_npu

    h = hashlib.md5()
    for part in (repr(module), inspect.getsource(func) if _has_source(func) else func.__qualname__,
                 torch.__version__, torch_npu.__version__, str(_FORMAT)):
        h.update(part.encode())
    return f"{type(module).__name__}_{'dynamic' if dynamic else 'static'}_aclgraphcache_{h.hexdigest()}"


def _has_source(func) -> bool:
    try:
        inspect.getsource(func)
        return True
    except (OSError, TypeError):
        return False


def _rank_dir(global_rank, tp_rank, pp_rank):
    dist = torch.distributed
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if global_rank is None and world > 1:
        global_rank = dist.get_rank()
    if global_rank is None and tp_rank is None and pp_rank is None:
        return None
    name = f"world{world}global_rank{global_rank or 0}"
    if tp_rank is not None:
        name += f"tp_rank{tp_rank}"
    if pp_rank is not None:
        name += f"pp_rank{pp_rank}"
    return name


def _sources(gm):
    """The Python expression (over ``L``, the call's arguments) of each graph input, or why not."""
    sources = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            grapharg = node.meta.get("grapharg")
            source = getattr(grapharg, "source", None)
            if source is None:
                return f"graph input {node.name} has no source"
            sources.append(source.name() if callable(source.name) else source.name)
    return sources


class _CacheCompiled:
    """The callable :func:`cache_compile` returns."""

    def __init__(self, func, dynamic, cache_dir, global_rank, tp_rank, pp_rank, kwargs):
        self.func = func
        self.module = func.__self__
        self.dynamic = dynamic
        self.cache_dir = cache_dir
        self.ranks = (global_rank, tp_rank, pp_rank)
        decompositions = kwargs.pop("custom_decompositions", None)
        if decompositions is not None and not isinstance(decompositions, dict):
            raise TypeError("cache_compile(): custom_decompositions must be a dict of operator -> function")
        self.decompositions = decompositions
        from torch_npu.dynamo import graphs

        self.options = graphs._check_options("npugraph_ex", kwargs)
        self._compiled = None  # (kind, callable): "dynamo" or "cache"
        self.path = None
        functools.update_wrapper(self, func)

    def cache_path(self) -> str:
        base = self.cache_dir if self.cache_dir is not None else ".torchair_cache"
        base = os.path.abspath(base)
        parts = [base, _model_info(self.module, self.func, self.dynamic)]
        rank = _rank_dir(*self.ranks)
        if rank:
            parts.append(rank)
        parts += [self.func.__name__, CACHE_FILE]
        return os.path.join(*parts)

    def _backend(self, gm, example_inputs):
        from torch_npu.dynamo import graphs

        if self.decompositions:
            def compile_graph(g, inputs, is_backward):
                graphs._prepare_graph(g)
                return g.forward, False

            return graphs._aot_backend_with_decomps("npugraph_ex", gm, example_inputs, self.options, compile_graph,
                                                    self.decompositions)
        return graphs.npugraph_ex_backend(gm, example_inputs, self.options)

    def _bind(self, args, kwargs):
        bound = inspect.signature(self.func.__func__).bind(self.module, *args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def __call__(self, *args, **kwargs):
        if self._compiled is None:
            self.path = self.cache_path()
            if os.path.exists(self.path):
                self._compiled = ("cache", self._load(self.path, args, kwargs))
            else:
                self._compiled = ("dynamo", self._compile_and_save(args, kwargs))
                return self._compiled[1](*args, **kwargs)
        return self._compiled[1](*args, **kwargs)

    # ---- first run: Dynamo, and the graph written to the cache ----
    def _compile_and_save(self, args, kwargs):
        recorded = {}

        def backend(gm, example_inputs):
            if "gm" in recorded:
                recorded["recompiled"] = True
            recorded["gm"] = gm
            recorded["sources"] = _sources(gm)  # Dynamo drops them once the graph is compiled
            compiled = self._backend(gm, example_inputs)

            def run(*inputs):
                outs = compiled(*inputs)
                recorded.setdefault("outputs", outs)
                return outs

            return run

        compiled = torch.compile(self.func, backend=backend, fullgraph=True, dynamic=self.dynamic)
        result = compiled(*args, **kwargs)
        try:
            self._save(recorded, result)
        except Exception as e:  # noqa: BLE001  (an unsupported graph is not cached)
            warnings.warn(f"cache_compile(): {self.func.__qualname__} is not cached: {e}")
        first = [result]

        def call(*a, **k):
            if first:
                return first.pop()
            return compiled(*a, **k)

        return call

    def _save(self, recorded, result):
        gm = recorded.get("gm")
        if gm is None or "outputs" not in recorded:
            raise RuntimeError("no graph was compiled")
        if recorded.get("recompiled"):
            raise RuntimeError("it was compiled more than once (recompilation)")
        if isinstance(recorded["sources"], str):
            raise RuntimeError(recorded["sources"])
        sources = recorded["sources"]
        outputs = list(recorded["outputs"])
        leaves, spec = torch.utils._pytree.tree_flatten(result)
        out_map = []
        for leaf in leaves:
            idx = next((i for i, o in enumerate(outputs) if o is leaf), None)
            if idx is None:
                raise RuntimeError("an output of the function is not an output of its graph")
            out_map.append(idx)
        attrs = {}
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                attrs[node.target] = getattr(gm, node.target)
        clean = torch.fx.GraphModule(attrs, gm.graph)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        payload = {"format": _FORMAT, "func": self.func.__qualname__, "dynamic": self.dynamic,
                   "sources": sources, "out_map": out_map, "out_spec": torch.utils._pytree.treespec_dumps(spec),
                   "code": clean.code, "graph_module": clean}
        tmp = self.path + f".tmp{os.getpid()}"
        torch.save(payload, tmp)
        os.replace(tmp, self.path)

    # ---- later runs: the cache, without Dynamo ----
    def _load(self, path, args, kwargs):
        payload = _read(path)
        gm = payload["graph_module"]
        sources = payload["sources"]
        out_map = payload["out_map"]
        spec = torch.utils._pytree.treespec_loads(payload["out_spec"])
        scope = {"L": None, "G": self.func.__globals__}
        codes = [compile(s, "<cache_compile input>", "eval") for s in sources]
        state = {}

        def inputs(a, k):
            scope["L"] = self._bind(a, k)
            return [eval(c, {"__builtins__": {}}, scope) for c in codes]  # noqa: S307 (our own file)

        def call(*a, **k):
            flat = inputs(a, k)
            if "fn" not in state:
                state["fn"] = self._backend(gm, flat)
            outs = state["fn"](*flat)
            return torch.utils._pytree.tree_unflatten([outs[i] for i in out_map], spec)

        return call


def _read(path):
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"cache_bin must be a path, got {type(path).__name__}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"cache_bin {os.fspath(path)!r} is not a file")
    payload = torch.load(path, weights_only=False)
    if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
        raise ValueError(f"cache_bin {os.fspath(path)!r} is not a compile cache of this torch_npu")
    return payload


def cache_compile(func, *, dynamic: bool = True, cache_dir=None, global_rank=None, tp_rank=None, pp_rank=None, **kwargs):
    r"""Compile ``func`` (a method of an ``nn.Module``) with the ``npugraph_ex`` backend and
    cache the result on disk (see the module docstring for the layout); returns the callable
    to use instead of ``func``. ``kwargs``: ``custom_decompositions`` (operator -> function,
    as ``torch._decomp.get_decompositions`` gives) and the backend's options."""
    if not inspect.ismethod(func) or not isinstance(func.__self__, torch.nn.Module):
        raise TypeError("cache_compile(): func must be a method of a torch.nn.Module instance, "
                        f"got {type(func).__name__}")
    if not isinstance(dynamic, bool):
        raise TypeError(f"cache_compile(): dynamic must be a bool, got {type(dynamic).__name__}")
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
        raise TypeError(f"cache_compile(): cache_dir must be a path, got {type(cache_dir).__name__}")
    for name, value in (("global_rank", global_rank), ("tp_rank", tp_rank), ("pp_rank", pp_rank)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"cache_compile(): {name} must be a non-negative int, got {value!r}")
    return _CacheCompiled(func, dynamic, cache_dir, global_rank, tp_rank, pp_rank, dict(kwargs))


def readable_cache(cache_bin, print_output=True, file=None):
    r"""The readable text of the cache file ``cache_bin`` (a ``compiled_module``): printed
    when ``print_output``, written to ``file`` when given; returns it."""
    payload = _read(cache_bin)
    lines = [f"# npugraph_ex compile cache: {os.fspath(cache_bin)}",
             f"# func: {payload['func']}", f"# dynamic: {payload['dynamic']}", "# graph inputs:"]
    lines += [f"#   {i}: {s}" for i, s in enumerate(payload["sources"])]
    text = "\n".join(lines) + "\n" + payload["code"].strip("\n") + "\n"
    if print_output:
        print(text)
    if file is not None:
        with open(file, "w", encoding="utf-8") as f:
            f.write(text)
    return text
