"""``ConcurrentTasksManager``: runs the analysis's parsers as a dependency graph, as torch_npu's.

A task (``ConcurrentTask``: a name, the names of the tasks whose output it needs, a
``ConcurrentMode``) implements ``run(deps_data) -> (ret_code, output)``; ``deps_data`` maps
each dependency's name to its output. A task runs once all its dependencies succeeded, up
to ``max_concurrent_num`` at a time:

* ``MAIN_PROCESS``: called in place (an exception ends the whole run; the task stays
  ``Running``);
* ``SUB_PROCESS``: in a forked child, which sends its output (pickled) and return code back
  through a pipe, and its prints (stdout is redirected into the pipe: the parent has other
  threads, and a child writing to a shared stdout could deadlock). A child that ends
  without a return code (an exception) makes the task ``Failed``;
* ``PTHREAD``: in a thread of this process (the output is handed over in memory, only the
  return code goes through the pipe);
* ``NON_BLOCKING`` (with one of the others): the run ends when only such tasks are left.

The pipe messages are TLV: a 4-byte big-endian type (``TaskMsgType``), a 4-byte big-endian
length, the value (``send_result_to_manager`` sends the output, if any, then the return
code; ``send_print_req_to_manager`` a text). The manager waits on the pipes with epoll.
"""
import fcntl
import os
import pickle
import select
import signal
import stat
import sys
import threading
import time
import multiprocessing
from abc import ABC, abstractmethod
from enum import Enum

from ._constant import Constant, print_error_msg
from ._log import ProfilerLogger

__all__ = []

_HEAD = 8  # type (4 bytes) + length (4 bytes)
_READ_SIZE = 64 * 1024  # a Linux pipe's buffer


class ConcurrentMode:
    MAIN_PROCESS = 0
    SUB_PROCESS = 1
    PTHREAD = 2
    NON_BLOCKING = 4


class ConcurrentTask(ABC):
    def __init__(self, name: str, deps: list, mode: int):
        self.name = name
        self.deps = deps
        self.mode = mode

    @property
    def is_non_blocking(self) -> bool:
        return bool(self.mode & ConcurrentMode.NON_BLOCKING)

    @abstractmethod
    def run(self, user_input: dict):
        """``user_input``: {dependency name: its output}. Returns (return code, output); 0 is success."""
        raise NotImplementedError("Function run need to be implemented.")


class TaskMsgType(Enum):
    RET_CODE = 1
    OUTPUT = 2
    PRINT = 3


def _message(msg_type: TaskMsgType, value: bytes) -> bytes:
    return msg_type.value.to_bytes(4, "big") + len(value).to_bytes(4, "big") + value


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def send_result_to_manager(fd: int, ret_code: int, output) -> None:
    """The output (when truthy) and then the return code: the manager takes the return code
    as the end of the task."""
    if fd < 0:
        raise OSError("[Errno 9] Bad file descriptor")
    msg = _message(TaskMsgType.OUTPUT, pickle.dumps(output)) if output else b""
    _write_all(fd, msg + _message(TaskMsgType.RET_CODE, ret_code.to_bytes(4, "big")))


def send_print_req_to_manager(fd: int, text: str) -> None:
    _write_all(fd, _message(TaskMsgType.PRINT, bytes(text, encoding="utf-8")))


class TaskStatus(Enum):
    Init = 0
    Running = 1
    Succeed = 2
    Failed = 3
    Stopped = 4


class TaskInfo:
    """A task's place in the graph (the tasks it waits for, those waiting for it) and its run."""

    def __init__(self, task: ConcurrentTask):
        self.task = task
        self.pre_tasks = set(task.deps)
        self.post_tasks = set()
        self.status = TaskStatus.Init
        self.output = None
        self.handler = None  # its Process or Thread
        self.pipe = (-1, -1)  # (read end, write end); -1: closed
        self.recv_buffer = None  # the start of a message not yet complete
        self.start_time = None
        self.end_time = None
        self.execution_time = None


def _mode_names(mode: int) -> str:
    names = [name for name in ("SUB_PROCESS", "PTHREAD", "NON_BLOCKING") if mode & getattr(ConcurrentMode, name)]
    return "|".join(names) if names else "MAIN_PROCESS"


