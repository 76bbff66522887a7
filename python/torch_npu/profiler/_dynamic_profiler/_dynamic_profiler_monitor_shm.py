"""``DynamicProfilerShareMemory``: the shared-memory segment through which the dynamic
profiler's monitor hands ``profiler_config.json`` to every process of a job, as torch_npu's.

The processes that call ``dynamic_profile.init`` with one folder share one POSIX
shared-memory segment (``/dev/shm/DynamicProfileNpuShm_{uid}_{hash of the folder}``, per
user and folder; ``CFG_BUFFER_SIZE`` bytes). The first process creates it (``is_create_process``),
creates ``profiler_config.json`` with ``JSON_DATA`` if it is missing and runs the monitor
(``DynamicProfilerMonitor``); the others attach. Launchers (``torchrun``, ``python -m
torch.distributed.run``, ...) without ``RANK`` attach to nothing.

Layout: a header (``HEADER``: a sequence number, the config file's mtime in ns, the
payload's length, the creator's pid and start time) and the config as JSON. The monitor
writes with a sequence lock (odd while writing), so readers never see half a config; each
publication moves the sequence number on, which is how readers see a new config.

A segment whose creator is gone (a job that was killed: nothing unlinked it) is removed by
the next job's first process (``_clean_shm_for_killed``); a segment whose creator runs is used.
"""
import hashlib
import json
import os
import random
import struct
import sys
import threading
import time

from ._dynamic_profiler_utils import DynamicProfilerUtils

__all__ = []

_LOG = DynamicProfilerUtils.out_log
_LEVEL = DynamicProfilerUtils.LoggerLevelEnum
_TRACKER_LOCK = threading.Lock()


def _shared_memory(name: str, create: bool, size: int = 0):
    """A ``multiprocessing.shared_memory.SharedMemory`` that the resource tracker does not
    own (it would unlink the segment when any process that attached exits)."""
    from multiprocessing import resource_tracker, shared_memory

    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, create=create, size=size, track=False)
    with _TRACKER_LOCK:
        register = resource_tracker.register
        resource_tracker.register = lambda *args, **kwargs: None
        try:
            return shared_memory.SharedMemory(name=name, create=create, size=size)
        finally:
            resource_tracker.register = register


def _unlink(shm) -> None:
    """Remove the segment (without the resource tracker, which never owned it)."""
    if sys.version_info >= (3, 13):
        shm.unlink()
    else:
        import _posixshmem

        _posixshmem.shm_unlink(shm._name)


