"""``FwkApiDbParser``: the PYTORCH_API table of the db export and its id tables, as torch_npu's.

The rows come from DbPreParser (``FwkFileParser.get_fwk_api``): Python calls, enqueues,
dequeues, host ops and ``mstx_*`` marks. A host op is connected to the device work it
started through CANN's node launches (msprof's CANN_API rows named "launch" at node level):
without the task queue, the innermost op of the launching thread holding the launch; with
it, the launch is inside a dequeue, whose enqueue (same correlation id) is inside the op. The
op's connection ids (the launches' correlation ids and its forward / backward link) are
stored in CONNECTION_IDS under one id. ``mstx_*`` marks are connected the same way to
msprof's MSTX_EVENTS. Then the tables PYTORCH_API, STRING_IDS, CONNECTION_IDS,
PYTORCH_CALLCHAINS and ENUM_API_TYPE are written.
"""
import bisect
from collections import defaultdict

from ...prof_common_func._constant import (ApiType, CannNodeLaunchApiOri, Constant, DbConstant,
                                           TableColumnsManager, TaskQueueDataOri, TorchOpDataOri)
from ...prof_common_func._db_manager import TorchDb
from ...prof_common_func._id_manager import CallChainIdManager, ConnectionIdManager, Str2IdManager
from ...prof_common_func._log import ProfilerLogger
from .._base_parser import BaseParser

__all__ = []

_NODE_LEVEL = 10000  # CANN_API.type of node-level APIs


def _create_table(table: str) -> None:
    TorchDb().create_table_with_headers(table, TableColumnsManager.TableColumns.get(table))


class _SpansByThread:
    """Rows (start at ``START_NS``, end at ``END_NS``, thread at ``GLOBAL_TID``) by thread, in
    start order: ``innermost(tid, start, end)``, the latest-starting row strictly holding
    (start, end) (rows of a thread nest, so that is the innermost one)."""

    def __init__(self, rows: list):
        self._rows = defaultdict(list)
        for row in sorted(rows, key=lambda r: r[TorchOpDataOri.START_NS]):
            self._rows[row[TorchOpDataOri.GLOBAL_TID]].append(row)
        self._starts = {tid: [row[TorchOpDataOri.START_NS] for row in rows] for tid, rows in self._rows.items()}

    def innermost(self, tid: int, start: int, end: int):
        rows = self._rows.get(tid, [])
        for index in range(bisect.bisect_left(self._starts.get(tid, []), start) - 1, -1, -1):
            if rows[index][TorchOpDataOri.END_NS] > end:
                return rows[index]
        return None


