"""``torch_npu.profiler.analysis``: torch_npu's parsing of profiling data.

The views of a run on this simulator are written from its task records by
``torch_npu/profiler/_analysis.py``. This package is torch_npu's analysis of what a real
Ascend device's run leaves behind -- the host side's binary records in ``FRAMEWORK/`` and
msprof's ``PROF_*`` folder with its exported CSV / JSON / SQLite files -- so that such output
can be parsed here too, and the parts both share (file names, columns, clocks):

* ``prof_bean``: one class per kind of record, with torch_npu's names and properties -- the
  decoders of the binary FRAMEWORK records (``TorchOpBean`` of torch.op_range,
  ``OpMarkBean``, ``MemoryUseBean``, ``PythonTracerFuncBean`` / ``PythonTracerHashBean``,
  ``ParamTensorBean``, ``GCRecordBean``; their struct layouts and TLV tags are those of
  torch_npu's C++ data reporter), the beans of the rows of msprof's CSV / JSON files, and the
  op tree helpers ``TorchOpNode`` / ``NodeInfoBean``;
* ``prof_parse``: the readers (``CANNFileParser`` of msprof's files and host-to-device flows,
  ``FwkFileParser`` of the FRAMEWORK records and the host side's trace / db rows,
  ``FwkCANNRelationParser`` host op -> device tasks and step spans, ``PythonTraceParser``,
  ``EventTree`` for the memory timeline);
* ``prof_view``: the parsers that write the views (trace_view.json, kernel_details.csv,
  step_trace_time.csv, operator_memory.csv / memory_record.csv, communication*.json, msprof's
  summary files, the memory timeline, the db export's tables), each a task of
  ``prof_common_func._task_manager.ConcurrentTasksManager``; ``cann_parse`` runs CANN's
  ``msprof`` tool (export, analyze); ``prof_config``: which parser needs which;
* ``_profiler_config.ProfilerConfig``: the run's ``profiler_info.json`` (level, export type,
  rank, the msprof summary files the config asks for) and its clock: system-counter values
  to monotonic ns, monotonic to wall-clock ns;
* ``prof_common_func``: ``_tlv_decoder.TLVDecoder`` / ``_binary_decoder.BinaryDecoder`` (a
  FRAMEWORK file into beans), ``_file_manager.FileManager`` (the analysis's file writers and
  size-limited readers), ``_tree_builder.TreeBuilder`` (the host-op call tree of a thread and
  the correlation ids of its enqueues), ``_trace_event_manager.TraceEventManager`` (the host
  side's Chrome-trace events and flows), ``_time_range_calculator.RangeCaculator`` (pure
  communication and free time of the overlap analysis), ``_host_info.get_host_info``,
  ``_id_manager`` (the string / call-chain / connection id tables of the db export),
  ``_feature_manager.FeatureManager`` (features agreed with CANN's feature table),
  ``_log.ProfilerLogger`` (the rotating ``logs/profiler_*.log`` of a parse),
  ``_path_manager.ProfilerPathManager`` (the parts of a result directory: FRAMEWORK/,
  ``PROF_*`` and its host / device / export folders, profiler_info.json),
  ``_task_manager`` (the parsers' dependency graph run in threads and processes),
  ``_cann_package_manager`` (which features the installed CANN toolkit's ``msprof`` offers),
  ``_db_manager`` (the SQLite access of the ``export_type="db"`` databases, ``TorchDb``),
  ``_csv_headers`` and ``_constant``'s names, messages, table columns and exact ns/us
  conversions.
"""
