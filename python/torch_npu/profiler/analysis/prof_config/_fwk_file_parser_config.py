"""``FwkFileParserConfig``: the FRAMEWORK files (by name pattern) and how each is decoded:
its bean, whether its records are TLV (a fixed-size head, then tagged variable fields) or
plain structs, and the size of the fixed part."""
import struct

from ..prof_bean._gc_record_bean import GCRecordBean
from ..prof_bean._memory_use_bean import MemoryUseBean
from ..prof_bean._op_mark_bean import OpMarkBean
from ..prof_bean._param_tensor_bean import ParamTensorBean
from ..prof_bean._python_tracer_func_bean import PythonTracerFuncBean
from ..prof_bean._python_tracer_hash_bean import PythonTracerHashBean
from ..prof_bean._torch_op_bean import TorchOpBean
from ..prof_common_func._constant import Constant
from ..prof_common_func._file_tag import FileTag

__all__ = []


def _decode(bean, is_tlv: bool, struct_format: str = None) -> dict:
    """The size of the fixed part is that of the bean's struct (58 bytes for torch.op_range)."""
    return {"bean": bean, "is_tlv": is_tlv, "struct_size": struct.calcsize(struct_format or bean.CONSTANT_STRUCT)}


class FwkFileParserConfig:
    FILE_DISPATCH_MAP = {
        FileTag.TORCH_OP: r"^torch\.op_range",
        FileTag.OP_MARK: r"^torch\.op_mark",
        FileTag.MEMORY: r"^torch\.memory_usage",
        FileTag.GC_RECORD: r"torch\.gc_record",
        FileTag.PYTHON_TRACER_FUNC: r"torch\.python_tracer_func",
        FileTag.PYTHON_TRACER_HASH: r"torch\.python_tracer_hash",
        FileTag.PARAM_TENSOR_INFO: r"torch\.param_tensor_info",
    }

    FILE_BEAN_MAP = {
        FileTag.TORCH_OP: _decode(TorchOpBean, True),
        FileTag.OP_MARK: _decode(OpMarkBean, True),
        FileTag.MEMORY: _decode(MemoryUseBean, True),
        FileTag.GC_RECORD: _decode(GCRecordBean, False, Constant.GC_RECORD_FORMAT),
        FileTag.PYTHON_TRACER_FUNC: _decode(PythonTracerFuncBean, False),
        FileTag.PYTHON_TRACER_HASH: _decode(PythonTracerHashBean, True),
        FileTag.PARAM_TENSOR_INFO: _decode(ParamTensorBean, True),
    }
