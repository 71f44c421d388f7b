"""kill -9 of the server at every point of a push, through the real server
(gunicorn) and a real `git push`: after a restart and one request the ref
store equals the disk, nothing is left pending or locked, and the server's
refs are what the client was told.

Fault points (aspen_cgi/refstore/store.py `fault`, tests only), in push order:
after-intake, after-hooks, refs-locked (the ref locks taken, the version not
yet in the store: the locks must not outlive the writer), store-committed (the store has the version, the
disk not yet), disk-written (the disk has it, the version is not marked
done), reported (the report went to the client). The serving worker SIGKILLs
itself there; the test then kill -9s the rest of the server (master and
workers), starts a clean server on the same root and makes one request.

What the client sees depends on the connection: git's libcurl retries a POST
on a fresh connection when a *reused* connection dies before any response
byte, so with keep-alive the push is silently replayed against the respawned
worker; with keep-alive off (`reuse=fresh`) the client sees the crash."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Optional

import pytest

from bench.faults import told_ok

from . import harness as h
from . import pushkit as pk
from .harness import verify_ok, versions
from .pushkit import ZERO

pytestmark = pytest.mark.timeout(120)

POINTS = ["after-intake", "after-hooks", "refs-locked", "store-committed", "disk-written", "reported"]
# From here on the version is in the store: the push must end up applied (roll forward).
ROLL_FORWARD = {"store-committed", "disk-written", "reported"}

REPO_DIR = str(Path(__file__).resolve().parent.parent)
NO_KEEPALIVE = {"GUNICORN_CMD_ARGS": "--keep-alive 0"}


# --- the server process tree ----------------------------------------------------------

def _children(pid: int) -> list[int]:
    """Direct children of PID, read from /proc."""
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rindex(b")") + 2:].split()
        if int(fields[1]) == pid:
            kids.append(int(entry))
    return kids


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for k in _children(todo.pop()):
            out.append(k)
            todo.append(k)
    return out


def kill9_server(server: h.Server) -> None:
    """kill -9 the gunicorn master and everything under it. The harness starts
    gunicorn in the test runner's own process group, so the group cannot be
    signalled: the master is stopped first (so it respawns nothing), then
    every descendant and the master get SIGKILL."""
    master = server.proc.pid
    assert server.proc.poll() is None, "the gunicorn master died on its own"
    os.kill(master, signal.SIGSTOP)
    for pid in _descendants(master):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.kill(master, signal.SIGKILL)
    server.proc.wait(timeout=30)


def wait_out_of_tree(pid: int, master: int, timeout: float = 30) -> None:
    """Wait until PID, started by a worker that has died, is no longer under MASTER."""
    deadline = time.monotonic() + timeout
    while pid in _descendants(master):
        assert time.monotonic() < deadline, f"{pid} is still under the server {timeout} s after its worker died"
        time.sleep(0.01)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    return data[data.rindex(b")") + 2:].split()[0] != b"Z"


# --- the repository side ------------------------------------------------------------

def effective(v: dict) -> dict[str, tuple[str, str]]:
    """The updates of version V that change something (a voided update has new == old)."""
    return {u["ref"]: (u["old"], u["new"]) for u in v["updates"] if u["old"] != u["new"]}


def locks(repo: Path) -> list[str]:
    """git's lock files, and the packed-refs.new it writes under packed-refs.lock;
    pack builders' locks once no live builder holds them are not (a dead
    builder's is taken over by the next: bench.faults.builders_settled)."""
    from bench.faults import builders_settled
    dead = set(builders_settled(repo))
    found = [p for p in [repo / "packed-refs.new"] if p.exists()]
    for dirpath, _, filenames in os.walk(repo):      # a builder's scratch directory may go while we look
        found += [Path(dirpath) / f for f in filenames if f.endswith(".lock")]
    return sorted(x for x in (str(p.relative_to(repo)) for p in found) if x not in dead)


