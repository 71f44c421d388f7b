"""kill -9 of the server at every point of a push, through the real server
(gunicorn) and a real `git push`: after a restart and one request the ref
store equals the disk, nothing is left pending or locked, and the server's
refs are what the client was told.

Fault points (aspen_cgi/refstore/store.py `fault`, tests only), in push order:
after-intake, after-hooks, store-committed (the store has the version, the
disk not yet), disk-written (the disk has it, the version is not marked done),
reported (the report went to the client)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from . import harness as h
from . import pushkit as pk
from .pushkit import ZERO

pytestmark = pytest.mark.timeout(120)

POINTS = ["after-intake", "after-hooks", "store-committed", "disk-written", "reported"]
# Where the push is (or must be rolled) forward after the crash; elsewhere either outcome is allowed
# unless the client was told "ok".
ROLL_FORWARD = {"store-committed", "disk-written", "reported"}
NEVER_APPLIED = {"after-intake", "after-hooks"}


# --- the server process tree ----------------------------------------------------------

def _children(pid: int) -> list[int]:
    """Direct children of PID, read from /proc (no psutil)."""
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
    signalled; the master is stopped first (it cannot respawn workers), then
    every descendant and the master get SIGKILL."""
    master = server.proc.pid
    os.kill(master, signal.SIGSTOP)
    for pid in _descendants(master):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.kill(master, signal.SIGKILL)
    server.proc.wait(timeout=30)


# --- the repository side ------------------------------------------------------------

def aspen_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aspen_cgi.cli", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=120, cwd=str(Path(__file__).resolve().parent.parent))


def verify_ok(repo: Path) -> None:
    p = aspen_cli("verify", "-q", str(repo))
    assert p.returncode == 0, f"aspen verify failed:\n{p.stdout.decode()}{p.stderr.decode()}"


def versions(repo: Path) -> list[dict]:
    p = aspen_cli("log", "--json", str(repo))
    assert p.returncode == 0, p.stderr.decode()
    return [json.loads(line) for line in p.stdout.decode().splitlines() if line.strip()]


def locks(repo: Path) -> list[str]:
    return sorted(str(p.relative_to(repo)) for p in repo.rglob("*.lock"))


def ok_refs(porcelain: str) -> set[str]:
    """Refs the client was told were updated (`git push --porcelain` status lines)."""
    out = set()
    for line in porcelain.splitlines():
        parts = line.split("\t")
        if len(parts) >= 2 and parts[0] in (" ", "+", "-", "*") and ":" in parts[1]:
            out.add(parts[1].split(":", 1)[1])
    return out


def setup_repo(root: Path) -> Path:
    return pk.enable_push(root / "repo.git")


def start(server_factory, root: Path, point: Optional[str], tmp_path: Path) -> h.Server:
    if point is None:
        return server_factory(root)
    once = tmp_path / f"fault-once-{point}"
    once.write_text("armed\n")
    return server_factory(root, ASPEN_FAULT=point, ASPEN_FAULT_ONCE=str(once))


@pytest.mark.parametrize("atomic", [False, True], ids=["single", "atomic"])
@pytest.mark.parametrize("point", POINTS)
def test_kill9_at_fault_point(root, server_factory, tmp_path, point, atomic):
    repo = setup_repo(root)
    before = h.refs_of(str(repo))
    srv = start(server_factory, root, point, tmp_path)
    work = pk.clone(f"{srv.url}/repo.git", tmp_path / "work")
    new = pk.commit(work, f"crash at {point}")
    targets = ["refs/heads/main"] + (["refs/heads/topic", "refs/heads/fresh"] if atomic else [])
    specs = [f"HEAD:{t}" for t in targets]
    if atomic:
        specs[1] = "+" + specs[1]
    p = pk.push(work, *(["--atomic"] if atomic else []), "origin", *specs, check=False)
    told_ok = ok_refs(p.stdout.decode())
    print(point, atomic, p.returncode, p.stdout.decode(), p.stderr.decode(), sep="\n")
    import time; t=time.time()
    kill9_server(srv)
    print("kill", time.time()-t); t=time.time()
    print(locks(repo))
    srv2 = server_factory(root)
    h.git("ls-remote", f"{srv2.url}/repo.git")
    print("restart", time.time()-t); t=time.time()
    print(versions(repo))
    verify_ok(repo)
    print("verify", time.time()-t); t=time.time()
    h.fsck_strict(str(repo))
    after = h.refs_of(str(repo))
    assert 0
