"""The response cache, pre-warm and admission control, end to end: real git
clients and raw HTTP requests against gunicorn (and the CGI program), real
files on disk, a real tmpfs for the full disk.

What each case gets:
- N identical concurrent requests: one computation, N byte-identical 200s.
- a slow reader: served the whole entry while faster readers finish first.
- a small byte bound: older entries evicted, superseded versions first.
- a corrupt or truncated entry: recomputed (cold), never an error.
- a full disk: every request still answered in full (uncached or spilled).
- a push to HEAD's branch: the first depth-1 clone after it is a hit.
- more cold requests than slots and queue places: 503 with Retry-After.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shlex
import socket
import subprocess
import threading
import time
import zlib
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from aspen_cgi import settings
from aspen_cgi.cache import evict
from aspen_cgi.cache.entries import HEADER, HEADER_SIZE, KEPT, MAGIC
from aspen_cgi.fetch.prewarm import clone_request

from .harness import Server, fsck_strict, git, out, refs_of

HOOK = """#!/bin/sh
echo run >> {counter}
{wait}exec "$@"
"""
# while the gate is shut, a computation waits before git packs anything (bounded: a test that
# failed without opening it leaves no git waiting for long)
GATE_WAIT = """i=0
while [ ! -e {gate} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i + 1)); done
"""
WAIT_S = 60.0


class Gate:
    """Holds every computation of a hooked server (its pack-objects hook) until
    open(): requests that arrive meanwhile can only follow the computation
    that began, never find its entry complete. The fixture opens it at the
    end of the test, before the servers stop."""

    def __init__(self, path: Path):
        self.path = path

    def open(self) -> None:
        self.path.touch()


@pytest.fixture
def gate(tmp_path):
    g = Gate(tmp_path / "gate-open")
    yield g
    g.open()


def _hooked_env(tmp_path: Path, gate: Optional[Gate] = None, **extra: str) -> dict[str, str]:
    """A server environment whose git pack-objects runs are counted (and held
    at GATE while it is shut): uploadpack.packObjectsHook from command-scope
    config, as operators set it."""
    counter = tmp_path / "computations"
    hook = tmp_path / "counting-hook.sh"
    wait = GATE_WAIT.format(gate=shlex.quote(str(gate.path))) if gate is not None else ""
    hook.write_text(HOOK.format(counter=shlex.quote(str(counter)), wait=wait))
    hook.chmod(0o755)
    env = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "uploadpack.packObjectsHook",
           "GIT_CONFIG_VALUE_0": str(hook), "ASPEN_ACCESS_LOG": "1", "ASPEN_RUN_DIR": str(tmp_path / "run"),
           "ASPEN_WIDE_DEPTH1": "0"}
    env.update(extra)
    return env


def _computations(tmp_path: Path) -> int:
    f = tmp_path / "computations"
    return len(f.read_text().splitlines()) if f.exists() else 0


def _wait(what: str, cond: Callable[[], Any], timeout: float = WAIT_S,
          state: Optional[Callable[[], str]] = None) -> Any:
    """COND()'s first true value, polled; past TIMEOUT the test fails saying
    what it waited for (and STATE(), what it saw last)."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            seen = f"; {state()}" if state is not None else ""
            raise AssertionError(f"waited {timeout:.0f} s for {what}{seen}")
        time.sleep(0.02)


def _computing(tmp_path: Path, n: int, runs: Optional["Threads"] = None) -> None:
    """Wait until the hook has started N computations."""
    _wait(f"{n} computation(s) to start", lambda: runs is not None and runs.errors or _computations(tmp_path) >= n,
          state=lambda: f"{_computations(tmp_path)} started")
    if runs is not None:
        assert runs.errors == [], runs.errors
    assert _computations(tmp_path) == n


def _holders(path: Path) -> int:
    """How many open file descriptors, in any process, are PATH (each request
    following an entry being written holds its `.part` open)."""
    target = os.path.realpath(path)
    n = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        fds = f"/proc/{pid}/fd"
        try:
            names = os.listdir(fds)
        except OSError:
            continue
        for fd in names:
            try:
                n += os.readlink(f"{fds}/{fd}") == target
            except OSError:
                pass
    return n