BUILDER_LOCKS = {"aspen/packs/.build.lock", "aspen/packs/.segments.lock"}


def start(server_factory, root: Path, tmp_path: Path, point: Optional[str], **env: str) -> h.Server:
    if point is not None:
        once = tmp_path / f"fault-once-{point}"
        once.write_text("armed\n")
        env.update(ASPEN_FAULT=point, ASPEN_FAULT_ONCE=str(once))
    return server_factory(root, **env)


def recovered_server(server_factory, root: Path) -> h.Server:
    """A clean server on the same root, and one request so that recovery runs."""
    srv = server_factory(root)
    h.git("ls-remote", f"{srv.url}/repo.git")
    return srv


def check_consistent(repo: Path, url: str, tmp_path: Path, name: str) -> None:
    """aspen verify, git fsck --strict, no lock left, and a fresh strict mirror clone equal to the server."""
    verify_ok(repo)
    h.fsck_strict(str(repo))
    deadline = time.monotonic() + 60
    while locks(repo) and set(locks(repo)) <= BUILDER_LOCKS and time.monotonic() < deadline:
        time.sleep(0.1)          # a pack build the last push started (or compaction) still runs: its locks go with it
    left = locks(repo)
    assert left == [], f"lock files left behind: {left}"
    mirror = tmp_path / name
    h.git("-c", "transfer.fsckObjects=true", "clone", "-q", "--mirror", url, str(mirror))
    h.fsck_strict(str(mirror))
    assert h.refs_of(str(mirror)) == h.refs_of(str(repo))


def check_outcome(repo: Path, before: dict[str, str], targets: list[str], new: str, must_apply: bool,
                  log_before: int, what: str) -> bool:
    """The refs TARGETS hold all the new value or all their old values (all of
    it when MUST_APPLY); the store has exactly one complete push version for
    it, or none (a version recovery voided, every update old == new, changes
    nothing and counts as none). Returns whether the push was applied."""
    after = h.refs_of(str(repo))
    olds = {t: before.get(t, ZERO) for t in targets}
    now = {t: after.get(t, ZERO) for t in targets}
    applied = all(v == new for v in now.values())
    assert applied or now == olds, f"{what}: refs are neither all new ({new}) nor all old: {now} (old {olds})"
    if must_apply:
        assert applied, f"{what}: the push must be applied, refs are {now}"
    others = {r: v for r, v in after.items() if r not in targets}
    assert others == {r: v for r, v in before.items() if r not in targets}, f"{what}: other refs changed"
    pushes = [v for v in versions(repo) if v["id"] > log_before and effective(v)]
    assert all(v["kind"] == "push" and v["state"] == "done" for v in pushes), \
        f"{what}: versions after the crash: {json.dumps(pushes, indent=1)}"
    if applied:
        assert [effective(v) for v in pushes] == [{t: (olds[t], new) for t in targets}], \
            f"{what}: expected exactly one complete version, the log has {pushes}"
    else:
        assert pushes == [], f"{what}: a push that did not land left versions: {pushes}"
    return applied


def second_push(work: Path, url: str, ref: str) -> str:
    """Fetch what the server at URL has, build on it and push to REF again: it must just work."""
    h.git("remote", "set-url", "origin", url, cwd=str(work))
    h.git("fetch", "-q", "origin", cwd=str(work))
    h.git("reset", "-q", "--hard", "origin/main", cwd=str(work))
    tip = pk.commit(work, "after the crash")
    pk.push(work, "origin", f"HEAD:{ref}")
    return tip


# (atomic, connection, repository config): a bare repository logs no ref updates, so Aspen may write
# the refs itself; with reflogs on they go through `git update-ref`.
SHAPES = [(False, "keepalive", "plain"), (False, "fresh", "plain"), (True, "keepalive", "plain"),
          (True, "fresh", "plain"), (False, "fresh", "reflogs"), (True, "keepalive", "reflogs")]