class ConcurrentTasksManager:
    def __init__(self, *, max_concurrent_num: int = 16, progress_bar=None):
        self.task_infos = {}  # task name -> TaskInfo
        self.listening_infos = {}  # read end of a pipe -> TaskInfo
        self.ready_tasks = []
        self.epoll = None
        self.max_concurrent_num = max_concurrent_num
        self.progress_bar = progress_bar  # "dot" or "cursor": shown while running
        self.logger = None

    def add_task(self, task: ConcurrentTask) -> None:
        """Tasks are added after the tasks they depend on."""
        if not isinstance(task, ConcurrentTask):
            raise TypeError(f"Task should be an instance of ConcurrentTask, got {type(task).__name__}")
        unknown = [dep for dep in task.deps if dep not in self.task_infos]
        if unknown:
            raise ValueError(f"Unknow task {unknown[0]} in deps.")
        for dep in task.deps:
            self.task_infos[dep].post_tasks.add(task.name)
        info = TaskInfo(task)
        self.task_infos[task.name] = info
        if not task.deps:
            self.ready_tasks.append(info)

    def run(self) -> None:
        try:
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, self.finalize)
            self._start_progress_bar()
            self._schedule()
            while not self._listen():
                self._schedule()
        except Exception as err:
            print_error_msg(f"An error occurred: {err}")
        finally:
            self.finalize()
            self.log_task_execution_summary()

    def finalize(self, *_signal_args) -> None:
        """Stops every task that has not succeeded."""
        for info in self.task_infos.values():
            if info.status != TaskStatus.Succeed:
                print_error_msg(f"Task [{info.task.__class__.__name__}] run failed.")
                self._stop_task(info)
        self.progress_bar = None

    def clear(self) -> None:
        for info in list(self.listening_infos.values()):
            self._stop_task(info)
        self.task_infos, self.listening_infos, self.ready_tasks = {}, {}, []
        if self.epoll is not None:
            self.epoll.close()
            self.epoll = None

    def __del__(self):
        self.clear()

    # scheduling
    def _schedule(self) -> None:
        free = max(self.max_concurrent_num - len(self.listening_infos), 0)
        starting, self.ready_tasks = self.ready_tasks[:free], self.ready_tasks[free:]
        for info in starting:
            self._run_one_task(info)

    def _deps_input(self, info: TaskInfo) -> dict:
        return {dep: self.task_infos[dep].output for dep in info.task.deps if dep in self.task_infos}

    def _run_one_task(self, info: TaskInfo) -> None:
        info.status = TaskStatus.Running
        info.start_time = time.time()
        deps_input = self._deps_input(info)
        if info.task.mode & ConcurrentMode.SUB_PROCESS:
            self._run_in_subprocess(info, deps_input)
        elif info.task.mode & ConcurrentMode.PTHREAD:
            self._run_in_thread(info, deps_input)
        else:
            ret_code, output = info.task.run(deps_input)
            self._on_task_done(info, ret_code, output)

    def _run_in_subprocess(self, info: TaskInfo, deps_input: dict) -> None:
        def child(task_info, inputs):
            os.close(task_info.pipe[0])
            write_end = task_info.pipe[1]
            sys.stdout.write = lambda text: send_print_req_to_manager(write_end, text)
            sys.stdout.flush = lambda: None
            ret_code, output = task_info.task.run(inputs)
            send_result_to_manager(write_end, ret_code, output if ret_code == 0 else None)

        self._add_listening(info)
        process = multiprocessing.Process(target=child, args=(info, deps_input))
        info.handler = process
        process.start()
        os.close(info.pipe[1])  # the child holds the write end: its exit closes the pipe
        info.pipe = (info.pipe[0], -1)

    def _run_in_thread(self, info: TaskInfo, deps_input: dict) -> None:
        def worker(task_info, inputs):
            ret_code, output = task_info.task.run(inputs)
            if ret_code == 0:
                task_info.output = output  # shared memory: no need to send it
            write_end = task_info.pipe[1]
            send_result_to_manager(write_end, ret_code, None)
            task_info.pipe = (task_info.pipe[0], -1)
            os.close(write_end)  # the hang-up ends the task

        self._add_listening(info)
        thread = threading.Thread(target=worker, args=(info, deps_input))
        info.handler = thread
        thread.start()

    def _on_task_done(self, info: TaskInfo, ret_code: int, output) -> None:
        info.end_time = time.time()
        info.execution_time = info.end_time - info.start_time
        if ret_code != 0:
            info.status = TaskStatus.Failed
            return
        info.status = TaskStatus.Succeed
        if output is not None:
            info.output = output
        for name in info.post_tasks:
            post = self.task_infos[name]
            post.pre_tasks.discard(info.task.name)
            if not post.pre_tasks:
                self.ready_tasks.append(post)
        for name in info.task.deps:
            pre = self.task_infos[name]
            pre.post_tasks.discard(info.task.name)
            if not pre.post_tasks:
                pre.output = None  # no one needs it any more

    def _on_task_exit(self, info: TaskInfo) -> None:
        if info.status != TaskStatus.Succeed:
            info.status = TaskStatus.Failed  # ended without a return code
        self._remove_listening(info)

    # the pipes
    def _add_listening(self, info: TaskInfo) -> None:
        if self.epoll is None:
            self.epoll = select.epoll()
        read_end, write_end = os.pipe()
        fcntl.fcntl(read_end, fcntl.F_SETFL, fcntl.fcntl(read_end, fcntl.F_GETFL) | os.O_NONBLOCK)
        for fd in (read_end, write_end):
            try:
                os.fchmod(fd, stat.S_IRUSR | stat.S_IWUSR)
            except OSError:
                pass
        info.pipe = (read_end, write_end)
        self.epoll.register(read_end, select.EPOLLIN | select.EPOLLET | select.EPOLLERR | select.EPOLLHUP)
        self.listening_infos[read_end] = info

    def _remove_listening(self, info: TaskInfo) -> None:
        read_end, write_end = info.pipe
        if read_end != -1:
            self.listening_infos.pop(read_end, None)
            self.epoll.unregister(read_end)
            os.close(read_end)
        if write_end != -1:
            os.close(write_end)
        info.pipe = (-1, -1)

    def _listen(self) -> bool:
        """Handles the pipes' events; True when the run is over (nothing left to wait for
        but non-blocking tasks)."""
        if self.ready_tasks and not self.listening_infos:
            return False  # tasks made ready by ones that ran in place
        if not self.ready_tasks and all(info.task.is_non_blocking for info in self.listening_infos.values()):
            time.sleep(Constant.SLEEP_TIME * 5)
            if all(info.task.is_non_blocking for info in self.listening_infos.values()):
                return True
        for fd, event in self.epoll.poll():
            info = self.listening_infos.get(fd)
            if info is None:
                continue
            if event & select.EPOLLIN:
                self._on_recv_msg(fd, info)
            if event & (select.EPOLLERR | select.EPOLLHUP):
                self._on_task_exit(info)
        return False

    def _on_recv_msg(self, fd: int, info: TaskInfo) -> None:
        msg = b""
        while True:  # edge-triggered: read all there is
            try:
                chunk = os.read(fd, _READ_SIZE)
            except BlockingIOError:
                break
            if not chunk:
                break
            msg += chunk
        if info.recv_buffer:
            msg, info.recv_buffer = info.recv_buffer + msg, None
        while msg:
            if len(msg) < _HEAD or len(msg) < _HEAD + int.from_bytes(msg[4:8], "big"):
                info.recv_buffer = msg  # the rest comes with the next event
                return
            msg_type = int.from_bytes(msg[:4], "big")
            end = _HEAD + int.from_bytes(msg[4:8], "big")
            value, msg = msg[_HEAD:end], msg[end:]
            if msg_type == TaskMsgType.RET_CODE.value:
                self._on_task_done(info, int.from_bytes(value, "big"), None)
            elif msg_type == TaskMsgType.OUTPUT.value:
                info.output = pickle.loads(value)
            elif msg_type == TaskMsgType.PRINT.value:
                print(str(value, encoding="utf-8"), end="")

    def _stop_task(self, info: TaskInfo) -> None:
        handler = info.handler
        if handler is None or not handler.is_alive():
            return
        if info.task.mode & ConcurrentMode.SUB_PROCESS:
            handler.terminate()
        elif info.task.mode & ConcurrentMode.PTHREAD:
            import ctypes

            # A thread cannot be stopped from outside: raise an exception in it.
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_long(handler.ident),
                                                       ctypes.py_object(InterruptedError))
        info.status = TaskStatus.Stopped

    # progress and summary
    def _start_progress_bar(self) -> None:
        if self.progress_bar not in ("dot", "cursor"):
            return

        def show(manager, style):
            frames = "|/-\\"
            i = 0
            while manager.progress_bar:
                print("." if style == "dot" else frames[i] + "\b", end="", flush=True)
                i = (i + 1) % len(frames)
                time.sleep(1)

        threading.Thread(target=show, args=(self, self.progress_bar), daemon=True).start()

    def get_task_execution_summary(self) -> list:
        return [{"task_name": name, "mode": _mode_names(info.task.mode), "status": info.status.name,
                 "execution_time": info.execution_time, "start_time": info.start_time, "end_time": info.end_time,
                 "deps": ", ".join(info.task.deps) if info.task.deps else "None"}
                for name, info in self.task_infos.items() if info.execution_time is not None]

    def log_task_execution_summary(self) -> None:
        try:
            self.logger = ProfilerLogger.get_instance()
        except RuntimeError:
            return  # no log of this parse
        self.logger.info("=" * 60)
        self.logger.info("Task execution completed")
        self.logger.info("=" * 60)
        for task in self.get_task_execution_summary():
            self.logger.info("%-25s | %-15s | %-10s | %.3fs | deps: %s", task["task_name"], task["mode"],
                             task["status"], task["execution_time"], task["deps"])