def _following(cache: Path, n: int, runs: Optional["Threads"] = None) -> Path:
    """Wait until exactly one entry is being written in CACHE and N requests
    follow it (the one computing included); its `.part`."""
    def ready():
        if runs is not None and runs.errors:
            return True
        parts = list(cache.glob("*.part"))
        return parts[0] if len(parts) == 1 and _holders(parts[0]) >= n else None

    def state() -> str:
        parts = list(cache.glob("*.part")) if cache.is_dir() else []
        return f"parts {[(p.name, _holders(p)) for p in parts]}, errors {runs.errors if runs else []}"
    part = _wait(f"{n} requests following one entry in {cache}", ready, state=state)
    if runs is not None:
        assert runs.errors == [], runs.errors
    return part


class Threads:
    """Callables each run in a thread of its own. Every exception is kept
    (BaseException: a pytest outcome raised in a thread too); join() bounds
    the wait and asserts that every thread it joined ended."""

    def __init__(self) -> None:
        self.threads: dict[str, threading.Thread] = {}
        self.results: dict[str, Any] = {}
        self.errors: list[str] = []

    def start(self, name: str, fn: Callable[..., Any], *args: Any) -> None:
        def body() -> None:
            try:
                self.results[name] = fn(*args)
            except BaseException as e:      # noqa: BLE001  (reported by join(), never lost with the thread)
                self.errors.append(f"{name}: {e!r}")
        t = threading.Thread(target=body, name=name, daemon=True)
        self.threads[name] = t
        t.start()

    def join(self, timeout: float = 120, names: Optional[list[str]] = None) -> None:
        deadline = time.monotonic() + timeout
        for name in names if names is not None else list(self.threads):
            t = self.threads[name]
            t.join(max(0.0, deadline - time.monotonic()))
            assert not t.is_alive(), f"{name} still running after {timeout:.0f} s"
        assert self.errors == [], self.errors


def _tip(repo: Path, ref: str = "refs/heads/main") -> str:
    return out("rev-parse", ref, cwd=str(repo))


