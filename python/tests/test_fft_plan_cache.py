"""The FFT operators on npu and torch.npu.backends.fft_plan_cache (torch_npu's LRU cache of FFT
plans: one plan per distinct transform, max_size 10 by default, 1 to 99)."""
import pytest
import torch

import torch_npu  # noqa: F401

cache = torch.npu.backends.fft_plan_cache


@pytest.fixture(autouse=True)
def _fresh_cache():
    cache.clear()
    cache.max_size = 10
    yield
    cache.clear()
    cache.max_size = 10


def test_transforms_match_the_cpu_and_fill_the_cache():
    x = torch.randn(3, 8, dtype=torch.complex64)
    r = torch.randn(4, 6)
    torch.testing.assert_close(torch.fft.ifft(x.npu()).cpu(), torch.fft.ifft(x))
    assert cache.size == 1
    torch.testing.assert_close(torch.fft.ifft(x.npu()).cpu(), torch.fft.ifft(x))
    assert cache.size == 1  # the same transform: the same plan
    torch.testing.assert_close(torch.fft.fft(x.npu()).cpu(), torch.fft.fft(x))
    assert cache.size == 2  # the other direction
    torch.testing.assert_close(torch.fft.rfft(r.npu()).cpu(), torch.fft.rfft(r))
    torch.testing.assert_close(torch.fft.irfft(torch.fft.rfft(r).npu(), n=6).cpu(), r, rtol=1e-5, atol=1e-5)
    assert cache.size == 4  # r2c, c2r
    torch.testing.assert_close(torch.fft.fft(x.to(torch.complex128).npu()).cpu(), torch.fft.fft(x.to(torch.complex128)))
    torch.testing.assert_close(torch.fft.fft2(x.npu()).cpu(), torch.fft.fft2(x))
    assert cache.size == 6  # another dtype, another signal (3 x 8)
    out = torch.empty(3, 8, dtype=torch.complex64, device="npu")
    torch.fft.fft(x.npu(), out=out)
    torch.testing.assert_close(out.cpu(), torch.fft.fft(x))
    assert cache.size == 6  # out= uses fft's plan


def test_clear_and_max_size_evict_least_recently_used_plans():
    for n in range(2, 14):
        torch.fft.fft(torch.randn(n, dtype=torch.complex64, device="npu"))
    assert cache.size == 10 and cache.max_size == 10  # capacity reached: the oldest went
    cache.max_size = 3
    assert cache.max_size == 3 and cache.size == 3
    torch.fft.fft(torch.randn(13, dtype=torch.complex64, device="npu"))  # most recent: still cached
    assert cache.size == 3
    torch.fft.fft(torch.randn(2, dtype=torch.complex64, device="npu"))  # evicted earlier: a new plan
    assert cache.size == 3
    cache.clear()
    assert cache.size == 0 and cache.max_size == 3


def test_bad_settings():
    with pytest.raises(RuntimeError, match="read-only"):
        cache.size = 1
    with pytest.raises(RuntimeError, match="invalid value of cache_size, expected 1 to 99"):
        cache.max_size = 0
    with pytest.raises(RuntimeError, match="expected 1 to 99"):
        cache.max_size = 100
    with pytest.raises(TypeError, match="max_size must be an int"):
        cache.max_size = 2.5
    with pytest.raises(AttributeError, match="Unknown attribute"):
        cache.capacity  # noqa: B018
    with pytest.raises(RuntimeError, match="expected 1 to 99"):  # the binding checks as well
        torch_npu._C._npu_set_fft_plan_cache_max_size(0)
    assert cache.max_size == 10
