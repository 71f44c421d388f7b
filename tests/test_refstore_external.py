"""Ref changes made outside Aspen -- a push through stock git-http-backend,
`git update-ref`, `pack-refs`, `gc`, `symbolic-ref` -- are noticed at the
next request through the real server (gunicorn): Aspen advertises exactly
what stock advertises for the same repository (v0 info/refs, v2 ls-refs, dumb
info/refs), records real changes as `external` versions, and `aspen verify`
passes. Also: a repository whose store cannot be kept is served from disk,
and ASPEN_STATE_DIR moves the store out of the repository."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import pytest

from aspen_cgi import settings
from aspen_cgi.refstore import fingerprint
from aspen_cgi.refstore.store import RefStore, state_dir
from aspen_cgi.runtime.repository import Repository

from . import differential as d
from . import harness as h
from . import pushkit as pk
from .pushkit import ZERO

pytestmark = pytest.mark.timeout(180)

ASPEN = str(Path(sys.executable).parent / "aspen")


# ---------------------------------------------------------------- helpers

def aspen_cli(*args: str, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([ASPEN, *args], capture_output=True, env=e, timeout=120)


def http(url: str, body: Optional[bytes] = None, headers: Optional[dict] = None) -> bytes:
    req = urllib.request.Request(url, data=body, headers=headers or {})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200
        return resp.read()


def v0_advert(base: str, repo: str = "repo.git") -> tuple[list[str], list[str]]:
    """(ref lines "oid name", symref capabilities) of the smart v0 upload-pack advertisement."""
    body = http(f"{base}/{repo}/info/refs?service=git-upload-pack")
    lines = [t[1].decode() for t in d.tokens(body) if t[0] == "pkt"]
    assert lines[0] == "# service=git-upload-pack\n"
    refs, symrefs = [], []
    for i, line in enumerate(lines[1:]):
        line = line.rstrip("\n")
        if i == 0 and "\0" in line:
            line, caps = line.split("\0", 1)
            symrefs = [c for c in caps.split() if c.startswith("symref=")]
        refs.append(line)
    return refs, symrefs


def v2_ls_refs(base: str, repo: str = "repo.git") -> list[str]:
    body = d.v2_request("ls-refs", caps=["object-format=sha1"], args=["symrefs", "peel", "unborn"])
    out = http(f"{base}/{repo}/git-upload-pack", body,
               {"Content-Type": "application/x-git-upload-pack-request", "Git-Protocol": "version=2"})
    return [t[1].decode().rstrip("\n") for t in d.tokens(out) if t[0] == "pkt"]


def dumb_info_refs(base: str, repo: str = "repo.git") -> bytes:
    return http(f"{base}/{repo}/info/refs")


def ls_remote(base: str, repo: str = "repo.git") -> dict[str, str]:
    text = h.out("ls-remote", f"{base}/{repo}")
    return {name: oid for oid, name in (line.split("\t") for line in text.splitlines())}


@dataclass
class Pair:
    root: Path
    repo: Path
    aspen: str          # gunicorn base URL
    stock: str          # stock git-http-backend (CGI) base URL

    @property
    def store_path(self) -> Path:
        return self.repo / "aspen" / "aspen.sqlite3"

    def versions(self) -> list[tuple[int, str, list[tuple[str, str, str, bool]]]]:
        """The store's versions read straight from its tables (no sync, unlike the CLI)."""
        out = []
        for vid, kind in h.store_rows(self.repo, "SELECT id, kind FROM versions ORDER BY id"):
            ups = [(r, o, n, bool(f)) for r, o, n, f in
                   h.store_rows(self.repo, "SELECT ref, old, new, ff FROM updates WHERE version = ? ORDER BY ref",
                                (vid,))]
            out.append((vid, kind, ups))
        return out

    def rev(self, what: str) -> str:
        return h.out("rev-parse", what, cwd=str(self.repo))

    def assert_same_as_stock(self) -> None:
        """Aspen advertises what stock advertises, both equal git's view of the
        disk, and `aspen verify` passes."""
        a0, s0 = v0_advert(self.aspen), v0_advert(self.stock)
        assert a0 == s0
        assert v2_ls_refs(self.aspen) == v2_ls_refs(self.stock)
        assert dumb_info_refs(self.aspen) == dumb_info_refs(self.stock)
        disk = h.refs_of(str(self.repo))
        advertised = {name: oid for oid, name in (line.split(" ", 1) for line in a0[0])
                      if name != "HEAD" and not name.endswith("^{}") and name != "capabilities^{}"}
        assert advertised == disk
        res = aspen_cli("verify", str(self.repo))
        assert res.returncode == 0, res.stdout.decode() + res.stderr.decode()
        assert b"consistent" in res.stdout and b"NOT" not in res.stdout


