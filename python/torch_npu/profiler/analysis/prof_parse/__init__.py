"""Readers of a run's raw data, as torch_npu's ``prof_parse``.

* ``_cann_file_parser.CANNFileParser``: msprof's exported files of the run's ``PROF_*``
  folder (``mindstudio_profiler_output/``'s CSV and JSON, ``analyze/``'s communication
  analysis, msprof's databases) found by name (``CANNDataEnum``), the timeline's events, the
  host-to-device flows (``combine_acl_to_npu``: the device tasks each host launch started)
  and the offset of msprof's clock;
* ``_fwk_file_parser.FwkFileParser``: the ``FRAMEWORK/`` binary records (host ops, task
  queue marks, memory, Python tracer, GC) as beans, and from them the host side's trace
  events and the rows of the db export's PYTORCH_API table;
* ``_fwk_cann_relation_parser.FwkCANNRelationParser``: host ops to device tasks
  (correlation ids through the task queue), and each ProfilerStep's span on the device;
* ``_python_trace_parser.PythonTraceParser``: the Python tracer's call / return records
  replayed into calls with parents (and the module / optimizer parameters they saw);
* ``_event_tree_parser.EventTree``: host ops, allocations and Python calls of the
  FRAMEWORK data as one tree per thread with tensor and allocation ids (the input of the
  memory timeline, ``prof_view._memory_timeline_parser``).
"""
