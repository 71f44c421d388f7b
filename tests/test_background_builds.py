"""Background pack builds, with real repositories, git and processes:

- a builder (the detached `aspen import --background` CGI starts, or a
  server's thread) whose repository is deleted mid-build stops, kills its git
  child and leaves nothing of the repository on disk, with no second
  `rm -rf`, also right after a push or fetch through aspen-cgi;
- builds run git at niceness 10 with one pack-objects thread, and at most
  ASPEN_BUILDS_PER_SERVER of them at once on the machine (seen in /proc);
- `aspen import REPO` waits for a running builder, then builds what it left;
- `aspen import --all ROOT` imports every repository under ROOT and, killed
  (kill -9) half-way, finishes on the next run without rebuilding what was
  built.

Processes are observed in /proc: a build's git is `git ... pack-objects
--window=...` whose working directory is the repository."""

from __future__ import annotations

import errno
import hashlib
import os
import pty
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from aspen_cgi import settings
from aspen_cgi.packs import background, builder
from aspen_cgi.refstore.store import RefStore
from aspen_cgi.runtime.repository import Repository

from . import harness as h
from . import pushkit as pk

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(autouse=True)
def _detached_builders(monkeypatch):
    """Builders start as a CGI request starts them (detached processes), whatever
    ran before in this pytest process: importing the WSGI application (another
    test) makes them threads of this process, which the tests here kill."""
    monkeypatch.setattr(background, "IN_PROCESS", False)


ASPEN = str(Path(sys.executable).parent / "aspen")


# -- repositories ------------------------------------------------------------------------------------

def big_repo(path: Path, commits: int = 50, files: int = 50, seed: int = 1) -> Path:
    """A bare repository of about COMMITS × FILES similar text blobs (git fast-import):
    its wide-window delta search takes seconds."""
    h.git("init", "-q", "--bare", "-b", "main", str(path))
    rng = random.Random(seed)
    words = [f"w{rng.randrange(100000)}" for _ in range(4000)]
    text = {f: [rng.choice(words) for _ in range(300)] for f in range(files)}
    out = []
    for c in range(commits):
        out.append(f"commit refs/heads/main\nmark :{c + 1}\ncommitter T <t@x> {1700000000 + c} +0000\n"
                   f"data 9\ncommit {c:02d}\n")
        if c:
            out.append(f"from :{c}\n")
        for f in range(files):
            for _ in range(5):
                text[f][rng.randrange(300)] = rng.choice(words)
            data = " ".join(text[f]) + "\n"
            out.append(f"M 100644 inline d{f % 7}/f{f}.txt\ndata {len(data)}\n{data}")
        out.append("\n")
    h.git("fast-import", "--quiet", cwd=str(path), input="".join(out).encode())
    return path


def env_for(tmp_path: Path, **extra: str) -> dict:
    """The process environment with this test's own build slots (ASPEN_RUN_DIR)."""
    env = dict(os.environ)
    env.pop("GIT_DIR", None)
    env.update({"ASPEN_RUN_DIR": str(tmp_path / "run"), "ASPEN_ACCESS_LOG": "0"})
    env.update(extra)
    return env


def record(repo: Path, env: dict) -> None:
    """What the first request does: the store, with the repository as version 1."""
    res = subprocess.run([ASPEN, "log", "-n", "1", str(repo)], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def in_thread(fn):
    """FN() in a short-lived thread: the store's connections are per thread and go with it."""
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("v", fn()))
    t.start()
    t.join()
    return box.get("v")


def fully_built(repo: Path, env: dict) -> bool:
    def look() -> bool:
        store = RefStore.open(Repository.of(str(repo), dict(env, GIT_DIR=str(repo))), create=False)
        return store is not None and store.all_packs_built() and not builder.segments_to_build(store)
    return in_thread(look)


def pack_files(repo: Path) -> dict[str, int]:
    """The stored packs' files and their mtimes (ns)."""
    return {p.name: p.stat().st_mtime_ns for p in (repo / "aspen" / "packs").glob("pack-*")}


