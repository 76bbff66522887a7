"""Helpers of torch_npu's profiling analysis (see ``torch_npu.profiler.analysis``)."""
