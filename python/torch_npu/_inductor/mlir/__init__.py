"""The MLIR backend of ``torch.compile`` on npu: FX graph -> MLIR -> IREE (llvm-cpu).

Selected like in Huawei's torch_npu, first match wins:

1. ``torch.compile(model, options={"npu_backend": "mlir"})``
2. ``torch._inductor.config.npu_backend = "mlir"``
3. ``TORCHINDUCTOR_NPU_BACKEND=mlir`` (read at compile time)

otherwise ``"default"`` (Inductor). ``install()`` (called by ``import torch_npu``) makes
``npu_backend`` an Inductor config key and routes ``torch.compile``'s Inductor wrapper
through ``resolve_backend``. It is cheap: neither Inductor nor IREE is imported here
(``torch._inductor.config`` alone costs ~1.5 s); the compiler lives in ``compiler.py``.
"""
import os
import sys

ENV_VAR = "TORCHINDUCTOR_NPU_BACKEND"
CONFIG_KEY = "npu_backend"
BACKENDS = ("default", "mlir")


def check_backend(value, source: str) -> str:
    """Return ``value`` if it names a backend, else raise naming it and the allowed ones."""
    if value not in BACKENDS:
        raise ValueError(f"Unsupported npu_backend {value!r} (from {source}): expected one of "
                         f"{', '.join(repr(b) for b in BACKENDS)}")
    return value


def resolve_backend(option=None) -> str:
    """The backend for one compilation: compile options, then Inductor config, then env."""
    config = sys.modules.get("torch._inductor.config")
    candidates = (
        (option, 'torch.compile(options={"npu_backend": ...})'),
        (getattr(config, CONFIG_KEY, None) if config is not None else None,
         "torch._inductor.config.npu_backend"),
        (os.environ.get(ENV_VAR), f"the environment variable {ENV_VAR}"),
    )
    for value, source in candidates:
        if value not in (None, "", "default"):
            return check_backend(value, source)
    return "default"


def _add_config_key(module) -> None:
    """Declare ``npu_backend`` (a str, default "default") in torch._inductor.config."""
    from torch.utils._config_module import Config, _ConfigEntry

    if CONFIG_KEY not in module._config:
        module._config[CONFIG_KEY] = _ConfigEntry(Config(default="default", value_type=str), CONFIG_KEY)


def _hook_config_module() -> None:
    """Add the key when torch._inductor.config is created (or now, if it already is).

    The config module turns itself into a ConfigModule by calling
    ``install_config_module`` as its last statement; wrapping that function lets the key
    appear without importing Inductor at ``import torch_npu`` time.
    """
    import torch.utils._config_module as config_module

    if "torch._inductor.config" in sys.modules:
        _add_config_key(sys.modules["torch._inductor.config"])
    original = config_module.install_config_module
    if getattr(original, "_npu_wrapped", False):
        return

    def install_config_module(module):
        original(module)
        if module.__name__ == "torch._inductor.config":
            _add_config_key(module)

    install_config_module._npu_wrapped = True
    config_module.install_config_module = install_config_module


def _hook_inductor_wrapper() -> None:
    """Route torch.compile's Inductor backend to the MLIR compiler when selected."""
    import torch

    wrapper = torch._TorchCompileInductorWrapper
    if getattr(wrapper, "_npu_backend_hooked", False):
        return
    original_apply_options = wrapper.apply_options
    original_call = wrapper.__call__

    def apply_options(self, options):
        if options and CONFIG_KEY in options:  # a bad value fails at torch.compile(), not later
            check_backend(options[CONFIG_KEY], 'torch.compile(options={"npu_backend": ...})')
        original_apply_options(self, options)

    def __call__(self, model_, inputs_, *, config_patches=None):
        patches = {**self.config, **(config_patches or {})}
        if resolve_backend(patches.get(CONFIG_KEY)) == "mlir":
            from torch_npu._inductor.mlir import compiler

            return compiler.compile_graph(model_, inputs_, config_patches=patches)
        return original_call(self, model_, inputs_, config_patches=config_patches)

    wrapper.apply_options = apply_options
    wrapper.__call__ = __call__
    wrapper._npu_backend_hooked = True


def install() -> None:
    """Idempotent; called once by ``import torch_npu``."""
    _hook_config_module()
    _hook_inductor_wrapper()
