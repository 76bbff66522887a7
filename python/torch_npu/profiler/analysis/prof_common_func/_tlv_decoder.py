"""``TLVDecoder``: the FRAMEWORK files of TLV records (``torch.op_range``, ``torch.op_mark``,
``torch.memory_usage``, ``torch.python_tracer_hash``, ``torch.param_tensor_info``).

torch_npu's C++ data reporter writes each record as ``type:uint16 | length:uint32 | body``
(little-endian); a body is a fixed-size struct (the bean's ``CONSTANT_STRUCT``) followed by
TLV fields ``tag:uint16 | length:uint32 | utf-8 text``. ``decode(all_bytes, class_bean,
constant_struct_size)`` gives ``class_bean({tag: text, ..., Constant.CONSTANT_BYTES: head})``
per record; a record shorter than its struct, or cut off, is dropped with a warning, and a field
that is not utf-8 becomes ``'N/A'`` (counted, one warning per decode).
"""
import struct
from warnings import warn

from ._constant import Constant

__all__ = []

_LOST = "The collected data has been lost"


class TLVDecoder:
    T_LEN = 2
    L_LEN = 4
    undecodable_msg_count = 0
    _HEAD = struct.Struct("<HI")

    @classmethod
    def decode(cls, all_bytes: bytes, class_bean, constant_struct_size: int) -> list:
        beans = []
        for record in cls.tlv_list_decode(all_bytes):
            if len(record) < constant_struct_size:
                warn(_LOST)
                continue
            fields = cls.tlv_list_decode(record[constant_struct_size:], is_field=True)
            fields[Constant.CONSTANT_BYTES] = record[:constant_struct_size]
            beans.append(class_bean(fields))
        if cls.undecodable_msg_count > 0:
            warn("The collected data can't be decode by bytes.decode, "
                 f"find {cls.undecodable_msg_count} items of undecoded tlv data")
            cls.undecodable_msg_count = 0
        return beans

    @classmethod
    def tlv_list_decode(cls, tlv_bytes: bytes, is_field: bool = False):
        """The TLV items of ``tlv_bytes``: a list of values, or (``is_field``) a dict tag -> text."""
        out = {} if is_field else []
        pos, end = 0, len(tlv_bytes)
        while pos < end:
            if pos + cls.T_LEN + cls.L_LEN > end:
                warn(_LOST)
                break
            tag, length = cls._HEAD.unpack_from(tlv_bytes, pos)
            pos += cls.T_LEN + cls.L_LEN
            if pos + length > end:
                warn(_LOST)
                break
            value = bytes(tlv_bytes[pos:pos + length])
            pos += length
            if not is_field:
                out.append(value)
                continue
            try:
                out[tag] = value.decode()
            except UnicodeDecodeError:
                cls.undecodable_msg_count += 1
                out[tag] = "N/A"
        return out
