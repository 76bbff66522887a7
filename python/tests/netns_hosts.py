"""Two simulated "hosts" on one machine: Linux network namespaces joined by a veth pair.

Each namespace gets one end of the pair (10.77.0.1/24 and 10.77.0.2/24, addresses only
inside the namespaces) and its own loopback; hccl tells hosts apart by their network
namespace, so ranks in one namespace share memory and those in the other are reached over
TCP. Needs root (CAP_NET_ADMIN). Used by test_hccl_multihost.py and
benchmarks/multihost_bench.py.
"""
import contextlib
import os
import signal
import subprocess
import sys

PREFIX = "tnpuhccl"  # namespaces: tnpuhccl<pid>a / b; veths: tnh<pid>a / b
MASTER = "10.77.0.1"
ADDRESSES = (MASTER, "10.77.0.2")


class Unavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no `ip`, no veth support)."""


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _remove_leftovers():
    """Namespaces of earlier runs whose process is gone (deleting one deletes its veth)."""
    res = _ip("netns", "list", check=False)
    for line in res.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(PREFIX):
            pid = name[len(PREFIX):-1]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                _ip("netns", "del", name, check=False)


@contextlib.contextmanager
def two_hosts():
    """Yields the two namespaces' names; removes them on exit. Raises Unavailable."""
    if os.geteuid() != 0:
        raise Unavailable("creating network namespaces needs root (CAP_NET_ADMIN)")
    try:
        _remove_leftovers()
    except FileNotFoundError as e:
        raise Unavailable(f"no `ip` command: {e}")
    pid = os.getpid()
    ns = (f"{PREFIX}{pid}a", f"{PREFIX}{pid}b")
    veth = (f"tnh{pid % 10**9}a", f"tnh{pid % 10**9}b")
    try:
        try:
            _ip("netns", "add", ns[0])
            _ip("netns", "add", ns[1])
            _ip("link", "add", veth[0], "type", "veth", "peer", "name", veth[1])
            for i, addr in enumerate(ADDRESSES):
                _ip("link", "set", veth[i], "netns", ns[i])
                _ip("-n", ns[i], "addr", "add", f"{addr}/24", "dev", veth[i])
                _ip("-n", ns[i], "link", "set", veth[i], "up")
                _ip("-n", ns[i], "link", "set", "lo", "up")
        except (subprocess.CalledProcessError, FileNotFoundError) as e:
            raise Unavailable(f"cannot create network namespaces here: {getattr(e, 'stderr', '') or e}")
        yield ns
    finally:
        for name in ns:
            _ip("netns", "del", name, check=False)


def kill_tree(pid):
    """SIGKILL `pid` and all its descendants."""
    parent = {}
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat") as f:
                parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (ValueError, OSError, IndexError):
            pass
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += [c for c, pp in parent.items() if pp == p]
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def torchrun_on_hosts(ns, argv, nproc_per_node, env, timeout, cwd=None):
    """``torchrun --nnodes=2`` of `argv` (a script and its arguments), one node per
    namespace, static rendezvous at MASTER; returns [(returncode, output)] per host."""
    port = 29400 + os.getpid() % 1000  # inside fresh namespaces: nothing else listens there
    procs = [subprocess.Popen(["ip", "netns", "exec", ns[k], sys.executable, "-m", "torch.distributed.run",
                               "--nnodes=2", f"--nproc_per_node={nproc_per_node}", f"--node_rank={k}",
                               f"--master_addr={MASTER}", f"--master_port={port}", *argv],
                              env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for k in range(2)]
    out = []
    try:
        for p in procs:
            try:
                text, _ = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:  # a hang: report what it printed
                kill_tree(p.pid)  # the agent and its workers (in sessions of their own)
                text = p.communicate()[0] + f"\n[killed after {timeout} s]"
            out.append((p.returncode, text))
    finally:
        for p in procs:
            if p.poll() is None:
                kill_tree(p.pid)
                p.wait()
    return out
