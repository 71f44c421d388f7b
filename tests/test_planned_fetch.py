"""Fetches answered from stored packs, end to end: after `aspen import`, a
protocol v2 clone is planned and spliced by Aspen (the access log says so);
the client's strict fsck passes and its refs and objects equal a clone of
the same repository from stock. What the planner cannot prove goes to git."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from aspen_cgi.runtime.repository import Repository

from . import harness as h
from . import pushkit as pk


def _objects(repo: Path) -> set[str]:
    out = h.out("rev-list", "--objects", "--all", cwd=str(repo))
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _clone(url: str, dest: Path, version: int, *extra: str) -> subprocess.CompletedProcess:
    return h.git("-c", f"protocol.version={version}", "-c", "transfer.fsckObjects=true",
                 "clone", "-q", "--mirror", *extra, url, str(dest))


def _plans(server) -> list[str]:
    """The access lines of fetch answers (each says how it was answered: plan= or cache=), oldest
    first. A v2 clone's ls-refs line may be written after its fetch's (each as its body closes)."""
    return [line for line in re.findall(r"service=upload-pack method=POST .*", server.log_text())
            if " plan=" in line or " cache=" in line]


def _import(repo: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "aspen_cgi.cli", "import", "-q", str(repo)],
                         capture_output=True, text=True, cwd=h.REPO_DIR)
    assert res.returncode == 0, res.stderr


@pytest.fixture
def pushed(root, server_factory, tmp_path):
    """A repository with a history pushed through Aspen (versions 2..), its
    server and a work clone. The server builds no packs (version packs off):
    the tests build them with `aspen import` when they choose."""
    server = server_factory(root, ASPEN_ACCESS_LOG="1", ASPEN_CACHE="off",   # each fetch planned anew
                            ASPEN_VERSION_PACKS="off")
    repo = pk.enable_push(root / "repo.git")
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    for i in range(6):
        (work / "grow.txt").write_text("".join(f"line {n} of {i}\n" for n in range(300 * (i + 1))))
        (work / f"f{i % 2}.txt").write_text(f"{i}\n")
        pk.commit(work, f"c{i}")
        h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    h.git("tag", "-a", "-m", "release", "v9", cwd=str(work))
    h.git("push", "-q", "origin", "v9", cwd=str(work))
    return server, repo, work


def test_v2_clone_is_planned_and_equals_stock(pushed, cgi_server_factory, tmp_path):
    server, repo, _ = pushed
    _import(repo)
    client = tmp_path / "client.git"
    _clone(server.url + "/repo.git", client, 2)
    h.fsck_strict(str(client))
    assert h.refs_of(str(client)) == h.refs_of(str(repo))
    last = _plans(server)[-1]
    assert "plan=planned" in last, last
    assert re.search(r"extents=\d+ objects=\d+", last), last
    stock = cgi_server_factory(repo.parent, "stock")
    other = tmp_path / "stock.git"
    _clone(stock.url + "/repo.git", other, 2)
    assert h.refs_of(str(other)) == h.refs_of(str(client))
    assert _objects(other) == _objects(client)


def test_answers_in_the_cgi_process_leave_a_clean_log(pushed, cgi_server_factory, tmp_path):
    """aspen-cgi answering in its own process (no resident): the packs it
    opened are closed before the interpreter's teardown, whose finalizers
    would otherwise write tracebacks into Apache's error log."""
    _, repo, _ = pushed
    _import(repo)
    h.git("--git-dir", str(repo), "repack", "-adq")     # the push's reading of objects opens packs
    cgi = cgi_server_factory(repo.parent, "aspen", ASPEN_CGI_RESIDENT="0", ASPEN_ACCESS_LOG="1", ASPEN_CACHE="off")
    work = tmp_path / "cgi-work"
    h.git("clone", "-q", cgi.url + "/repo.git", str(work))
    (work / "more.txt").write_text("more\n")
    pk.commit(work, "more")
    h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))       # the push's adoption reads objects
    _clone(cgi.url + "/repo.git", tmp_path / "client.git", 2)
    log = cgi.log_text()
    assert "plan=planned" in log and "push=ok=1" in log, log
    assert "Traceback" not in log and "Exception ignored" not in log, log


