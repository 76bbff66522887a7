"""``BinaryDecoder.decode(all_bytes, class_bean, struct_size)``: a FRAMEWORK file of fixed-size
records (``torch.python_tracer_func``, ``torch.gc_record``) as a list of ``class_bean(record)``;
a short tail (a record cut off when the run stopped) is dropped."""

__all__ = []


class BinaryDecoder:
    @classmethod
    def decode(cls, all_bytes: bytes, class_bean, struct_size: int) -> list:
        if not isinstance(struct_size, int) or struct_size <= 0:
            raise ValueError(f"BinaryDecoder.decode: struct_size must be a positive int, got {struct_size!r}")
        whole = len(all_bytes) - len(all_bytes) % struct_size
        return [class_bean(all_bytes[i:i + struct_size]) for i in range(0, whole, struct_size)]
