r"""``npu-smi``: the Ascend System Management Interface, for the simulated devices of this host.

The console script the wheel installs. It shows what the simulator knows, in the real tool's
layout: devices (SoC, health, HBM used and total, AI Core utilisation) and the processes using
each device with their HBM. Power, temperature, bus ids and board serials are not simulated and
read ``NA``.

Data comes from the registry that every process using a simulated device keeps in shared
memory (``/dev/shm/ascend_sim_smi.<uid>``, written by core/acl/src/smi.cpp): per process and
physical device, the HBM its device memory arena holds and the time its streams ran tasks. A
process that died without leaving the registry is not shown.

    npu-smi info                      # the devices and processes tables
    npu-smi info -t memory -i <id>    # HBM of one device
    npu-smi info -t usages -i <id>    # utilisation of one device
    npu-smi info -t board -i <id>     # board information of one device
    npu-smi info watch [-i <id>] [-d <seconds>]   # one line per device and period, until Ctrl-C
"""
import argparse
import mmap
import os
import struct
import sys
import time

__all__ = ["main", "read_registry"]

_MAGIC = b"ASIMSMI1"
_VERSION = 1
_HEADER = struct.Struct("=8s4IQII24s")  # magic, version, slots, devices, slot_bytes, hbm, count, -, soc
_SLOT_HEAD = struct.Struct("=iIQ16s")  # pid, reserved, start_ticks, name
_MiB = 1 << 20
_UTIL_SAMPLE_S = 0.2


def _registry_path():
    return f"/dev/shm/ascend_sim_smi.{os.getuid()}"


