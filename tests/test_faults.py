"""Faults injected for real into a gunicorn Aspen (2 workers) under real git
clients: kill -9 of workers under clone/fetch/push load, a full disk during
a push (repository on a small tmpfs) and under the ref store (its state
directory on one), the ref store's SQLite file held locked by another
process, git children killed mid-transfer (upload-pack, pack-objects,
unpack-objects, index-pack, a background version-pack build) and kill -9 of
the whole server mid-push. After each: no acknowledged push lost, no
half-written ref, `aspen verify` and `git fsck --strict` clean, no lock file
or quarantine left, and the service resumes with no manual step (a strict
mirror clone equals the server).

A full disk while a cache entry is written, under concurrent clones, is
tests/test_cache.py::test_full_disk_degrades_to_computing. kill -9 at each
point of a push is tests/test_refstore_crash.py, whose process-tree helpers
are used here. The load and injection helpers are bench/faults.py's, which
`aspen-bench faults` soaks with."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from aspen_cgi.runtime.repository import Repository
from bench import faults as F

from . import harness as h
from . import pushkit as pk
from .harness import verify_ok, versions
from .test_refstore_crash import check_consistent, kill9_server

pytestmark = pytest.mark.timeout(120)

NO_KEEPALIVE = {"GUNICORN_CMD_ARGS": "--keep-alive 0"}     # a client sees a killed worker (no silent replay)


# -- helpers ----------------------------------------------------------------------------------

def no_leftovers(repo: Path) -> None:
    left = F.leftovers(repo)
    assert left == [], f"left behind in the repository: {left}"


def big_commit(work: Path, name: str, size: int, files: int = 1) -> str:
    """A commit adding FILES files of random bytes, SIZE in all."""
    d = work / name
    d.mkdir()
    for i in range(files):
        (d / f"blob{i}.bin").write_bytes(os.urandom(size // files))
    h.git("add", "-A", cwd=str(work))
    h.git("commit", "-q", "-m", name, cwd=str(work))
    return pk.rev(work, "HEAD")


def _read_over(n: int):
    def check(p) -> bool:
        try:
            with open(f"/proc/{p.pid}/io") as f:
                return any(line.startswith("rchar:") and int(line.split()[1]) > n for line in f)
        except OSError:
            return False
    return check


def local_work(repo: Path, url: str, dest: Path) -> Path:
    """A client work tree cloned from the repository's path (no request), origin URL."""
    h.git("clone", "-q", str(repo), str(dest))
    h.git("remote", "set-url", "origin", url, cwd=str(dest))
    return dest


def push_in_thread(work: Path, *args: str) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def run() -> None:
        box["p"] = pk.push(work, *args, check=False)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def server_errors(srv: h.Server) -> list[str]:
    return [line for line in srv.log_text().splitlines() if "Traceback" in line]


@pytest.fixture
def tmpfs(tmp_path):
    """Small tmpfs mounts (CI runs as root), unmounted at teardown."""
    mounts: list[Path] = []

    def mount(name: str, size: str) -> Path:
        mnt = tmp_path / name
        mnt.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], check=True)
        mounts.append(mnt)
        return mnt
    yield mount
    for mnt in mounts:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


# -- kill -9 of workers under load -------------------------------------------------------------

KILL_ROUNDS = 5


