"""The in-process ref writer's lock claims (refstore/reflocks.py): a writer
killed with its locks taken leaves nothing the next request cannot remove,
and a side name left before its claim blocks no ref."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from aspen_cgi.refstore import reflocks
from aspen_cgi.refstore.store import RefStore
from aspen_cgi.runtime.repository import Repository

from . import harness as h


def _killed_writer(repo: Path, old: str, new: str) -> subprocess.CompletedProcess:
    """A process that takes refs/heads/main's lock through a Claim, says so, and is killed -9."""
    script = f"""
import os, sys
from aspen_cgi.refstore import diskrefs, reflocks
from aspen_cgi.model.versions import RefChange
w = diskrefs.LooseWrite({str(repo)!r})
ok = w.prepare([RefChange("refs/heads/main", {old!r}, {new!r}, True, "commit", None)],
               reflocks.Claim({str(repo / "aspen")!r}))
print(ok, flush=True)
os.kill(os.getpid(), 9)
"""
    return subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          cwd=str(Path(__file__).resolve().parent.parent))


def test_a_writer_killed_holding_its_lock_leaves_none_behind(tmp_path):
    repo = h.make_history(tmp_path / "repo.git")
    store = RefStore.open(Repository.of(str(repo), dict(os.environ)))
    store.sync()
    old, new = h.out("rev-parse", "main", cwd=str(repo)), h.out("rev-parse", "main~1", cwd=str(repo))
    p = _killed_writer(repo, old, new)
    assert p.returncode == -signal.SIGKILL and p.stdout.strip() == b"True", p.stderr
    lock = repo / "refs" / "heads" / "main.lock"
    assert lock.exists()
    assert not [f for f in (repo / "refs" / "heads").iterdir() if ".aspen-" in f.name]
    again = RefStore.open(Repository.of(str(repo), dict(os.environ)))
    again.sync()                      # sweeps the dead writer's claim
    assert not lock.exists()
    h.git("update-ref", "refs/heads/main", new, old, cwd=str(repo))
    assert h.out("rev-parse", "main", cwd=str(repo)) == new


def test_a_side_name_left_before_its_claim_blocks_no_ref(tmp_path):
    repo = h.make_history(tmp_path / "repo.git")
    side = repo / "refs" / "heads" / "main.aspen-1-2.lock"
    side.write_text(h.out("rev-parse", "main~1", cwd=str(repo)) + "\n")
    assert "refs/heads/main.aspen-1-2" not in h.refs_of(str(repo))
    old, new = h.out("rev-parse", "main", cwd=str(repo)), h.out("rev-parse", "main~1", cwd=str(repo))
    h.git("update-ref", "refs/heads/main", new, old, cwd=str(repo))
    h.fsck_strict(str(repo))


def test_a_writer_killed_with_its_side_name_made_leaves_nothing_behind(tmp_path):
    """Killed after making its side name and before claiming the lock's
    inode: the side name was claimed before it was made, so the next sweep
    removes it."""
    repo = h.make_history(tmp_path / "repo.git")
    RefStore.open(Repository.of(str(repo), dict(os.environ))).sync()
    script = f"""
import os
from aspen_cgi.refstore import reflocks
claim = reflocks.Claim({str(repo / "aspen")!r})
side = claim.side_name({str(repo / "refs" / "heads" / "main")!r})
assert claim.add_side(side)
open(side, "w").write("x\\n")
print(side, flush=True)
os.kill(os.getpid(), 9)
"""
    p = subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       cwd=str(Path(__file__).resolve().parent.parent))
    side = Path(p.stdout.decode().strip())
    assert p.returncode == -signal.SIGKILL and side.exists() and ".aspen-" in side.name, p.stderr
    RefStore.open(Repository.of(str(repo), dict(os.environ))).sync()          # sweeps the dead writer's claim
    assert not side.exists()
    assert not [f for f in (repo / "refs" / "heads").iterdir() if ".aspen-" in f.name]


def test_a_claim_line_cut_short_by_a_kill_removes_no_ref(tmp_path):
    """A dead writer's claim whose last line a kill cut short (naming the
    ref itself, not its side name) makes the sweep remove nothing of it;
    its whole lines are swept."""
    repo = h.make_history(tmp_path / "repo.git")
    RefStore.open(Repository.of(str(repo), dict(os.environ))).sync()
    ref = repo / "refs" / "heads" / "main"
    ref.write_text(h.out("rev-parse", "main", cwd=str(repo)) + "\n")        # loose, as git writes it
    side = repo / "refs" / "heads" / "other.aspen-1-2-3.lock"
    side.write_text("x\n")
    claims = repo / "aspen" / reflocks.DIR
    claims.mkdir(exist_ok=True)
    (claims / f"{socket.gethostname()}:1:1+7").write_text(f"- {side}\n- {ref}")      # pid 1 never started at 1
    assert reflocks.sweep(str(repo / "aspen")) == [str(side)]
    assert ref.exists() and not side.exists()
