"""Random number generation state of NPUs: seeding and saving/restoring generator state.

Each device has a default generator (a Philox generator in C++, the one behind
``torch.Generator("npu")`` and every random op on that device without an explicit
``generator=``); these functions drive those generators. ``torch.manual_seed`` also
reaches them through ``manual_seed_all``.
"""

from typing import Iterable, List, Union

import torch

__all__ = [
    "get_rng_state",
    "get_rng_state_all",
    "set_rng_state",
    "set_rng_state_all",
    "manual_seed",
    "manual_seed_all",
    "seed",
    "seed_all",
    "initial_seed",
]

_DeviceLike = Union[int, str, torch.device]


def _generator(device: _DeviceLike, fn: str) -> torch.Generator:
    import torch_npu.npu as npu

    npu._lazy_init()
    idx = npu.utils._valid_device_index(device, fn=fn)
    return npu.default_generators[idx]


def _check_seed(seed, fn: str) -> int:
    # int(seed), as torch.manual_seed and torch.cuda's: a bool seeds 0 or 1.
    try:
        return int(seed)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{fn}(): argument 'seed' must be an int, got "
                        f"{type(seed).__name__} ({seed!r})") from err


def get_rng_state(device: _DeviceLike = "npu") -> torch.Tensor:
    r"""Return the random number generator state of an NPU as a ``torch.ByteTensor``.

    Args:
        device (torch.device, str or int, optional): the device; the current one by default.
    """
    return _generator(device, "get_rng_state").get_state()


def get_rng_state_all():
    r"""Return the random number generator states of all NPUs."""
    import torch_npu.npu as npu

    return [get_rng_state(i) for i in range(npu.device_count())]


def set_rng_state(new_state: torch.Tensor, device: _DeviceLike = "npu") -> None:
    r"""Set the random number generator state of an NPU.

    Args:
        new_state (torch.ByteTensor): a state from :func:`get_rng_state`.
        device (torch.device, str or int, optional): the device; the current one by default.
    """
    if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8:
        what = (f"a tensor of dtype {new_state.dtype}" if isinstance(new_state, torch.Tensor)
                else type(new_state).__name__)
        raise TypeError("set_rng_state(): argument 'new_state' must be a torch.ByteTensor "
                        f"(from get_rng_state()), got {what}")
    with torch._C._DisableFuncTorch():
        state = new_state.detach().to("cpu").clone(memory_format=torch.contiguous_format)
    _generator(device, "set_rng_state").set_state(state)


def set_rng_state_all(new_states):
    r"""Set the random number generator state of every NPU (``new_states[i]`` for device ``i``)."""
    for idx, state in enumerate(new_states):
        set_rng_state(state, idx)


def manual_seed(seed):
    r"""Seed the random number generator of the current NPU.

    To seed all NPUs use :func:`manual_seed_all` (``torch.manual_seed`` does).
    """
    seed = _check_seed(seed, "manual_seed")
    import torch_npu.npu as npu

    def cb():
        npu.default_generators[npu.current_device()].manual_seed(seed)

    npu._lazy_call(cb, seed=True)


def manual_seed_all(seed):
    r"""Seed the random number generators of all NPUs."""
    seed = _check_seed(seed, "manual_seed_all")
    import torch_npu.npu as npu

    def cb():
        for gen in npu.default_generators:
            gen.manual_seed(seed)

    npu._lazy_call(cb, seed_all=True)


def seed():
    r"""Seed the generator of the current NPU with a non-deterministic random number."""
    import torch_npu.npu as npu

    def cb():
        npu.default_generators[npu.current_device()].seed()

    npu._lazy_call(cb, seed=True)


def seed_all():
    r"""Seed the generators of all NPUs with one non-deterministic random number."""
    import torch_npu.npu as npu

    def cb():
        gens = npu.default_generators
        if not gens:
            return
        gens[0].seed()
        value = gens[0].initial_seed()
        for gen in gens[1:]:
            gen.manual_seed(value)

    npu._lazy_call(cb, seed_all=True)


def initial_seed():
    r"""Return the initial seed of the generator of the current NPU."""
    import torch_npu.npu as npu

    npu._lazy_init()
    return npu.default_generators[npu.current_device()].initial_seed()


def _philox_rand(shape, seed, offset, stride=None, device=None, dtype=None):
    """``rngprims::philox_rand`` on npu: uniform values in [0, 1) that depend only on the
    ``seed`` and ``offset`` tensors (AOTAutograd's stateless rand, CUDA's Philox on GPUs), and
    the offset increment of the call (the values drawn, in Philox's blocks of 4). The bits
    are not CUDA's: a CPU generator seeded from (seed, offset) draws them."""
    if stride is not None:
        raise AssertionError(f"stride must be None, got {stride}")
    numel = 1
    for size in shape:
        numel *= int(size)
    generator = torch.Generator()
    generator.manual_seed((int(seed) * 0x9E3779B97F4A7C15 + int(offset)) & 0x7FFFFFFFFFFFFFFF)
    values = torch.rand(shape, generator=generator, dtype=dtype or torch.get_default_dtype())
    return values.to(device if device is not None else seed.device), \
        torch.scalar_tensor((numel + 3) // 4 * 4, dtype=torch.int64)

