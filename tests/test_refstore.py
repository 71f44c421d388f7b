"""The ref store (aspen_cgi/refstore) on real repositories made with the git
CLI and real SQLite files: import, commit (compare-and-swap, atomicity,
fast-forward flags), ancestry proofs and their visit counts, tips, segment
growth under churn, compaction after the fact, the schema version, and the
advertisement view against git's own."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Optional

import pytest

from aspen_cgi.git import reader
from aspen_cgi.model.versions import ZERO, RefChange, VersionMeta
from aspen_cgi.packs import builder
from aspen_cgi.refstore import db, segments
from aspen_cgi.refstore.store import RefStore
from aspen_cgi.runtime.repository import Repository

from . import harness as h

pytestmark = pytest.mark.timeout(300)

ASPEN = str(Path(sys.executable).parent / "aspen")


# ---------------------------------------------------------------- helpers

def env_for(gitdir: Path) -> dict:
    e = dict(os.environ)
    e["GIT_DIR"] = str(gitdir)
    return e


def open_store(gitdir: Path) -> RefStore:
    store = RefStore.open(Repository.of(str(gitdir), env_for(gitdir)))
    assert store is not None
    return store


def in_new_thread(fn):
    """Run FN in a fresh thread: the store keeps one SQLite connection per
    thread, so this is a real reopen of the file (connect, schema check)."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001
            out["error"] = e
    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def sql(store: RefStore, query: str, args=()) -> list[tuple]:
    """Read the store's tables directly (a separate connection)."""
    return h.store_rows(store, query, args)


def sql_write(store: RefStore, *statements: str) -> None:
    h.store_write(store, *statements)


def commits(repo: Path, n: int, parent: Optional[str] = None, tag: str = "c") -> list[str]:
    """N commits in a chain (the first on PARENT, or a root), made by
    `git fast-import` and left unreferenced; their ids in order."""
    marks = repo / f"marks-{tag}-{os.getpid()}"
    lines = []
    for i in range(n):
        msg = f"{tag} {i}\n"
        lines.append(f"commit refs/fastimport/tmp\nmark :{i + 1}\n"
                     f"committer T <t@x> {1600000000 + i} +0000\ndata {len(msg)}\n{msg}")
        if i:
            lines.append(f"from :{i}\n")
        elif parent:
            lines.append(f"from {parent}\n")
        lines.append(f"M 644 inline f.txt\ndata {len(msg)}\n{msg}\n")
    h.git("fast-import", "--quiet", f"--export-marks={marks}", cwd=str(repo), input="".join(lines).encode())
    h.git("update-ref", "-d", "refs/fastimport/tmp", cwd=str(repo))
    got = dict(line.split() for line in marks.read_text().splitlines())
    marks.unlink()
    return [got[f":{i + 1}"] for i in range(n)]


def empty_repo(path: Path) -> Path:
    h.git("init", "-q", "--bare", "-b", "main", str(path))
    return path


def disk_refs(repo: Path) -> dict[str, str]:
    return h.refs_of(str(repo))


def ok(store: RefStore, changes, who: Optional[str] = None, push_id: Optional[str] = None) -> int:
    err = store.commit(changes, VersionMeta("push", who, push_id))
    assert err is None, err
    return store.latest()


def bound(n: int) -> float:
    return 2 * math.log2(max(n, 1)) + 4