def test_kill9_workers_under_clone_fetch_push_load(root, server_factory, tmp_path):
    """Six clients (2 pushers, 2 cloners, 2 fetchers, protocol v0 and v2) while
    workers are killed in five rounds, each time the one running a git child
    when there is one. gunicorn respawns each; every acknowledged push is on
    the server, every branch holds a value its client pushed, and afterwards
    the service needs nothing: each pusher's next push lands and the store,
    the objects and a strict mirror clone agree."""
    repo = pk.enable_push(root / "repo.git")
    srv = server_factory(root, **NO_KEEPALIVE)
    url = f"{srv.url}/repo.git"
    h.git("ls-remote", url)
    load = F.Load(url, repo, tmp_path / "clients", pushers=2, cloners=2, fetchers=2, rounds=10, timeout=90)
    load.start()
    master = srv.proc.pid
    kills = 0
    for k in range(KILL_ROUNDS):
        time.sleep(0.6)
        before = F.workers(master)
        # every other round, the worker taking in a push's pack when one is caught in time
        intake = F.wait_for(lambda: F.git_children(master, ["unpack-objects", "index-pack"]), 2) if k % 2 else None
        busy = {p.ppid for p in (intake or F.git_children(master))} & set(before)
        victim = sorted(busy)[0] if busy else before[0]
        assert F.kill9(victim)
        kills += 1
        assert F.respawned(master, before), f"no new worker after kill -9 of {victim}"
    assert load.join(180), "clients still running"
    print(f"FAULTS kill -9 worker: {kills}; requests {dict(sorted(load.counts.items()))}")
    assert load.hung == [] and load.errors == [], (load.hung, load.errors)
    assert kills == KILL_ROUNDS
    assert sum(v for k, v in load.counts.items() if k.startswith("push")) == 20

    pc = F.check_pushes(repo, load.pushes)
    assert pc.lost == [], f"acknowledged pushes lost: {pc.lost}"
    assert pc.stray == [], f"refs holding values no client pushed: {pc.stray}"
    print(f"FAULTS pushes acknowledged {pc.acknowledged}, lost {len(pc.lost)}, "
          f"failed but landed {pc.failed_but_landed}")
    for i in range(2):      # service resumed: each pusher's line lands whole
        work = tmp_path / "clients" / f"push-{i}"
        pk.push(work, "origin", f"HEAD:refs/heads/fault-{i}")
        assert h.refs_of(str(repo))[f"refs/heads/fault-{i}"] == pk.rev(work, "HEAD")
    no_leftovers(repo)
    check_consistent(repo, url, tmp_path, "mirror")


# -- disk full ------------------------------------------------------------------------------------

@pytest.mark.parametrize("intake", ["unpack-objects", "index-pack"])
def test_disk_full_during_push(tmp_path, server_factory, tmpfs, intake):
    """The repository on a 1 MiB tmpfs; a 3 MiB push fails with the client
    told why (git's unpack error), no ref changes, no quarantine is left and
    the store is consistent; once the filesystem has room the same push lands."""
    root = tmpfs("small", "1m")
    repo = pk.enable_push(h.make_history(root / "repo.git", commits=3))
    before = h.refs_of(str(repo))
    srv = server_factory(root)
    url = f"{srv.url}/repo.git"
    work = pk.clone(url, tmp_path / "work")
    files = 1 if intake == "unpack-objects" else 120          # receive.unpackLimit is 100 objects
    tip = big_commit(work, "big", 3 << 20, files)
    p = pk.push(work, "origin", "HEAD:refs/heads/main", check=False)
    err = p.stderr.decode(errors="replace")
    assert p.returncode != 0 and not F.told_ok(p.stdout.decode()), err
    assert f"unpack failed: {intake} abnormal exit" in err, err
    assert h.refs_of(str(repo)) == before
    no_leftovers(repo)
    verify_ok(repo)
    h.fsck_strict(str(repo))
    assert server_errors(srv) == []

    subprocess.run(["mount", "-o", "remount,size=64m", "tmpfs", str(root)], check=True)
    pk.push(work, "origin", "HEAD:refs/heads/main")
    assert h.refs_of(str(repo))["refs/heads/main"] == tip
    no_leftovers(repo)
    check_consistent(repo, url, tmp_path, "mirror")


def _fill(mnt: Path) -> Path:
    """Fill MNT to the last block."""
    filler = mnt / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler


