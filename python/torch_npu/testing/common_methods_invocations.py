"""Sample-input generators of torch_npu's OpInfo tests (``torch_npu.testing.common_methods_invocations``)."""
from functools import partial

from torch.testing import make_tensor
from torch.testing._internal import common_methods_invocations
from torch.testing._internal.common_methods_invocations import sample_inputs_normal_common

__all__ = ["sample_inputs_normal_tensor_second", "sample_inputs_median_custom"]


def sample_inputs_normal_tensor_second(self, device, dtype, requires_grad, **kwargs):
    """torch.normal(mean, std) samples with a tensor std: ([3, 4], 0.3), ([3, 55], 0), ([5, 6, 7, 8], same)."""
    cases = [
        ([3, 4], 0.3, {}),
        ([3, 55], 0, {}),
        ([5, 6, 7, 8], [5, 6, 7, 8], {}),
    ]
    return sample_inputs_normal_common(self, device, dtype, requires_grad, cases, **kwargs)


def sample_inputs_median_custom(self, device, dtype, requires_grad, **kwargs):
    """torch.median samples: two empty inputs ((2, 0), (0, 2)), then PyTorch's reduction samples."""
    make_arg = partial(make_tensor, device=device, dtype=dtype, requires_grad=requires_grad)
    for shape in [(2, 0), (0, 2)]:
        yield common_methods_invocations.SampleInput(make_arg(shape))
    yield from common_methods_invocations.sample_inputs_reduction(self, device, dtype, requires_grad, **kwargs)
