"""``ProfGCDetector``: Python garbage collections that take at least ``gc_detect_threshold``
ms (``_ExperimentalConfig(gc_detect_threshold=...)``, with ProfilerActivity.CPU), as
torch_npu's: ``start()`` hooks ``gc.callbacks``, each long enough collection is kept as
(pid, start, end) in the system counter's clock (the simulator's steady clock, that of the
npu tasks), ``save()`` writes them to the run's ``FRAMEWORK/torch.gc_record``
(``Constant.GC_RECORD_FORMAT`` each) and the trace view shows them as "GC" ranges."""
import gc
import os
import struct

from torch_npu._C._profiler import _get_monotonic, _get_syscnt, _get_syscnt_enable

from ._profiler_path_creator import ProfPathCreator
from .analysis.prof_common_func._constant import Constant, print_error_msg, print_warn_msg
from .analysis.prof_common_func._file_manager import FileManager
from .analysis.prof_common_func._path_manager import ProfilerPathManager

__all__ = []


class ProfGCDetector:
    SAVE_FILE = "torch.gc_record"
    START_PHASE = "start"
    STOP_PHASE = "stop"

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold * Constant.NS_TO_MS  # ns
        self.time_info = {}  # pid -> (monotonic ns, counter) of the collection under way
        self.save_info = []  # (pid, start, end) of the long collections
        self.get_cur_ts = _get_syscnt if _get_syscnt_enable() else _get_monotonic

    def start(self) -> None:
        if self.gc_callback not in gc.callbacks:
            gc.callbacks.append(self.gc_callback)

    def stop(self) -> None:
        self.time_info.clear()
        self.save()
        self.save_info = []
        if self.gc_callback in gc.callbacks:
            gc.callbacks.remove(self.gc_callback)

    @staticmethod
    def to_bytes(records) -> bytes:
        return b"".join(struct.pack(Constant.GC_RECORD_FORMAT, *record) for record in records)

    def save(self) -> None:
        """Write the collections into the current result directory's FRAMEWORK folder."""
        if not self.save_info:
            return
        output_path = None
        try:
            prof_dir = ProfPathCreator().get_prof_dir()
            fwk_path = ProfilerPathManager.get_fwk_path(prof_dir) or os.path.join(prof_dir, Constant.FRAMEWORK_DIR)
            output_path = os.path.join(fwk_path, self.SAVE_FILE)
            FileManager.create_bin_file_by_path(output_path, self.to_bytes(self.save_info))
        except Exception as ex:  # noqa: BLE001  (profiling must not stop the job)
            print_error_msg(f"Can't create file: {output_path} ({ex})")

    def gc_callback(self, phase, info) -> None:
        pid = os.getpid()
        now = _get_monotonic()
        if phase == self.START_PHASE:
            self.time_info[pid] = (now, self.get_cur_ts())
        elif phase == self.STOP_PHASE:
            if pid not in self.time_info:
                print_warn_msg("Invalid pid in GC detect.")
            elif now - self.time_info[pid][0] >= self.threshold:
                self.save_info.append((pid, self.time_info[pid][1], self.get_cur_ts()))
        else:
            print_warn_msg("Invalid GC detect phase.")
