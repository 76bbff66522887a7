"""Parts of ``torch_npu.profiler.dynamic_profile`` under torch_npu's module names: the parsed
``profiler_config.json`` (``ConfigContext``), the owner of that file
(``DynamicProfilerShareMemory``) and logging (``DynamicProfilerUtils``)."""