def objects_state(repo: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, _, files in os.walk(repo / "objects"):
        for f in files:
            st = os.stat(os.path.join(dirpath, f))
            out[os.path.relpath(os.path.join(dirpath, f), repo)] = (st.st_size, st.st_mtime_ns)
    return out


# ---------------------------------------------------------------- import

def test_import_records_every_ref_as_version_1_without_touching_objects(tmp_path):
    repo = h.make_history(tmp_path / "repo.git")
    h.git("update-ref", "refs/heads/feature/x", "topic", cwd=str(repo))
    h.git("tag", "-a", "-m", "tag of a tag", "tt", "v1.0", cwd=str(repo))
    # history with a hole: an import that walked objects would trip over it
    blob = h.out("rev-parse", "main~4:README", cwd=str(repo))
    loose = repo / "objects" / blob[:2] / blob[2:]
    assert loose.is_file()
    loose.unlink()
    before = objects_state(repo)
    want = disk_refs(repo)

    store = open_store(repo)
    assert store.sync() == 1
    assert objects_state(repo) == before
    log = list(store.log())
    assert [(v.id, v.kind, v.who, v.state) for v in log] == [(1, "import", None, "done")]
    ups = {u.ref: u for u in log[0].updates}
    assert {r: u.new for r, u in ups.items()} == want
    assert all(u.old == ZERO and not u.ff for u in ups.values())
    # every value is a tip of version 1, peeled tags too
    for ref, oid in want.items():
        assert (1, ref) in store.tips(oid).tips
    v1_commit = h.out("rev-parse", "v1.0^{commit}", cwd=str(repo))
    assert (1, "refs/tags/v1.0") in store.tips(v1_commit).tips
    assert (1, "refs/tags/tt") in store.tips(v1_commit).tips
    # syncing again changes nothing
    assert store.sync() == 1
    assert in_new_thread(lambda: open_store(repo).sync()) == 1
    assert len(list(store.log())) == 1


def test_import_of_an_empty_repository_is_version_1_with_no_updates(tmp_path):
    repo = empty_repo(tmp_path / "empty.git")
    store = open_store(repo)
    assert store.sync() == 1
    (v,) = list(store.log())
    assert (v.kind, v.updates) == ("import", ())
    assert store.verify().ok


# ---------------------------------------------------------------- commit

@pytest.mark.parametrize("fast", [False, True], ids=["update-ref", "in-process"])
def test_commit_create_ff_force_delete_records_flags(tmp_path, fast):
    repo = empty_repo(tmp_path / "repo.git")
    a, b, c = commits(repo, 3)
    (d,) = commits(repo, 1, tag="other")
    store = open_store(repo)
    assert store.sync() == 1
    ref = "refs/heads/main"

    def push(change: RefChange, who: str) -> int:
        err = store.commit([change], VersionMeta("push", who, f"id-{who}"), fast=fast)
        assert err is None, err
        return store.latest()

    # the caller's ff flag is kept for updates; a create or a delete is never a fast-forward
    v_create = push(RefChange(ref, ZERO, a, ff=True), "ann")
    assert disk_refs(repo) == {ref: a}
    v_ff = push(RefChange(ref, a, c, ff=True), "bob")
    v_force = push(RefChange(ref, c, d, ff=False), "cy")
    assert disk_refs(repo) == {ref: d}
    v_delete = push(RefChange(ref, d, ZERO, ff=True), "dee")
    assert disk_refs(repo) == {}
    assert [v_create, v_ff, v_force, v_delete] == [2, 3, 4, 5]

    log = {v.id: v for v in store.log()}
    assert [(v.kind, v.who, v.push_id, v.state) for v in (log[i] for i in (2, 3, 4, 5))] == [
        ("push", "ann", "id-ann", "done"), ("push", "bob", "id-bob", "done"),
        ("push", "cy", "id-cy", "done"), ("push", "dee", "id-dee", "done")]
    assert [tuple((u.ref, u.old, u.new, u.ff) for u in log[i].updates) for i in (2, 3, 4, 5)] == [
        ((ref, ZERO, a, False),), ((ref, a, c, True),), ((ref, c, d, False),), ((ref, d, ZERO, False),)]
    assert store.snapshot().refs == ()
    assert store.tips(c).tips == ((3, ref),)
    assert store.tips(b).tips == ()         # never a ref's value
    assert store.verify().ok, store.verify().problems


def test_commit_records_type_peeled_and_introduced(tmp_path):
    repo = h.make_history(tmp_path / "repo.git")
    store = open_store(repo)
    store.sync()
    tag = h.out("rev-parse", "refs/tags/v1.0", cwd=str(repo))
    target = h.out("rev-parse", "v1.0^{}", cwd=str(repo))
    main = h.out("rev-parse", "main", cwd=str(repo))
    err = store.commit([RefChange("refs/tags/again", ZERO, tag, otype="tag", peeled=target)],
                       VersionMeta("push", "u", "p1", introduced=(main,)))
    assert err is None
    v = store.latest()
    assert (v, "refs/tags/again") in store.tips(target).tips     # the peeled commit is a tip too
    assert store.introduced_by(main) == [v]
    snap = store.snapshot().by_name()
    assert (snap["refs/tags/again"].oid, snap["refs/tags/again"].peeled) == (tag, target)
    assert store.snapshot() == reader.read_refs(str(repo), env_for(repo), None)


@pytest.mark.parametrize("fast", [False, True], ids=["update-ref", "in-process"])
@pytest.mark.parametrize("case", ["stale-old", "create-existing", "delete-missing", "update-missing"])
def test_cas_failure_returns_gits_message_and_records_nothing(tmp_path, case, fast):
    repo = empty_repo(tmp_path / "repo.git")
    a, b = commits(repo, 2)
    h.git("update-ref", "refs/heads/main", a, cwd=str(repo))
    store = open_store(repo)
    store.sync()
    change, words = {
        "stale-old": (RefChange("refs/heads/main", b, a), ["cannot lock ref 'refs/heads/main'", f"is at {a}",
                                                             f"expected {b}"]),
        "create-existing": (RefChange("refs/heads/main", ZERO, b), ["cannot lock ref 'refs/heads/main'",
                                                                    "reference already exists"]),
        "delete-missing": (RefChange("refs/heads/nope", a, ZERO), ["cannot lock ref 'refs/heads/nope'"]),
        "update-missing": (RefChange("refs/heads/nope", a, b), ["cannot lock ref 'refs/heads/nope'"]),
    }[case]
    before_disk, before_db = disk_refs(repo), sql(store, "SELECT * FROM versions")
    err = store.commit([change], VersionMeta("push", "u"), fast=fast)
    assert err is not None
    for w in words:
        assert w in err, err
    # the same text git itself gives for this transaction
    line = (f"delete {change.ref} {change.old}" if change.new == ZERO
            else f"update {change.ref} {change.new} {change.old}")
    direct = h.git("update-ref", "--stdin", cwd=str(repo), input=f"{line}\n".encode(), check=False)
    assert direct.returncode != 0
    assert err in direct.stderr.decode()
    assert disk_refs(repo) == before_disk
    assert sql(store, "SELECT * FROM versions") == before_db
    assert sql(store, "SELECT count(*) FROM updates WHERE version > 1") == [(0,)]
    assert store.latest() == 1
    assert store.verify().ok


def test_atomic_multi_ref_commit_is_one_version_or_nothing(tmp_path):
    repo = empty_repo(tmp_path / "repo.git")
    a, b, c = commits(repo, 3)
    for name, oid in (("main", a), ("old", a), ("keep", b)):
        h.git("update-ref", f"refs/heads/{name}", oid, cwd=str(repo))
    store = open_store(repo)
    store.sync()
    changes = [RefChange("refs/heads/main", a, c, ff=True), RefChange("refs/heads/new", ZERO, b),
               RefChange("refs/heads/old", a, ZERO)]
    v = ok(store, changes)
    assert v == 2
    (ver,) = [x for x in store.log() if x.id == v]
    assert [(u.ref, u.old, u.new, u.ff) for u in ver.updates] == [
        ("refs/heads/main", a, c, True), ("refs/heads/new", ZERO, b, False), ("refs/heads/old", a, ZERO, False)]
    assert disk_refs(repo) == {"refs/heads/main": c, "refs/heads/new": b, "refs/heads/keep": b}

    # one stale old value: nothing of the transaction happens, on disk or in the store
    err = store.commit([RefChange("refs/heads/main", c, a), RefChange("refs/heads/other", ZERO, a),
                        RefChange("refs/heads/keep", a, c)], VersionMeta())
    assert err is not None and "refs/heads/keep" in err
    assert disk_refs(repo) == {"refs/heads/main": c, "refs/heads/new": b, "refs/heads/keep": b}
    assert store.latest() == 2
    assert store.verify().ok


# ---------------------------------------------------------------- ancestry

def test_is_ancestor_true_along_fast_forwards_false_across_force_delete_and_absence(tmp_path):
    repo = empty_repo(tmp_path / "repo.git")
    c = commits(repo, 6)
    (x,) = commits(repo, 1, tag="unrelated")
    main, side, dr, late = "refs/heads/main", "refs/heads/side", "refs/heads/dr", "refs/heads/late"
    h.git("update-ref", main, c[0], cwd=str(repo))
    h.git("update-ref", dr, c[0], cwd=str(repo))
    store = open_store(repo)
    assert store.sync() == 1
    assert ok(store, [RefChange(main, c[0], c[1], ff=True)]) == 2
    assert ok(store, [RefChange(side, ZERO, x)]) == 3
    assert ok(store, [RefChange(main, c[1], c[2], ff=True), RefChange(side, x, c[0])]) == 4
    assert ok(store, [RefChange(main, c[2], c[3], ff=True)]) == 5
    assert ok(store, [RefChange(main, c[3], x)]) == 6                      # force-push
    assert ok(store, [RefChange(main, x, c[4], ff=False)]) == 7
    assert ok(store, [RefChange(dr, c[0], ZERO)]) == 8                      # delete ...
    assert ok(store, [RefChange(dr, ZERO, c[5])]) == 9                      # ... and recreate a descendant
    assert ok(store, [RefChange(late, ZERO, c[5])]) == 10
    assert ok(store, [RefChange(late, c[5], c[5], ff=True)]) == 11          # a no-op update is a fast-forward

    def anc(ref, j, k):
        return store.is_ancestor(ref, j, k)

    for j in range(1, 6):
        for k in range(j, 6):
            a = anc(main, j, k)
            assert a.ancestor, (j, k)
            assert a.visits.total <= bound(k - j)
    a = anc(main, 1, 5)
    assert (a.value_j, a.value_k) == (c[0], c[3])
    assert anc(main, 3, 3).ancestor and anc(main, 3, 3).visits.total == 0    # j == k: nothing to visit
    # across the force-push: not provable, whichever side
    for j in range(1, 6):
        assert not anc(main, j, 6).ancestor
        assert not anc(main, j, 10).ancestor
    assert anc(main, 6, 6).ancestor
    assert not anc(main, 6, 7).ancestor                # x -> c4 not a fast-forward by the flags
    assert anc(main, 7, 11).ancestor                   # versions leaving main alone keep it
    # side: a force-push at 4
    assert anc(side, 3, 3).ancestor and not anc(side, 3, 4).ancestor
    # delete + recreate: false even though c0 is an ancestor of c5 in git
    a = anc(dr, 1, 9)
    assert not a.ancestor and (a.value_j, a.value_k) == (c[0], c[5])
    assert not anc(dr, 8, 9).ancestor                  # deleted at 8: no value at j
    assert anc(dr, 8, 9).value_j is None
    assert anc(dr, 9, 11).ancestor
    # a ref that did not exist at j
    a = anc(late, 5, 11)
    assert not a.ancestor and a.value_j is None and a.value_k == c[5]
    assert anc(late, 10, 11).ancestor
    assert not anc("refs/heads/never", 1, 11).ancestor
    assert not anc(main, 5, 4).ancestor                # j > k


def build_ff_history(repo: Path, n: int) -> tuple[RefStore, list[str], dict[int, str]]:
    """N versions (the import plus N-1 pushes): main fast-forwards in most,
    every third also force-moves `side` between two unrelated commits.
    Returns the store, main's chain and side's value per version."""
    chain = commits(repo, n)
    s1, s2 = commits(repo, 1, tag="s1")[0], commits(repo, 1, tag="s2")[0]
    h.git("update-ref", "refs/heads/main", chain[0], cwd=str(repo))
    h.git("update-ref", "refs/heads/side", s1, cwd=str(repo))
    store = open_store(repo)
    assert store.sync() == 1
    side = {1: s1}
    cur_side = s1
    for v in range(2, n + 1):
        ch = [RefChange("refs/heads/main", chain[v - 2], chain[v - 1], ff=True)]
        if v % 3 == 0:
            nxt = s2 if cur_side == s1 else s1
            ch.append(RefChange("refs/heads/side", cur_side, nxt, ff=False))
            cur_side = nxt
        assert ok(store, ch) == v
        side[v] = cur_side
    return store, chain, side


@pytest.mark.parametrize("n", [10, 100, 1000])
def test_ancestry_visits_are_logarithmic(tmp_path, n):
    repo = empty_repo(tmp_path / "repo.git")
    store, chain, _ = build_ff_history(repo, n)
    assert store.latest() == n
    assert store.verify().ok
    worst = 0
    for j in range(1, n + 1):           # every j against the latest version
        a = store.is_ancestor("refs/heads/main", j, n)
        assert a.ancestor and a.value_j == chain[j - 1] and a.value_k == chain[n - 1], j
        assert a.visits.total <= bound(n), (j, a.visits)
        assert a.visits.total <= bound(n - j), (j, a.visits)
        worst = max(worst, a.visits.total)
    rnd = random.Random(n)
    for _ in range(300):                # and a sample of arbitrary ranges, for both refs
        j = rnd.randint(1, n)
        k = rnd.randint(j, n)
        a = store.is_ancestor("refs/heads/main", j, k)
        assert a.ancestor
        assert a.visits.total <= bound(k - j), (j, k, a.visits)
        s = store.is_ancestor("refs/heads/side", j, k)
        forced = any(v % 3 == 0 for v in range(j + 1, k + 1))
        assert s.ancestor == (not forced), (j, k)
        assert s.visits.total <= bound(k - j), (j, k, s.visits)
    # a linear walk would visit n - 1 versions; the segments keep it logarithmic
    if n >= 100:
        assert worst < (n - 1) / 4
    assert worst >= 1
    segs, rows, top = db.segment_counts(store.conn)
    assert top == segments.levels(n) - 1
    assert segs <= n


def test_tips_map_a_commit_to_the_versions_that_made_it_a_tip(tmp_path):
    repo = empty_repo(tmp_path / "repo.git")
    a, b, c = commits(repo, 3)
    h.git("update-ref", "refs/heads/main", a, cwd=str(repo))
    store = open_store(repo)
    store.sync()
    assert store.tips(a).tips == ((1, "refs/heads/main"),)
    v2 = ok(store, [RefChange("refs/heads/main", a, b, ff=True)])
    v3 = ok(store, [RefChange("refs/heads/topic", ZERO, b)])
    v4 = ok(store, [RefChange("refs/heads/main", b, c, ff=True)])
    t = store.tips(b)
    assert t.tips == ((v2, "refs/heads/main"), (v3, "refs/heads/topic"))
    assert t.first == (v2, "refs/heads/main")
    assert t.visits.total == 1                  # one index lookup
    assert store.tips(c).tips == ((v4, "refs/heads/main"),)
    assert store.tips("f" * 40).tips == () and store.tips("f" * 40).first is None
    # the tip found answers the planner's question: b (main at v2) is an ancestor of main now
    assert store.is_ancestor("refs/heads/main", t.first[0], store.latest()).ancestor


# ---------------------------------------------------------------- segments

def test_segments_stay_bounded_under_create_delete_churn(tmp_path):
    repo = empty_repo(tmp_path / "repo.git")
    a, b = commits(repo, 2)
    h.git("update-ref", "refs/heads/main", a, cwd=str(repo))
    store = open_store(repo)
    store.sync()
    churn = "refs/heads/churn"
    for i in range(2000):
        ok(store, [RefChange(churn, ZERO, b)] if i % 2 == 0 else [RefChange(churn, b, ZERO)])
    n = store.latest()
    assert n == 2001
    assert churn not in disk_refs(repo)
    rep = store.compact()
    assert rep.versions == n and rep.nodes_built == 0       # pushes compacted as they landed
    segs, rows, top = db.segment_counts(store.conn)
    assert (rep.segments, rep.segment_rows, rep.levels) == (segs, rows, top)
    # a binary counter: at most one node per version, log2(N) levels, and each node
    # summarises only the refs touched inside it -- here one
    assert segs <= n
    assert top == segments.levels(n) - 1 == 9      # nodes with index 0 are never built
    assert rows == segs
    assert rows <= n * math.log2(n)
    built = sum(1 for v in range(2, n + 1) for _ in segments.nodes_ending_at(v))
    assert segs == built
    # churn is no fast-forward: between two of its creations the answer is false, found at the first node
    for j in range(2, n - 1, 2):                # even versions create the ref
        a_ = store.is_ancestor(churn, j, n - 1)
        assert not a_.ancestor and a_.value_j == b and a_.value_k == b
        assert a_.visits.total == 1, (j, a_.visits)
    # a ref the churn leaves alone is still proved across the whole range, in few visits
    m = store.is_ancestor("refs/heads/main", 1, n)
    assert m.ancestor and m.visits.total <= bound(n)
    assert m.visits.total <= 2 * segments.levels(n) + 2
    assert store.verify().ok


def test_compact_after_the_fact_builds_missing_nodes(tmp_path):
    repo = empty_repo(tmp_path / "repo.git")
    store, chain, side = build_ff_history(repo, 64)
    n = store.latest()
    assert n == 64
    before = {(j, k): store.is_ancestor(ref, j, k).ancestor
              for ref in ("refs/heads/main", "refs/heads/side") for j in (1, 2, 7, 30) for k in (33, 64)}
    assert store.is_ancestor("refs/heads/main", 1, n).visits.total <= bound(n)
    # simulate versions no compaction ever saw (e.g. written by an older Aspen, or a crash)
    sql_write(store, "DELETE FROM segments", "DELETE FROM segment_refs",
              "UPDATE state SET value = '1' WHERE key = 'compacted_through'")
    slow = store.is_ancestor("refs/heads/main", 1, n)
    assert slow.ancestor
    assert (slow.visits.versions, slow.visits.segments) == (n - 1, 0)       # one by one
    rep = store.compact()
    expected = sum(1 for v in range(2, n + 1) for _ in segments.nodes_ending_at(v))
    assert rep.nodes_built == expected > 0
    assert (rep.versions, rep.segments) == (n, expected)
    assert sql(store, "SELECT value FROM state WHERE key = 'compacted_through'") == [(str(n),)]
    fast = store.is_ancestor("refs/heads/main", 1, n)
    assert fast.ancestor and fast.visits.total <= bound(n) and fast.visits.segments >= 1
    after = {(j, k): store.is_ancestor(ref, j, k).ancestor
             for ref in ("refs/heads/main", "refs/heads/side") for j in (1, 2, 7, 30) for k in (33, 64)}
    assert after == before
    assert store.compact().nodes_built == 0                     # nothing left to build
    assert store.verify().ok


def test_external_versions_are_compacted_too(tmp_path):
    repo = empty_repo(tmp_path / "repo.git")
    chain = commits(repo, 17)
    h.git("update-ref", "refs/heads/main", chain[0], cwd=str(repo))
    store = open_store(repo)
    store.sync()
    for i in range(1, 17):          # 16 changes made with git, each seen by a sync
        h.git("update-ref", "refs/heads/main", chain[i], cwd=str(repo))
        assert store.sync() == i + 1
    log = list(store.log())
    assert [v.kind for v in log] == ["external"] * 16 + ["import"]
    assert all(not u.ff for v in log for u in v.updates)            # outside changes prove nothing
    assert store.compact().nodes_built == 0
    segs, _, top = db.segment_counts(store.conn)
    assert segs == sum(1 for v in range(2, 18) for _ in segments.nodes_ending_at(v)) and top == 3
    a = store.is_ancestor("refs/heads/main", 1, 17)
    assert not a.ancestor and a.visits.total == 1


# ---------------------------------------------------------------- schema

@pytest.mark.sqlite_store("the file's PRAGMAs and sqlite_master")
def test_schema_version_recorded_and_reopening_does_not_migrate(tmp_path):
    repo = h.make_history(tmp_path / "repo.git")
    store = open_store(repo)
    store.sync()
    assert store.path == str(repo / "aspen" / "aspen.sqlite3")
    assert sql(store, "PRAGMA user_version") == [(db.SCHEMA_VERSION,)]
    assert sql(store, "PRAGMA journal_mode") == [("wal",)]
    tables = {n for (n,) in sql(store, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"versions", "updates", "tips", "introduced", "refs", "segments", "segment_refs", "state"} <= tables
    cookie = sql(store, "PRAGMA schema_version")
    master = sql(store, "SELECT type, name, sql FROM sqlite_master ORDER BY name")
    # reopen: in another thread (a new connection) and in another process (the CLI)
    assert in_new_thread(lambda: open_store(repo).sync()) == 1
    res = subprocess.run([ASPEN, "log", str(repo), "--json"], capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.splitlines()) == 1
    assert sql(store, "PRAGMA schema_version") == cookie          # no DDL ran again
    assert sql(store, "SELECT type, name, sql FROM sqlite_master ORDER BY name") == master
    assert sql(store, "PRAGMA user_version") == [(db.SCHEMA_VERSION,)]
    assert [v.kind for v in store.log()] == ["import"]


@pytest.mark.sqlite_store("migrations of older SQLite files")
def test_a_schema_3_store_gains_commit_parents_and_builds_record_them(tmp_path):
    repo = h.make_history(tmp_path / "repo.git")
    store = open_store(repo)
    store.sync()
    store.conn.execute("DROP TABLE commit_parents")
    store.conn.execute("PRAGMA user_version = 3")
    store = in_new_thread(lambda: open_store(repo))      # a new connection migrates: the versions stay
    assert sql(store, "PRAGMA user_version") == [(db.SCHEMA_VERSION,)] and db.SCHEMA_VERSION >= 4
    assert [v.kind for v in store.log()] == ["import"]
    assert sql(store, "SELECT count(*) FROM commit_parents") == [(0,)]
    builder.build_packs(store)
    commits = h.out("rev-list", "--all", "--parents", cwd=str(repo)).splitlines()
    facts = store.commit_facts([c.split()[0] for c in commits])
    assert {c: p for c, (_, p) in facts.items()} == {c.split()[0]: tuple(c.split()[1:]) for c in commits}
    assert {v for v, _ in facts.values()} == {(1,)}


@pytest.mark.sqlite_store("migrations of older SQLite files")
def test_a_schema_4_store_gains_commit_times_and_a_later_record_fills_them(tmp_path):
    repo = h.make_history(tmp_path / "repo.git")
    store = open_store(repo)
    store.sync()
    builder.build_packs(store)
    lines = h.out("rev-list", "--all", "--parents", "--timestamp", cwd=str(repo)).splitlines()
    times = {line.split()[1]: int(line.split()[0]) for line in lines}
    assert store.commit_times(list(times)) == times                  # recorded by the build
    store.conn.execute("ALTER TABLE commit_parents DROP COLUMN ctime")
    store.conn.execute("PRAGMA user_version = 4")
    store = in_new_thread(lambda: open_store(repo))
    assert sql(store, "PRAGMA user_version") == [(db.SCHEMA_VERSION,)]
    assert store.commit_times(list(times)) == {}                      # older rows: no time, git is asked
    assert set(store.commit_facts(list(times))) == set(times)         # their parents stay
    one = next(iter(times))
    parents = store.commit_facts([one])[one][1]
    db.write(store.conn, lambda conn: db.insert_parents(conn, {one: parents}, {one: times[one]}))
    assert store.commit_times(list(times)) == {one: times[one]}
    db.write(store.conn, lambda conn: db.insert_parents(conn, {one: parents}, {one: 1}))
    assert store.commit_times([one]) == {one: times[one]}             # the first time recorded stays


def test_deleting_the_state_directory_reimports(tmp_path):
    repo = h.make_history(tmp_path / "repo.git")
    store = open_store(repo)
    store.sync()
    a = h.out("rev-parse", "topic", cwd=str(repo))
    ok(store, [RefChange("refs/heads/new", ZERO, a)])
    assert store.latest() == 2
    store.conn.close()
    shutil.rmtree(repo / "aspen")
    fresh = in_new_thread(lambda: (lambda s: (s.sync(), [v.kind for v in s.log()],
                                              s.snapshot().by_name()["refs/heads/new"].oid))(open_store(repo)))
    assert fresh == (1, ["import"], a)


# ---------------------------------------------------------------- the advertisement view

def rich_repo(path: Path) -> Path:
    repo = h.make_history(path)
    g = lambda *a: h.git(*a, cwd=str(repo))  # noqa: E731
    g("update-ref", "refs/heads/feature/deep/x", "topic")
    g("tag", "-a", "-m", "tag of a tag", "tt", "v1.0")
    g("tag", "-a", "-m", "tag of a tag of a tag", "ttt", "tt")
    tree = h.out("rev-parse", "main^{tree}", cwd=str(repo))
    g("tag", "-a", "-m", "a tag of a tree", "treetag", tree)
    g("update-ref", "refs/remotes/origin/main", "topic")
    g("symbolic-ref", "refs/remotes/origin/HEAD", "refs/remotes/origin/main")
    g("symbolic-ref", "refs/heads/alias", "refs/heads/topic")
    g("symbolic-ref", "refs/remotes/dangling/HEAD", "refs/remotes/dangling/gone")
    for ref, value in (("refs/heads/main", "topic"), ("refs/heads/second", "main"), ("refs/tags/v1", "v1.0")):
        g("update-ref", f"refs/namespaces/team/{ref}", value)
    g("symbolic-ref", "refs/namespaces/team/HEAD", "refs/namespaces/team/refs/heads/main")
    g("symbolic-ref", "refs/namespaces/team/refs/heads/alias", "refs/namespaces/team/refs/heads/second")
    g("update-ref", "refs/namespaces/bare/refs/heads/only", "main")       # a namespace without HEAD
    g("update-ref", "refs/namespaces/detached/refs/heads/x", "main")
    (repo / "refs" / "namespaces" / "detached" / "HEAD").write_text(h.out("rev-parse", "topic", cwd=str(repo)) + "\n")
    g("pack-refs", "--all")
    # a ref whose object does not exist (written by hand: git refuses to)
    (repo / "refs" / "heads" / "missing").write_text("1234567890abcdef1234567890abcdef12345678\n")
    return repo


HEADS = {
    "branch": lambda r: h.git("symbolic-ref", "HEAD", "refs/heads/main", cwd=str(r)),
    "via-symref": lambda r: h.git("symbolic-ref", "HEAD", "refs/heads/alias", cwd=str(r)),
    "detached": lambda r: (r / "HEAD").write_text(h.out("rev-parse", "topic", cwd=str(r)) + "\n"),
    "detached-tag": lambda r: (r / "HEAD").write_text(h.out("rev-parse", "refs/tags/v1.0", cwd=str(r)) + "\n"),
    "unborn": lambda r: h.git("symbolic-ref", "HEAD", "refs/heads/unborn", cwd=str(r)),
}


@pytest.mark.parametrize("head", list(HEADS))
def test_snapshot_equals_gits_view(tmp_path, head):
    repo = rich_repo(tmp_path / "repo.git")
    HEADS[head](repo)
    env = env_for(repo)
    store = open_store(repo)
    store.sync()
    names = {r.name for r in store.snapshot().refs}
    assert {"refs/heads/missing", "refs/remotes/origin/HEAD", "refs/heads/alias", "refs/tags/ttt",
            "refs/namespaces/team/HEAD"} <= names
    assert store.snapshot().by_name()["refs/heads/missing"].missing
    for ns in (None, "team", "bare", "detached", "nobody"):
        assert store.snapshot(ns) == reader.read_refs(str(repo), env, ns), ns
    team = store.snapshot("team")
    assert team.head is not None and team.head_target == "refs/heads/main"
    assert team.by_name()["refs/heads/alias"].symref_target == "refs/heads/second"
    # the view follows a commit (the in-process cache is keyed by the latest version)
    topic = h.out("rev-parse", "topic", cwd=str(repo))
    main = h.out("rev-parse", "main", cwd=str(repo))
    ok(store, [RefChange("refs/heads/topic", topic, main, ff=True),
               RefChange("refs/namespaces/team/refs/heads/new", ZERO, topic)])
    for ns in (None, "team"):
        assert store.snapshot(ns) == reader.read_refs(str(repo), env, ns), ns
    # the ref with a missing object is a problem verify names (and nothing else is)
    problems = store.verify().problems
    assert any("refs/heads/missing" in p for p in problems)
    assert all("missing" in p or "1234567890abcdef" in p for p in problems), problems


# ---------------------------------------------------------------- regressions of bugs found while writing these tests

def test_voided_version_leaves_no_tips(tmp_path):
    """A writer killed after its version is committed to the store but before git
    wrote the ref (fault point store-committed); the disk then moves on without
    it, so recovery voids the version. Nothing may claim that version made its
    commit a tip: the planner would take a have of that commit as proof that
    the client holds the ref's (unchanged) value."""
    repo = h.make_history(tmp_path / "repo.git")
    main = h.out("rev-parse", "main", cwd=str(repo))
    topic = h.out("rev-parse", "topic", cwd=str(repo))
    store = open_store(repo)
    store.sync()
    code = (f"import os\n"
            f"from aspen_cgi.refstore.store import RefStore\n"
            f"from aspen_cgi.runtime.repository import Repository\n"
            f"from aspen_cgi.model.versions import RefChange, VersionMeta\n"
            f"env = dict(os.environ, GIT_DIR={str(repo)!r}, ASPEN_FAULT='store-committed')\n"
            f"s = RefStore.open(Repository.of({str(repo)!r}, env))\n"
            f"s.sync()\n"
            f"s.commit([RefChange('refs/heads/main', {main!r}, {topic!r})], VersionMeta('push', 'w', "
            f"introduced=({topic!r},)))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60,
                         cwd=str(Path(__file__).resolve().parent.parent))
    assert res.returncode == -9, res.stderr                        # killed itself at the fault point
    assert h.out("rev-parse", "main", cwd=str(repo)) == main        # git never wrote it
    elsewhere = h.out("rev-parse", "v1.0^{}", cwd=str(repo))
    h.git("update-ref", "refs/heads/main", elsewhere, main, cwd=str(repo))   # the disk moves on
    store.sync()
    v2 = [v for v in store.log() if v.id == 2][0]
    assert (v2.kind, v2.state, [(u.old, u.new) for u in v2.updates]) == ("push", "done", [(main, main)])
    assert store.verify().ok
    assert store.tips(topic).tips == ((1, "refs/heads/topic"),)     # fails: (2, refs/heads/main) is there too
    assert store.introduced_by(topic) == []


def test_deleting_the_state_directory_under_a_running_process_reimports(tmp_path):
    """DESIGN §3: deleting aspen/ returns the repository to stock behaviour and
    Aspen re-imports on next use. A server's worker thread opens the store
    for each request; the next request after the deletion must use a new file."""
    repo = h.make_history(tmp_path / "repo.git")
    store = open_store(repo)
    store.sync()
    shutil.rmtree(repo / "aspen")
    again = open_store(repo)           # the same thread's next request
    again.sync()
    topic = h.out("rev-parse", "topic", cwd=str(repo))
    ok(again, [RefChange("refs/heads/after", ZERO, topic)], who="w")
    assert (repo / "aspen" / h.store_file(repo)).is_file()          # fails: never created again
    res = subprocess.run([ASPEN, "log", str(repo), "--json"], capture_output=True, text=True, timeout=60)
    kinds = [json.loads(line)["kind"] for line in res.stdout.splitlines()]
    assert kinds == ["push", "import"]


@pytest.mark.sqlite_store("migrations of older SQLite files")
def test_a_schema_5_store_gains_push_certificates(tmp_path):
    """Migration 6: a table of push certificates beside the versions; a version
    written with a certificate reads back with it, the others without."""
    from aspen_cgi.model.versions import PushCert, RefChange, VersionMeta
    repo = h.make_history(tmp_path / "repo.git")
    store = open_store(repo)
    store.sync()
    store.conn.execute("DROP TABLE push_certs")
    store.conn.execute("PRAGMA user_version = 5")
    store = in_new_thread(lambda: open_store(repo))
    assert sql(store, "PRAGMA user_version") == [(db.SCHEMA_VERSION,)] and db.SCHEMA_VERSION >= 6
    assert [(v.kind, v.cert) for v in store.log()] == [("import", None)]
    main = h.out("rev-parse", "main", cwd=str(repo))
    topic = h.out("rev-parse", "topic", cwd=str(repo))
    cert = PushCert("c" * 40, "A U Thor <a@x>", "0123456789ABCDEF", "G", "SLOP", "5-abc", 3, b"certificate\n")
    assert store.commit([RefChange("refs/heads/signed", ZERO, main, otype="commit")],
                        VersionMeta("push", "alice", "p1", cert=cert)) is None
    assert store.commit([RefChange("refs/heads/plain", ZERO, topic, otype="commit")],
                        VersionMeta("push", "bob", "p2")) is None
    log = list(store.log())
    assert [(v.who, v.cert) for v in log] == [("bob", None), ("alice", cert), (None, None)]
    assert sql(store, "SELECT version, status, cert FROM push_certs") == [(log[1].id, "G", b"certificate\n")]
