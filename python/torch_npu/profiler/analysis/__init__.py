"""``torch_npu.profiler.analysis``: torch_npu's parsing of profiling data.

torch_npu's parsers read msprof's CANN output; here the views are written from the
simulator's task records by ``torch_npu/profiler/_analysis.py``. What this package holds is
what applies to both: ``prof_common_func._cann_package_manager`` (which features the
installed CANN toolkit's ``msprof`` offers, checked with ``_path_manager.ProfilerPathManager``)
, ``prof_common_func._db_manager`` (the SQLite access of the ``export_type="db"`` databases)
and ``prof_common_func._constant``'s messages and exact ns/µs conversions.
"""
