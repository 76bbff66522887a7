"""torch_npu.distributed.tensor.experimental: ``context_parallel``, context parallelism for
attention on npu (ring attention over ``npu_fusion_attention`` on DTensors sharded along the
sequence)."""
from torch_npu.distributed.tensor.experimental._context_parallel import context_parallel

__all__ = ["context_parallel"]

context_parallel.__module__ = __name__
