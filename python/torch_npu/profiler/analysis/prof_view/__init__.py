"""The views torch_npu's analysis writes from a run's raw data (its ``prof_view``): each a
parser, a task of ``prof_common_func._task_manager`` (``_base_parser.BaseParser``) that reads
what its dependencies produced and the run's files.

* ``prepare_parse``: the host records (``TorchOpParser``, ``TaskQueueParser``), the op tree
  (``TreeBuildParser``), the host side of the trace (``TracePreParser``), the rows of the db
  export (``DbPreParser``) and host op -> device task (``RelationParser``);
* ``cann_parse``: msprof's export and analysis of the ``PROF_*`` folder (``CANNExportParser``,
  ``CANNTimelineParser``, ``CANNAnalyzeParser``; they run the ``msprof`` command line tool);
* ``_trace_view_parser`` (trace_view.json), ``_kernel_view_parser`` (kernel_details.csv),
  ``_trace_step_time_parser`` (step_trace_time.csv), ``_memory_view_parser``
  (operator_memory.csv, memory_record.csv), ``_integrate_parser`` (msprof's summary files
  copied over), ``_communication_parser`` (communication.json, communication_matrix.json),
  ``_memory_timeline_parser`` (``export_memory_timeline``);
* ``prof_db_parse``: the tables of the db export (``BasicDbParser``, ``FwkApiDbParser``).
"""