@pytest.mark.parametrize("atomic,reuse,config", SHAPES,
                         ids=["-".join(("atomic" if a else "single", r, c)) for a, r, c in SHAPES])
@pytest.mark.parametrize("point", POINTS)
def test_kill9_at_fault_point(root, server_factory, tmp_path, point, atomic, reuse, config):
    """kill -9 at POINT during a real push; restart; the push is whole or absent, never half."""
    repo = pk.enable_push(root / "repo.git", **({"core_logAllRefUpdates": "true"} if config == "reflogs" else {}))
    before = h.refs_of(str(repo))
    log_before = max(v["id"] for v in versions(repo))
    srv = start(server_factory, root, tmp_path, point, **(NO_KEEPALIVE if reuse == "fresh" else {}))
    work = pk.clone(f"{srv.url}/repo.git", tmp_path / "work")
    new = pk.commit(work, f"crash at {point}")
    if atomic:   # a fast-forward, a forced update and a creation, all or nothing
        targets = ["refs/heads/main", "refs/heads/topic", "refs/heads/fresh"]
        p = pk.push(work, "--atomic", "origin", "HEAD:refs/heads/main", "+HEAD:refs/heads/topic",
                    "HEAD:refs/heads/fresh", check=False)
    else:
        targets = ["refs/heads/main"]
        p = pk.push(work, "origin", "HEAD:refs/heads/main", check=False)
    out, err = p.stdout.decode(), p.stderr.decode()
    seen = f"client exit {p.returncode}\nstdout:\n{out}\nstderr:\n{err}\nserver log:\n{srv.log_text()}"
    assert not (tmp_path / f"fault-once-{point}").exists(), f"the fault {point} did not fire\n{seen}"
    acked = told_ok(out)
    assert acked in (set(), set(targets)), f"an atomic push was half acknowledged\n{seen}"
    if p.returncode == 0:
        assert acked == set(targets), seen
    if reuse == "fresh":
        # no replay: the client saw the crash, and was never told "ok"
        assert p.returncode != 0 and not acked, seen
        assert re.search(r"RPC failed|unexpected disconnect|remote end hung up", err), seen
    kill9_server(srv)

    srv2 = recovered_server(server_factory, root)
    applied = check_outcome(repo, before, targets, new, bool(acked) or point in ROLL_FORWARD, log_before,
                            f"{point}\n{seen}")
    if reuse == "fresh" and point not in ROLL_FORWARD:
        assert not applied, f"{point}: died before the store had the version, yet the push landed\n{seen}"
    first = next((l for l in err.splitlines() if "error" in l or "rejected" in l or "fatal" in l), "")
    print(f"OUTCOME {point} exit={p.returncode} acked={sorted(acked)} applied={applied} client: {first}")
    check_consistent(repo, f"{srv2.url}/repo.git", tmp_path, "mirror")
    # nothing is left locked: the same ref takes the next push
    tip = second_push(work, f"{srv2.url}/repo.git", "refs/heads/main")
    assert h.refs_of(str(repo))["refs/heads/main"] == tip
    check_consistent(repo, f"{srv2.url}/repo.git", tmp_path, "mirror2")


# --- a stale lock: git update-ref killed along with the worker ------------------------------

WRAPPER = r"""#!/bin/sh
# ASPEN_GIT for one test: the first `git update-ref` (armed by $STALE_ARM) is
# fed through a FIFO this script keeps open, so when the worker dies git does
# not see its input end and keeps holding its lock files -- until the test
# kill -9s it, as a kill of the whole process group or cgroup would.
if [ "$1" = update-ref ] && rm "$STALE_ARM" 2>/dev/null; then
    fifo="$STALE_DIR/update-ref.fifo"
    mkfifo "$fifo"
    git "$@" <"$fifo" &
    echo $! >"$STALE_DIR/git.pid"
    echo $$ >"$STALE_DIR/wrapper.pid"
    exec 3>"$fifo"
    cat >&3
    exec sleep 600
fi
exec git "$@"
"""