class FwkApiDbParser(BaseParser):
    def __init__(self, name: str, param_dict: dict):
        super().__init__(name, param_dict)
        self._fwk_apis = []
        ProfilerLogger.init(self._profiler_path, "FwkApiDbParser")
        self.logger = ProfilerLogger.get_instance()

    def run(self, deps_data: dict):
        def work():
            self.init_db_connect()
            self.set_start_string_id()
            self.get_api_data_for_db(deps_data.get(Constant.DB_PRE_PARSER, {}))
            self.save_api_data_to_db()

        return self._run_logged(work, "Failed to generate framework api table")

    @staticmethod
    def _store_connection_ids(apis: list) -> None:
        """Replaces each row's list of connection ids by its CONNECTION_IDS id (None: no connection)."""
        manager = ConnectionIdManager()
        for api in apis:
            ids = api[TorchOpDataOri.CONNECTION_ID]
            api[TorchOpDataOri.CONNECTION_ID] = manager.get_id_from_connection_ids(ids) if ids else None

    def get_api_data_for_db(self, fwk_api_data: dict) -> None:
        if not fwk_api_data:
            return
        task_enqueues = fwk_api_data.get(Constant.ENQUEUE_DATA, [])
        task_dequeues = fwk_api_data.get(Constant.DEQUEUE_DATA, [])
        torch_op_apis = fwk_api_data.get(Constant.TORCH_OP_DATA, [])
        mstx_mark_apis = fwk_api_data.get(Constant.MSTX_OP_DATA, [])
        self._fwk_apis = fwk_api_data.get(Constant.PYTHON_TRACE_DATA, []) + task_enqueues + task_dequeues
        if TorchDb().judge_table_exist(DbConstant.TABLE_CANN_API):
            self.get_torch_op_connection_ids_with_cann_api(task_enqueues, task_dequeues, torch_op_apis)
        self._store_connection_ids(torch_op_apis)
        self._fwk_apis.extend(torch_op_apis)
        if TorchDb().judge_table_exist(DbConstant.TABLE_MSTX_EVENTS):
            self.get_mstx_mark_op_connection_ids_with_cann_api(task_enqueues, task_dequeues, mstx_mark_apis)
        self._store_connection_ids(mstx_mark_apis)
        self._fwk_apis.extend(mstx_mark_apis)

    def get_mstx_mark_op_connection_ids_with_cann_api(self, task_enqueues: list, task_dequeues: list,
                                                      mstx_mark_apis: list) -> None:
        if not mstx_mark_apis:
            return
        cann_tx_apis = TorchDb().fetch_all_data(f"select startNs, endNs, globalTid, connectionId from "
                                                f"{DbConstant.TABLE_MSTX_EVENTS} order by startNs")
        if not cann_tx_apis:
            raise RuntimeWarning("Failed to get msprof_tx apis")
        mstx_mark_apis.sort(key=lambda api: api[TorchOpDataOri.START_NS])
        if task_enqueues and task_dequeues:
            self.get_torch_op_connection_ids_with_task_queue(task_enqueues, task_dequeues, mstx_mark_apis,
                                                             len(mstx_mark_apis), cann_tx_apis)

    def get_torch_op_connection_ids_with_cann_api(self, task_enqueues: list, task_dequeues: list,
                                                  torch_op_apis: list) -> None:
        if not torch_op_apis:
            return
        launch_ids = TorchDb().fetch_one_data(f"select id from {DbConstant.TABLE_STRING_IDS} where value = 'launch'")
        if not (launch_ids and launch_ids[0]):
            self.logger.error("Failed to find node launch str id")
            return
        node_launch_apis = TorchDb().fetch_all_data(
            f"select startNs, endNs, globalTid, connectionId from {DbConstant.TABLE_CANN_API} "
            f"where name = {launch_ids[0]} and type = {_NODE_LEVEL} order by startNs")
        if not node_launch_apis:
            self.logger.error("Failed to get node launch apis")
            return
        torch_op_apis.sort(key=lambda api: api[TorchOpDataOri.START_NS])
        if task_enqueues and task_dequeues:
            self.get_torch_op_connection_ids_with_task_queue(task_enqueues, task_dequeues, torch_op_apis,
                                                             len(torch_op_apis), node_launch_apis)
        else:
            self.get_torch_op_connection_ids_without_task_queue(torch_op_apis, len(torch_op_apis),
                                                                node_launch_apis)

    def get_torch_op_connection_ids_with_task_queue(self, task_enqueues: list, task_dequeues: list,
                                                    torch_op_apis: list, torch_op_len: int,
                                                    node_lauch_apis: list) -> None:
        """Each launch inside a dequeue connects the op holding that dequeue's enqueue."""
        manager = ConnectionIdManager()

        def corr_id(row):
            return manager.get_connection_ids_from_id(row[TaskQueueDataOri.CORRELATION_ID])[0]

        enqueue_of = {corr_id(enqueue): enqueue for enqueue in task_enqueues}
        dequeues = [dequeue for dequeue in task_dequeues if corr_id(dequeue) in enqueue_of]
        if not dequeues:
            return
        dequeues_by_tid = defaultdict(list)
        for dequeue in sorted(dequeues, key=lambda row: row[TaskQueueDataOri.START_NS]):
            dequeues_by_tid[dequeue[TaskQueueDataOri.GLOBAL_TID]].append(dequeue)
        starts = {tid: [row[TaskQueueDataOri.START_NS] for row in rows] for tid, rows in dequeues_by_tid.items()}
        ops = None
        for launch in node_lauch_apis:
            tid = launch[CannNodeLaunchApiOri.GLOBAL_TID]
            index = bisect.bisect_left(starts.get(tid, []), launch[CannNodeLaunchApiOri.START_NS]) - 1
            if index < 0:
                continue
            dequeue = dequeues_by_tid[tid][index]
            if not launch[CannNodeLaunchApiOri.END_NS] < dequeue[TaskQueueDataOri.END_NS]:
                continue
            ops = ops or _SpansByThread(torch_op_apis[:torch_op_len])
            enqueue = enqueue_of[corr_id(dequeue)]
            op = ops.innermost(enqueue[TaskQueueDataOri.GLOBAL_TID], enqueue[TaskQueueDataOri.START_NS],
                               enqueue[TaskQueueDataOri.END_NS])
            if op is not None:
                op[TorchOpDataOri.CONNECTION_ID].append(launch[CannNodeLaunchApiOri.CORRELATION_ID])

    def get_torch_op_connection_ids_with_enqueue(self, torch_op_apis: list, torch_op_len: int, enqueue: list,
                                                 last_torch_op_index: int, connection_id: int) -> int:
        """Connects the innermost op (from ``last_torch_op_index`` on) holding the enqueue;
        returns the index to continue from."""
        found = None
        for index in range(last_torch_op_index, torch_op_len):
            op = torch_op_apis[index]
            if enqueue[TaskQueueDataOri.GLOBAL_TID] != op[TorchOpDataOri.GLOBAL_TID]:
                continue
            if enqueue[TaskQueueDataOri.END_NS] < op[TorchOpDataOri.START_NS]:
                break
            if op[TorchOpDataOri.START_NS] < enqueue[TaskQueueDataOri.START_NS] and \
                    enqueue[TaskQueueDataOri.END_NS] < op[TorchOpDataOri.END_NS]:
                found = index
        if found is None:
            return last_torch_op_index
        torch_op_apis[found][TorchOpDataOri.CONNECTION_ID].append(connection_id)
        return found

    def get_torch_op_connection_ids_without_task_queue(self, torch_op_apis: list, torch_op_len: int,
                                                       node_lauch_apis: list) -> None:
        """Each launch connects the innermost op of its thread holding it."""
        ops = _SpansByThread(torch_op_apis[:torch_op_len])
        for launch in node_lauch_apis:
            op = ops.innermost(launch[CannNodeLaunchApiOri.GLOBAL_TID], launch[CannNodeLaunchApiOri.START_NS],
                               launch[CannNodeLaunchApiOri.END_NS])
            if op is not None:
                op[TorchOpDataOri.CONNECTION_ID].append(launch[CannNodeLaunchApiOri.CORRELATION_ID])

    def set_start_string_id(self) -> None:
        Str2IdManager().set_start_id(DbConstant.START_STRING_ID_FWK_API)

    def init_db_connect(self) -> None:
        if not TorchDb().create_connect_db():
            raise RuntimeError(f"Failed to connect to db file: {TorchDb().get_db_path()}")

    def save_fwk_api(self) -> None:
        if self._fwk_apis:
            _create_table(DbConstant.TABLE_PYTORCH_API)
            TorchDb().insert_data_into_table(DbConstant.TABLE_PYTORCH_API, self._fwk_apis)

    def save_string_ids(self) -> None:
        _create_table(DbConstant.TABLE_STRING_IDS)
        TorchDb().insert_data_into_table(DbConstant.TABLE_STRING_IDS, Str2IdManager().get_all_string_2_id_data())

    def sava_connection_ids(self) -> None:
        rows = [[index, conn_id] for index, conn_ids in ConnectionIdManager().get_all_connection_ids().items()
                for conn_id in conn_ids]
        if rows:
            _create_table(DbConstant.TABLE_CONNECTION_IDS)
            TorchDb().insert_data_into_table(DbConstant.TABLE_CONNECTION_IDS, rows)

    def save_callchain_ids(self) -> None:
        rows = [[index] + frame for index, frames in CallChainIdManager().get_all_callchain_id().items()
                for frame in frames]
        if rows:
            _create_table(DbConstant.TABLE_PYTORCH_CALLCHAINS)
            TorchDb().insert_data_into_table(DbConstant.TABLE_PYTORCH_CALLCHAINS, rows)

    def save_enum_api_types_to_db(self) -> None:
        if not TorchDb().judge_table_exist(DbConstant.TABLE_ENUM_API_TYPE):
            _create_table(DbConstant.TABLE_ENUM_API_TYPE)
        TorchDb().insert_data_into_table(DbConstant.TABLE_ENUM_API_TYPE, [
            (ApiType.TORCH_OP, "op"), (ApiType.TASK_QUEUE, "queue"), (ApiType.PYTHON_TRACE, "trace"),
            (ApiType.MSTX_OP, "mstx")])

    def save_api_data_to_db(self) -> None:
        self.save_fwk_api()
        self.save_string_ids()
        self.sava_connection_ids()
        self.save_callchain_ids()
        self.save_enum_api_types_to_db()
