"""``prof_bean``: one class per kind of profiling record, as torch_npu's.

The FRAMEWORK records written by the profiler (decoded from their binary layout):
``_torch_op_bean.TorchOpBean`` (torch.op_range), ``_op_mark_bean.OpMarkBean`` (torch.op_mark),
``_memory_use_bean.MemoryUseBean`` (torch.memory_usage), ``_python_tracer_func_bean`` /
``_python_tracer_hash_bean`` (torch.python_tracer_func / _hash), ``_param_tensor_bean``
(torch.param_tensor_info), ``_gc_record_bean.GCRecordBean`` (torch.gc_record). The rows of the
CSV / JSON files of a run (a dict per row): ``_event_bean.EventBean`` (a trace event),
``_op_summary_bean``, ``_op_statistic_bean``, ``_api_statistic_bean``, ``_ai_cpu_bean``,
``_l2_cache_bean``, ``_npu_mem_bean``, ``_npu_module_mem_bean``, ``_ge_memory_record_bean``,
``_ge_op_memory_bean``, ``_step_trace_bean``, ``_task_time_bean``, ``_soc_pmu_bean``, and the
interconnect ones (``_hccs_bean``, ``_pcie_bean``, ``_nic_bean``, ``_roce_bean``). Tree
helpers: ``_torch_op_node.TorchOpNode``, ``_node_info_bean.NodeInfoBean``.
"""
