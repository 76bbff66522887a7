"""``torch_npu.npu._memory_viz``: views of a memory snapshot (``torch.npu.memory._snapshot()``).

The snapshot of the npu caching allocator has torch.cuda's layout, so torch's own
``torch.cuda._memory_viz`` renders it: ``segments`` / ``memory`` (flame graphs of the
segments, of the blocks by stream), ``trace_plot``, ``segment_plot``, ``profile_plot``,
``compare``, and the helpers torch_npu also exposes (``format_flamegraph``, ``_write_blocks``,
``_block_extra``, ...). They are torch's functions, re-exported under torch_npu's module name.
"""
from torch.cuda._memory_viz import (_block_extra, _block_extra_legacy, _frame_filter, _frame_fmt,  # noqa: F401
                                    _frames_fmt, _write_blocks, compare, format_flamegraph, memory,
                                    profile_plot, segment_plot, segments, segsum, trace, trace_plot)

__all__ = ["segments", "memory"]