def _post(server, body: bytes) -> tuple[int, dict, bytes]:
    """One v2 upload-pack POST, read to its end."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    try:
        conn.request("POST", "/repo.git/git-upload-pack", body=body,
                     headers={"Content-Type": "application/x-git-upload-pack-request", "Git-Protocol": "version=2"})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def _marks(server) -> list[str]:
    return [w.split("=", 1)[1] for line in server.log_text().splitlines()
            if "service=upload-pack" in line and "method=POST" in line
            for w in line.split() if w.startswith("cache=")]


def _wait_marks(server, n: int) -> list[str]:
    """The cache marks of the server's upload-pack POSTs once there are N,
    asserting there are not more (access lines are written as bodies close,
    which can be after the client has read the last byte)."""
    _wait(f"{n} access lines with cache=", lambda: len(_marks(server)) >= n,
          state=lambda: f"marks {_marks(server)}")
    marks = _marks(server)
    assert len(marks) == n, marks
    return marks


def _cache_dir(root: Path) -> Path:
    return root / "repo.git" / "aspen" / "cache"


def _stats(repo: Path) -> dict:
    from .harness import aspen_cli
    res = aspen_cli("stats", "--json", str(repo))
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["repositories"][0]


def _clone_ok(url: str, dest: Path, server_repo: Path, *args: str) -> None:
    git("clone", "-q", *args, url, str(dest))
    fsck_strict(str(dest))
    theirs = refs_of(str(server_repo))
    mine = refs_of(str(dest))
    for name, oid in mine.items():
        if name.startswith("refs/remotes/origin/") and not name.endswith("/HEAD"):
            assert theirs["refs/heads/" + name[len("refs/remotes/origin/"):]] == oid


def _clones_at_once(server, root: Path, tmp_path: Path, n: int, gate: Gate, cache: Path) -> None:
    """N real `git clone --depth 1` at once, each checked: GATE holds the
    computation until all N follow the one entry being written in CACHE."""
    runs = Threads()
    for i in range(n):
        runs.start(f"clone {i}", _clone_ok, f"{server.url}/repo.git", tmp_path / f"c{i}", root / "repo.git",
                   "--depth", "1")
    try:
        _following(cache, n, runs)
    finally:
        gate.open()
    runs.join(120)


def test_identical_concurrent_requests_are_computed_once(root, server_factory, tmp_path, gate):
    server = server_factory(root, **_hooked_env(tmp_path, gate))
    body = clone_request([_tip(root / "repo.git")] * 2)
    runs = Threads()
    for i in range(8):
        runs.start(f"request {i}", _post, server, body)
    try:
        _following(_cache_dir(root), 8, runs)      # all eight follow the one entry being written
        _computing(tmp_path, 1, runs)              # whose computation is held at the gate
    finally:
        gate.open()
    runs.join(60)
    results = [runs.results[f"request {i}"] for i in range(8)]
    assert all(r[0] == 200 for r in results), [r[0] for r in results]
    assert len({r[2] for r in results}) == 1, "every response byte-identical"
    assert b"packfile\n" in results[0][2]
    assert _computations(tmp_path) == 1
    marks = _wait_marks(server, 8)
    assert sorted(marks) == ["cold"] + ["shared"] * 7, marks
    # a real client gets the same cached answer and a correct repository
    _clone_ok(f"{server.url}/repo.git", tmp_path / "c", root / "repo.git", "--depth", "1")
    assert _computations(tmp_path) == 1
    assert _wait_marks(server, 9)[-1] == "hit"
    s = _stats(root / "repo.git")
    assert (s["cold"], s["shared"], s["hits"], s["entries"]) == (1, 7, 1, 1), s


def test_many_real_clients_at_once_all_succeed_from_one_computation(root, tmp_path, gate):
    # 12 threads a worker: gunicorn may hand all twelve clients to the same worker, and every
    # one of them must be in a request at once
    server = Server(root, _hooked_env(tmp_path, gate), threads=12).start()
    try:
        _clones_at_once(server, root, tmp_path, 12, gate, _cache_dir(root))
        assert _computations(tmp_path) == 1
        assert sorted(_wait_marks(server, 12)) == ["cold"] + ["shared"] * 11
    finally:
        gate.open()
        server.stop()


def _slow_client(server, body: bytes, go_on: threading.Event) -> tuple[int, bytes]:
    """A client that reads the first 4 KiB of its answer, then nothing more
    until GO_ON is set; its receive buffer is 4 KiB, so the server cannot
    hand it more than its own send buffer holds meanwhile."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(120)
    sock.connect(("127.0.0.1", server.port))
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    conn.sock = sock
    try:
        conn.request("POST", "/repo.git/git-upload-pack", body=body,
                     headers={"Content-Type": "application/x-git-upload-pack-request", "Git-Protocol": "version=2"})
        resp = conn.getresponse()
        first = resp.read(4096)
        if not go_on.wait(120):
            raise AssertionError("never told to read on")
        return resp.status, first + resp.read()
    finally:
        conn.close()


