"""Server-side cost of a workload: CPU seconds (user+sys) and peak resident
memory of a process tree, read from /proc (Linux only).

    tree = ProcTree(target.pids).start()
    ... run the workload ...
    stats = tree.stop()        # ProcStats(cpu_s, peak_rss_bytes, samples)

What it sees:
- CPU: at start and at stop, the sum over the live tree of utime+stime plus
  cutime+cstime (the CPU of children each process has *waited for*). The
  figure is the difference. A short-lived child (a `git upload-pack` under a
  gunicorn worker, or under stock's git-http-backend) is thus counted through
  its parent's cutime/cstime once reaped, however briefly it lived; a child
  alive at stop is counted directly. All threads of a process are included.
- Peak RSS: a sampler thread walks the tree every ~50 ms and records the
  largest sum of RSS over its processes.

Precise mode (`ProcTree(roots, precise=True)`, for the CPU of one fetch):
the CPU of live threads is read in nanoseconds from
/proc/PID/task/TID/schedstat instead of clock ticks (10 ms on most
kernels), thread by thread; reaped children still arrive through cutime and
cstime, in ticks. A thread that exits between start and stop loses its share
of the interval (the short stdin feeder threads of a request: microseconds);
it never subtracts what it used before start.

What it cannot see:
- processes that left the tree (daemonized, reparented to init, e.g. a
  detached `git gc --auto`) and children not yet reaped at stop whose parent
  has exited, unless a root names them (a callable root: aspen-cgi's
  resident, which aspen-apache's target adds; its workers' CPU reaches it
  through cutime when it reaps them);
- the memory of processes that live less than one sampling interval, and
  RSS peaks between samples; the sum counts shared pages (libraries, page
  cache mappings) once per process, so it overstates real memory use.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Iterable, Optional, Union

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class ProcStats:
    """CPU and peak memory of a process tree over a measured interval."""
    cpu_s: float              # user+sys seconds, children waited for included
    peak_rss_bytes: int       # largest sum of RSS over the tree seen by the sampler
    samples: int = 0          # sampler passes made


@dataclass
class _Stat:
    ppid: int
    cpu_ticks: int            # utime+stime+cutime+cstime
    rss_bytes: int


def _read_stat(pid: int) -> Optional[_Stat]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2:].split()
    # fields[0] is field 3 (state) of proc(5): ppid=4, utime=14, stime=15, cutime=16, cstime=17, rss=24
    return _Stat(int(fields[1]), sum(int(x) for x in fields[11:15]), int(fields[21]) * _PAGE)


_HAVE_CHILDREN = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def _children(pid: int) -> list[int]:
    """Direct children of PID, through every thread's `children` file (gthread workers spawn from threads)."""
    kids: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                kids.extend(int(x) for x in f.read().split())
        except OSError:
            continue
    return kids


def _all_stats() -> dict[int, _Stat]:
    stats = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _read_stat(int(name))
            if st is not None:
                stats[int(name)] = st
    return stats


def tree_stats(roots: Iterable[int]) -> dict[int, _Stat]:
    """The stats of ROOTS and all their live descendants.

    A root may be a callable returning pids, asked each time (a server's
    process that comes and goes beside its tree: aspen-cgi's resident).

    Uses /proc/PID/task/TID/children where the kernel has it (CONFIG_PROC_CHILDREN),
    else one pass over every /proc/PID/stat."""
    stack = [p for r in roots for p in (r() if callable(r) else (r,))]
    out: dict[int, _Stat] = {}
    if _HAVE_CHILDREN:
        while stack:
            pid = stack.pop()
            if pid in out:
                continue
            st = _read_stat(pid)
            if st is not None:
                out[pid] = st
                stack.extend(_children(pid))
        return out
    everything = _all_stats()
    kids: dict[int, list[int]] = {}
    for pid, st in everything.items():
        kids.setdefault(st.ppid, []).append(pid)
    while stack:
        pid = stack.pop()
        if pid in out or pid not in everything:
            continue
        out[pid] = everything[pid]
        stack.extend(kids.get(pid, ()))
    return out