def _start_ticks(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _alive(pid, start_ticks):
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return start_ticks == 0 or _start_ticks(pid) == start_ticks


def read_registry(path=None):
    r"""The registry as ``{"soc", "hbm_capacity", "physical_count", "processes": [{"pid", "name",
    "hbm_used": {device: bytes}, "busy_ns": {device: ns}}]}``, or None when no process has used
    a simulated device (or the registry has another layout)."""
    try:
        with open(path or _registry_path(), "rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    with data:
        if len(data) < _HEADER.size:
            return None
        magic, version, slots, devices, slot_bytes, hbm, count, _, soc = _HEADER.unpack_from(data, 0)
        if magic != _MAGIC or version != _VERSION or len(data) < _HEADER.size + slots * slot_bytes:
            return None
        per_device = struct.Struct(f"={devices}Q")
        processes = []
        for i in range(slots):
            base = _HEADER.size + i * slot_bytes
            pid, _, start, name = _SLOT_HEAD.unpack_from(data, base)
            if not _alive(pid, start):
                continue
            used = per_device.unpack_from(data, base + _SLOT_HEAD.size)
            busy = per_device.unpack_from(data, base + _SLOT_HEAD.size + per_device.size)
            processes.append({"pid": pid, "name": name.split(b"\0", 1)[0].decode(errors="replace"),
                              "hbm_used": {d: v for d, v in enumerate(used) if v},
                              "busy_ns": {d: v for d, v in enumerate(busy) if v}})
    return {"soc": soc.split(b"\0", 1)[0].decode(), "hbm_capacity": hbm, "physical_count": count,
            "processes": processes}


class _Snapshot:
    """Devices, HBM and AI Core utilisation over a short sample of the registry."""

    def __init__(self, sample_s=_UTIL_SAMPLE_S):
        first = read_registry()
        if first is not None and sample_s > 0:
            time.sleep(sample_s)
        last = read_registry() if first is not None else None
        self.reg = last or first
        if self.reg is None:  # no process has used a device yet: the devices as this process sees them
            import torch
            import torch_npu  # noqa: F401

            self.reg = {"soc": torch.npu.get_device_name(0), "processes": [],
                        "hbm_capacity": torch.npu.get_device_properties(0).total_memory,
                        "physical_count": torch.npu.device_count()}
        self.count = self.reg["physical_count"]
        self.util = {}
        if first is not None and last is not None:
            before = {p["pid"]: p["busy_ns"] for p in first["processes"]}
            for p in last["processes"]:
                for d, ns in p["busy_ns"].items():
                    delta = ns - before.get(p["pid"], {}).get(d, 0)
                    self.util[d] = self.util.get(d, 0) + max(delta, 0)
            self.util = {d: min(100, round(100 * ns / (sample_s * 1e9))) for d, ns in self.util.items()}

    def name(self):
        soc = self.reg["soc"]
        return soc[len("Ascend"):] if soc.startswith("Ascend") else soc

    def hbm_used(self, device):
        return sum(p["hbm_used"].get(device, 0) for p in self.reg["processes"])

    def hbm_total(self):
        return self.reg["hbm_capacity"]

    def hbm_rate(self, device):
        """HBM in use on `device`, in percent of its capacity."""
        return round(100 * self.hbm_used(device) / self.hbm_total()) if self.hbm_total() else 0

    def processes(self, device):
        return [p for p in self.reg["processes"] if p["hbm_used"].get(device)]


def _version():
    try:
        from torch_npu.version import cann_version
    except ImportError:
        return "NA"
    return cann_version


def _info_table(snap, out):
    line = "+" + "-" * 27 + "+" + "-" * 15 + "+" + "-" * 52 + "+"
    double = "+" + "=" * 27 + "+" + "=" * 15 + "+" + "=" * 52 + "+"
    ver = _version()
    out.write("+" + "-" * 96 + "+\n")
    out.write("| " + f"npu-smi {ver} (simulated)".ljust(33) + f"Version: {ver}".ljust(62) + "|\n")
    out.write(line + "\n")
    out.write("| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|\n")
    out.write("| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |\n")
    out.write(double + "\n")
    total = snap.hbm_total() // _MiB
    for d in range(snap.count):
        used = snap.hbm_used(d) // _MiB
        out.write(f"| {d:<5} {snap.name():<19} | {'OK':<13} | {'NA':<11} {'NA':<17} {'0    / 0':<21}|\n")
        out.write(f"| {0:<25} | {'NA':<13} | {snap.util.get(d, 0):<11} {'0    / 0':<17} "
                  f"{f'{used:<4} / {total}':<21}|\n")
        out.write(double + "\n")
    out.write(line + "\n")
    out.write("| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |\n")
    out.write(double + "\n")
    for d in range(snap.count):
        procs = snap.processes(d)
        if not procs:
            out.write("| " + f"No running processes found in NPU {d}".ljust(95) + "|\n")
        for p in procs:
            out.write(f"| {d:<7} {0:<17} | {p['pid']:<13} | {p['name']:<24} | "
                      f"{p['hbm_used'][d] // _MiB:<24}|\n")
        out.write(double + "\n")


def _fields(out, rows):
    width = max(len(k) for k, _ in rows) + 1
    for k, v in rows:
        out.write(f"\t{k.ljust(width)}: {v}\n" if k else "\n")


def _check_id(snap, device):
    if device is None:
        raise SystemExit("npu-smi: -i <id> is required with -t")
    if not 0 <= device < snap.count:
        raise SystemExit(f"npu-smi: invalid NPU id {device} (this host has NPU 0..{snap.count - 1})")


def _info_type(snap, kind, device, out):
    _check_id(snap, device)
    total = snap.hbm_total() // _MiB
    rate = snap.hbm_rate(device)
    if kind == "memory":
        _fields(out, [("NPU ID", device), ("Chip Count", 1), ("", ""), ("DDR Capacity(MB)", 0),
                      ("DDR Clock Speed(MHz)", "NA"), ("DDR Usage Rate(%)", 0), ("HBM Capacity(MB)", total),
                      ("HBM Clock Speed(MHz)", "NA"), ("HBM Usage Rate(%)", rate), ("Chip ID", 0)])
    elif kind == "usages":
        _fields(out, [("NPU ID", device), ("Chip Count", 1), ("", ""), ("DDR Capacity(MB)", 0),
                      ("DDR Usage Rate(%)", 0), ("HBM Capacity(MB)", total), ("HBM Usage Rate(%)", rate),
                      ("Aicore Usage Rate(%)", snap.util.get(device, 0)), ("Aivector Usage Rate(%)", "NA"),
                      ("Aicpu Usage Rate(%)", "NA"), ("Ctrlcpu Usage Rate(%)", "NA"),
                      ("HBM Bandwidth Usage Rate(%)", "NA"), ("Chip ID", 0)])
    else:  # board
        _fields(out, [("NPU ID", device), ("Product Name", f"{snap.name()} (simulated)"), ("Model", "NA"),
                      ("Manufacturer", "NA"), ("Serial Number", "NA"), ("Software Version", _version()),
                      ("Firmware Version", "NA"), ("Compatibility", "OK"), ("Board ID", "NA"),
                      ("PCIe Bus Info", "NA"), ("Slot ID", device), ("Chip Count", 1)])


def _watch(device, delay, out):
    header = "NpuID(Idx)  ChipId(Idx) Pwr(W)      Temp(C)     AI Core(%)  AI Cpu(%)   Ctrl Cpu(%) Memory(%)   Memory BW(%)"
    out.write(header + "\n")
    out.flush()
    try:
        while True:
            snap = _Snapshot(sample_s=delay)
            devices = [device] if device is not None else range(snap.count)
            for d in devices:
                _check_id(snap, d)
                out.write(f"{d:<11} {0:<11} {'NA':<11} {'NA':<11} {snap.util.get(d, 0):<11} {'NA':<11} "
                          f"{'NA':<11} {snap.hbm_rate(d):<11} {'NA'}\n")
            out.flush()
    except KeyboardInterrupt:
        pass


def main(argv=None):
    r"""``npu-smi`` (see the module's documentation); returns the exit status."""
    parser = argparse.ArgumentParser(prog="npu-smi", description="Ascend NPU System Management Interface "
                                     "(simulated devices)")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="device information")
    info.add_argument("what", nargs="?", choices=["watch"], help="watch: one line per device and period")
    info.add_argument("-t", dest="type", choices=["memory", "usages", "board"], help="information of one kind")
    info.add_argument("-i", dest="id", type=int, help="NPU id")
    info.add_argument("-c", dest="chip", type=int, default=0, help="chip id (0: one chip per NPU)")
    info.add_argument("-d", dest="delay", type=float, default=1.0, help="watch: seconds per period")
    args = parser.parse_args(argv)
    if args.chip != 0:
        parser.error(f"invalid chip id {args.chip} (each NPU has one chip, id 0)")
    out = sys.stdout
    if args.what == "watch" and args.delay <= 0:
        parser.error(f"-d must be positive, got {args.delay}")
    try:
        if args.what == "watch":
            _watch(args.id, args.delay, out)
        elif args.type:
            _info_type(_Snapshot(), args.type, args.id, out)
        else:
            _info_table(_Snapshot(), out)
        out.flush()
    except BrokenPipeError:  # `npu-smi info | head`: the reader left; end quietly, as a CLI does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