class DynamicProfilerShareMemory:
    # profiler_config.json as torch_npu creates it.
    JSON_DATA = {
        "activities": ["CPU", "NPU"],
        "prof_dir": "./",
        "analyse": False,
        "async_mode": False,
        "record_shapes": False,
        "profile_memory": False,
        "with_stack": False,
        "with_flops": False,
        "with_modules": False,
        "active": 1,
        "warmup": 0,
        "start_step": 0,
        "is_rank": False,
        "rank_list": [],
        "experimental_config": {
            "profiler_level": "Level0",
            "aic_metrics": "AiCoreNone",
            "l2_cache": False,
            "op_attr": False,
            "gc_detect_threshold": None,
            "data_simplification": True,
            "record_op_args": False,
            "export_type": ["text"],
            "msprof_tx": False,
            "mstx": False,
            "host_sys": [],
            "mstx_domain_include": [],
            "mstx_domain_exclude": [],
            "sys_io": False,
            "sys_interconnection": False,
        },
    }
    # a process started as one of these (without RANK) is a launcher, not a worker
    DISTRIBUTED_LAUNCHERS = ("torchrun", "torch_npu_run", "vllm")
    DISTRIBUTED_MODULES = {
        "torch.distributed.run",
        "torch.distributed.launch",
        "torch_npu.distributed.run",
        "torch_npu.distributed.launch",
        "vllm.entrypoints.openai.api_server",
    }
    # sequence number, config mtime (ns), payload length, creator pid, creator start time
    HEADER = struct.Struct("<QQIiQ")
    SHM_DIR = "/dev/shm"
    CREATE_TRIES = 10

    def __init__(self, path: str, config_path: str, rank_id: int):
        self._path = os.path.abspath(path) if path else ""
        self.config_path = config_path
        self._rank_id = rank_id
        key = hashlib.sha1(self._path.encode("utf-8")).hexdigest()[:16]
        self.shm_path = f"DynamicProfileNpuShm_{os.getuid()}_{key}"
        self._shm_buf_bytes_size = DynamicProfilerUtils.CFG_BUFFER_SIZE
        self._is_dyno = DynamicProfilerUtils.is_dyno_model()
        self.is_create_process = False
        self.shm = None
        self.cur_mtime = 0  # profiler_config.json's mtime (ns) when the segment was created
        self.is_mmap = False  # (torch_npu's file-backed segment for Python 3.7)
        self._clean_shm_for_killed()
        self._create_shm()
        if self.is_create_process and not self._is_dyno:
            self._create_prof_cfg()

    # -- processes -------------------------------------------------------------------------
    def _get_pid_st_ctime(self, pid):
        """The start time of process ``pid`` (clock ticks after boot, from /proc/<pid>/stat),
        or None (logged) if it cannot be read."""
        try:
            fd = os.open(f"/proc/{int(pid)}/stat", os.O_RDONLY)
            try:
                text = os.read(fd, 4096).decode("utf-8", "replace")
            finally:
                os.close(fd)
            # "pid (comm) state ppid ..." : starttime is field 22, the 20th after "(comm)"
            return int(text[text.rindex(")") + 2:].split()[19])
        except Exception as ex:  # noqa: BLE001
            _LOG(f"Cannot read the start time of process {pid}: {ex}", _LEVEL.ERROR)
            return None

    def _is_worker_process(self) -> bool:
        if os.environ.get("RANK") is not None:  # set by torchrun & co for their workers
            return True
        try:
            with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
                args = [a.decode("utf-8", "ignore") for a in f.read(1024).split(b"\x00") if a]
        except OSError as ex:
            _LOG(f"Failed to read the cmdline of current process: {ex}", _LEVEL.WARNING)
            return False
        exe = os.path.basename(args[0]) if args else ""
        if exe.endswith(self.DISTRIBUTED_LAUNCHERS):
            return False  # torchrun ...
        if "python" in exe.lower() and len(args) >= 2:
            if args[1].endswith(self.DISTRIBUTED_LAUNCHERS):
                return False  # python .../torchrun ...
            if len(args) >= 3 and args[1] == "-m" and args[2] in self.DISTRIBUTED_MODULES:
                return False  # python -m torch.distributed.run ...
        return True

    def _segment_file(self) -> str:
        return os.path.join(self.SHM_DIR, self.shm_path)

    def _clean_shm_for_killed(self) -> None:
        """Remove the segment if the process that created it is gone (killed before it could
        unlink it) or its pid now names another process; keep it while its creator runs or
        when that cannot be told."""
        seg = self._segment_file()
        try:
            fd = os.open(seg, os.O_RDONLY)
        except OSError:
            return  # none (or not ours to read: creating it will say so)
        try:
            ino = os.fstat(fd).st_ino
            head = os.read(fd, self.HEADER.size)
        finally:
            os.close(fd)
        if len(head) < self.HEADER.size:
            return  # being created
        _, _, _, pid, start = self.HEADER.unpack(head)
        if pid <= 0:
            return  # being created
        if os.path.exists(f"/proc/{pid}"):
            now = self._get_pid_st_ctime(pid)
            if now is None or now == start:
                return
        try:
            if os.stat(seg).st_ino == ino:
                os.unlink(seg)
                _LOG(f"Removed the shared memory {seg} of a job that ended without removing it "
                     f"(its process {pid} is gone).", _LEVEL.INFO)
        except OSError as ex:
            _LOG(f"Cannot remove the stale shared memory {seg}: {ex}; remove it and retry.", _LEVEL.WARNING)

    # -- the segment ---------------------------------------------------------------------
    def _create_shm(self) -> None:
        if not self._is_worker_process():
            return
        self._create_shm_over_py38()

    def _get_default_cfg_bytes(self) -> bytes:
        return json.dumps(self.JSON_DATA).encode("utf-8")

    def _create_shm_over_py38(self) -> None:
        """Attach to the job's segment, or create it (exactly one process succeeds)."""
        for tries_left in range(self.CREATE_TRIES - 1, -1, -1):
            try:
                self.shm = _shared_memory(self.shm_path, create=False)
                if self.shm.size < self.HEADER.size:
                    raise ValueError(f"the shared memory {self.shm_path} is too small ({self.shm.size} bytes)")
                self.is_create_process = False
                _LOG(f"Rank {self._rank_id} shared memory is connected.")
                return
            except FileNotFoundError:
                try:
                    self.shm = _shared_memory(self.shm_path, create=True, size=self._shm_buf_bytes_size)
                    self.is_create_process = True
                    payload = self._get_default_cfg_bytes()
                    self.shm.buf[self.HEADER.size:self.HEADER.size + len(payload)] = payload
                    self.HEADER.pack_into(self.shm.buf, 0, 0, 0, len(payload), os.getpid(),
                                          self._get_pid_st_ctime(os.getpid()) or 0)
                    _LOG(f"Rank {self._rank_id} shared memory is created.")
                    return
                except Exception as ex:  # noqa: BLE001  (another process created it first: attach)
                    self._close()
                    _LOG(f"Rank {self._rank_id} shared memory create failed, retry times = {tries_left}, "
                         f"{ex} has occur.", _LEVEL.ERROR)
                    time.sleep(random.uniform(0, 0.02))
            except Exception as ex:  # noqa: BLE001  (e.g. being created: not sized yet)
                self._close()
                _LOG(f"Rank {self._rank_id} shared memory create failed, retry times = {tries_left}, "
                     f"{ex} has occur.", _LEVEL.ERROR)
                time.sleep(0.02)
        raise RuntimeError(f"Failed to create shared memory {self.shm_path}.")

    def _create_prof_cfg(self) -> None:
        """profiler_config.json with JSON_DATA if missing; its mtime is the monitor's start."""
        if not os.path.exists(self.config_path):
            _LOG("Create profiler_config.json default.")
            with open(self.config_path, "w") as f:
                json.dump(self.JSON_DATA, f, indent=4)
        else:
            if not os.access(self.config_path, os.R_OK):
                _LOG(f"Dynamic profiler config '{self.config_path}' is not readable, please check the "
                     f"permission, and execute chmod u+r {self.config_path}", _LEVEL.ERROR)
            if not os.access(self.config_path, os.W_OK):
                _LOG(f"Dynamic profiler config '{self.config_path}' is not writeable, please check the "
                     f"permission, and execute chmod u+w {self.config_path}", _LEVEL.ERROR)
        self.cur_mtime = os.stat(self.config_path).st_mtime_ns

    def _close(self) -> None:
        if self.shm is not None:
            try:
                self.shm.close()
            except Exception:  # noqa: BLE001
                pass
            self.shm = None

    def clean_resource(self) -> None:
        """Detach; the creator also removes the segment."""
        if self.shm is None:
            return
        if self.is_create_process:
            try:
                _unlink(self.shm)
                _LOG(f"Rank {self._rank_id} unlink shm")
            except Exception as ex:  # noqa: BLE001
                _LOG(f"Rank {self._rank_id} unlink shm failed, may be removed, {ex} has occur", _LEVEL.WARNING)
        self._close()

    # -- reading and writing ---------------------------------------------------------------
    def write_config(self, payload: bytes, file_mtime: int) -> None:
        """Publish a config (JSON bytes) under a new sequence number."""
        room = self._shm_buf_bytes_size - self.HEADER.size
        if len(payload) > room:
            raise ValueError(f"the config has {len(payload)} bytes, more than the {room} bytes of the shared memory")
        buf = self.shm.buf
        seq, _, _, pid, start = self.HEADER.unpack_from(buf, 0)
        struct.pack_into("<Q", buf, 0, seq + 1)  # odd: being written
        buf[self.HEADER.size:self.HEADER.size + len(payload)] = payload
        self.HEADER.pack_into(buf, 0, seq + 1, file_mtime, len(payload), pid, start)
        struct.pack_into("<Q", buf, 0, seq + 2)
        del buf

    def read_snapshot(self):
        """(sequence number, config mtime in ns, config bytes) of one publication."""
        buf = self.shm.buf
        try:
            for _ in range(1000):
                seq, mtime, length, _, _ = self.HEADER.unpack_from(buf, 0)
                if seq % 2 == 0:
                    payload = bytes(buf[self.HEADER.size:self.HEADER.size + length])
                    if struct.unpack_from("<Q", buf, 0)[0] == seq:
                        return seq, mtime, payload
                time.sleep(0.0005)
        finally:
            del buf
        raise RuntimeError(f"the shared memory {self.shm_path} is being written for too long")

    def read_bytes(self, read_time: bool = False) -> bytes:
        """The config's JSON bytes; with ``read_time`` the 8 bytes of its sequence number
        (which changes with each new config)."""
        if self.shm is None:
            raise RuntimeError(f"rank {self._rank_id} has no shared memory (not a worker process)")
        if read_time:
            return bytes(self.shm.buf[:8])
        return self.read_snapshot()[2]
