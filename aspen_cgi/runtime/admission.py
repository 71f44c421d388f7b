"""Admission control for cold computations (git upload-pack runs): at most
ASPEN_COLD_PER_REPO at once per repository and ASPEN_COLD_PER_SERVER per
machine, across every process (CGI, gunicorn and mod_wsgi workers alike).
The rest wait in a queue of ASPEN_QUEUE places for up to ASPEN_QUEUE_WAIT
seconds; past the queue bound a request is refused at once with `503` and
`Retry-After`.

Version and segment pack builds (packs/background.py, `aspen import`) take
none of those: each holds one of ASPEN_BUILDS_PER_SERVER build slots per
machine (default half the cores, at least 1), waited for without a queue
bound, so that builds never queue live clones nor take every core.

Slots and queue places are flock()ed files in ASPEN_RUN_DIR (default
/tmp/aspen-run-<uid>): a process that dies, even by kill -9, gives its
places back."""

from __future__ import annotations

import fcntl
import hashlib
import os
import random
import time
from dataclasses import dataclass
from typing import Callable, Optional

from .. import settings


class Overloaded(Exception):
    """No place in the queue, or the wait ran out."""

    def __init__(self, retry_after: int, why: str):
        super().__init__(why)
        self.retry_after = retry_after
        self.why = why


@dataclass(frozen=True)
class Capacity:
    """How much cold work this machine takes at once, and how long the rest waits."""
    run_dir: str
    per_repo: int
    per_server: int
    queue: int
    wait_s: float
    retry_after: int
    builds: int = 1          # pack builds at once on this machine (ASPEN_BUILDS_PER_SERVER)


BUILDS_ENV = "ASPEN_BUILDS_PER_SERVER"


def capacity(s: settings.Settings) -> Capacity:
    """The ASPEN_RUN_DIR, ASPEN_COLD_*, ASPEN_QUEUE*, ASPEN_RETRY_AFTER and
    ASPEN_BUILDS_PER_SERVER settings (settings.py)."""
    return Capacity(s.run_dir, s.cold_per_repo, s.cold_per_server, s.queue, s.queue_wait, s.retry_after,
                  s.builds_per_server)


def _take(path: str) -> Optional[int]:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except OSError:
        os.close(fd)
        return None


def _take_one(prefix: str, n: int) -> Optional[int]:
    start = random.randrange(n)
    for i in range(n):
        fd = _take(f"{prefix}.{(start + i) % n}")
        if fd is not None:
            return fd
    return None


class Slot:
    """A held place to compute; release() (or process exit) gives it back."""

    def __init__(self, fds: list[int], waited_s: float):
        self.fds = fds
        self.waited_s = waited_s

    def release(self) -> None:
        fds, self.fds = self.fds, []
        for fd in fds:
            os.close(fd)


def _prefixes(lim: Capacity, repo: str) -> tuple[str, str, str]:
    tag = hashlib.sha256(os.path.realpath(repo).encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return (os.path.join(lim.run_dir, f"repo-{tag}.slot"), os.path.join(lim.run_dir, "server.slot"),
            os.path.join(lim.run_dir, "queue"))


def _try(lim: Capacity, repo_prefix: str, server_prefix: str) -> Optional[list[int]]:
    a = _take_one(repo_prefix, lim.per_repo)
    if a is None:
        return None
    b = _take_one(server_prefix, lim.per_server)
    if b is None:
        os.close(a)
        return None
    return [a, b]


def acquire(lim: Capacity, gitdir: str, queue: bool = True) -> Slot:
    """A slot for one cold computation over GITDIR, waiting in the queue when
    all are taken. Raises Overloaded when the queue is full or the wait runs
    out (QUEUE=False: wait without a queue place, for background work)."""
    try:
        os.makedirs(lim.run_dir, mode=0o1777, exist_ok=True)
    except OSError:
        return Slot([], 0.0)        # nowhere to count: admit (never an error for lack of a directory)
    if not os.access(lim.run_dir, os.W_OK | os.X_OK):
        return Slot([], 0.0)        # another user's directory (ASPEN_RUN_DIR passed to mod_wsgi's daemons): admit
    repo_p, server_p, queue_p = _prefixes(lim, gitdir)
    got = _try(lim, repo_p, server_p)
    if got is not None:
        return Slot(got, 0.0)
    ticket = None
    if queue:
        ticket = _take_one(queue_p, lim.queue) if lim.queue else None
        if ticket is None:
            raise Overloaded(lim.retry_after, "queue full")
    started = time.monotonic()
    pause = 0.005
    try:
        while True:
            got = _try(lim, repo_p, server_p)
            if got is not None:
                return Slot(got, time.monotonic() - started)
            if queue and time.monotonic() - started > lim.wait_s:
                raise Overloaded(lim.retry_after, "queue wait over")
            time.sleep(pause)
            pause = min(pause * 1.5, 0.05)
    finally:
        if ticket is not None:
            os.close(ticket)


def acquire_build(lim: Capacity, check: Optional[Callable[[], None]] = None,
                  on_wait: Optional[Callable[[int], None]] = None) -> Slot:
    """One of the machine's LIM.builds build slots, waiting as long as it
    takes (no queue bound: builds are background work). CHECK() is called
    while waiting and may raise to give up; ON_WAIT(n) once, when all N
    slots are taken."""
    try:
        os.makedirs(lim.run_dir, mode=0o1777, exist_ok=True)
    except OSError:
        return Slot([], 0.0)        # nowhere to count: build (never an error for lack of a directory)
    prefix = os.path.join(lim.run_dir, "build.slot")
    started = time.monotonic()
    pause = 0.01
    told = False
    while True:
        fd = _take_one(prefix, lim.builds)
        if fd is not None:
            return Slot([fd], time.monotonic() - started)
        if on_wait is not None and not told:
            told = True
            on_wait(lim.builds)
        if check is not None:
            check()
        time.sleep(pause)
        pause = min(pause * 1.5, 0.1)


def _held(prefix: str, n: int) -> int:
    held = 0
    for i in range(n):
        path = f"{prefix}.{i}"
        if not os.path.exists(path):
            continue
        fd = _take(path)
        if fd is None:
            held += 1
        else:
            os.close(fd)
    return held


@dataclass(frozen=True)
class Gauges:
    running: int        # cold computations running on this machine
    queued: int         # requests waiting for one
    builds: int = 0     # pack builds running on this machine


def gauges(lim: Capacity) -> Gauges:
    return Gauges(_held(os.path.join(lim.run_dir, "server.slot"), lim.per_server),
                  _held(os.path.join(lim.run_dir, "queue"), lim.queue),
                  _held(os.path.join(lim.run_dir, "build.slot"), lim.builds))
