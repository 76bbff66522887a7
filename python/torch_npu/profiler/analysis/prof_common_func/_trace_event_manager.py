"""``TraceEventManager``: the Chrome-trace events of the host side, as torch_npu writes them
(times in us text, ``convert_ns2us_str``): ``create_x_event`` (a complete event of an op bean),
``create_m_event`` / ``create_gc_m_event`` (the names and sort order of the process and its
threads; a dequeue thread sorts after all others), the flow arrows ``create_torch_to_npu_flow``
(op -> device task), ``create_task_queue_flow`` (enqueue -> dequeue) and ``create_fwd_flow``
(forward op -> its backward, when on other threads), and ``get_pid_format`` (the pid of a
process's device-side lanes)."""
from ._constant import Constant, convert_ns2us_float, convert_ns2us_str

__all__ = []


def _meta(name: str, pid: int, tid: int, args: dict) -> dict:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": args}


def _flow(ph: str, name: str, flow_id, pid, tid, ts_ns: int, cat: str) -> dict:
    return {"ph": ph, "bp": "e", "name": name, "id": flow_id, "pid": pid, "tid": tid,
            "ts": convert_ns2us_str(ts_ns), "cat": cat}


class TraceEventManager:
    FWK_SORT_INDEX = 0
    GC_SORT_INDEX = 1
    PID_OFFSET = 10
    INDEX_OFFSET = 5

    @classmethod
    def create_x_event(cls, event, cat: str) -> dict:
        return {"ph": "X", "name": event.name, "pid": event.pid, "tid": event.tid, "ts": convert_ns2us_str(event.ts),
                "dur": convert_ns2us_float(event.dur), "cat": cat, "args": event.args}

    @classmethod
    def _process_meta(cls, pid: int, name: str, sort_index: int) -> list:
        return [_meta(Constant.PROCESS_NAME, pid, 0, {"name": name}),
                _meta(Constant.PROCESS_LABEL, pid, 0, {"labels": "CPU"}),
                _meta(Constant.PROCESS_SORT, pid, 0, {"sort_index": sort_index})]

    @classmethod
    def create_m_event(cls, pid: int, tid_dict: dict) -> list:
        """``tid_dict``: thread id -> whether it is the task queue's dequeue thread."""
        events = cls._process_meta(pid, "Python", cls.FWK_SORT_INDEX)
        last = max(tid_dict) + 1 if tid_dict else 0
        for tid, is_dequeue in tid_dict.items():
            events.append(_meta(Constant.THREAD_NAME, pid, tid, {"name": f"Thread {tid}"}))
            events.append(_meta(Constant.THREAD_SORT, pid, tid, {"sort_index": last if is_dequeue else tid}))
        return events

    @classmethod
    def create_gc_m_event(cls, pid: int, tid: int) -> list:
        return cls._process_meta(pid, "Python GC", cls.GC_SORT_INDEX) + [
            _meta(Constant.THREAD_NAME, pid, tid, {"name": "Python GC"}),
            _meta(Constant.THREAD_SORT, pid, tid, {"sort_index": tid})]

    @classmethod
    def create_torch_to_npu_flow(cls, start_event, end_event) -> list:
        flow_id = end_event.ts
        return [_flow("s", "torch_to_npu", flow_id, start_event.pid, start_event.tid, start_event.ts, "async_npu"),
                _flow("f", "torch_to_npu", flow_id, end_event.pid, end_event.tid, end_event.ts, "async_npu")]

    @classmethod
    def create_task_queue_flow(cls, ph: str, event) -> dict:
        return _flow(ph, "enqueue_to_dequeue", event.corr_id, event.pid, event.tid, event.ts, "async_task_queue")

    @classmethod
    def create_fwd_flow(cls, event: dict) -> list:
        """``event``: forward id -> {"start": {pid, tid, ts}, "end": {...}}; pairs on one thread need no arrow."""
        flows = []
        for fwd_id, node in event.items():
            start, end = node.get("start"), node.get("end")
            if not (start and end) or start["tid"] == end["tid"]:
                continue
            flows.append(_flow("s", "fwdbwd", fwd_id, start["pid"], start["tid"], start["ts"], "fwdbwd"))
            flows.append(_flow("f", "fwdbwd", fwd_id, end["pid"], end["tid"], end["ts"], "fwdbwd"))
        return flows

    @classmethod
    def get_pid_format(cls, pid: int, sort_index: int, device_id: int) -> int:
        return (pid << cls.PID_OFFSET) | (sort_index << cls.INDEX_OFFSET) | device_id