def test_disk_full_under_the_ref_store(root, server_factory, tmp_path, tmpfs):
    """The store (and with it the response cache) in ASPEN_STATE_DIR on a
    tmpfs, filled to the last block: clones still work (the cache starts no
    entry), and a push is either acknowledged and on disk -- the store catching
    up once it has room -- or refused with the ref unchanged; never
    acknowledged and lost. After room is made the store records it all."""
    state = tmpfs("state", "2m")
    env = {"ASPEN_STATE_DIR": str(state)}
    repo = pk.enable_push(root / "repo.git")
    srv = server_factory(root, **env)
    url = f"{srv.url}/repo.git"
    work = pk.clone(url, tmp_path / "work")
    before = h.refs_of(str(repo))
    filler = _fill(state)
    clones = [h.git("clone", "-q", url, str(tmp_path / f"c{i}"), check=False) for i in range(2)]
    assert [c.returncode for c in clones] == [0, 0], [c.stderr.decode() for c in clones]
    tips = []
    outcomes = []
    for k in range(3):
        tip = pk.commit(work, f"while the store's disk is full {k}")
        p = pk.push(work, "origin", "HEAD:refs/heads/main", check=False)
        acked = p.returncode == 0 and "refs/heads/main" in F.told_ok(p.stdout.decode())
        now = h.refs_of(str(repo))["refs/heads/main"]
        if acked:
            assert now == tip, f"acknowledged but not on disk: {p.stderr.decode()}"
            tips.append(tip)
        else:
            assert now == (tips[-1] if tips else before["refs/heads/main"]), "a refused push moved the ref"
            h.git("reset", "-q", "--hard", "HEAD~1", cwd=str(work))
        outcomes.append("acked" if acked else "refused")
    print(f"FAULTS store disk full: pushes {outcomes}")
    h.fsck_strict(str(repo))

    filler.unlink()
    tip = pk.commit(work, "after room was made")
    pk.push(work, "origin", "HEAD:refs/heads/main")
    assert h.refs_of(str(repo))["refs/heads/main"] == tip
    for t in tips:      # acknowledged while the store could not write: still in main's history
        assert h.git("merge-base", "--is-ancestor", t, tip, cwd=str(repo), check=False).returncode == 0
    log = versions_in(repo, env)
    print(f"FAULTS store disk full: versions recorded {[v['kind'] for v in log]}")
    assert log[-1]["kind"] == "push" and log[-1]["updates"][0]["new"] == tip, log[-3:]
    no_leftovers(repo)
    p = subprocess.run([sys.executable, "-m", "aspen_cgi.cli", "verify", "-q", str(repo)], cwd=h.REPO_DIR,
                       env=dict(os.environ, **env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert p.returncode == 0, p.stdout.decode()
    check_consistent_store_elsewhere(repo, url, tmp_path)


def versions_in(repo: Path, env: dict) -> list[dict]:
    import json
    p = subprocess.run([sys.executable, "-m", "aspen_cgi.cli", "log", "--json", str(repo)], cwd=h.REPO_DIR,
                       env=dict(os.environ, **env), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.returncode == 0, p.stderr.decode()
    return sorted((json.loads(x) for x in p.stdout.decode().splitlines() if x.strip()), key=lambda v: v["id"])


def check_consistent_store_elsewhere(repo: Path, url: str, tmp_path: Path) -> None:
    h.fsck_strict(str(repo))
    mirror = tmp_path / "mirror"
    h.git("-c", "transfer.fsckObjects=true", "clone", "-q", "--mirror", url, str(mirror))
    h.fsck_strict(str(mirror))
    assert h.refs_of(str(mirror)) == h.refs_of(str(repo))


# -- the ref store's SQLite file locked by another process ---------------------------------------

@pytest.mark.parametrize("mode,wait", [("immediate", "30"), ("exclusive-mode", "30"), ("exclusive-mode", "1")],
                         ids=["begin-immediate", "locking-mode-exclusive", "locking-mode-exclusive-wait-1s"])
@pytest.mark.sqlite_store("another process holds the SQLite file locked")
def test_store_locked_by_another_process(root, server_factory, tmp_path, mode, wait):
    """Another process holds aspen.sqlite3 locked for a few seconds (BEGIN
    IMMEDIATE; or PRAGMA locking_mode=EXCLUSIVE, which keeps readers out as
    well) while clients fetch and push. Fetches are answered while the lock is
    held (refs from the disk after db.READ_WAIT when the store cannot even be
    read). A push waits up to ASPEN_STORE_WAIT: within it, it lands as a push
    version once the lock goes; past it, git writes the refs alone and the
    store records them as an external version when it can. Nothing
    acknowledged is lost, and verify is clean after."""
    hold = 5.0
    repo = pk.enable_push(root / "repo.git")
    first = server_factory(root)
    h.git("ls-remote", f"{first.url}/repo.git")          # the store is made
    # An exclusive locking mode is only granted while no other connection has the file
    # open (Aspen's stay open): the other process takes it before the server starts.
    first.stop()
    holder = F.hold_store_lock(str(repo / "aspen" / "aspen.sqlite3"), mode, hold)
    srv = server_factory(root, ASPEN_STORE_WAIT=wait)
    url = f"{srv.url}/repo.git"
    work = local_work(repo, url, tmp_path / "work")
    reader = local_work(repo, url, tmp_path / "reader")
    tip = pk.commit(work, "while the store is locked")
    try:
        pusher, box = push_in_thread(work, "origin", "HEAD:refs/heads/main")
        fetched_while_locked = 0
        for version in ("2", "0", "2"):
            f = h.git("-c", f"protocol.version={version}", "fetch", "-q", "origin", cwd=str(reader), check=False)
            assert f.returncode == 0, f.stderr.decode()
            fetched_while_locked += holder.poll() is None
        c = h.git("clone", "-q", url, str(tmp_path / "clone"), check=False)
        assert c.returncode == 0, c.stderr.decode()
        assert fetched_while_locked >= 1, "no fetch was answered while the lock was held"
        pusher.join(90)
        assert not pusher.is_alive(), "the push hung"
    finally:
        holder.wait(30)
    p = box["p"]
    assert p.returncode == 0, p.stderr.decode()
    assert h.refs_of(str(repo))["refs/heads/main"] == tip
    h.git("ls-remote", url)      # the next request brings the store up to the disk
    log = versions(repo)
    kinds = [v["kind"] for v in log if any(u["new"] == tip for u in v["updates"])]
    print(f"FAULTS sqlite lock {mode} ASPEN_STORE_WAIT={wait}: fetches while locked {fetched_while_locked}, "
          f"push recorded as {kinds}")
    assert kinds == (["push"] if wait == "30" else ["external"]), log[-3:]
    tip2 = pk.commit(work, "after the lock")
    pk.push(work, "origin", "HEAD:refs/heads/main")
    assert [v["kind"] for v in versions(repo)][-1] == "push"
    assert h.refs_of(str(repo))["refs/heads/main"] == tip2
    no_leftovers(repo)
    check_consistent(repo, url, tmp_path, "mirror")
    assert server_errors(srv) == []


# -- git children killed ------------------------------------------------------------------------

THROTTLE_HOOK = """#!/bin/bash
# uploadpack.packObjectsHook: git's own pack-objects, its output read slowly
# (a slow reader), so that it is surely mid-transfer when killed.
set -o pipefail
"$@" | {python} -c '
import sys, time
i, o = sys.stdin.buffer, sys.stdout.buffer
while True:
    b = i.read1(65536)
    if not b:
        break
    o.write(b)
    o.flush()
    time.sleep(0.03)
'
"""


def _throttled_env(tmp_path: Path, **extra: str) -> dict:
    hook = tmp_path / "throttle-hook.sh"
    hook.write_text(THROTTLE_HOOK.format(python=sys.executable))
    hook.chmod(0o755)
    return {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "uploadpack.packObjectsHook",
            "GIT_CONFIG_VALUE_0": str(hook), "ASPEN_WIDE_DEPTH1": "0", "ASPEN_RUN_DIR": str(tmp_path / "run"),
            **extra}


def _with_big_blob(repo: Path, tmp_path: Path, size: int = 3 << 20) -> str:
    work = local_work(repo, str(repo), tmp_path / "seed")
    tip = big_commit(work, "big", size)
    h.git("push", "-q", "origin", "HEAD:refs/heads/main", cwd=str(work))
    return tip


@pytest.mark.parametrize("victim,cache", [("pack-objects", "on"), ("upload-pack", "on"), ("pack-objects", "off")])
def test_git_killed_during_clone(root, server_factory, tmp_path, victim, cache):
    """kill -9 of git pack-objects or upload-pack while a clone's pack is being
    sent: the client gets an error, the server is fine, the cache keeps no
    truncated answer (no entry; the next clone computes afresh and is
    correct, and the one after is a hit from a complete entry). Version
    packs off: the clone is git's, and no builder's pack-objects is about
    (test_background_version_pack_build_killed covers those)."""
    repo = root / "repo.git"
    _with_big_blob(repo, tmp_path)
    cache_dir = tmp_path / "cache"
    env = _throttled_env(tmp_path, ASPEN_CACHE=cache, ASPEN_CACHE_DIR=str(cache_dir), ASPEN_CACHE_RESERVE_BYTES="0",
                         ASPEN_VERSION_PACKS="off")
    srv = server_factory(root, **env)
    url = f"{srv.url}/repo.git"
    clone = subprocess.Popen(["git", "clone", "-q", "--no-checkout", url, str(tmp_path / "killed")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # mid-transfer: pack-objects has been sending (the entry has grown, or a while has passed)
        found = F.wait_for(lambda: F.git_children(srv.proc.pid, [victim]), 30)
        assert found, "the git child never ran"
        if cache == "on":
            assert F.wait_for(lambda: sum(p.stat().st_size for p in cache_dir.glob("*.part")) > 256 << 10, 30), \
                "the cache entry never grew"
        else:
            time.sleep(0.5)
        assert F.kill9(found[0].pid)
        _, err = clone.communicate(timeout=60)
    finally:
        if clone.poll() is None:
            clone.kill()
    assert clone.returncode != 0, "the clone succeeded although its pack-objects was killed"
    print(f"FAULTS kill -9 git {victim} (cache {cache}): client saw: {err.decode(errors='replace').strip()[:200]}")
    assert list(cache_dir.glob("*.entry")) == [], "a truncated answer was kept"
    for name in ("c1", "c2"):
        c = h.git("-c", "transfer.fsckObjects=true", "clone", "-q", "--mirror", url, str(tmp_path / name),
                  check=False)
        assert c.returncode == 0, c.stderr.decode()
        h.fsck_strict(str(tmp_path / name))
        assert h.refs_of(str(tmp_path / name)) == h.refs_of(str(repo))
    if cache == "on":
        assert len(list(cache_dir.glob("*.entry"))) == 1
    assert server_errors(srv) == []
    verify_ok(repo)


@pytest.mark.parametrize("intake", ["unpack-objects", "index-pack"])
def test_git_killed_during_push(root, server_factory, tmp_path, intake):
    """kill -9 of unpack-objects / index-pack while a push streams into it:
    the push fails, no ref changes, the quarantine is removed; the same push
    then lands."""
    repo = pk.enable_push(root / "repo.git")
    before = h.refs_of(str(repo))
    srv = server_factory(root)
    url = f"{srv.url}/repo.git"
    work = local_work(repo, url, tmp_path / "work")
    tip = big_commit(work, "big", 16 << 20, 1 if intake == "unpack-objects" else 120)   # long enough to be caught
    pusher, box = push_in_thread(work, "origin", "HEAD:refs/heads/main")
    found = F.wait_for(lambda: F.git_children(srv.proc.pid, [intake]), 60)
    assert found, f"{intake} never ran"
    assert F.kill9(found[0].pid)
    pusher.join(90)
    p = box["p"]
    err = p.stderr.decode(errors="replace")
    print(f"FAULTS kill -9 git {intake}: client exit {p.returncode}: {err.strip()[:200]}")
    assert p.returncode != 0 and f"unpack failed: {intake} abnormal exit" in err, err
    assert h.refs_of(str(repo)) == before
    no_leftovers(repo)
    verify_ok(repo)
    pk.push(work, "origin", "HEAD:refs/heads/main")
    assert h.refs_of(str(repo))["refs/heads/main"] == tip
    no_leftovers(repo)
    check_consistent(repo, url, tmp_path, "mirror")
    assert server_errors(srv) == []


HOLD_WIDE_BUILD = """#!/bin/sh
# ASPEN_GIT for one test: the first wide pack-objects (a version-pack build's
# --window=250; armed by $HOLD_DIR/arm) writes its pid and is held, before it
# becomes git, on a FIFO nothing writes: the test kills it there.
case " $* " in
*" pack-objects "*"--window=250 "*)
    if rm "$HOLD_DIR/arm" 2>/dev/null; then
        echo $$ >"$HOLD_DIR/pid.tmp" && mv "$HOLD_DIR/pid.tmp" "$HOLD_DIR/pid"
        read _ <"$HOLD_DIR/fifo"
    fi;;
esac
exec git "$@"
"""


def _held_pid(hold: Path) -> int:
    try:
        return int((hold / "pid").read_text())
    except (OSError, ValueError):
        return 0


def test_background_version_pack_build_killed(root, server_factory, tmp_path):
    """kill -9 of the background builder's wide git pack-objects (ASPEN_VERSION_PACKS=auto;
    here the import's pack built again wide, the pushes' packs being adopted), held
    by an ASPEN_GIT wrapper until it is killed: the build fails, says so and lets go
    of its locks, the quick pack staying; the next push starts another builder and
    every version has its pack; fetches stay correct throughout and verify is clean."""
    from aspen_cgi.refstore.store import RefStore
    repo = pk.enable_push(root / "repo.git")
    _with_big_blob(repo, tmp_path, 4 << 20)
    hold = tmp_path / "hold"
    hold.mkdir()
    os.mkfifo(hold / "fifo")
    (hold / "arm").write_text("armed\n")
    wrapper = tmp_path / "git-hold-wide"
    wrapper.write_text(HOLD_WIDE_BUILD)
    wrapper.chmod(0o755)
    srv = server_factory(root, ASPEN_VERSION_PACKS="auto", ASPEN_BUILD_WAIT_MS="0", ASPEN_GIT=str(wrapper),
                         HOLD_DIR=str(hold))
    url = f"{srv.url}/repo.git"
    work = local_work(repo, url, tmp_path / "work")
    pk.commit(work, "first")
    pk.push(work, "origin", "HEAD:refs/heads/main")
    pid = F.wait_for(lambda: _held_pid(hold), 60, 0.05)      # the builder waits for a quiet repository first
    assert pid, "no version pack build ran"
    held = [p for p in F.descendants(srv.proc.pid) if p.pid == pid]
    assert held and "pack-objects" in held[0].argv and "--window=250" in held[0].argv, held
    assert F.kill9(pid)
    c = h.git("clone", "-q", url, str(tmp_path / "during"), check=False)
    assert c.returncode == 0, c.stderr.decode()
    h.fsck_strict(str(tmp_path / "during"))
    pk.commit(work, "second")
    pk.push(work, "origin", "HEAD:refs/heads/main")
    store = RefStore.open(Repository.of(str(repo), {}), create=False)
    assert F.wait_for(lambda: (store.sync(), store.all_packs_built())[1], 90, 0.2), "packs never built"
    assert F.wait_for(lambda: not list((repo / "aspen" / "packs").glob("build-*")), 30, 0.1), "scratch left"
    print("FAULTS kill -9 git pack-objects (version-pack build): 1; all packs built by the next push's builder")
    verify_ok(repo)
    check_consistent(repo, url, tmp_path, "mirror")
    assert "building packs" in srv.log_text()      # the failed build said so, once
    assert server_errors(srv) == []


# -- kill -9 of the whole server mid-push ----------------------------------------------------------

def test_kill9_whole_server_mid_push_then_restart(root, server_factory, tmp_path):
    """kill -9 of gunicorn's master and workers while four clients push (with
    big enough pushes to be mid-intake) and one clones; a new server on the
    same root serves at once, with one admission slot per repository (a slot
    held by a dead process would block it): acknowledged pushes are there,
    quarantines of the dead pushes go with the next push, verify is clean."""
    repo = pk.enable_push(root / "repo.git")
    env = {"ASPEN_COLD_PER_REPO": "1", "ASPEN_QUEUE_WAIT": "20", "ASPEN_RUN_DIR": str(tmp_path / "run")}
    srv = server_factory(root, **env)
    url = f"{srv.url}/repo.git"
    h.git("ls-remote", url)
    load = F.Load(url, repo, tmp_path / "clients", pushers=4, cloners=1, fetchers=0, timeout=60)
    load.start()
    big = local_work(repo, url, tmp_path / "big")
    big_commit(big, "big", 64 << 20)
    assert F.wait_for(lambda: load.counts["push acknowledged"] >= 2, 60, 0.05), dict(load.counts)
    bigpush, box = push_in_thread(big, "origin", "HEAD:refs/heads/big")
    # the big push's intake, not a small pusher's (which may end before the kill): it has read over 1 MiB
    assert F.wait_for(lambda: F.git_children(srv.proc.pid, ["unpack-objects"], also=_read_over(1 << 20)), 60), \
        "the big push never began"
    kill9_server(srv)
    load.stop()
    assert load.join(120)
    bigpush.join(60)
    assert load.hung == [] and load.errors == [], (load.hung, load.errors)
    assert box["p"].returncode != 0 and "refs/heads/big" not in h.refs_of(str(repo))
    stale = list((repo / "objects").glob("incoming-*"))
    assert stale, "the push killed in its intake left no quarantine (nothing for the restart to clean)"

    srv2 = server_factory(root, **env)
    url2 = f"{srv2.url}/repo.git"
    pc = F.check_pushes(repo, load.pushes)
    print(f"FAULTS kill -9 whole server: requests {dict(sorted(load.counts.items()))}; "
          f"acknowledged {pc.acknowledged}, lost {len(pc.lost)}, failed but landed {pc.failed_but_landed}")
    assert pc.lost == [] and pc.stray == [], (pc.lost, pc.stray)
    c = h.git("clone", "-q", url2, str(tmp_path / "after"), check=False)
    assert c.returncode == 0, c.stderr.decode()
    for i in range(4):
        work = tmp_path / "clients" / f"push-{i}"
        h.git("remote", "set-url", "origin", url2, cwd=str(work))
        pk.commit(work, f"after the restart {i}")
        pk.push(work, "origin", f"HEAD:refs/heads/fault-{i}")
        assert h.refs_of(str(repo))[f"refs/heads/fault-{i}"] == pk.rev(work, "HEAD")
    no_leftovers(repo)      # the dead pushes' quarantines went with the first push after the restart
    check_consistent(repo, url2, tmp_path, "mirror")
    assert server_errors(srv2) == []


# -- the store locked between the disk write and the version's "done" --------------------------------

REF_TX_HOOK = """#!/bin/sh
# reference-transaction: once git has renamed the refs into place (the first
# time only), another process takes the ref store's write lock for 3 s.
if [ "$1" = committed ] && rm "{arm}" 2>/dev/null; then
    "{python}" "{script}" "{db}" immediate 3 >"{out}" 2>&1 &
    while ! grep -q locked "{out}"; do sleep 0.01; done
fi
"""


@pytest.mark.sqlite_store("another process locks the SQLite file")
def test_store_locked_after_the_refs_are_written(root, server_factory, tmp_path):
    """The store is locked by another process right after git renamed the
    push's refs into place, longer than the push may wait (ASPEN_STORE_WAIT=1):
    the push is on disk and its version in the store, so the client is told
    ok, and the version left pending by this live worker is finished by the
    next request once the lock goes (no manual step, verify clean)."""
    repo = pk.enable_push(root / "repo.git", core_logAllRefUpdates="true")   # refs written by git update-ref
    script = tmp_path / "hold.py"
    script.write_text(F.LOCK_SCRIPT)
    arm, out = tmp_path / "arm", tmp_path / "holder.out"
    arm.write_text("armed\n")
    pk.write_hook(repo, "reference-transaction", REF_TX_HOOK.format(
        arm=arm, python=sys.executable, script=script, db=repo / "aspen" / "aspen.sqlite3", out=out))
    srv = server_factory(root, ASPEN_STORE_WAIT="1")
    url = f"{srv.url}/repo.git"
    h.git("ls-remote", url)
    work = local_work(repo, url, tmp_path / "work")
    tip = pk.commit(work, "locked after the disk write")
    p = pk.push(work, "origin", "HEAD:refs/heads/main", check=False)
    assert not arm.exists(), "the hook did not take the lock"
    assert p.returncode == 0 and "refs/heads/main" in F.told_ok(p.stdout.decode()), p.stderr.decode()
    assert h.refs_of(str(repo))["refs/heads/main"] == tip
    assert F.wait_for(lambda: "released" in out.read_text(), 30, 0.05), out.read_text()
    h.git("ls-remote", url)           # recovery finishes the pending version
    log = versions(repo)
    assert log[-1]["kind"] == "push" and log[-1]["state"] == "done", log[-2:]
    assert [u["new"] for u in log[-1]["updates"]] == [tip]
    tip2 = pk.commit(work, "next")
    pk.push(work, "origin", "HEAD:refs/heads/main")
    assert h.refs_of(str(repo))["refs/heads/main"] == tip2
    check_consistent(repo, url, tmp_path, "mirror")
    assert server_errors(srv) == []
