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

Fairness between clients: one client (model/client.py: the authenticated
user, else the address) may hold ASPEN_CLIENT_SHARE per cent (default 50,
at least one) of each of those slot counts and of the queue. A client
within its share takes any free slot; one holding its share may still take
a slot when at least one other slot of the repository's and of the
machine's stays free after it, so the last free slot always goes to a
client within its share: a client that arrives while another runs a storm
of cold requests finds a slot at once (unless clients within their share
hold them all), and later waiters within their share never compete with
the storm for the last one. Past its share of the queue a client is
refused at once (503), whatever room the queue has for others. Stored and
cached answers never come here: they cost no computation.

Slots and queue places are flock()ed files in ASPEN_RUN_DIR (default
/tmp/aspen-run-<uid>): a process that dies, even by kill -9, gives its
places back. A client's own places are files in `clients/` named by its
tag (a hash: no address in a file name), taken lowest first and removed as
they are given back, so that the directory holds only the clients holding
something now. While shares apply, slots are taken under one lock
(`admission.lock`), so that counting the free slots and taking one is one
step for every process."""

from __future__ import annotations

import fcntl
import hashlib
import os
import random
import time
from dataclasses import dataclass
from typing import Callable, Optional

from .. import settings
from ..model.client import Client


class Overloaded(Exception):
    """No place in the queue, or the wait ran out. CLIENT: because the request's
    client held its share (of the queue, or of the slots while its wait ran out)."""

    def __init__(self, retry_after: int, why: str, client: bool = False):
        super().__init__(why)
        self.retry_after = retry_after
        self.why = why
        self.client = client


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
    share: int = 100         # per cent of the slots and of the queue one client may hold (ASPEN_CLIENT_SHARE)

    def shares(self) -> tuple[int, int, int]:
        """One client's share: (slots per repository, slots on the machine, queue places), each at least 1
        (none of a queue of 0)."""
        return (max(1, self.per_repo * self.share // 100), max(1, self.per_server * self.share // 100),
                max(1, self.queue * self.share // 100) if self.queue else 0)


BUILDS_ENV = "ASPEN_BUILDS_PER_SERVER"
CLIENTS = "clients"         # the clients' files, under the run directory
MUTEX = "admission.lock"    # held while a slot is taken, when clients have shares


def capacity(s: settings.Settings) -> Capacity:
    """The ASPEN_RUN_DIR, ASPEN_COLD_*, ASPEN_QUEUE*, ASPEN_RETRY_AFTER,
    ASPEN_BUILDS_PER_SERVER and ASPEN_CLIENT_SHARE settings (settings.py)."""
    return Capacity(s.run_dir, s.cold_per_repo, s.cold_per_server, s.queue, s.queue_wait, s.retry_after,
                    s.builds_per_server, s.client_share)


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


@dataclass(frozen=True)
class _Held:
    fd: int
    path: Optional[str] = None      # a client's file: removed as it is given back


def _take_client(prefix: str, n: int) -> Optional[_Held]:
    """The lowest free of a client's N places `PREFIX.<i>`, or None when it
    holds them all. Its files exist only while held (removed on release;
    a process killed leaves its file, taken again by the next): a client
    holding nothing leaves nothing behind. A file removed between our
    open() and flock() is not the file at PATH any more: try again."""
    for i in range(n):
        path = f"{prefix}.{i}"
        for _ in range(8):
            fd = _take(path)
            if fd is None:
                break
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(path))
            except OSError:
                same = False
            if same:
                return _Held(fd, path)
            os.close(fd)
    return None


def _free(prefix: str, n: int) -> int:
    return n - _held(prefix, n)


BEHIND_NICE = 10      # how much lower a client's further computations run than its first (see Slot.behind)


class Slot:
    """A held place to compute; release() (or process exit) gives it back.
    OVER_SHARE: it waited while its client held its share of the slots.
    BEHIND: when it was taken its client held another computation on this
    machine, or had other requests waiting: it runs BEHIND_NICE lower in CPU
    priority, so that on cores a storm fills, another client's one
    computation gets them first (alone on the machine, a niced process runs
    as fast)."""

    def __init__(self, held: list, waited_s: float, over_share: bool = False, behind: bool = False):
        self.held = held
        self.waited_s = waited_s
        self.over_share = over_share
        self.behind = behind

    def release(self) -> None:
        held, self.held = self.held, []
        _give_back(held)


def _give_back(held: list) -> None:
    for h in held:
        if h.path is not None:
            try:
                os.unlink(h.path)       # still locked by us: whoever opened it sees another file at PATH
            except OSError:
                pass
        os.close(h.fd)


@dataclass(frozen=True)
class _Paths:
    repo: str
    server: str
    queue: str
    client_repo: Optional[str] = None       # the client's own files (None: no share applies)
    client_server: Optional[str] = None
    client_queue: Optional[str] = None


def _paths(lim: Capacity, repo: str, client: Optional[Client]) -> _Paths:
    tag = hashlib.sha256(os.path.realpath(repo).encode("utf-8", "surrogateescape")).hexdigest()[:12]
    base = (os.path.join(lim.run_dir, f"repo-{tag}.slot"), os.path.join(lim.run_dir, "server.slot"),
            os.path.join(lim.run_dir, "queue"))
    if client is None or lim.share >= 100:
        return _Paths(*base)
    c = os.path.join(lim.run_dir, CLIENTS, client.tag)
    return _Paths(*base, f"{c}.{tag}.slot", f"{c}.slot", f"{c}.queue")


class _Mutex:
    """The run directory's admission lock, held while a slot is taken when
    clients have shares: a client past its share counts the free slots and
    takes one as one step."""

    def __init__(self, lim: Capacity, on: bool):
        self.path = os.path.join(lim.run_dir, MUTEX) if on else None
        self.fd: Optional[int] = None

    def __enter__(self) -> "_Mutex":
        if self.path is not None:
            try:
                self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
                fcntl.flock(self.fd, fcntl.LOCK_EX)
            except OSError:
                if self.fd is not None:
                    os.close(self.fd)
                self.fd = None
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _try(lim: Capacity, p: _Paths, queued: int = 0) -> tuple[Optional[list], bool, bool]:
    """(the places taken for one computation, or None; whether the client held
    its share; whether it held another computation on this machine or had
    requests waiting beyond its own QUEUED places).

    At each level, the repository's slots then the machine's: a client
    within its share takes one of its own places there and any free slot; a
    client holding its share takes a slot only when another stays free after
    it (the last free slot of each level goes to a client within its share)."""
    rs, ss, _ = lim.shares()
    held: list = []
    over = behind = False
    with _Mutex(lim, lim.share < 100):
        for prefix, n, cprefix, cshare in ((p.repo, lim.per_repo, p.client_repo, rs),
                                           (p.server, lim.per_server, p.client_server, ss)):
            if cprefix is not None:
                own = _take_client(cprefix, cshare)
                if own is None:
                    over = behind = True
                    if _free(prefix, n) < 2:
                        break
                else:
                    held.append(own)
                    behind = behind or (cprefix == p.client_server and not (own.path or "").endswith(".0"))
            fd = _take_one(prefix, n)
            if fd is None:
                break
            held.append(_Held(fd))
        else:
            if not behind and p.client_queue is not None:
                behind = _held(p.client_queue, lim.shares()[2]) > queued
            return held, over, behind
    _give_back(held)
    return None, over, behind


def _client_dir(lim: Capacity) -> bool:
    d = os.path.join(lim.run_dir, CLIENTS)
    if os.path.isdir(d):
        return os.access(d, os.W_OK | os.X_OK)
    try:
        os.mkdir(d)
        os.chmod(d, 0o1777)
    except FileExistsError:
        pass
    except OSError:
        return False
    return os.path.isdir(d) and os.access(d, os.W_OK | os.X_OK)


def acquire(lim: Capacity, gitdir: str, queue: bool = True, client: Optional[Client] = None) -> Slot:
    """A slot for one cold computation over GITDIR, waiting in the queue when
    all are taken, or when CLIENT holds its share (ASPEN_CLIENT_SHARE) of
    them. Raises Overloaded when the queue is full, the client holds its share
    of the queue, or the wait runs out (QUEUE=False: wait without a queue
    place, for background work). CLIENT None: no share applies."""
    try:
        os.makedirs(lim.run_dir, mode=0o1777, exist_ok=True)
    except OSError:
        return Slot([], 0.0)        # nowhere to count: admit (never an error for lack of a directory)
    if not os.access(lim.run_dir, os.W_OK | os.X_OK):
        return Slot([], 0.0)        # another user's directory (ASPEN_RUN_DIR passed to mod_wsgi's daemons): admit
    if client is not None and lim.share < 100 and not _client_dir(lim):
        client = None               # no directory for the clients' files: no share (never an error)
    p = _paths(lim, gitdir, client)
    got, over, behind = _try(lim, p)
    if got is not None:
        return Slot(got, 0.0, behind=behind)
    tickets: list = []
    if queue:
        if p.client_queue is not None and lim.queue:
            own = _take_client(p.client_queue, lim.shares()[2])
            if own is None:
                raise Overloaded(lim.retry_after, "client holds its share of the queue", client=True)
            tickets.append(own)
        fd = _take_one(p.queue, lim.queue) if lim.queue else None
        if fd is None:
            _give_back(tickets)
            raise Overloaded(lim.retry_after, "queue full")
        tickets.append(_Held(fd))
    started = time.monotonic()
    pause = 0.005
    try:
        while True:
            got, now_over, behind = _try(lim, p, sum(1 for t in tickets if t.path is not None))
            over = over or now_over
            if got is not None:
                return Slot(got, time.monotonic() - started, over, behind)
            if queue and time.monotonic() - started > lim.wait_s:
                raise Overloaded(lim.retry_after, "queue wait over", client=over)
            time.sleep(pause)
            pause = min(pause * 1.5, 0.05)
    finally:
        _give_back(tickets)


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
            return Slot([_Held(fd)], time.monotonic() - started)
        if on_wait is not None and not told:
            told = True
            on_wait(lim.builds)
        if check is not None:
            check()
        time.sleep(pause)
        pause = min(pause * 1.5, 0.1)


def _held(prefix: str, n: int) -> int:
    """How many of `PREFIX.<i>` are held now, making none of them (a
    client's files exist only while held). One that cannot be opened counts
    as held."""
    held = 0
    for i in range(n):
        try:
            fd = os.open(f"{prefix}.{i}", os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        except OSError:
            held += 1
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            held += 1
        finally:
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