def test_unbuilt_pushes_go_to_git_in_v0_and_v2(pushed, tmp_path):
    server, repo, work = pushed
    _import(repo)
    pk.commit(work, "after the import")
    h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    a = tmp_path / "a.git"
    _clone(server.url + "/repo.git", a, 2)
    h.fsck_strict(str(a))
    assert h.refs_of(str(a)) == h.refs_of(str(repo))
    assert "plan=fallback why=not-built" in _plans(server)[-1]
    b = tmp_path / "b.git"
    _clone(server.url + "/repo.git", b, 0)
    assert h.refs_of(str(b)) == h.refs_of(str(repo))
    assert "plan=fallback why=not-built" in _plans(server)[-1]
    _import(repo)
    c = tmp_path / "c.git"
    _clone(server.url + "/repo.git", c, 2)
    h.fsck_strict(str(c))
    assert h.refs_of(str(c)) == h.refs_of(str(repo))
    assert "plan=planned" in _plans(server)[-1]


def test_corrupt_stored_pack_falls_back_to_git(pushed, tmp_path):
    server, repo, _ = pushed
    _import(repo)
    packs = repo / "aspen" / "packs"
    victim = sorted(packs.glob("pack-*.pack"), key=lambda p: p.stat().st_size)[-1]
    data = bytearray(victim.read_bytes())
    del data[-30:]                      # truncated: its index no longer matches
    victim.write_bytes(bytes(data))
    client = tmp_path / "client.git"
    _clone(server.url + "/repo.git", client, 2)
    h.fsck_strict(str(client))
    assert h.refs_of(str(client)) == h.refs_of(str(repo))
    assert "why=pack-error" in _plans(server)[-1]
    shutil.rmtree(packs)


@pytest.mark.parametrize("kind", ["gunicorn", "cgi"])
def test_pushes_build_their_packs_in_the_background(kind, root, server_factory, cgi_server_factory, tmp_path):
    """With ASPEN_VERSION_PACKS=auto a push starts one builder (a thread of a
    gunicorn worker; a detached `aspen import` under CGI); once it is done the
    next v2 clone is planned, without `aspen import` by hand."""
    import time

    from aspen_cgi.refstore.store import RefStore
    if kind == "gunicorn":
        server = server_factory(root, ASPEN_ACCESS_LOG="1", ASPEN_VERSION_PACKS="auto")
    else:
        server = cgi_server_factory(root, "aspen", ASPEN_ACCESS_LOG="1", ASPEN_VERSION_PACKS="auto")
    repo = pk.enable_push(root / "repo.git")
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    for i in range(3):
        (work / "n.txt").write_text(f"{i}\n" * 50)
        pk.commit(work, f"n{i}")
        h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    store = RefStore.open(Repository.of(str(repo), dict(os.environ, GIT_DIR=str(repo))))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        store.sync()
        if store.all_packs_built() and not (repo / "aspen" / "packs" / ".build.lock").exists():
            break
        time.sleep(0.2)
    assert store.all_packs_built(), "the background builder did not finish"
    client = tmp_path / "client.git"
    _clone(server.url + "/repo.git", client, 2)
    h.fsck_strict(str(client))
    assert h.refs_of(str(client)) == h.refs_of(str(repo))
    assert "plan=planned" in _plans(server)[-1]


@pytest.mark.parametrize("kind", ["gunicorn", "cgi"])
def test_fetch_right_after_a_push_is_planned_and_never_waits_for_a_build(kind, root, server_factory,
                                                                         cgi_server_factory, tmp_path):
    """A push through Aspen is acknowledged with its client's pack already
    its version's pack (adopted, no git): the fetch right after it is
    planned and found nothing to wait for. A change made outside Aspen
    (stock's push) has no client's pack to adopt: the next fetch is git's
    answer at once (why=not-built, build_wait_ms=0.0), though
    ASPEN_BUILD_WAIT_MS would let it wait 30 s, unless the builder its
    advertisement started was done already; once it is done, a clone is
    planned."""
    env = dict(ASPEN_ACCESS_LOG="1", ASPEN_VERSION_PACKS="auto", ASPEN_BUILD_WAIT_MS="30000")
    server = server_factory(root, **env) if kind == "gunicorn" else cgi_server_factory(root, "aspen", **env)
    stock = cgi_server_factory(root, "stock")
    repo = pk.enable_push(root / "repo.git")
    work, client = tmp_path / "work", tmp_path / "client"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    h.git("-c", "protocol.version=2", "clone", "-q", server.url + "/repo.git", str(client))
    h.wait_packs_built(repo)            # no fetch waits for the import's pack: git answers meanwhile

    def fetch() -> str:
        h.git("-c", "protocol.version=2", "-c", "transfer.fsckObjects=true", "fetch", "-q", "origin", cwd=str(client))
        h.fsck_strict(str(client))
        assert h.out("rev-parse", "origin/main", cwd=str(client)) == h.out("rev-parse", "main", cwd=str(repo))
        return _plans(server)[-1]
    for i, url in enumerate((server.url, stock.url)):
        (work / "w.txt").write_text(f"{i}\n" * 80)
        pk.commit(work, f"w{i}")
        h.git("push", "-q", url + "/repo.git", "HEAD:main", cwd=str(work))
        plan = fetch()
        if url == server.url:
            assert "plan=planned" in plan and "build_wait_ms" not in plan, plan
            pushed = re.findall(r"service=receive-pack method=POST .*", server.log_text())[-1]
            assert re.search(r" adopted=yes,[0-9.]+ms phases=intake:[0-9.]+,check:[0-9.]+,migrate:[0-9.]+,refs:[0-9.]+,adopt:[0-9.]+,after:[0-9.]+",
                             pushed), pushed
        else:
            # built already when a builder the advertisement started was quick enough; never waited for
            assert "plan=planned" in plan or "plan=fallback why=not-built build_wait_ms=0.0" in plan, plan
            h.wait_packs_built(repo)
            _clone(server.url + "/repo.git", tmp_path / "after.git", 2)
            assert "plan=planned" in _plans(server)[-1], _plans(server)[-1]
            h.fsck_strict(str(tmp_path / "after.git"))
            assert h.refs_of(str(tmp_path / "after.git")) == h.refs_of(str(repo))