def test_slow_reader_streams_while_faster_ones_finish(root, server_factory, tmp_path, gate):
    # an answer larger than the server's largest socket send buffer (tcp_wmem's 4 MiB): the
    # slow reader's response cannot be all handed over while it does not read
    work = tmp_path / "w"
    git("clone", "-q", str(root / "repo.git"), str(work))
    (work / "big.bin").write_bytes(os.urandom(6 << 20))
    git("add", "big.bin", cwd=str(work))
    git("commit", "-q", "-m", "big", cwd=str(work))
    git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    server = server_factory(root, **_hooked_env(tmp_path, gate))
    body = clone_request([_tip(root / "repo.git")] * 2)
    go_on = threading.Event()
    runs = Threads()
    try:
        runs.start("slow", _slow_client, server, body, go_on)
        _computing(tmp_path, 1, runs)                 # the slow client's request is the one computing
        for i in range(3):
            runs.start(f"fast{i}", _post, server, body)
        _following(_cache_dir(root), 4, runs)        # the fast ones follow it
        gate.open()
        runs.join(120, [f"fast{i}" for i in range(3)])
        fast = [runs.results[f"fast{i}"] for i in range(3)]
        assert all(r[0] == 200 and len(r[2]) > 6 << 20 for r in fast), [(r[0], len(r[2])) for r in fast]
        assert _wait_marks(server, 3) == ["shared"] * 3, "the fast readers were served while the slow one lags"
        assert runs.threads["slow"].is_alive() and len(_marks(server)) == 3, \
            "the slow reader's response is still being sent when the fast ones are done"
        entries = list(_cache_dir(root).glob("*.entry"))
        assert len(entries) == 1, "the producer finished the entry while the slow reader lags"
    finally:
        go_on.set()
    runs.join(120)
    slow = runs.results["slow"]
    assert slow[0] == 200 and slow[1] == fast[0][2]
    assert _wait_marks(server, 4)[-1] == "cold"
    assert len({r[2] for r in fast}) == 1
    assert _computations(tmp_path) == 1


def test_small_bound_evicts_least_recently_used(root, server_factory, tmp_path):
    server = server_factory(root, **_hooked_env(tmp_path, ASPEN_CACHE_MAX_BYTES="1"))
    tip = _tip(root / "repo.git")
    sizes = []
    for depth in (1, 2, 3):
        body = clone_request([tip, tip]).replace(b"deepen 1", f"deepen {depth}".encode())
        status, _, data = _post(server, body)
        assert status == 200
        sizes.append(len(data))
    # a bound of one byte keeps nothing: every entry is larger (so none is kept)
    assert list(_cache_dir(root).glob("*.entry")) == []
    server.stop()
    bound = sizes[1] + sizes[2] + HEADER_SIZE * 2 + 10
    server = server_factory(root, **_hooked_env(tmp_path, ASPEN_CACHE_MAX_BYTES=str(bound)))
    for depth in (1, 2, 3):
        body = clone_request([tip, tip]).replace(b"deepen 1", f"deepen {depth}".encode())
        assert _post(server, body)[0] == 200
    names = sorted(p.stat().st_size for p in _cache_dir(root).glob("*.entry"))
    assert sum(names) <= bound
    assert len(names) == 2, "depth 1, the least recently used, went"
    s = _stats(root / "repo.git")
    assert s["evictions"] >= 1 and s["entry_bytes"] <= bound


def test_eviction_order_superseded_versions_first(tmp_path):
    d = tmp_path / "cache"
    d.mkdir()
    now = time.time()
    for name, version, used in (("aaaa-x", 5, now - 10), ("aaaa-y", 4, now), ("aaaa-z", 5, now - 100),
                                ("bbbb-w", 1, now - 50)):
        p = d / (name + ".entry")
        body = b"\0" * 60
        p.write_bytes(HEADER.pack(MAGIC, len(body), zlib.crc32(body), KEPT, 0, version) + body)
        os.utime(p, (used, used))
    order = [Path(e.path).name[:-len(".entry")] for e in evict.order(evict.entries(str(d)))]
    assert order == ["aaaa-y", "aaaa-z", "bbbb-w", "aaaa-x"]
    removed, freed = evict.evict(str(d), 250)
    assert (removed, freed) == (2, 200)
    assert sorted(p.name for p in d.iterdir()) == ["aaaa-x.entry", "bbbb-w.entry"]


