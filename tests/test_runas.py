"""Operators' commands run as root act as the repository's owner: `aspen
import`, `undo`, `restore`, `compact`, `verify` and `log` leave no file the
server's user cannot write, and the pre-warmer an import starts runs as that
user too. A repository whose state directory the server cannot write is said
in the server's log on each request (it is served from disk, as stock
serves it)."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

import pytest

from . import harness as h
from .deploy_apache import world_dir

pytestmark = pytest.mark.timeout(300)

ASPEN = str(Path(sys.executable).parent / "aspen")
NOBODY = pwd.getpwnam("nobody")
# root's git reads nobody's repositories
TRUST = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*"}


def need_root() -> None:
    if os.geteuid() == 0:
        return
    if os.environ.get("CI") == "true":
        pytest.fail("acting as another user needs root: CI runs the suite as root")
    pytest.skip("acting as another user needs root")


def aspen(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([ASPEN, *args], capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, **(env or {})), cwd="/root" if os.path.isdir("/root") else "/")


def nobodys_repo(tmp_path: Path) -> Path:
    repo = h.make_history(world_dir(tmp_path) / "repo.git", commits=6)
    subprocess.run(["chown", "-R", f"{NOBODY.pw_uid}:{NOBODY.pw_gid}", str(repo)], check=True)
    return repo


def refs(repo: Path) -> str:
    return h.out("for-each-ref", "--format=%(refname)", cwd=str(repo), env=TRUST)


def strangers(root: Path) -> list[str]:
    """Every path under ROOT not owned by nobody."""
    found = []
    for d, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            p = os.path.join(d, name)
            if os.lstat(p).st_uid != NOBODY.pw_uid:
                found.append(p)
    return found


def prewarmers(repo: Path) -> list[int]:
    """The owners of the pre-warm processes (aspen_cgi.fetch.prewarm) naming REPO."""
    return [uid for _, uid, cmd in h.processes()
            if b"aspen_cgi.fetch.prewarm" in cmd and str(repo).encode() in cmd.replace(b"\0", b" ")]


def test_import_as_root_leaves_everything_to_the_owner(tmp_path):
    need_root()
    repo = nobodys_repo(tmp_path)
    res = aspen("import", "-q", str(repo))
    assert res.returncode == 0, res.stderr
    assert f"aspen import: acting as nobody, the owner of {repo}" in res.stderr
    seen_uids: set[int] = set()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:         # the detached pre-warmer the import started
        uids = prewarmers(repo)
        seen_uids.update(uids)
        if not uids and (repo / "aspen" / "cache").exists():
            break
        time.sleep(0.1)
    assert (repo / "aspen" / "cache").exists(), "the import's pre-warm made the response cache"
    assert seen_uids <= {NOBODY.pw_uid}
    assert (repo / "aspen").stat().st_uid == NOBODY.pw_uid
    assert strangers(repo) == []


def test_every_repository_command_as_root_acts_as_the_owner(tmp_path):
    need_root()
    repo = nobodys_repo(tmp_path)
    env = {"ASPEN_PREWARM": "off"}
    assert aspen("import", "-q", str(repo), env=env).returncode == 0
    h.git("--git-dir", str(repo), "update-ref", "refs/heads/extra", "refs/heads/main")
    subprocess.run(["chown", "-R", f"{NOBODY.pw_uid}:{NOBODY.pw_gid}", str(repo)], check=True)
    for args in (["log", str(repo)], ["verify", "-q", str(repo)], ["compact", str(repo)],
                 ["stats", str(repo)]):
        res = aspen(*args, env=env)
        assert res.returncode == 0, (args, res.stderr)
        assert "acting as nobody" in res.stderr, args
        assert strangers(repo) == [], args
    versions = [json.loads(line) for line in aspen("log", "--json", str(repo)).stdout.splitlines()]
    last = versions[0]["id"]
    res = aspen("undo", str(repo), str(last), env=env)
    assert res.returncode == 0, res.stderr
    assert "refs/heads/extra" not in refs(repo)
    res = aspen("restore", str(repo), "refs/heads/extra", "--at", str(last), env=env)
    assert res.returncode == 0, res.stderr
    assert "refs/heads/extra" in refs(repo)
    assert strangers(repo) == []


def test_an_owner_who_cannot_reach_the_repository_is_told_so(tmp_path):
    need_root()
    repo = nobodys_repo(tmp_path)
    os.chmod(tmp_path, 0o700)
    res = aspen("log", str(repo))
    assert res.returncode == 1
    assert f"nobody cannot reach {repo}: a directory above it is closed" in res.stderr
    assert not (repo / "aspen").exists()


def test_repositories_of_different_owners_are_refused_together(tmp_path):
    need_root()
    theirs = nobodys_repo(tmp_path / "a")
    ours = h.make_history(tmp_path / "b" / "repo.git", commits=2)
    res = aspen("stats", str(theirs), str(ours))
    assert res.returncode == 1
    assert "belong to different users" in res.stderr and "Traceback" not in res.stderr
    assert not (ours / "aspen").exists() and not (theirs / "aspen").exists()


def test_root_owned_repositories_are_left_to_root(tmp_path):
    repo = h.make_history(tmp_path / "repo.git", commits=2)
    res = aspen("log", str(repo))
    assert res.returncode == 0 and "acting as" not in res.stderr
    assert (repo / "aspen").stat().st_uid == os.geteuid()


PROBE = """
import sys
from aspen_cgi.refstore import snapshots
from aspen_cgi.runtime.repository import Repository
log = []
store = snapshots.open_store(Repository.of(sys.argv[1], {"GIT_DIR": sys.argv[1]}), log)
print(store is None)
print("".join(log), end="")
"""


def test_a_state_directory_the_server_cannot_write_is_said_in_the_log(tmp_path):
    need_root()
    repo = h.make_history(world_dir(tmp_path) / "repo.git", commits=2)
    assert aspen("log", str(repo)).returncode == 0          # root's aspen/, as a root command once left it
    os.chmod(repo, 0o755)

    def drop() -> None:
        os.setgid(NOBODY.pw_gid)
        os.setuid(NOBODY.pw_uid)
    res = subprocess.run([sys.executable, "-c", PROBE, str(repo)], capture_output=True, text=True, timeout=60,
                         preexec_fn=drop, cwd="/", env=dict(os.environ, HOME="/"))
    assert res.returncode == 0, res.stderr
    none, line = res.stdout.split("\n", 1)
    assert none == "True"
    assert line.startswith(f"aspen: the ref store cannot be kept in {repo}/aspen ("), line
    assert "serving refs from disk" in line
