"""``torch_npu.profiler.analysis``: torch_npu's parsing of profiling data.

torch_npu's parsers read msprof's CANN output; here the views are written from the
simulator's task records by ``torch_npu/profiler/_analysis.py``. What this package holds is
what applies to both:

* ``prof_bean``: one class per kind of record, with torch_npu's names and properties -- the
  decoders of the binary FRAMEWORK records the profiler writes (``TorchOpBean`` of
  torch.op_range, ``OpMarkBean``, ``MemoryUseBean``, ``PythonTracerFuncBean`` /
  ``PythonTracerHashBean``, ``ParamTensorBean``, ``GCRecordBean``; their struct layouts and TLV
  tags are those of torch_npu's C++ data reporter), the beans of the rows of msprof's CSV / JSON
  files, and the op tree helpers ``TorchOpNode`` / ``NodeInfoBean``;
* ``_profiler_config.ProfilerConfig``: the run's ``profiler_info.json`` (level, export type,
  rank) and its clock: system-counter values to monotonic ns, monotonic to wall-clock ns;
* ``prof_common_func``: ``_tlv_decoder.TLVDecoder`` / ``_binary_decoder.BinaryDecoder`` (a
  FRAMEWORK file into beans), ``_file_manager.FileManager`` (the analysis's file writers and
  size-limited readers), ``_tree_builder.TreeBuilder`` (the host-op call tree of a thread and
  the correlation ids of its enqueues), ``_trace_event_manager.TraceEventManager`` (the host
  side's Chrome-trace events and flows), ``_time_range_calculator.RangeCaculator`` (pure
  communication and free time of the overlap analysis), ``_host_info.get_host_info``,
  ``_id_manager`` (the string / call-chain / connection id tables of the db export),
  ``_feature_manager.FeatureManager`` (features agreed with CANN's feature table),
  ``_log.ProfilerLogger`` (the rotating ``logs/profiler_*.log`` of a parse), ``_path_manager.ProfilerPathManager`` (the FRAMEWORK and msprof
  ``PROF_*`` folders, profiler_info.json, ``host/info.json``), ``_cann_package_manager`` (which
  features the installed CANN toolkit's ``msprof`` offers), ``_db_manager`` (the SQLite access
  of the ``export_type="db"`` databases) and ``_constant``'s messages, record field names and
  exact ns/µs conversions.

Not here: torch_npu's prof_parse / prof_view parsers of msprof output (the views are built by
``_analysis.py``).
"""
