"""Context parallelism for attention on npu (``torch_npu.distributed.tensor.experimental``).

``context_parallel`` is torch_npu's; the other names are those of
``torch.distributed.tensor.experimental._context_parallel`` (sharding helpers, options, load
balancers), whose dispatcher runs npu attention as ring attention once this package is
imported (see ``_attention``).
"""
from torch.distributed.tensor.experimental._context_parallel._attention import (
    _CausalBehavior,
    _context_parallel_shard,
    _ContextParallel,
    _cp_options,
    _disable_context_parallel_dispatcher,
    _enable_context_parallel_dispatcher,
    _is_causal_behavior,
    _RotateMethod,
    context_parallel_unshard,
    set_rotate_method,
)
from torch.distributed.tensor.experimental._context_parallel._load_balancer import (
    _HeadTailLoadBalancer,
    _LoadBalancer,
    _PerDocumentHeadTailLoadBalancer,
)

from torch_npu.distributed.tensor.experimental._context_parallel._attention import context_parallel

__all__ = [
    "_CausalBehavior",
    "_context_parallel_shard",
    "_ContextParallel",
    "_cp_options",
    "_disable_context_parallel_dispatcher",
    "_enable_context_parallel_dispatcher",
    "_HeadTailLoadBalancer",
    "_is_causal_behavior",
    "_LoadBalancer",
    "_PerDocumentHeadTailLoadBalancer",
    "_RotateMethod",
    "context_parallel",
    "context_parallel_unshard",
    "set_rotate_method",
]
