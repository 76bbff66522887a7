"""Parts of ``torch_npu.profiler.dynamic_profile`` under torch_npu's module names: the parsed
``profiler_config.json`` (``ConfigContext``), the job's shared memory
(``DynamicProfilerShareMemory``), the monitor that fills it (``DynamicProfilerMonitor``, thread
``DynMonitorProc``), the dynolog client (``PyDynamicMonitorProxySingleton``) and logging
(``DynamicProfilerUtils``)."""