@pytest.mark.parametrize("change", ["update", "delete"])
def test_kill9_with_stale_lock_needs_no_manual_steps(root, server_factory, tmp_path, change):
    """kill -9 at store-committed of the worker AND of its `git update-ref`
    (as a kill of the process group or cgroup does): git's lock files stay on
    disk -- the ref's, HEAD's when HEAD names the updated branch, packed-refs'
    when a packed ref is deleted. After a restart and one request the push is
    rolled forward, no lock is left, and the refs take the next pushes (an
    update of the same ref, a deletion of a packed ref): no manual clean-up."""
    # reflogs on: the refs are written by `git update-ref`, which this test kills with the worker
    repo = pk.enable_push(root / "repo.git", core_logAllRefUpdates="true")
    before = h.refs_of(str(repo))
    log_before = max(v["id"] for v in versions(repo))
    stale = tmp_path / "stale"
    stale.mkdir()
    wrapper = tmp_path / "git-wrapper"
    wrapper.write_text(WRAPPER)
    wrapper.chmod(0o755)
    (stale / "arm").write_text("armed\n")
    srv = start(server_factory, root, tmp_path, "store-committed", ASPEN_GIT=str(wrapper),
                STALE_ARM=str(stale / "arm"), STALE_DIR=str(stale), **NO_KEEPALIVE)
    work = pk.clone(f"{srv.url}/repo.git", tmp_path / "work")
    # no background work left in the server: another worker's builder opening the store would
    # roll the push forward (and drop the locks) before the test has looked at them
    h.wait_builder_done(repo)
    if change == "update":
        ref, new = "refs/heads/main", pk.commit(work, "crash with the lock held")
        held = ["HEAD.lock", "refs/heads/main.lock"]      # HEAD names main: git locks both
        p = pk.push(work, "origin", f"HEAD:{ref}", check=False)
    else:
        assert "refs/heads/topic" in (repo / "packed-refs").read_text()
        ref, new = "refs/heads/topic", ZERO
        held = ["packed-refs.lock", "packed-refs.new", "refs/heads/topic.lock"]
        p = pk.push(work, "origin", f":{ref}", check=False)
    seen = f"client exit {p.returncode}\n{p.stdout.decode()}\n{p.stderr.decode()}\n{srv.log_text()}"
    assert p.returncode != 0 and not told_ok(p.stdout.decode()), seen
    assert not (tmp_path / "fault-once-store-committed").exists(), f"the fault did not fire\n{seen}"
    assert not (stale / "arm").exists(), f"the push did not go through `git update-ref`\n{seen}"
    git_pid = int((stale / "git.pid").read_text())
    wrapper_pid = int((stale / "wrapper.pid").read_text())
    # the client sees the worker's socket close before the kernel has handed the worker's
    # children to init: killing the server's tree meanwhile would kill the wrapper too
    wait_out_of_tree(wrapper_pid, srv.proc.pid)
    kill9_server(srv)
    try:
        assert _alive(git_pid), "git update-ref should still hold its locks"
    finally:
        for pid in (git_pid, wrapper_pid):
            os.kill(pid, signal.SIGKILL)
    assert locks(repo) == held, "kill -9 of git update-ref leaves its locks behind"
    if new != ZERO:
        assert (repo / "refs" / "heads" / "main.lock").read_text().strip() == new

    srv2 = recovered_server(server_factory, root)
    url = f"{srv2.url}/repo.git"
    check_outcome(repo, before, [ref], new, True, log_before, f"stale lock\n{seen}")
    check_consistent(repo, url, tmp_path, "mirror")
    # the next pushes need no manual step: the same ref again, and a deletion of a packed ref
    tip = second_push(work, url, ref)
    pk.push(work, "origin", ":refs/tags/light")
    refs = h.refs_of(str(repo))
    assert refs[ref] == tip and "refs/tags/light" not in refs
    check_consistent(repo, url, tmp_path, "mirror2")
