"""``CsvHeaders``: column names of torch_npu's CSV views and of the msprof files they come from
(op_summary -> kernel_details; step_trace_time; operator_memory and memory_record). Both the
views of a simulator run (``profiler/_analysis.py``) and the parsers of msprof output
(``prof_view``) write these."""

__all__ = []


class CsvHeaders:
    TASK_START_TIME = "Task Start Time(us)"
    OP_SUMMARY_SHOW_HEADERS = ["Device_id", "Op Name", "OP Type", "Task Type", TASK_START_TIME,
                               "Task Duration(us)", "Task Wait Time(us)", "Block Num"]
    OP_SUMMARY_SHAPE_HEADERS = ["Input Shapes", "Input Data Types", "Input Formats", "Output Shapes",
                                "Output Data Types", "Output Formats"]
    OP_SUMMARY_KERNEL_BASE_HEADERS = ["Device_id", "Name", "Type", "Accelerator Core", "Start Time(us)",
                                      "Duration(us)", "Wait Time(us)", "Block Num"]
    STEP_TRACE_TIME = ["Device_id", "Step", "Computing", "Communication(Not Overlapped)", "Overlapped",
                       "Communication", "Free", "Stage", "Bubble", "Communication(Not Overlapped and Exclude Receive)",
                       "Preparing"]
    OPERATOR_MEMORY = ["Name", "Size(KB)", "Allocation Time(us)", "Release Time(us)", "Active Release Time(us)",
                       "Duration(us)", "Active Duration(us)", "Allocation Total Allocated(MB)",
                       "Allocation Total Reserved(MB)", "Allocation Total Active(MB)", "Release Total Allocated(MB)",
                       "Release Total Reserved(MB)", "Release Total Active(MB)", "Stream Ptr", "Device Type"]
    MEMORY_RECORD = ["Component", "Timestamp(us)", "Total Allocated(MB)", "Total Reserved(MB)", "Total Active(MB)",
                     "Stream Ptr", "Device Type"]