@pytest.mark.parametrize("damage", ["flip", "truncate", "header"])
def test_corrupt_or_truncated_entry_is_recomputed(root, server_factory, tmp_path, damage):
    server = server_factory(root, **_hooked_env(tmp_path))
    body = clone_request([_tip(root / "repo.git")] * 2)
    status, _, first = _post(server, body)
    assert status == 200
    [entry] = _cache_dir(root).glob("*.entry")
    raw = bytearray(entry.read_bytes())
    if damage == "flip":
        raw[len(raw) // 2] ^= 0xFF
    elif damage == "truncate":
        raw = raw[:len(raw) - 100]
    else:
        raw[:8] = b"garbage!"
    entry.write_bytes(bytes(raw))
    status, _, again = _post(server, body)
    assert status == 200
    assert b"packfile\n" in again and again.endswith(b"0000")
    assert _wait_marks(server, 2) == ["cold", "cold"], "recomputed, not served"
    assert _computations(tmp_path) == 2
    _clone_ok(f"{server.url}/repo.git", tmp_path / "c", root / "repo.git", "--depth", "1")
    assert _wait_marks(server, 3)[-1] == "hit"


@pytest.fixture
def tiny_fs(tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], check=True)
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_degrades_to_computing(root, server_factory, tmp_path, tiny_fs, gate):
    work = tmp_path / "w"
    git("clone", "-q", str(root / "repo.git"), str(work))
    (work / "big.bin").write_bytes(os.urandom(400 << 10))      # the answer cannot fit in 64 KiB
    git("add", "big.bin", cwd=str(work))
    git("commit", "-q", "-m", "big", cwd=str(work))
    git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    # reserve 0: entries are started and the disk fills mid-answer
    server = server_factory(root, **_hooked_env(tmp_path, gate, ASPEN_CACHE_DIR=str(tiny_fs),
                                                ASPEN_CACHE_RESERVE_BYTES="0"))
    _clones_at_once(server, root, tmp_path, 4, gate, tiny_fs)
    assert list(tiny_fs.glob("*.entry")) == [] and list(tiny_fs.glob("*.part")) == []
    server.stop()
    # the default reserve (64 MiB free) is not there: nothing is started, every request computes
    server = server_factory(root, **_hooked_env(tmp_path, ASPEN_CACHE_DIR=str(tiny_fs)))
    for i in range(2):
        _clone_ok(f"{server.url}/repo.git", tmp_path / f"d{i}", root / "repo.git", "--depth", "1")
    assert _wait_marks(server, 2) == ["uncached", "uncached"]


def _commit_and_push(server, work: Path, name: str, ref: str = "main") -> None:
    git("remote", "set-url", "origin", f"{server.url}/repo.git", cwd=str(work))
    (work / f"{name}.txt").write_text(f"{name}\n")
    git("add", f"{name}.txt", cwd=str(work))
    git("commit", "-q", "-m", name, cwd=str(work))
    git("push", "-q", "origin", f"HEAD:{ref}", cwd=str(work))


def _prewarmed(repo: Path, n: int) -> None:
    """Wait until N pre-warmed answers are counted, asserting not more."""
    _wait(f"{n} pre-warmed answers", lambda: _stats(repo)["prewarmed"] >= n, timeout=120,
          state=lambda: f"stats {_stats(repo)}")
    assert _stats(repo)["prewarmed"] == n


def test_prewarm_makes_the_first_clone_after_a_push_a_hit(root, server_factory, tmp_path):
    git("config", "http.receivepack", "true", cwd=str(root / "repo.git"))
    server = server_factory(root, ASPEN_ACCESS_LOG="1", ASPEN_RUN_DIR=str(tmp_path / "run"))
    work = tmp_path / "w"
    git("clone", "-q", f"{server.url}/repo.git", str(work))
    _clone_ok(f"{server.url}/repo.git", tmp_path / "before", root / "repo.git", "--depth", "1")   # the demand
    marks = _wait_marks(server, 2)
    _commit_and_push(server, work, "new")
    _prewarmed(root / "repo.git", 2)       # `clone --depth 1` and `--branch main`
    _clone_ok(f"{server.url}/repo.git", tmp_path / "c", root / "repo.git", "--depth", "1")
    assert _wait_marks(server, 3) == marks + ["hit"]
    _clone_ok(f"{server.url}/repo.git", tmp_path / "b", root / "repo.git", "--depth", "1", "--branch", "main")
    assert _wait_marks(server, 4) == marks + ["hit", "hit"]
    assert _tip(tmp_path / "c", "HEAD") == _tip(root / "repo.git")