@pytest.fixture
def pair(root, server_factory, cgi_server_factory) -> Pair:
    repo = pk.enable_push(root / "repo.git")
    p = Pair(root, repo, server_factory(root).url, cgi_server_factory(root).url)
    p.assert_same_as_stock()                          # the first request imports
    assert [v[:2] for v in p.versions()] == [(1, "import")]
    return p


def the_new_versions(p: Pair, after: int) -> list[tuple[int, str, list]]:
    return [v for v in p.versions() if v[0] > after]


# ---------------------------------------------------------------- a push through stock

def test_push_through_stock_is_an_external_version(pair, tmp_path):
    p = pair
    work = pk.clone(f"{p.stock}/repo.git", tmp_path / "work")
    old_main = p.rev("main")
    new_main = pk.commit(work, "through stock")
    h.git("branch", "from-stock", "HEAD~1", cwd=str(work))
    pk.push(work, "origin", "main", "from-stock")
    assert p.rev("main") == new_main
    assert [v[0] for v in p.versions()] == [1]        # nothing asked Aspen yet
    # the next request through Aspen sees the new values ...
    seen = ls_remote(p.aspen)
    assert seen["refs/heads/main"] == new_main and seen["refs/heads/from-stock"] == old_main
    # ... and recorded them as one external version (fast-forward not proved for outside changes)
    assert the_new_versions(p, 1) == [(2, "external", [("refs/heads/from-stock", ZERO, old_main, False),
                                                        ("refs/heads/main", old_main, new_main, False)])]
    res = aspen_cli("log", str(p.repo), "--json")
    assert res.returncode == 0, res.stderr
    newest = json.loads(res.stdout.splitlines()[0])
    assert (newest["id"], newest["kind"], newest["who"]) == (2, "external", None)
    assert {u["ref"]: u["new"] for u in newest["updates"]} == {"refs/heads/main": new_main,
                                                              "refs/heads/from-stock": old_main}
    p.assert_same_as_stock()
    # and a clone through Aspen gets the commit pushed through stock
    clone = pk.clone(f"{p.aspen}/repo.git", tmp_path / "clone", fsck=True)
    assert pk.rev(clone, "origin/main") == new_main
    h.fsck_strict(str(clone))


def test_push_through_aspen_after_an_external_change(pair, tmp_path):
    """The store is in step after an outside change: Aspen's own push (CAS on the
    value stock wrote) lands as a push version on top of the external one."""
    p = pair
    work = pk.clone(f"{p.stock}/repo.git", tmp_path / "work")
    pk.commit(work, "through stock")
    pk.push(work, "origin", "main")
    mid = p.rev("main")
    h.git("remote", "set-url", "origin", f"{p.aspen}/repo.git", cwd=str(work))
    top = pk.commit(work, "through aspen")
    pk.push(work, "origin", "main")
    assert p.rev("main") == top
    assert [(v[0], v[1]) for v in p.versions()] == [(1, "import"), (2, "external"), (3, "push")]
    assert p.versions()[2][2] == [("refs/heads/main", mid, top, True)]
    p.assert_same_as_stock()


# ---------------------------------------------------------------- changes made with git on the server

# Each change returns the updates of the external version the next request must
# record, or None when it must record none.

def change_update_ref(p: Pair) -> Optional[list]:
    topic = p.rev("topic")
    h.git("update-ref", "refs/heads/direct", "topic", cwd=str(p.repo))
    return [("refs/heads/direct", ZERO, topic, False)]


def change_move_ref(p: Pair) -> Optional[list]:
    main, topic = p.rev("main"), p.rev("topic")
    h.git("update-ref", "refs/heads/main", "topic", cwd=str(p.repo))
    return [("refs/heads/main", main, topic, False)]


def change_delete_ref(p: Pair) -> Optional[list]:
    topic = p.rev("topic")
    h.git("update-ref", "-d", "refs/heads/topic", cwd=str(p.repo))
    return [("refs/heads/topic", topic, ZERO, False)]