def _sample(roots: list[int]) -> tuple[int, int]:
    """(cpu ticks, rss bytes) summed over the live tree."""
    stats = tree_stats(roots).values()
    return sum(s.cpu_ticks for s in stats), sum(s.rss_bytes for s in stats)


def settle(roots: list, quiet: float = 0.3, timeout: float = 10.0) -> bool:
    """Wait until the trees of ROOTS use no CPU for QUIET seconds (a
    server's workers done booting: gunicorn answers as soon as one has
    loaded the application, and the others' imports then share the cores
    with the first measured request), at most TIMEOUT seconds; True when
    they did."""
    deadline = time.monotonic() + timeout
    last, since = _sample(roots)[0], time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = _sample(roots)[0]
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return True
    return False


def _children_ticks(pid: int) -> Optional[int]:
    """cutime+cstime of PID (children it has waited for), in ticks."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2:].split()
    return int(fields[13]) + int(fields[14])


def _thread_ns(pid: int) -> Optional[dict[int, int]]:
    """tid -> CPU ns run so far (schedstat's first field), for every live thread of PID;
    None when schedstat cannot be read."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    out: dict[int, int] = {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                out[int(tid)] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return out or None


@dataclass
class _Precise:
    total_ticks: int                  # utime+stime+cutime+cstime: what a parent's cutime gets when it is reaped
    children_ticks: int               # cutime+cstime
    threads: Optional[dict[int, int]]  # tid -> ns; None without schedstat


def precise_snapshot(roots: Iterable[int]) -> dict[int, _Precise]:
    """The tree's CPU, per process, as `precise_cpu_s` compares it."""
    out = {}
    for pid, st in tree_stats(list(roots)).items():
        kids = _children_ticks(pid)
        if kids is None:
            continue
        out[pid] = _Precise(st.cpu_ticks, kids, _thread_ns(pid))
    return out


def precise_cpu_s(start: dict[int, _Precise], stop: dict[int, _Precise]) -> float:
    """CPU seconds the tree used between two snapshots: live threads in ns, reaped
    children in ticks; a process gone at STOP gives back what it had used at START
    (its parent's cutime now holds all of it)."""
    ns, ticks = 0, 0
    for pid, b in stop.items():
        a = start.get(pid)
        ticks += b.children_ticks - (a.children_ticks if a else 0)
        if b.threads is None or (a is not None and a.threads is None):
            ticks += (b.total_ticks - b.children_ticks) - ((a.total_ticks - a.children_ticks) if a else 0)
            continue
        before = a.threads if a else {}
        ns += sum(v - before.get(tid, 0) for tid, v in b.threads.items() if v >= before.get(tid, 0))
    for pid, a in start.items():
        if pid not in stop:
            ticks -= a.total_ticks
    return max(0.0, ns / 1e9 + ticks / _TICK)


class ProcTree:
    """Measures the process trees rooted at ROOTS between start() and stop()."""

    def __init__(self, roots: Union[int, Iterable[int]], interval: float = 0.05, precise: bool = False):
        self.roots = [roots] if isinstance(roots, int) else list(roots)
        self.interval = interval
        self.precise = precise
        self._start_precise: Optional[dict] = None
        self._start_ticks = 0
        self._peak = 0
        self._samples = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _note(self) -> int:
        ticks, rss = _sample(self.roots)
        self._peak = max(self._peak, rss)
        self._samples += 1
        return ticks

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._note()

    def start(self) -> "ProcTree":
        self._stop.clear()
        self._peak = self._samples = 0
        self._start_ticks = self._note()
        if self.precise:
            self._start_precise = precise_snapshot(self.roots)
        self._thread = threading.Thread(target=self._run, name="proctree", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> ProcStats:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.precise and self._start_precise is not None:
            cpu = precise_cpu_s(self._start_precise, precise_snapshot(self.roots))
            self._note()
            return ProcStats(cpu, self._peak, self._samples)
        end_ticks = self._note()
        return ProcStats(max(0, end_ticks - self._start_ticks) / _TICK, self._peak, self._samples)

    def __enter__(self) -> "ProcTree":
        return self.start()

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self.stop()