def test_prewarm_only_where_depth1_clones_were_asked_for(root, server_factory, tmp_path):
    """A push starts a pre-warmer only once a client asked for a depth-1 clone
    within ASPEN_PREWARM_DEMAND_S: a full clone is no such demand."""
    from aspen_cgi.fetch import prewarm
    from aspen_cgi.fetch.demand import demanded
    repo = root / "repo.git"
    git("config", "http.receivepack", "true", cwd=str(repo))
    server = server_factory(root, ASPEN_RUN_DIR=str(tmp_path / "run"))
    git("clone", "-q", f"{server.url}/repo.git", str(tmp_path / "full"))
    env = {"ASPEN_PREWARM": "default"}
    sdir = str(repo / "aspen")
    assert not demanded(sdir, settings.of(env))
    assert prewarm.kick(str(repo), env, in_process=False) is False
    _clone_ok(f"{server.url}/repo.git", tmp_path / "shallow", repo, "--depth", "1")
    assert demanded(sdir, settings.of(env))
    assert not demanded(sdir, settings.of({**env, "ASPEN_PREWARM_DEMAND_S": "-1"}))   # outside the window
    assert prewarm.kick(str(repo), {**env, "ASPEN_PREWARM": "off"}, in_process=False) is False


def _locked(path: Path) -> bool:
    """Whether a process holds a flock() on PATH, read from /proc/locks:
    looking takes no lock, so no request finds its place taken by the test."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "FLOCK" not in fields or "->" in fields:
            continue
        for f in fields:
            parts = f.split(":")
            if len(parts) == 3 and all(parts):
                try:
                    if (int(parts[0], 16), int(parts[1], 16), int(parts[2])) == want:
                        return True
                except ValueError:
                    pass
    return False


def _free(path: Path) -> None:
    """Wait until nobody holds PATH's flock(), without taking it."""
    _wait(f"the flock on {path} to be let go", lambda: not _locked(path))


@pytest.mark.parametrize("kind", ["gunicorn", "cgi"])
def test_a_cache_that_cannot_be_written_is_said_in_the_log(kind, root, server_factory, cgi_server_factory, tmp_path):
    """Where the cache directory cannot be made (here a file stands in its
    place, as a directory a command run as another user left does for the
    server's user), every depth-1 clone is computed uncached and correct,
    and the server's log says why, each time."""
    env = dict(ASPEN_ACCESS_LOG="1", ASPEN_RUN_DIR=str(tmp_path / "run"))
    server = server_factory(root, **env) if kind == "gunicorn" else cgi_server_factory(root, "aspen", **env)
    repo = root / "repo.git"
    git("ls-remote", f"{server.url}/repo.git", cwd=str(tmp_path))       # the repository's aspen/ exists
    _cache_dir(root).write_text("not a directory\n")
    for i in range(2):
        _clone_ok(f"{server.url}/repo.git", tmp_path / f"c{i}", repo, "--depth", "1")
    log = server.log_text()
    said = re.findall(r"aspen: the response cache \S+ cannot be written \((\w+): [^)]*\); answering uncached", log)
    assert len(said) >= 2 and set(said) <= {"FileExistsError", "NotADirectoryError"}, log[-3000:]
    assert "cache=uncached" in log