def change_delete_packed_ref(p: Pair) -> Optional[list]:
    light = p.rev("refs/tags/light")
    h.git("pack-refs", "--all", cwd=str(p.repo))
    assert not (p.repo / "refs" / "tags" / "light").exists()
    h.git("update-ref", "-d", "refs/tags/light", cwd=str(p.repo))
    return [("refs/tags/light", light, ZERO, False)]


def change_pack_refs(p: Pair) -> Optional[list]:
    h.git("pack-refs", "--all", cwd=str(p.repo))
    assert (p.repo / "packed-refs").is_file() and not (p.repo / "refs" / "heads" / "main").exists()
    return None         # the same values in another file: no version


def change_gc(p: Pair) -> Optional[list]:
    h.git("gc", "--quiet", "--prune=now", cwd=str(p.repo))
    assert not (p.repo / "refs" / "heads" / "main").exists()
    return None


def change_head(p: Pair) -> Optional[list]:
    h.git("symbolic-ref", "HEAD", "refs/heads/topic", cwd=str(p.repo))
    return None         # HEAD is read from its file for every advertisement, not versioned


def change_symref_under_refs(p: Pair) -> Optional[list]:
    h.git("symbolic-ref", "refs/heads/alias", "refs/heads/topic", cwd=str(p.repo))
    return []           # a symbolic ref is kept in the store's refs but has no value of its own: a version, no update


def change_annotated_tag(p: Pair) -> Optional[list]:
    h.git("tag", "-a", "-m", "made on the server", "server-tag", "topic", cwd=str(p.repo))
    return [("refs/tags/server-tag", ZERO, p.rev("refs/tags/server-tag"), False)]


CHANGES = {
    "update-ref": change_update_ref,
    "update-ref-move": change_move_ref,
    "update-ref-delete": change_delete_ref,
    "update-ref-delete-packed": change_delete_packed_ref,
    "pack-refs": change_pack_refs,
    "gc": change_gc,
    "symbolic-ref-HEAD": change_head,
    "symbolic-ref-under-refs": change_symref_under_refs,
    "annotated-tag": change_annotated_tag,
}


@pytest.mark.parametrize("name", list(CHANGES))
def test_outside_change_is_noticed_at_the_next_request(pair, name, tmp_path):
    p = pair
    expected = CHANGES[name](p)
    want = h.refs_of(str(p.repo))
    # the next request through Aspen serves the disk's values
    seen = ls_remote(p.aspen)
    assert {k: v for k, v in seen.items() if k.startswith("refs/") and not k.endswith("^{}")} == want
    new = the_new_versions(p, 1)
    if expected is None:
        assert new == []
    else:
        assert new == [(2, "external", expected)]
    p.assert_same_as_stock()
    # noticed once: more requests record nothing more
    ls_remote(p.aspen)
    assert len(the_new_versions(p, 1)) == len(new)
    if name == "symbolic-ref-HEAD":
        assert v0_advert(p.aspen)[1] == ["symref=HEAD:refs/heads/topic"]
        clone = pk.clone(f"{p.aspen}/repo.git", tmp_path / "clone")
        assert h.out("symbolic-ref", "HEAD", cwd=str(clone)) == "refs/heads/topic"
    if name == "gc":
        clone = pk.clone(f"{p.aspen}/repo.git", tmp_path / "clone", fsck=True)
        h.fsck_strict(str(clone))


def test_new_branch_in_a_new_subdirectory_right_after_another_change(pair):
    """Two changes in quick succession (well inside one second), each followed by
    a request: the second one creates directories under refs/heads."""
    p = pair
    topic, main = p.rev("topic"), p.rev("main")
    h.git("update-ref", "refs/heads/x", "topic", cwd=str(p.repo))
    assert ls_remote(p.aspen)["refs/heads/x"] == topic
    h.git("update-ref", "refs/heads/a/b/c", "main", cwd=str(p.repo))
    assert ls_remote(p.aspen)["refs/heads/a/b/c"] == main
    h.git("update-ref", "refs/heads/a/b/d", "topic", cwd=str(p.repo))
    h.git("update-ref", "-d", "refs/heads/x", cwd=str(p.repo))
    seen = ls_remote(p.aspen)
    assert seen["refs/heads/a/b/d"] == topic and "refs/heads/x" not in seen
    assert [(v[0], v[1], v[2]) for v in the_new_versions(p, 1)] == [
        (2, "external", [("refs/heads/x", ZERO, topic, False)]),
        (3, "external", [("refs/heads/a/b/c", ZERO, main, False)]),
        (4, "external", [("refs/heads/a/b/d", ZERO, topic, False), ("refs/heads/x", topic, ZERO, False)])]
    p.assert_same_as_stock()


