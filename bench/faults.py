"""`aspen-bench faults`: a soak of clone, fetch and push load against Aspen
under gunicorn while faults are injected at random -- kill -9 of a gunicorn
worker, kill -9 of a git child of a worker (upload-pack, pack-objects,
index-pack, unpack-objects), kill -9 of the whole server and a restart, the
ref store's SQLite file held locked by another process for a few seconds --
then the checks: every push a client
saw acknowledged is on the server, `aspen verify` and `git fsck --strict`
are clean, and a final clone equals the server.

The process-tree, lock-holding and load helpers here are also what
tests/test_faults.py injects its faults with."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

PROJECT = Path(__file__).resolve().parent.parent
GIT_CHILDREN = ("upload-pack", "pack-objects", "index-pack", "unpack-objects")


# -- the server's process tree ----------------------------------------------------------------

@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    argv: tuple[str, ...]


def processes() -> dict[int, Proc]:
    """Every process, from /proc (argv empty for zombies and kernel threads)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = tuple(a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a)
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2:].split()
        if fields[0] in (b"Z", b"X"):
            continue
        out[int(entry)] = Proc(int(entry), int(fields[1]), argv)
    return out


def descendants(pid: int, table: Optional[dict[int, Proc]] = None) -> list[Proc]:
    table = processes() if table is None else table
    kids: dict[int, list[Proc]] = {}
    for p in table.values():
        kids.setdefault(p.ppid, []).append(p)
    out, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k.pid)
    return out


def workers(master: int) -> list[int]:
    """The gunicorn workers: the master's direct children."""
    return sorted(p.pid for p in processes().values() if p.ppid == master)


def git_children(master: int, names: Sequence[str] = GIT_CHILDREN,
                 also: Callable[[Proc], bool] = lambda p: True) -> list[Proc]:
    """git processes under the server running one of NAMES (`git [-c ...] NAME ...`)."""
    return [p for p in descendants(master) if p.argv and os.path.basename(p.argv[0]) == "git"
            and any(n in p.argv[1:6] for n in names) and also(p)]