def test_a_push_starts_no_pre_warmer_while_one_runs(root, server_factory, tmp_path):
    """prewarm.kick() as a CGI push calls it (a detached program each): while
    a pre-warmer holds the repository's mutex none is started (a burst of
    pushes started a program per push, each to find the mutex held); the
    running one warms every version landing before it lets go and looks once
    more after. Once the mutex is free, a push starts one."""
    import fcntl

    from aspen_cgi.fetch import prewarm
    repo = root / "repo.git"
    server = server_factory(root, ASPEN_ACCESS_LOG="1", ASPEN_RUN_DIR=str(tmp_path / "run"))
    _clone_ok(f"{server.url}/repo.git", tmp_path / "demand", repo, "--depth", "1")   # depth-1 clones asked for
    mutex = _cache_dir(root) / prewarm.MUTEX
    env = dict(os.environ, GIT_DIR=str(repo), ASPEN_RUN_DIR=str(tmp_path / "run"))
    fd = os.open(mutex, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert prewarm.running(str(_cache_dir(root)))
        assert prewarm.kick(str(repo), env, in_process=False) is False
    finally:
        os.close(fd)
    assert not prewarm.running(str(_cache_dir(root)))
    assert prewarm.kick(str(repo), env, in_process=False) is True
    _free(mutex)


def test_prewarm_other_branches_and_off_leave_the_cache_cold(root, server_factory, tmp_path):
    """Where depth-1 clones are asked for, a push to a branch other than
    HEAD's pre-warms nothing (ASPEN_PREWARM=default), nor does a push to
    HEAD's branch with ASPEN_PREWARM=off; the same push with the default
    does, so the zeros are not for want of a pre-warmer."""
    repo = root / "repo.git"
    git("config", "http.receivepack", "true", cwd=str(repo))
    run = str(tmp_path / "run")
    server = server_factory(root, ASPEN_ACCESS_LOG="1", ASPEN_RUN_DIR=run)
    work = tmp_path / "w"
    git("clone", "-q", f"{server.url}/repo.git", str(work))
    _clone_ok(f"{server.url}/repo.git", tmp_path / "demand", repo, "--depth", "1")   # without it no push pre-warms
    entries = sorted(p.name for p in _cache_dir(root).glob("*.entry"))
    mutex = _cache_dir(root) / "prewarm.mutex"
    assert not mutex.exists()
    _commit_and_push(server, work, "side", "refs/heads/side")          # not HEAD's branch
    # the push starts a pre-warmer (demand, policy default), which finds nothing to warm
    _wait("the pre-warmer the push to side started", mutex.exists)
    _free(mutex)
    assert _stats(repo)["prewarmed"] == 0
    assert sorted(p.name for p in _cache_dir(root).glob("*.entry")) == entries
    server.stop()

    server = server_factory(root, ASPEN_ACCESS_LOG="1", ASPEN_RUN_DIR=run, ASPEN_PREWARM="off")
    _commit_and_push(server, work, "off")                            # HEAD's branch, pre-warm off
    _clone_ok(f"{server.url}/repo.git", tmp_path / "after-off", repo, "--depth", "1")
    assert _wait_marks(server, 1) == ["cold"], "nothing pre-warmed the push's depth-1 answer"
    _free(mutex)
    assert _stats(repo)["prewarmed"] == 0
    server.stop()

    server = server_factory(root, ASPEN_ACCESS_LOG="1", ASPEN_RUN_DIR=run)
    _commit_and_push(server, work, "default")                        # HEAD's branch, the default
    _prewarmed(repo, 2)
    _clone_ok(f"{server.url}/repo.git", tmp_path / "after-default", repo, "--depth", "1")
    assert _wait_marks(server, 1) == ["hit"]


def test_past_the_queue_bound_requests_get_503_with_retry_after(root, server_factory, tmp_path, gate):
    env = _hooked_env(tmp_path, gate, ASPEN_CACHE="off", ASPEN_COLD_PER_REPO="1", ASPEN_COLD_PER_SERVER="1",
                      ASPEN_QUEUE="1")
    server = server_factory(root, **env)
    tip = _tip(root / "repo.git")

    def body(i: int) -> bytes:
        return clone_request([tip, tip]).replace(b"deepen 1", f"deepen {i + 1}".encode())
    runs = Threads()
    try:
        runs.start("first", _post, server, body(0))
        _computing(tmp_path, 1, runs)                        # it holds the one slot, held at the gate
        runs.start("queued", _post, server, body(1))
        _wait("the second request to take the queue's one place",
              lambda: runs.errors or _locked(tmp_path / "run" / "queue.0"), state=lambda: str(runs.errors))
        assert runs.errors == []
        runs.start("refused", _post, server, body(2))        # no slot, no queue place: refused at once
        runs.join(30, ["refused"])
        assert _computations(tmp_path) == 1
    finally:
        gate.open()
    runs.join(60)
    refused = runs.results["refused"]
    assert refused[0] == 503, refused[:2]
    assert refused[1].get("Retry-After") == "5"
    assert b"retry" in refused[2].lower() and b"Traceback" not in refused[2]
    assert (runs.results["first"][0], runs.results["queued"][0]) == (200, 200)
    assert _computations(tmp_path) == 2, "the queued request ran once the first ended"
    # and the server serves normally right after
    _clone_ok(f"{server.url}/repo.git", tmp_path / "c", root / "repo.git")


def test_queue_wait_over_gets_503(root, server_factory, tmp_path, gate):
    env = _hooked_env(tmp_path, gate, ASPEN_CACHE="off", ASPEN_COLD_PER_REPO="1", ASPEN_QUEUE="4",
                      ASPEN_QUEUE_WAIT="1")
    server = server_factory(root, **env)
    tip = _tip(root / "repo.git")

    def body(i: int) -> bytes:
        return clone_request([tip, tip]).replace(b"deepen 1", f"deepen {i + 1}".encode())
    runs = Threads()
    try:
        runs.start("first", _post, server, body(0))
        _computing(tmp_path, 1, runs)                        # it holds the repository's one slot
        runs.start("waiting", _post, server, body(1))        # waits its 1 s in the queue, then 503
        runs.join(30, ["waiting"])
    finally:
        gate.open()
    runs.join(60)
    assert (runs.results["first"][0], runs.results["waiting"][0]) == (200, 503)
    assert _computations(tmp_path) == 1


def test_cgi_requests_share_the_cache(root, cgi_server_factory, tmp_path):
    env = _hooked_env(tmp_path)
    server = cgi_server_factory(root, "aspen", **env)
    for i in range(3):
        _clone_ok(f"{server.url}/repo.git", tmp_path / f"c{i}", root / "repo.git", "--depth", "1")
    assert _computations(tmp_path) == 1
    s = _stats(root / "repo.git")
    assert s["cold"] == 1 and s["hits"] == 2


def test_depth1_clone_pack_is_smaller_than_stocks(tmp_path, server_factory, cgi_server_factory):
    """A depth-1 clone through Aspen, once the wide answer is built (in the
    background once a second clone asked for what the first, cold, got from
    git: test_depth1_cold.py),
    gets the pack made with the wider search and recompressed: fewer bytes
    than stock's for the same objects."""
    from aspen_cgi.cache.entries import DEPTH1_WIDE, peek
    from bench import repogen
    root = tmp_path / "gen"
    root.mkdir()
    repogen.generate(repogen.PRESETS["small"], root / "repo.git")
    aspen = server_factory(root, ASPEN_ACCESS_LOG="1", ASPEN_RUN_DIR=str(tmp_path / "run"))
    stock = cgi_server_factory(root, "stock")
    for name in ("cold", "again"):
        _clone_ok(f"{aspen.url}/repo.git", tmp_path / name, root / "repo.git", "--depth", "1", "--bare")
    [entry] = _cache_dir(root).glob("*.entry")
    _wait("the wide depth-1 entry built in the background",
          lambda: getattr(peek(str(entry)), "depth1", None) == DEPTH1_WIDE, timeout=120)
    sizes = {}
    for name, url in (("aspen", aspen.url), ("stock", stock.url)):
        dest = tmp_path / name
        _clone_ok(f"{url}/repo.git", dest, root / "repo.git", "--depth", "1", "--bare")
        [pack] = (dest / "objects" / "pack").glob("*.pack")
        sizes[name] = pack.stat().st_size
        objects = out("cat-file", "--batch-all-objects", "--batch-check=%(objectname)", cwd=str(dest)).split()
        sizes[name + "-objects"] = sorted(objects)
    assert sizes["aspen-objects"] == sizes["stock-objects"]
    assert sizes["aspen"] < sizes["stock"] * 0.99, sizes
