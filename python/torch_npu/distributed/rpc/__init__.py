"""torch_npu.distributed.rpc: torch.distributed.rpc for npu tensors.

Importing it registers the ``NPU_TENSORPIPE`` RPC backend (``backend_registry``), whose options
are ``options.NPUTensorPipeRpcBackendOptions``: npu tensors sent by ``rpc_sync``,
``rpc_async`` and ``remote`` arrive on the callee's device that the caller's device map names,
and results come back on the caller's device that the map inverts to.
"""
import torch.distributed.rpc as _rpc

__all__ = []

if _rpc.is_available():
    from . import backend_registry, options

    backend_registry._rpc_backend_registry()