def test_hidden_refs_objects_never_sent_from_stored_packs(root, server_factory, cgi_server_factory, tmp_path):
    """A stored pack of a version that wrote a hidden ref (the import, here)
    may hold objects only that ref reaches: a clone needing it goes to git
    (why=invisible-ref) and gets exactly stock's objects, without the secret;
    a fetch of a later push to a visible branch is still planned."""
    repo = pk.enable_push(root / "repo.git")
    h.git("config", "uploadpack.hideRefs", "refs/secret", cwd=str(repo))
    blob = subprocess.run(["git", "hash-object", "-w", "--stdin"], input=b"the secret\n", cwd=str(repo),
                          capture_output=True, check=True).stdout.decode().strip()
    tree = subprocess.run(["git", "mktree"], input=f"100644 blob {blob}\tsecret.txt\n".encode(), cwd=str(repo),
                          capture_output=True, check=True).stdout.decode().strip()
    secret = h.out("commit-tree", tree, "-m", "secret", cwd=str(repo))
    h.git("update-ref", "refs/secret/x", secret, cwd=str(repo))
    _import(repo)
    server = server_factory(root, ASPEN_ACCESS_LOG="1", ASPEN_VERSION_PACKS="auto")
    stock = cgi_server_factory(root, "stock")
    a, s = tmp_path / "a.git", tmp_path / "s.git"
    _clone(server.url + "/repo.git", a, 2)
    _clone(stock.url + "/repo.git", s, 2)
    assert "plan=fallback why=invisible-ref" in _plans(server)[-1]
    assert _objects(a) == _objects(s)
    for obj in (secret, blob):
        assert h.git("cat-file", "-e", obj, cwd=str(a), check=False).returncode != 0
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    (work / "visible.txt").write_text("visible\n")
    pk.commit(work, "visible")
    h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    h.wait_packs_built(repo)
    h.git("-c", "protocol.version=2", "fetch", "-q", "origin", cwd=str(a))
    assert "plan=planned" in _plans(server)[-1]
    h.fsck_strict(str(a))
    assert h.out("rev-parse", "refs/heads/main", cwd=str(a)) == h.out("rev-parse", "main", cwd=str(repo))
    assert h.git("cat-file", "-e", secret, cwd=str(a), check=False).returncode != 0