# -- processes -----------------------------------------------------------------------------------------

@dataclass
class Proc:
    pid: int
    ppid: int
    state: str
    nice: int
    threads: int
    argv: list
    cwd: str


def processes() -> list[Proc]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            cwd = os.readlink(f"/proc/{name}/cwd")
        except OSError:
            continue
        rest = data[data.rindex(b")") + 2:].split()
        out.append(Proc(int(name), int(rest[1]), rest[0].decode(), int(rest[16]), int(rest[17]), argv, cwd))
    return out


def build_gits(under: Path, procs: Optional[list] = None) -> list[Proc]:
    """The running pack-objects of builds' wide searches (the import's pack built again
    once the repository is quiet: seconds here) in repositories under UNDER."""
    return [p for p in (processes() if procs is None else procs)
            if p.argv and os.path.basename(p.argv[0]) == "git" and "pack-objects" in p.argv
            and "--no-reuse-delta" in p.argv and any(a.startswith("--window=") for a in p.argv)
            and p.cwd.startswith(str(under))
            and p.state not in ("Z", "X")]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    return data[data.rindex(b")") + 2:].split()[0] not in (b"Z", b"X")


def wait_for(what, timeout: float, pause: float = 0.01):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(pause)
    return what()


def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


def mentions(path: Path) -> list[Proc]:
    """Processes working in PATH, or naming it on their command line or in
    their environment (a CGI push's pre-warmer: ASPEN_PREWARM_GITDIR)."""
    p = str(path)
    return [x for x in processes() if x.pid != os.getpid() and x.state not in ("Z", "X")
            and (x.cwd.startswith(p) or any(p in a for a in x.argv)
                 or f"ASPEN_PREWARM_GITDIR={p}".encode() in _environ(x.pid).split(b"\0"))]


# -- deleting, as rm -rf does --------------------------------------------------------------------------

def rm_rf_once(path: Path) -> list[OSError]:
    """rm -rf PATH once, as a person or a test script does while work for it
    runs; only ENOTEMPTY may be met (a file made between rm's listing of a
    directory and its rmdir), what the work removes once it notices."""
    errors = h.rm_rf(path)
    assert all(getattr(e, "errno", None) == errno.ENOTEMPTY for e in errors), errors
    return errors


def assert_nothing_left(path: Path, errors: list[OSError]) -> None:
    """Once the work that raced rm -rf PATH has ended: nothing of PATH, with no second rm."""
    left = sorted(str(p) for p in Path(path).rglob("*")) if os.path.lexists(path) else []
    assert not os.path.lexists(path), f"{path} is left after rm -rf (which met {errors}): {left}"


def assert_stays_gone(path: Path, seconds: float = 1.5) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert not os.path.lexists(path), f"{path} came back: {list(Path(path).rglob('*'))}"
        time.sleep(0.02)


# -- 1. background work never outlives its repository ------------------------------------------------