def _coarse(repo: Path, t_ns: int) -> None:
    """Make the ref files look as a file system with one-second timestamps
    shows changes made within the second T_NS: every directory under refs/,
    HEAD and packed-refs carry the same whole-second mtime."""
    for dirpath, _, _ in os.walk(repo / "refs"):
        os.utime(dirpath, ns=(t_ns, t_ns))
    for name in ("HEAD", "packed-refs"):
        if (repo / name).exists():
            os.utime(repo / name, ns=(t_ns, t_ns))


def _coarse_now(repo: Path) -> None:
    """_coarse() with the whole second of now, read after the change just
    made: what a file system with one-second timestamps shows for it, never an
    earlier second (a state such a file system can show however slow the
    machine is)."""
    _coarse(repo, time.time_ns() // 10**9 * 10**9)


@pytest.mark.parametrize("second", ["update-existing", "new-subdirectory"])
def test_change_within_the_same_coarse_timestamp_is_noticed(tmp_path, second):
    """What a file system with one-second timestamps (ext3, ext4 with small inodes,
    HFS+, many NFS servers) shows: change 1 at s.1, Aspen's request at s.5,
    change 2 at s.7 -- every mtime still reads s.0. Simulated with utime, each
    change stamped with the second it was made in (on a machine too slow for
    one second, change 2 reads a later one, as it would there); the store is
    used in process so that one process (one fingerprint cache) sees both
    requests. Served refs equal the disk's either way. A fingerprint whose
    timestamps are all whole seconds is trusted only two seconds after the
    newest of them: the request's fingerprint, judged 1.5 s after its newest
    timestamp, is not trusted, where one of fine timestamps would be."""
    repo = pk.enable_push(h.make_history(tmp_path / "repo.git"))
    store = RefStore.open(Repository.of(str(repo), dict(os.environ, GIT_DIR=str(repo))))
    store.sync()
    time.sleep(1 - time.time() % 1)              # at the start of a second: all of it in that second, unless stalled
    h.git("update-ref", "refs/heads/x", "topic", cwd=str(repo))
    _coarse_now(repo)
    time.sleep(0.4)
    store.sync()
    assert "refs/heads/x" in store.snapshot().by_name()
    seen = fingerprint.take(str(repo))           # what that request's fingerprint saw
    assert seen.coarse, seen
    later = replace(seen, taken_ns=seen.newest_ns + 1_500_000_000)
    assert not later.trusted and replace(later, coarse=False).trusted
    if second == "update-existing":
        h.git("update-ref", "refs/heads/x", "main", cwd=str(repo))
    else:
        h.git("update-ref", "refs/heads/a/b/c", "main", cwd=str(repo))
    _coarse_now(repo)
    store.sync()
    served = {r.name: r.oid for r in store.snapshot().refs}
    assert served == h.refs_of(str(repo))


# ---------------------------------------------------------------- where the store lives

def test_store_that_cannot_be_kept_serves_refs_from_disk(root, server_factory, cgi_server_factory, tmp_path):
    """A read-only repository: Aspen cannot create aspen/ in it. As root (who may
    write anyway) the state location is made impossible instead: ASPEN_STATE_DIR
    under a regular file."""
    repo = root / "repo.git"
    env = {}
    if os.geteuid() == 0:
        blocker = tmp_path / "not-a-directory"
        blocker.write_text("a regular file\n")
        env["ASPEN_STATE_DIR"] = str(blocker / "state")
    modes = {}
    for dirpath, dirnames, filenames in os.walk(repo):
        for n in [dirpath] + [os.path.join(dirpath, f) for f in dirnames + filenames]:
            m = os.lstat(n).st_mode
            if not stat.S_ISLNK(m):
                modes[n] = m
                os.chmod(n, m & ~0o222)
    try:
        aspen = server_factory(root, **env).url
        stock = cgi_server_factory(root).url
        assert v0_advert(aspen) == v0_advert(stock)
        assert v2_ls_refs(aspen) == v2_ls_refs(stock)
        assert {k: v for k, v in ls_remote(aspen).items() if k.startswith("refs/") and not k.endswith("^{}")} \
            == h.refs_of(str(repo))
        clone = pk.clone(f"{aspen}/repo.git", tmp_path / "clone", fsck=True)
        h.fsck_strict(str(clone))
        assert pk.rev(clone, "origin/main") == h.out("rev-parse", "main", cwd=str(repo))
        assert not (repo / "aspen").exists()
        if env:
            assert not os.path.exists(env["ASPEN_STATE_DIR"])
        # the CLI says why, without a traceback
        res = aspen_cli("log", str(repo), env=env)
        assert res.returncode != 0
        assert b"cannot keep a ref store" in res.stderr and b"Traceback" not in res.stderr
    finally:
        for n, m in modes.items():
            os.chmod(n, m)


@pytest.mark.sqlite_store("where the SQLite file is kept")
def test_aspen_state_dir_keeps_the_store_outside_the_repository(root, server_factory, cgi_server_factory, tmp_path):
    repo = pk.enable_push(root / "repo.git")
    state = tmp_path / "state"
    state.mkdir()
    env = {"ASPEN_STATE_DIR": str(state)}
    aspen = server_factory(root, **env).url
    stock = cgi_server_factory(root).url
    work = pk.clone(f"{aspen}/repo.git", tmp_path / "work")
    new = pk.commit(work, "pushed through aspen")
    pk.push(work, "origin", "main")
    h.git("update-ref", "refs/heads/outside", "topic", cwd=str(repo))
    assert ls_remote(aspen)["refs/heads/outside"] == h.out("rev-parse", "topic", cwd=str(repo))
    db_path = state / os.path.realpath(repo).lstrip("/") / "aspen.sqlite3"
    assert Path(state_dir(str(repo), settings.of(env))) / "aspen.sqlite3" == db_path
    assert db_path.is_file()
    assert not (repo / "aspen").exists()
    res = aspen_cli("log", str(repo), "--json", env=env)
    assert res.returncode == 0, res.stderr
    kinds = [json.loads(line)["kind"] for line in res.stdout.splitlines()]
    assert kinds == ["external", "push", "import"]
    assert json.loads(res.stdout.splitlines()[1])["updates"][0]["new"] == new
    res = aspen_cli("verify", str(repo), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert not (repo / "aspen").exists()
    assert v0_advert(aspen) == v0_advert(stock)
    assert v2_ls_refs(aspen) == v2_ls_refs(stock)


# ---------------------------------------------------------------- the suite's own check (conftest.py)

@pytest.mark.sqlite_store("the suite's check finds SQLite files and corrupts them")
def test_harness_verify_finds_stores_where_the_server_keeps_them(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    plain = h.make_history(root / "plain.git")                     # never served: no store, none created
    inrepo = h.make_history(root / "group" / "inrepo.git")
    moved = h.make_history(root / "moved.git")
    state = tmp_path / "state"
    for repo, env in ((inrepo, {}), (moved, {"ASPEN_STATE_DIR": str(state)})):
        res = aspen_cli("verify", str(repo), env=env)
        assert res.returncode == 0, res.stdout
    assert h.git_dirs(root) == [root / "group" / "inrepo.git", moved, plain]
    assert h.verify_refstores(root, {}) == {}
    assert h.verify_refstores(root, {"ASPEN_STATE_DIR": str(state)}) == {}
    assert not (plain / "aspen").exists() and not (moved / "aspen").exists()
    h.git("update-ref", "refs/heads/later", "topic", cwd=str(inrepo))    # synced first, as a request would
    assert h.verify_refstores(root, {}) == {}
    topic = h.out("rev-parse", "topic", cwd=str(moved))
    for db_file in (inrepo / "aspen" / "aspen.sqlite3", Path(state_dir(str(moved), settings.of({"ASPEN_STATE_DIR": str(state)})))
                    / "aspen.sqlite3"):
        # history that does not lead to the current refs: no sync can mend that
        conn = sqlite3.connect(str(db_file))
        conn.execute("UPDATE updates SET new = ? WHERE version = 1 AND ref = 'refs/heads/main'", (topic,))
        conn.commit()
        conn.close()
    found = h.verify_refstores(root, {})
    assert list(found) == [str(inrepo)]
    main = h.out("rev-parse", "main", cwd=str(inrepo))
    assert found[str(inrepo)] == ["hash chain broken at version 1: its content changed after it was hashed",
                                  f"refs/heads/main: versions replay to {topic}, current table says {main}"]
    found = h.verify_refstores(root, {"ASPEN_STATE_DIR": str(state)})
    assert list(found) == [str(moved)]
    assert h.verify_refstores(root, {"ASPEN_REFSTORE": "0"}) == {}


CHECKED_SUITE = '''
import sqlite3

import pytest

from tests import harness as h
from tests.conftest import *  # noqa: F401,F403  (fixtures and the teardown hook)


def corrupt(root):
    conn = sqlite3.connect(str(root / "repo.git" / "aspen" / "aspen.sqlite3"))
    conn.execute("UPDATE updates SET new = '1234567890123456789012345678901234567890'"
                 " WHERE version = 1 AND ref = 'refs/heads/main'")
    conn.commit()
    conn.close()


def test_breaks_the_store(root, server):
    h.git("ls-remote", server.url + "/repo.git")
    corrupt(root)


@pytest.mark.aspen_store_unchecked(reason="this test corrupts the store on purpose")
def test_breaks_the_store_on_purpose(root, server):
    h.git("ls-remote", server.url + "/repo.git")
    corrupt(root)


def test_leaves_it_consistent(root, server):
    h.git("ls-remote", server.url + "/repo.git")
    h.git("update-ref", "refs/heads/outside", "main", cwd=str(root / "repo.git"))
'''


@pytest.mark.timeout(300)
def test_suite_check_fails_the_test_that_leaves_a_store_inconsistent(tmp_path):
    """conftest.py's teardown check, run by pytest with xdist on a small suite
    of its own: the test that corrupts its store errors at teardown, naming the
    repository and the problems; the marked one and the clean one pass."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text("from tests.conftest import pytest_configure, pytest_runtest_teardown  "
                                       "# noqa: F401\n")
    (suite / "test_checked.py").write_text(CHECKED_SUITE)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    for name in ("ASPEN_TEST_REFSTORE", "ASPEN_REFSTORE_URL"):      # its suite corrupts SQLite files
        env.pop(name, None)
    res = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-q",
                          "--rootdir", str(suite), str(suite)], capture_output=True, text=True, env=env,
                         cwd=str(suite), timeout=240)
    out = res.stdout
    assert res.returncode == 1, out + res.stderr
    assert "3 passed, 1 error" in out, out
    assert "ERROR at teardown of test_breaks_the_store " in out, out
    assert "aspen verify: ref store not consistent after test_checked.py::test_breaks_the_store:" in out
    assert "/repo.git:" in out
    assert "refs/heads/main: versions replay to 1234567890123456789012345678901234567890, current table says " in out
    assert "ERROR test_checked.py::test_breaks_the_store_on_purpose" not in out
    assert "ERROR test_checked.py::test_leaves_it_consistent" not in out


def test_ref_name_git_made_that_is_not_utf8_is_served_from_disk(pair, tmp_path):
    """git itself (update-ref, stock's receive-pack) accepts a ref name that is
    not UTF-8; SQLite text cannot hold it. Aspen then serves the refs from the
    disk, byte for byte as stock advertises them, and pushes still land; once
    the ref is gone the store takes over again. Before: every request was a 500."""
    subprocess.run([b"git", b"update-ref", b"refs/heads/caf\xe9", b"main"], cwd=str(pair.repo), check=True)
    for path in ("/repo.git/info/refs?service=git-upload-pack", "/repo.git/info/refs"):
        a, s = http(pair.aspen + path), http(pair.stock + path)
        assert b"refs/heads/caf\xe9" in a
        assert d.norm_advertisement(a) == d.norm_advertisement(s) if "service" in path else a == s
    clone = pk.clone(f"{pair.aspen}/repo.git", tmp_path / "clone", fsck=True)
    h.fsck_strict(str(clone))
    res = aspen_cli("verify", str(pair.repo))
    assert res.returncode != 0 and b"not valid UTF-8" in res.stderr and b"Traceback" not in res.stderr
    pk.commit(clone, "after")
    h.git("push", "origin", "HEAD:refs/heads/after", cwd=str(clone))
    assert h.out("rev-parse", "refs/heads/after", cwd=str(pair.repo)) == pk.rev(clone, "HEAD")
    subprocess.run([b"git", b"update-ref", b"-d", b"refs/heads/caf\xe9"], cwd=str(pair.repo), check=True)
    pair.assert_same_as_stock()
