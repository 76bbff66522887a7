r"""The Chrome-trace view of an NPUGraph's debug dump (``NPUGraph.debug_dump`` writes it next
to the raw dump as ``<name>.aligned.json``; open it in chrome://tracing or Perfetto).

The raw dump (``aclmdlRIDebugJsonPrint``) lists the captured model's tasks in replay order:
``{"model_id", "device", "tasks": [{"index", "type", "name"}, ...]}``. A capture joins the
streams it forked into that one ordered list, so the trace has one row, the model's stream.
A capture records no durations: every task is drawn one unit long, ``merge_gap`` units after
the previous one, so the picture shows order and kinds, not time. Event records and waits
(control tasks) are kept under their own names; every other task's name is shortened to the
operator (``aten::addmm`` stays, a compiled kernel's path prefix goes).

    python -m torch_npu.npu._npugraph_utils graph.json [-o graph.aligned.json]
"""

import json
import pathlib

import torch

__all__ = ["align_trace_json"]

log = torch._logging.getArtifactLogger("torch_npu.npugraph", "cudagraphs")

_CONTROL_TYPES = ("event_record", "event_wait", "event_reset")
_TASK_DURATION = 1.0


def _aligned_path(path):
    return path.with_name(path.name[: -len(".json")] + ".aligned.json" if path.name.endswith(".json")
                          else path.name + ".aligned.json")


def _short_name(task):
    name = str(task.get("name") or task.get("type") or "task")
    if task.get("type") in _CONTROL_TYPES:
        return name
    return name.rsplit("/", 1)[-1]


def _trace_events(dump, gap):
    if not isinstance(dump, dict) or not isinstance(dump.get("tasks"), list):
        raise ValueError("align_trace_json: expected an NPUGraph debug dump (a JSON object with a 'tasks' list), "
                         f"got {type(dump).__name__}")
    device = int(dump.get("device", 0))
    tid = f"model{dump.get('model_id', 0)}"
    events = [{"name": "process_name", "ph": "M", "pid": device, "args": {"name": f"NPU {device}"}},
              {"name": "thread_name", "ph": "M", "pid": device, "tid": tid,
               "args": {"name": f"NPUGraph model {dump.get('model_id', 0)}"}}]
    ts = 0.0
    for position, task in enumerate(dump["tasks"]):
        if not isinstance(task, dict):
            raise ValueError(f"align_trace_json: task {position} is not an object: {task!r}")
        events.append({"name": _short_name(task), "ph": "X", "pid": device, "tid": tid, "ts": ts,
                       "dur": _TASK_DURATION, "cat": str(task.get("type", "kernel")),
                       "args": {"Task Type": task.get("type"), "index": task.get("index", position),
                                "name": task.get("name")}})
        ts += _TASK_DURATION + gap
    return events


def align_trace_json(input, output=None, merge_gap=0.0):  # pylint: disable=redefined-builtin
    r"""Writes the Chrome trace of the NPUGraph debug dump ``input`` to ``output`` (by default
    ``input`` with ``.aligned.json`` for ``.json``) and returns its path. ``merge_gap``: the
    units between two tasks (at least 0)."""
    if float(merge_gap) < 0:
        raise ValueError(f"align_trace_json: merge_gap must be >= 0, got {merge_gap}")
    in_path = pathlib.Path(input)
    out_path = pathlib.Path(output) if output else _aligned_path(in_path)
    with in_path.open("r", encoding="utf-8") as f:
        dump = json.load(f)
    events = _trace_events(dump, float(merge_gap))
    with out_path.open("w", encoding="utf-8") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ns"}, f, indent=1)
    log.debug("NPUGraph trace of %s written to %s", in_path, out_path)
    return out_path


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Chrome trace of an NPUGraph debug dump.")
    parser.add_argument("input", help="the debug dump (NPUGraph.debug_dump's file)")
    parser.add_argument("-o", "--output", help="the trace (default: the input's name with .aligned.json)")
    parser.add_argument("--merge-gap", type=float, default=0.0, help="units between two tasks (default: 0)")
    cli = parser.parse_args()
    print(align_trace_json(cli.input, cli.output, cli.merge_gap))