def test_a_new_repositorys_first_push_is_fetched_from_its_pack_at_once(root, server_factory, tmp_path):
    """An empty repository's import holds nothing: a clone right after its
    first push waits for that push's build (and the empty import's), as
    after any push, and is planned. Here the builds wait a second for the
    machine's one build slot, which the test holds meanwhile."""
    h.git("init", "-q", "--bare", str(root / "new.git"))
    repo = pk.enable_push(root / "new.git")
    run = tmp_path / "run"
    run.mkdir()
    server = server_factory(root, ASPEN_ACCESS_LOG="1", ASPEN_BUILD_WAIT_MS="30000", ASPEN_CACHE="off",
                            ASPEN_RUN_DIR=str(run), ASPEN_BUILDS_PER_SERVER="1")
    work = tmp_path / "work"
    h.git("clone", "-q", str(root / "repo.git"), str(work))
    slot = os.open(run / "build.slot.0", os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(slot, fcntl.LOCK_EX)
    release = threading.Timer(1.0, lambda: os.close(slot))
    try:
        h.git("push", "-q", server.url + "/new.git", "HEAD:refs/heads/main", cwd=str(work))
        release.start()
        client = tmp_path / "client.git"
        _clone(server.url + "/new.git", client, 2)
    finally:
        release.join()
    assert "plan=planned" in _plans(server)[-1], _plans(server)[-1]
    h.fsck_strict(str(client))
    assert h.refs_of(str(client)) == h.refs_of(str(repo))


@pytest.mark.timeout(180)
def test_a_fetch_never_waits_for_the_import(tmp_path, server_factory):
    """While a repository, however small, waits for its import pack (here its
    build never starts: the machine's one build slot is held), a clone is
    answered by git at once, though ASPEN_BUILD_WAIT_MS would let it wait 10
    minutes; once the import pack is built, a clone is planned."""
    root = tmp_path / "root"
    repo = root / "repo.git"
    h.git("init", "-q", "--bare", str(repo))
    blob = subprocess.run(["git", "hash-object", "-w", "--stdin"], input=os.urandom(4096), cwd=str(repo),
                          capture_output=True, check=True).stdout.decode().strip()
    tree = subprocess.run(["git", "mktree"], input=f"100644 blob {blob}\tbig.bin\n".encode(), cwd=str(repo),
                          capture_output=True, check=True).stdout.decode().strip()
    h.git("update-ref", "refs/heads/main", h.out("commit-tree", tree, "-m", "big", cwd=str(repo)), cwd=str(repo))
    run = tmp_path / "run"
    run.mkdir()
    slot = os.open(run / "build.slot.0", os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(slot, fcntl.LOCK_EX)
    try:
        server = server_factory(root, ASPEN_ACCESS_LOG="1", ASPEN_RUN_DIR=str(run), ASPEN_BUILDS_PER_SERVER="1",
                                ASPEN_BUILD_WAIT_MS="600000", ASPEN_CACHE="off")    # the same clone again: planned
        _clone(server.url + "/repo.git", tmp_path / "first.git", 2)
        assert "plan=fallback why=not-built" in _plans(server)[-1], _plans(server)[-1]
        h.fsck_strict(str(tmp_path / "first.git"))
        assert h.refs_of(str(tmp_path / "first.git")) == h.refs_of(str(repo))
    finally:
        os.close(slot)
    h.wait_packs_built(repo)
    _clone(server.url + "/repo.git", tmp_path / "second.git", 2)
    assert "plan=planned" in _plans(server)[-1], _plans(server)[-1]
    h.fsck_strict(str(tmp_path / "second.git"))


class _Slot:
    def __init__(self, events: list):
        self.events = events

    def release(self) -> None:
        self.events.append("released")


def test_what_a_fallback_answer_was_asked_to_start_runs_after_its_last_byte_once(tmp_path):
    """The import build a fetch asks for (background.await_built's LATER)
    runs once git's answer is sent, never while its bytes are still to come,
    and once only; an answer closed early (a client gone) runs it at close."""
    from aspen_cgi.fetch.upload import _Admitted
    from aspen_cgi.git import gitexec
    repo = tmp_path / "repo.git"
    h.git("init", "-q", "--bare", str(repo))
    events: list = []
    body = _Admitted(gitexec.git_stream(["version"], cwd=str(repo)), _Slot(events), [lambda: events.append("after")])
    chunks = []
    for chunk in body:
        assert "after" not in events
        chunks.append(chunk)
    assert b"git version" in b"".join(chunks) and events.count("after") == 1
    body.close()
    assert events.count("after") == 1
    early: list = []
    cut = _Admitted(gitexec.git_stream(["version"], cwd=str(repo)), _Slot(early), [lambda: early.append("after")])
    cut.close()
    assert early.count("after") == 1


@pytest.mark.timeout(180)
def test_a_cached_git_answer_gives_way_once_the_packs_are_built(tmp_path, server_factory):
    """The cache never serves a worse answer than the one now possible: a
    clone git answered while a version's pack was unbuilt (a change made
    outside Aspen, its build held back by the test holding the machine's
    build slot) is kept as `entry=git-unbuilt`, served as such while the
    pack is still unbuilt, then dropped by the first identical clone after
    it is built (`entry=superseded`), which is planned; the one after that
    is a hit on the planned entry. (The import's own pack is named in the
    cache key: answers made before it, or before it is widened, are another
    key's.) Every clone is complete and fsck-clean."""
    root = tmp_path / "root"
    repo = root / "repo.git"
    h.git("init", "-q", "--bare", str(repo))

    def commit(data: bytes, *parents: str) -> str:
        blob = subprocess.run(["git", "hash-object", "-w", "--stdin"], input=data, cwd=str(repo),
                              capture_output=True, check=True).stdout.decode().strip()
        tree = subprocess.run(["git", "mktree"], input=f"100644 blob {blob}\tbig.bin\n".encode(), cwd=str(repo),
                              capture_output=True, check=True).stdout.decode().strip()
        return h.out("commit-tree", tree, *[a for p in parents for a in ("-p", p)], "-m", "big", cwd=str(repo))
    first = commit(os.urandom(4096))
    h.git("update-ref", "refs/heads/main", first, cwd=str(repo))
    run = tmp_path / "run"
    run.mkdir()
    server = server_factory(root, ASPEN_ACCESS_LOG="1", ASPEN_RUN_DIR=str(run), ASPEN_BUILDS_PER_SERVER="1",
                            ASPEN_COMPACT_QUIET_MS="600000")      # the import is not widened meanwhile

    def clone(name: str) -> str:
        _clone(server.url + "/repo.git", tmp_path / name, 0)
        h.fsck_strict(str(tmp_path / name))
        assert h.refs_of(str(tmp_path / name)) == h.refs_of(str(repo))
        return _plans(server)[-1]
    clone("zero.git")
    h.wait_packs_built(repo)
    slot = os.open(run / "build.slot.0", os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(slot, fcntl.LOCK_EX)
    try:
        h.git("update-ref", "refs/heads/main", commit(os.urandom(4096), first), cwd=str(repo))   # from outside
        one = clone("one.git")
        assert "cache=cold" in one and "plan=fallback why=not-built" in one, one
        two = clone("two.git")
        assert "cache=hit entry=git-unbuilt" in two, two
    finally:
        os.close(slot)
    h.wait_packs_built(repo)
    three = clone("three.git")
    assert "cache=cold entry=superseded" in three and "plan=planned" in three, three
    four = clone("four.git")
    assert "cache=hit entry=planned" in four, four


@pytest.mark.timeout(180)
def test_a_planned_answer_gives_way_once_the_import_is_packed_wide(root, server_factory, tmp_path):
    """A background build packs the import with git's own search first: a
    clone planned from that pack is cached (`entry=planned`); once the import
    is packed again with the wide search (here by the test, the server's
    builder waiting 10 minutes for quiet), the next identical clone drops
    that entry and is planned again from the wide pack (`entry=superseded`),
    no larger; the one after is a hit."""
    from aspen_cgi.packs import background, builder
    from aspen_cgi.packs.versionpack import DeltaSearch
    from aspen_cgi.refstore.store import RefStore
    repo = root / "repo.git"
    server = server_factory(root, ASPEN_ACCESS_LOG="1", ASPEN_COMPACT_QUIET_MS="600000")

    def clone(name: str) -> tuple[str, int]:
        _clone(server.url + "/repo.git", tmp_path / name, 0)
        h.fsck_strict(str(tmp_path / name))
        assert h.refs_of(str(tmp_path / name)) == h.refs_of(str(repo))
        line = _plans(server)[-1]
        return line, int(re.search(r" bytes=(\d+)", line).group(1))
    clone("zero.git")                    # the import's first request: git answers, the quick pack is built after
    h.wait_packs_built(repo)

    def look():
        store = RefStore.open(Repository.of(str(repo), dict(os.environ)), create=False)
        return store.import_window(), background.import_final(store)
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("v", look()))
    t.start()
    t.join()
    assert box["v"] == (10, False)
    one, quick_bytes = clone("one.git")
    assert "cache=cold" in one and "plan=planned" in one, one
    two, _ = clone("two.git")
    assert "cache=hit entry=planned" in two, two

    def widen():
        store = RefStore.open(Repository.of(str(repo), dict(os.environ)), create=False)
        return builder.widen_import(store, DeltaSearch()) is not None and background.import_final(store)
    box.clear()
    t = threading.Thread(target=lambda: box.setdefault("v", widen()))
    t.start()
    t.join()
    assert box["v"] is True
    three, wide_bytes = clone("three.git")
    assert "cache=cold entry=superseded" in three and "plan=planned" in three, three
    assert wide_bytes <= quick_bytes
    four, _ = clone("four.git")
    assert "cache=hit entry=planned" in four, four