def kill9(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False


def wait_for(fn: Callable[[], object], timeout: float, interval: float = 0.005):
    """FN()'s first true value within TIMEOUT seconds, else None."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            return None
        time.sleep(interval)


def respawned(master: int, before: Sequence[int], n: int = 2, timeout: float = 30.0) -> bool:
    """The master has N workers again, at least one of them new."""
    return bool(wait_for(lambda: len(w := workers(master)) >= n and set(w) != set(before), timeout, 0.05))


# -- another process holding the ref store's SQLite file ---------------------------------------

LOCK_MODES = ("immediate", "exclusive", "exclusive-mode")

LOCK_SCRIPT = r"""
import sqlite3, sys, time
path, mode, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
conn = sqlite3.connect(path, isolation_level=None, timeout=10)
if mode == "exclusive-mode":
    conn.execute("PRAGMA locking_mode=EXCLUSIVE")
conn.execute("BEGIN IMMEDIATE" if mode == "immediate" else "BEGIN EXCLUSIVE")
conn.execute("INSERT OR REPLACE INTO state(key, value) VALUES ('fault-lock', ?)", (mode,))
print("locked", flush=True)
time.sleep(seconds)
conn.execute("ROLLBACK")
conn.close()
print("released", flush=True)
"""


def hold_store_lock(db_path: str, mode: str, seconds: float) -> subprocess.Popen:
    """Start a process that holds DB_PATH locked for SECONDS (MODE: BEGIN
    IMMEDIATE; BEGIN EXCLUSIVE; or PRAGMA locking_mode=EXCLUSIVE first, which
    in WAL mode keeps readers out too) and return once it holds the lock."""
    proc = subprocess.Popen([sys.executable, "-c", LOCK_SCRIPT, db_path, mode, str(seconds)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = proc.stdout.readline()
    if line.strip() != b"locked":
        proc.kill()
        raise RuntimeError(f"could not lock {db_path}: {proc.stderr.read().decode(errors='replace')}")
    return proc


# -- the load -----------------------------------------------------------------------------------

def git(*args: str, cwd: Optional[Path] = None, timeout: float = 120, check: bool = False,
        ) -> subprocess.CompletedProcess:
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0", GIT_CONFIG_NOSYSTEM="1")
    env.setdefault("GIT_AUTHOR_NAME", "Aspen Faults")
    env.setdefault("GIT_AUTHOR_EMAIL", "faults@aspen.invalid")
    env.setdefault("GIT_COMMITTER_NAME", "Aspen Faults")
    env.setdefault("GIT_COMMITTER_EMAIL", "faults@aspen.invalid")
    p = subprocess.run(["git", *args], cwd=str(cwd) if cwd else None, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {p.stderr.decode(errors='replace')}")
    return p


def told_ok(porcelain: str) -> set[str]:
    """Refs `git push --porcelain` says were updated."""
    out = set()
    for line in porcelain.splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and parts[0] in (" ", "+", "-", "*") and ":" in parts[1]:
            out.add(parts[1].split(":", 1)[1])
    return out


@dataclass
class PushRecord:
    client: int
    ref: str
    tip: str
    acked: bool
    exit: int


class Load:
    """Clone, fetch and push clients, each in its own thread, looping until
    stopped or (with ROUNDS) after that many requests each. Pushers push to
    their own branch, always a fast-forward of their own line of commits, so
    every acknowledged push must be an ancestor of (or equal to) that
    branch's final value on the server."""

    def __init__(self, url: str, repo: Path, workdir: Path, pushers: int = 2, cloners: int = 2,
                 fetchers: int = 2, rounds: Optional[int] = None, timeout: float = 120.0):
        self.url, self.repo, self.workdir = url, Path(repo), Path(workdir)
        self.rounds, self.timeout = rounds, timeout
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.counts: Counter = Counter()
        self.pushes: list[PushRecord] = []
        self.hung: list[str] = []
        self.errors: list[str] = []
        self.clients: list[tuple[Callable[[int], None], int]] = (
            [(self._pusher, i) for i in range(pushers)] + [(self._cloner, i) for i in range(cloners)]
            + [(self._fetcher, i) for i in range(fetchers)])
        self.threads: list[threading.Thread] = []

    def work_clone(self, name: str) -> Path:
        """A client clone made locally from the server's repository (no request), origin the server."""
        w = self.workdir / name
        git("clone", "-q", str(self.repo), str(w), check=True)
        git("remote", "set-url", "origin", self.url, cwd=w, check=True)
        return w

    def start(self) -> "Load":
        self.workdir.mkdir(parents=True, exist_ok=True)
        for fn, i in self.clients:
            t = threading.Thread(target=self._guarded, args=(fn, i), daemon=True, name=f"{fn.__name__}-{i}")
            t.start()
            self.threads.append(t)
        return self

    def stop(self) -> None:
        self.stop_event.set()

    def join(self, timeout: float = 300.0) -> bool:
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self.threads)

    def _guarded(self, fn: Callable[[int], None], i: int) -> None:
        try:
            fn(i)
        except Exception as e:  # noqa: BLE001  (a client's own failure is a finding, reported)
            with self.lock:
                self.errors.append(f"{fn.__name__} {i}: {type(e).__name__}: {e}")

    def _loop(self) -> Iterable[int]:
        return range(self.rounds) if self.rounds is not None else _forever()

    def _count(self, what: str) -> None:
        with self.lock:
            self.counts[what] += 1

    def _run(self, what: str, *args: str, cwd: Optional[Path] = None) -> Optional[subprocess.CompletedProcess]:
        try:
            return git(*args, cwd=cwd, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            with self.lock:
                self.hung.append(f"{what}: git {' '.join(args)}")
            self._count(f"{what} hung")
            return None

    def _pusher(self, i: int) -> None:
        work = self.work_clone(f"push-{i}")
        ref = f"refs/heads/fault-{i}"
        for k in self._loop():
            if self.stop_event.is_set():
                return
            (work / f"pusher-{i}.txt").write_text(f"pusher {i} push {k} {time.time()}\n" * 20)
            git("add", "-A", cwd=work, check=True)
            git("commit", "-q", "-m", f"pusher {i} push {k}", cwd=work, check=True)
            tip = git("rev-parse", "HEAD", cwd=work, check=True).stdout.decode().strip()
            p = self._run("push", "push", "--porcelain", "origin", f"HEAD:{ref}", cwd=work)
            if p is None:
                continue
            acked = p.returncode == 0 and ref in told_ok(p.stdout.decode(errors="replace"))
            with self.lock:
                self.pushes.append(PushRecord(i, ref, tip, acked, p.returncode))
            self._count("push acknowledged" if acked else "push failed")

    def _cloner(self, i: int) -> None:
        for k in self._loop():
            if self.stop_event.is_set():
                return
            dest = self.workdir / f"clone-{i}-{k}"
            version = "0" if (i + k) % 2 else "2"
            p = self._run("clone", "-c", f"protocol.version={version}", "-c", "transfer.fsckObjects=true",
                          "clone", "-q", "--no-checkout", self.url, str(dest))
            if p is not None:
                self._count("clone ok" if p.returncode == 0 else "clone failed")
            shutil.rmtree(dest, ignore_errors=True)

    def _fetcher(self, i: int) -> None:
        work = self.work_clone(f"fetch-{i}")
        git("config", "transfer.fsckObjects", "true", cwd=work, check=True)
        for k in self._loop():
            if self.stop_event.is_set():
                return
            version = "0" if (i + k) % 2 else "2"
            p = self._run("fetch", "-c", f"protocol.version={version}", "fetch", "-q", "origin", cwd=work)
            if p is not None:
                self._count("fetch ok" if p.returncode == 0 else "fetch failed")
            time.sleep(0.05)


def _forever():
    k = 0
    while True:
        yield k
        k += 1


# -- the checks -----------------------------------------------------------------------------

def refs_of(repo: Path) -> dict[str, str]:
    text = git("for-each-ref", "--format=%(objectname) %(refname)", cwd=repo, check=True).stdout.decode()
    return dict(reversed(line.split(" ", 1)) for line in text.splitlines() if line)


@dataclass
class PushCheck:
    acknowledged: int
    lost: list = field(default_factory=list)          # acknowledged, not on the server
    stray: list = field(default_factory=list)         # refs holding a value no client pushed
    failed_but_landed: int = 0                        # the client saw an error; the store recorded the push


def recorded_values(repo: Path) -> set[str]:
    """Every value the ref store's versions gave any ref (`aspen log --json`)."""
    p = subprocess.run([sys.executable, "-m", "aspen_cgi.cli", "log", "--json", str(repo)], cwd=str(PROJECT),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"aspen log: {p.stderr.decode(errors='replace')}")
    return {u["new"] for line in p.stdout.decode().splitlines() if line.strip()
            for u in json.loads(line)["updates"]}


def check_pushes(repo: Path, pushes: Sequence[PushRecord]) -> PushCheck:
    """Every acknowledged push is an ancestor of (or is) its branch on the server;
    each branch holds a value its client pushed. A push the client saw fail
    counts as landed when a version recorded its value (a later push carries
    it along either way, so the branch's history cannot tell)."""
    refs = refs_of(repo)
    recorded = recorded_values(repo)
    out = PushCheck(sum(1 for p in pushes if p.acked))
    by_ref: dict[str, list[PushRecord]] = {}
    for p in pushes:
        by_ref.setdefault(p.ref, []).append(p)
    for ref, recs in by_ref.items():
        value = refs.get(ref)
        if value is not None and value not in {p.tip for p in recs}:
            out.stray.append(f"{ref} = {value}")
        for p in recs:
            present = value is not None and (p.tip == value or git(
                "merge-base", "--is-ancestor", p.tip, value, cwd=repo).returncode == 0)
            if p.acked and not present:
                out.lost.append(asdict(p))
            elif not p.acked and p.tip in recorded:
                out.failed_but_landed += 1
    return out


def aspen_verify(repo: Path) -> tuple[bool, str]:
    p = subprocess.run([sys.executable, "-m", "aspen_cgi.cli", "verify", "-q", str(repo)], cwd=str(PROJECT),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    return p.returncode == 0, p.stdout.decode(errors="replace").strip()


BUILDER_LOCKS = (".build.lock", ".segments.lock")


def builders_settled(repo: Path, timeout: float = 120.0) -> list[str]:
    """Wait (up to TIMEOUT s) until no live builder holds a lock of REPO's
    pack builders; the builder locks left then, each named for a dead owner
    (a builder killed with its worker: the next builder takes it over)."""
    from aspen_cgi.runtime.owners import owner_alive
    packs = repo / "aspen" / "packs"
    deadline = time.monotonic() + timeout
    while True:
        held = {}
        for name in BUILDER_LOCKS:
            try:
                held[name] = (packs / name).read_text().strip()
            except OSError:
                continue
        live = [n for n, owner in held.items() if owner_alive(owner)]
        if not live or time.monotonic() > deadline:
            return [f"aspen/packs/{n}" for n in held if n not in live]
        time.sleep(0.05)


def leftovers(repo: Path, timeout: float = 120.0) -> list[str]:
    """git lock files and quarantines left in REPO, and pack builders' locks
    still held (live) after waiting for them; a dead builder's lock is not a
    leftover (the next builder takes it over: tests/test_background_builds.py).
    A builder a push started just before may take its lock after the wait
    and before the listing: then the wait and the listing are done again."""
    deadline = time.monotonic() + timeout
    builders = {f"aspen/packs/{n}" for n in BUILDER_LOCKS}
    while True:
        dead = set(builders_settled(repo, max(0.0, deadline - time.monotonic())))
        found = [str(p.relative_to(repo)) for p in repo.rglob("*.lock") if str(p.relative_to(repo)) not in dead]
        found += [str(p.relative_to(repo)) for p in (repo / "objects").glob("incoming-*")]
        if not builders.intersection(found) or time.monotonic() > deadline:
            return sorted(found)
        time.sleep(0.05)


def final_clone(url: str, repo: Path, dest: Path) -> tuple[bool, str]:
    """A strict mirror clone: fsck --strict clean and refs equal to the server's."""
    p = git("-c", "transfer.fsckObjects=true", "clone", "-q", "--mirror", url, str(dest))
    if p.returncode != 0:
        return False, "clone failed: " + p.stderr.decode(errors="replace")[-500:]
    f = git("fsck", "--strict", "--no-progress", cwd=dest)
    if f.returncode != 0:
        return False, "fsck --strict failed: " + f.stderr.decode(errors="replace")[-500:]
    if refs_of(dest) != refs_of(repo):
        return False, "refs differ from the server's"
    return True, "ok"


# -- the soak ------------------------------------------------------------------------------------

@dataclass
class Summary:
    seconds: float
    seed: int
    faults: dict
    requests: dict
    pushes_acknowledged: int
    pushes_lost: int
    pushes_failed_but_landed: int
    stray_refs: list
    hung: list
    client_errors: list
    verify_ok: bool
    verify_output: str
    fsck_ok: bool
    final_clone: str
    leftovers: list
    server_tracebacks: int
    ok: bool


class Gunicorn:
    """Aspen under gunicorn (2 workers x 8 threads) on a fixed loopback port, in
    its own session, so that the whole server can be killed and started again
    at the same address."""

    def __init__(self, root: Path, workdir: Path, env: dict, port: int):
        self.root, self.workdir, self.env, self.port = root, workdir, env, port
        self.proc: Optional[subprocess.Popen] = None
        self.starts = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def start(self) -> "Gunicorn":
        self.starts += 1
        log = self.workdir / f"gunicorn-{self.starts}.log"
        env = dict(os.environ, GIT_PROJECT_ROOT=str(self.root), GIT_HTTP_EXPORT_ALL="1", GIT_CONFIG_COUNT="1",
                   GIT_CONFIG_KEY_0="http.receivepack", GIT_CONFIG_VALUE_0="true", **self.env)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT), env.get("PYTHONPATH")]))
        with open(log, "wb") as logf:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{self.port}", "--worker-class", "gthread",
                 "--workers", "2", "--threads", "8", "--timeout", "120", "aspen_cgi.wsgi:application"],
                env=env, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, cwd=str(PROJECT),
                start_new_session=True)
        if not wait_for(lambda: "Listening at" in log.read_text(errors="replace") or self.proc.poll() is not None,
                        60, 0.05) or self.proc.poll() is not None:
            raise RuntimeError(f"gunicorn did not start: {log.read_text(errors='replace')[-2000:]}")
        return self

    def kill9_all(self) -> None:
        """kill -9 of the master, its workers and their git children (the session's process group)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill9_all()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, AttributeError):
            pass

    def tracebacks(self) -> int:
        return sum(p.read_text(errors="replace").count("Traceback") for p in self.workdir.glob("gunicorn-*.log"))


class Injector:
    """Faults at random, one at a time, every 0.5-2.5 s: kill -9 of a worker, of
    a git child, of the whole server (restarted at once, half the time while
    another process holds the store with PRAGMA locking_mode=EXCLUSIVE, which
    it can only be granted while no server has the file open), and the store
    held with BEGIN IMMEDIATE or EXCLUSIVE by another process."""

    KINDS = {"worker": 3, "git-child": 4, "sqlite-lock": 2, "server": 1}

    def __init__(self, server: Gunicorn, store_db: str, rng: random.Random):
        self.server, self.store_db, self.rng = server, store_db, rng
        self.master = lambda: server.pid
        self.counts: Counter = Counter()
        self.stop_event = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stop_event.wait(self.rng.uniform(0.5, 2.5)):
            kind = self.rng.choices(list(self.KINDS), list(self.KINDS.values()))[0]
            try:
                getattr(self, "_" + kind.replace("-", "_"))()
            except Exception as e:  # noqa: BLE001
                self.errors.append(f"{kind}: {type(e).__name__}: {e}")

    def _server(self) -> None:
        self.server.kill9_all()
        self.counts["kill -9 whole server"] += 1
        holder = None
        if self.rng.random() < 0.5:
            holder = hold_store_lock(self.store_db, "exclusive-mode", round(self.rng.uniform(1.0, 4.0), 1))
            self.counts["sqlite lock exclusive-mode (at restart)"] += 1
        try:
            self.server.start()
        finally:
            if holder is not None:
                holder.wait(60)

    def _worker(self) -> None:
        master = self.master()
        before = workers(master)
        if before and kill9(self.rng.choice(before)):
            self.counts["kill -9 worker"] += 1
            if not respawned(master, before):
                self.errors.append("gunicorn did not respawn a worker within 30 s")

    def _git_child(self) -> None:
        found = wait_for(lambda: git_children(self.master()), 3.0)
        if not found:
            self.counts["git child: none running"] += 1
            return
        victim = self.rng.choice(found)
        name = next(n for n in GIT_CHILDREN if n in victim.argv[1:6])
        if kill9(victim.pid):
            self.counts[f"kill -9 git {name}"] += 1

    def _sqlite_lock(self) -> None:
        mode = self.rng.choice(["immediate", "exclusive"])
        seconds = round(self.rng.uniform(1.0, 4.0), 1)
        holder = hold_store_lock(self.store_db, mode, seconds)
        self.counts[f"sqlite lock {mode}"] += 1
        try:
            holder.wait(timeout=seconds + 30)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()


def soak(seconds: float, workdir: Path, seed: int = 1, say: Callable[[str], None] = print) -> Summary:
    import socket

    from . import repogen
    rng = random.Random(seed)
    root = workdir / "root"
    root.mkdir(parents=True)
    repo = root / "faults.git"
    repogen.generate(repogen.PRESETS["tiny"], repo)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = Gunicorn(root, workdir, {"ASPEN_STORE_WAIT": "30"}, port).start()
    url = f"http://127.0.0.1:{port}/faults.git"
    try:
        git("ls-remote", url, check=True)                  # the store is made (imported) before the faults
        store_db = str(repo / "aspen" / "aspen.sqlite3")
        load = Load(url, repo, workdir / "clients", pushers=3, cloners=2, fetchers=2).start()
        inj = Injector(server, store_db, rng)
        t = threading.Thread(target=inj.run, daemon=True)
        t.start()
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            time.sleep(min(10.0, seconds - (time.monotonic() - started)) or 0.1)
            say(f"faults: {time.monotonic() - started:.0f}/{seconds:.0f} s, faults {dict(inj.counts)}, "
                f"requests {dict(load.counts)}")
        inj.stop_event.set()
        t.join(60)
        load.stop()
        load.join(300)
        # the service resumes with no manual step: one more push per pusher and a clone, no faults
        settle = Load(url, repo, workdir / "settle", pushers=0, cloners=1, fetchers=0, rounds=1)
        for i in range(3):
            p = git("push", "--porcelain", "origin", f"HEAD:refs/heads/fault-{i}", cwd=workdir / "clients" / f"push-{i}")
            load.counts["final push " + ("acknowledged" if p.returncode == 0 else "failed")] += 1
        settle.start().join(120)
        load.counts.update({f"final {k}": v for k, v in settle.counts.items()})
        pc = check_pushes(repo, load.pushes)
        ok_verify, verify_out = aspen_verify(repo)
        fsck = git("fsck", "--strict", "--no-progress", cwd=repo).returncode == 0
        clone_ok, clone_msg = final_clone(url, repo, workdir / "final-mirror")
        left = leftovers(repo)
    finally:
        server.stop()
    tracebacks = server.tracebacks()
    requests = dict(sorted(load.counts.items()))
    summary = Summary(seconds, seed, dict(sorted(inj.counts.items())), requests, pc.acknowledged, len(pc.lost),
                      pc.failed_but_landed, pc.stray, load.hung, load.errors + inj.errors, ok_verify, verify_out,
                      fsck, clone_msg, left, tracebacks,
                      ok=not pc.lost and not pc.stray and not load.hung and not load.errors and not inj.errors
                      and ok_verify and fsck and clone_ok and not left and requests.get("final push failed", 0) == 0)
    return summary


def write_results(summary: Summary, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(asdict(summary), indent=2) + "\n")
    lines = [f"# Faults soak: {summary.seconds:.0f} s", "",
             "`aspen-bench faults` (bench/faults.py): clone, fetch and push clients against Aspen under gunicorn "
             "(2 workers x 8 threads) over the `tiny` generated repository, with faults injected at random "
             f"(`aspen-bench faults --seconds {summary.seconds:g} --seed {summary.seed}`).", "",
             "| fault | injected |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in summary.faults.items()]
    lines += ["", "| requests | count |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in summary.requests.items()]
    lines += ["", f"- pushes acknowledged: {summary.pushes_acknowledged}",
              f"- pushes lost: {summary.pushes_lost}",
              f"- pushes the client saw fail that landed anyway (recorded by a version): "
              f"{summary.pushes_failed_but_landed}",
              f"- `aspen verify`: {'clean' if summary.verify_ok else summary.verify_output}",
              f"- `git fsck --strict` on the server: {'clean' if summary.fsck_ok else 'FAILED'}",
              f"- final mirror clone (fsck --strict, refs equal): {summary.final_clone}",
              f"- lock files / quarantines left: {summary.leftovers or 'none'}",
              f"- requests that hung past 120 s: {len(summary.hung)}",
              f"- verdict: {'PASS' if summary.ok else 'FAIL'}", ""]
    (out / "README.md").write_text("\n".join(lines))


def cmd(args) -> int:
    """The `faults` subcommand."""
    from .progress import say
    out = Path(args.out) if args.out else PROJECT / "bench" / "results" / (time.strftime("%Y-%m-%d") + "-faults")
    workdir = Path(__import__("tempfile").mkdtemp(prefix="aspen-faults-"))
    try:
        summary = soak(args.seconds, workdir, args.seed, say)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    write_results(summary, out)
    print(json.dumps(asdict(summary), indent=2))
    say(f"faults: results in {out}")
    return 0 if summary.ok else 1