def test_a_detached_builder_stops_and_leaves_nothing_when_its_repository_is_deleted(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    repo = big_repo(root / "big.git")
    env = env_for(tmp_path)
    record(repo, env)
    packs = repo / "aspen" / "packs"
    assert background.kick(Repository.of(str(repo), env), str(packs))          # what a CGI push does: a detached builder
    lock = packs / background.LOCK
    assert wait_for(lambda: lock.exists() and lock.read_text().strip(), 20)
    builder = background.holder_pid(lock.read_text().strip())
    gits = wait_for(lambda: build_gits(repo), 30)
    assert gits, "the builder's pack-objects never ran"
    assert gits[0].ppid == builder and gits[0].nice == 10 and not any(a.startswith("--threads") for a in gits[0].argv)
    time.sleep(0.3)                                   # well into the delta search
    assert alive(builder) and alive(gits[0].pid)
    errors = rm_rf_once(repo)
    assert wait_for(lambda: not alive(builder) and not alive(gits[0].pid), 15), "the builder outlived its repository"
    assert_nothing_left(repo, errors)
    assert_stays_gone(repo)
    assert not mentions(repo), mentions(repo)
    assert os.listdir(root) == []


def test_a_server_thread_builder_stops_and_leaves_nothing_when_its_repository_is_deleted(tmp_path, monkeypatch):
    root = tmp_path / "root"
    root.mkdir()
    repo = big_repo(root / "big.git")
    env = env_for(tmp_path)
    record(repo, env)
    packs = repo / "aspen" / "packs"
    monkeypatch.setattr(background, "IN_PROCESS", True)      # what gunicorn and mod_wsgi workers do
    before = {t.ident for t in threading.enumerate()}
    assert background.kick(Repository.of(str(repo), env), str(packs))
    builder = [t for t in threading.enumerate() if t.ident not in before and t.name == "aspen-packs"]
    assert len(builder) == 1
    gits = wait_for(lambda: build_gits(repo), 30)
    assert gits, "the builder's pack-objects never ran"
    git = gits[0]
    assert git.ppid == os.getpid()
    # the thread's git child runs at niceness 10 (a `nice` prefix), with git's threads (one per core)
    own = os.getpriority(os.PRIO_PROCESS, 0)
    assert git.nice == max(10, own), git
    assert not any(a.startswith("--threads") for a in git.argv), git
    time.sleep(0.3)
    errors = rm_rf_once(repo)
    builder[0].join(15)
    assert not builder[0].is_alive(), "the builder thread outlived its repository"
    assert not alive(git.pid)
    assert_nothing_left(repo, errors)
    assert_stays_gone(repo)
    assert not mentions(repo), mentions(repo)
    assert os.listdir(root) == []


def test_rm_rf_right_after_a_cgi_push_or_fetch_leaves_nothing(tmp_path, cgi_server_factory):
    """As git's t5702 does: a repository is deleted as soon as the client is
    done with it, while the builder and pre-warmer the push (or the fetch)
    started are at work. Nothing of it is left once they end, with no second
    rm -rf, and nothing re-creates it. The rm -rf itself can meet a file one
    of them made between its listing of a directory and its rmdir
    (ENOTEMPTY), the one race a deletion has with them: how often is printed;
    what they made is theirs to remove once they notice."""
    root = tmp_path / "root"
    root.mkdir()
    server = cgi_server_factory(root, program="aspen", ASPEN_RUN_DIR=str(tmp_path / "run"))
    first_try_failures = 0
    for kind in ("push", "fetch"):
        for i in range(4):
            if kind == "push":
                repo = pk.enable_push(h.make_history(root / f"push{i}.git", commits=4))
                work = tmp_path / f"work{i}"
                h.git("clone", "-q", f"{server.url}/push{i}.git", str(work))
                pk.commit(work, f"change {i}")
                pk.push(work, "origin", "HEAD:main")
            else:
                repo = h.make_history(root / f"fetch{i}.git", commits=6)   # never served: the fetch starts its build
                h.git("clone", "-q", "--bare", f"{server.url}/fetch{i}.git", str(tmp_path / f"clone{i}.git"))
            errors = rm_rf_once(repo)                          # at once, as the test scripts do
            first_try_failures += bool(errors)
            assert wait_for(lambda: not mentions(repo), 20), mentions(repo)
            assert_nothing_left(repo, errors)
            assert_stays_gone(repo, 0.5)
    print(f"BACKGROUND rm -rf right after a CGI push or fetch: {first_try_failures} of 8 met ENOTEMPTY")
    assert sorted(os.listdir(root)) == []


def _depth1_builds(path: Path) -> list[Proc]:
    """Detached wide depth-1 builds (fetch/depth1.py) of the repository at PATH."""
    names = {f"ASPEN_DEPTH1_GITDIR={p}".encode() for p in (str(path), os.path.realpath(path))}
    return [x for x in processes() if x.pid != os.getpid() and x.state not in ("Z", "X")
            and names & set(_environ(x.pid).split(b"\0"))]


def test_rm_rf_right_after_a_cgi_depth1_clone_leaves_nothing(tmp_path, cgi_server_factory):
    """A depth-1 clone asked for a second time through aspen-cgi starts the
    detached wide depth-1 build; the repository deleted at once, that build
    (and whatever else works for it) ends without re-creating anything of it."""
    root = tmp_path / "root"
    root.mkdir()
    server = cgi_server_factory(root, program="aspen", ASPEN_RUN_DIR=str(tmp_path / "run"))
    repo = h.make_history(root / "shallow.git", commits=6)
    for name in ("clone.git", "again.git"):
        h.git("clone", "-q", "--depth", "1", "--bare", f"{server.url}/shallow.git", str(tmp_path / name))
    started = list((repo / "aspen" / "cache").glob(".*.wide.lock.tmp"))
    shutil.rmtree(repo, onerror=lambda *a: None)           # at once; what races it is the guard's to clear
    assert started, "the depth-1 clone started no wide build"
    assert wait_for(lambda: not mentions(repo) and not _depth1_builds(repo), 30), \
        (mentions(repo), _depth1_builds(repo))
    assert not os.path.lexists(repo), f"{repo} is left: {list(Path(repo).rglob('*'))}"
    assert os.listdir(root) == []


# -- 2. builds are niced and bounded per machine ------------------------------------------------------

@pytest.mark.parametrize("limit", [1, 3])
def test_at_most_builds_per_server_builds_run_at_once(tmp_path, limit):
    root = tmp_path / "root"
    root.mkdir()
    repos = [big_repo(root / f"r{i}.git", commits=30, files=40, seed=i) for i in range(3)]
    env = env_for(tmp_path, ASPEN_BUILDS_PER_SERVER=str(limit))
    for r in repos:
        record(r, env)
    for r in repos:                                        # three pushes' builders, at once
        assert background.kick(Repository.of(str(r), env), str(r / "aspen" / "packs"))
    seen: dict[int, Proc] = {}
    most = 0
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        running = build_gits(root)
        most = max(most, len(running))
        for p in running:
            seen.setdefault(p.pid, p)
        if not running and all(not background.running(str(r / "aspen" / "packs")) for r in repos) \
                and all(fully_built(r, env) for r in repos):
            break
        time.sleep(0.005)
    assert all(fully_built(r, env) for r in repos)
    assert {os.path.basename(p.cwd) for p in seen.values()} == {r.name for r in repos}
    assert all(p.nice == 10 and not any(a.startswith("--threads") for a in p.argv) for p in seen.values()), seen
    if limit == 1:
        assert most == 1, f"{most} background pack-objects ran at once with ASPEN_BUILDS_PER_SERVER=1"
    else:
        assert most >= 2, "the builders never overlapped: the observation would not show a bound"
    for r in repos:
        h.verify_ok(r)


def test_build_slots_default_to_half_the_cores_apart_from_live_slots(tmp_path):
    from aspen_cgi.runtime import admission
    lim = admission.capacity(settings.of({"ASPEN_RUN_DIR": str(tmp_path / "run")}))
    assert lim.builds == max(1, (os.cpu_count() or 2) // 2)
    assert admission.capacity(settings.of({admission.BUILDS_ENV: "3"})).builds == 3
    # every build slot taken: a live request's cold slot is still free
    held = [admission.acquire_build(lim) for _ in range(lim.builds)]
    cold = admission.acquire(lim, str(tmp_path), queue=False)
    assert cold.waited_s == 0.0
    assert admission.gauges(lim).builds == lim.builds
    cold.release()
    for s in held:
        s.release()


# -- 3. `aspen import` waits for a running builder ---------------------------------------------------

def _start_builder(repo: Path, env: dict) -> tuple[int, Proc]:
    packs = repo / "aspen" / "packs"
    assert background.kick(Repository.of(str(repo), env), str(packs))
    lock = packs / background.LOCK
    assert wait_for(lambda: lock.exists() and lock.read_text().strip(), 20)
    builder = background.holder_pid(lock.read_text().strip())
    gits = wait_for(lambda: build_gits(repo), 30)
    assert gits and gits[0].ppid == builder
    return builder, gits[0]


def test_aspen_import_waits_for_the_running_builder_then_exits_0(tmp_path):
    repo = big_repo(tmp_path / "big.git")
    env = env_for(tmp_path)
    record(repo, env)
    builder, _ = _start_builder(repo, env)
    res = subprocess.run([ASPEN, "import", str(repo)], env=env, capture_output=True, text=True, timeout=200)
    assert res.returncode == 0, res.stderr
    assert f"waiting for the builder running for {repo} (pid {builder}," in res.stderr, res.stderr
    assert not alive(builder)                             # it waited for the builder to end
    assert "0 version packs built now" in res.stdout, res.stdout
    assert fully_built(repo, env)
    h.verify_ok(repo)


def test_aspen_import_builds_what_a_killed_builder_left(tmp_path):
    repo = big_repo(tmp_path / "big.git")
    env = env_for(tmp_path)
    record(repo, env)
    builder, _ = _start_builder(repo, env)
    imp = subprocess.Popen([ASPEN, "import", str(repo)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        wide = wait_for(lambda: [g for g in build_gits(repo) if "--window=250" in g.argv], 60)
        assert wide, "the import's wide search never ran"
        os.kill(wide[0].pid, signal.SIGSTOP)              # the wide search held where it is
        said = imp.stderr.readline()                       # the import by hand waits for the builder
        assert f"waiting for the builder running for {repo} (pid {builder}," in said, said
        os.kill(builder, signal.SIGKILL)                  # the builder dies mid-build (the import's wide search)
        try:
            os.kill(wide[0].pid, signal.SIGCONT)
        except ProcessLookupError:
            pass        # its parent-death signal (setpriv --pdeathsig KILL) came first: SIGKILL ends a stopped git
        assert wait_for(lambda: not alive(wide[0].pid), 10), "the killed builder's git lived on"
        out, err = imp.communicate(timeout=200)
        err = said + err
    finally:
        if imp.poll() is None:
            imp.kill()
    assert imp.returncode == 0, err
    assert f"(pid {builder}," in err, err
    assert "the import's pack built again with the wide search" in out, out
    assert fully_built(repo, env)
    h.verify_ok(repo)


# -- 4. `aspen import --all ROOT` ---------------------------------------------------------------------

def test_import_all_resumes_after_kill_9_without_rebuilding(tmp_path):
    root = tmp_path / "root"
    names = ["a/one.git", "b/c/two.git", "four.git", "three.git"]          # the order they are imported in
    repos = [big_repo(root / n, commits=30, files=40, seed=i) for i, n in enumerate(names)]
    (root / "notes").mkdir()
    (root / "notes" / "HEAD").write_text("not a repository\n")
    (root / "empty.git").mkdir()
    env = env_for(tmp_path)
    first = subprocess.Popen([ASPEN, "import", "--all", str(root)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
    try:
        gits = wait_for(lambda: build_gits(repos[2]), 120, pause=0.02)      # the third repository's build
        assert gits, "the third repository's build was never seen"
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        assert wait_for(lambda: not alive(gits[0].pid), 10), "the killed import's git lived on"
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert fully_built(repos[0], env) and fully_built(repos[1], env)
    assert not fully_built(repos[2], env) and not (repos[3] / "aspen").exists()
    kept = {r: pack_files(r) for r in repos[:2]}
    assert all(kept.values())

    # again, on a terminal: a progress bar over the repositories
    master, slave = pty.openpty()
    second = subprocess.Popen([ASPEN, "import", "--all", str(root)], env=env, stdout=subprocess.PIPE,
                              stderr=slave, text=True)
    os.close(slave)
    shown = []

    def read_terminal() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError as e:
                if e.errno == errno.EIO:
                    return
                raise
            if not chunk:
                return
            shown.append(chunk)
    reader = threading.Thread(target=read_terminal, daemon=True)
    reader.start()
    out, _ = second.communicate(timeout=200)
    reader.join(10)
    os.close(master)
    terminal = b"".join(shown).decode(errors="replace")
    assert second.returncode == 0, terminal
    assert "importing repositories [" in terminal and "4/4" in terminal, terminal
    lines = out.splitlines()
    assert lines[-1].startswith(f"imported 4 repositories under {root}: 2 built now, 2 already built, 0 failed"), out
    assert "a/one.git: 1 versions, already built" in lines and "b/c/two.git: 1 versions, already built" in lines, out
    assert not any("notes" in line or "empty.git" in line for line in lines), out
    for r in repos:
        assert fully_built(r, env), r
        h.verify_ok(r)
    assert {r: pack_files(r) for r in repos[:2]} == kept         # not rebuilt: the same files, untouched


def test_a_background_git_whose_input_outlasts_its_first_poll_gets_all_of_it(tmp_path):
    """Background git is polled every INTERVAL while it runs; input larger
    than a pipe that is still being written when the first poll times out
    (an import's 1,800 tips, a loaded machine) must still reach git whole.
    It used to stop after the first poll: git waited for stdin forever."""
    from aspen_cgi.git import gitexec
    repo = tmp_path / "repo.git"
    h.git("init", "-q", "--bare", str(repo))
    data = os.urandom(1 << 20)
    out: list = []
    t = threading.Thread(target=lambda: out.append(gitexec.background_git(
        ["hash-object", "--stdin"], cwd=str(repo), input=data, interval=0.0001)), daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "git never got the rest of its input"
    res = out[0]
    assert res.ok
    assert res.stdout.decode().strip() == hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


# -- 5. the import's pack: git's own search first, the wide one once quiet --------------------------

def test_the_import_is_packed_quickly_first_then_widened_in_place(tmp_path):
    """A background build packs the import with git's own search (window 10,
    deltas reused), so fetches are planned soon; once the repository is
    quiet it builds the same objects again with the wide search and records
    that pack in place (the store's identity for the caches changes with
    it); the quick pack's files stay for fetches planned meanwhile.
    `aspen import` by hand packs it wide at once."""
    repo = big_repo(tmp_path / "big.git", commits=20, files=20)
    env = env_for(tmp_path, ASPEN_COMPACT_QUIET_MS="0")
    record(repo, env)

    def run(quick_first: bool):
        store = RefStore.open(Repository.of(str(repo), dict(env, GIT_DIR=str(repo))), create=False)
        before = store.settled()[0]
        rep = background.build(store, background.background_search(), quick_first=quick_first)
        return rep, before, store.settled()[0], store.import_window(), store.version_pack(1)[0]
    rep, before, after, window, (name, objects, size) = in_thread(lambda: run(True))
    assert [v for v, _ in rep.versions] == [1] and rep.widened
    assert window == background.background_search().window == 250
    quick = rep.versions[0][1]
    assert quick.objects == objects and quick.name != name and size <= quick.size
    assert (repo / "aspen" / "packs" / f"pack-{quick.name}.pack").exists()     # swept an hour later
    assert before[:2] == after[:2] and before[2] == "" and after[2] == name
    assert fully_built(repo, env) and background.import_final(RefStore.open(Repository.of(str(repo), dict(env, GIT_DIR=str(repo)))))
    h.verify_ok(repo)
    other = big_repo(tmp_path / "other.git", commits=5, files=5)
    res = subprocess.run([ASPEN, "import", str(other)], env=env, capture_output=True, text=True, timeout=200)
    assert res.returncode == 0, res.stderr
    assert "1 version packs built now" in res.stdout and "built again" not in res.stdout, res.stdout
    store = in_thread(lambda: RefStore.open(Repository.of(str(other), dict(env, GIT_DIR=str(other))), create=False).import_window())
    assert store == 250
