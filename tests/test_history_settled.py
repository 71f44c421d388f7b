"""The planner's history as of the latest settled version
(aspen_cgi/fetch/history.py): a version done but not yet packed, or a
push in flight, is not read; answers about settled versions are kept for
the process's later requests, and a version that settles later makes its
commits' answers new."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from aspen_cgi.fetch.history import StoreHistory
from aspen_cgi.packs import builder
from aspen_cgi.refstore.store import RefStore
from aspen_cgi.runtime.repository import Repository

from . import harness as h


def _commit(repo: Path, message: str, *parents: str) -> str:
    tree = h.git("mktree", cwd=str(repo), input=b"").stdout.decode().strip()
    args = [x for p in parents for x in ("-p", p)]
    return h.out("commit-tree", tree, *args, "-m", message, cwd=str(repo))


def _store(repo: Path) -> RefStore:
    store = RefStore.open(Repository.of(str(repo), dict(os.environ, GIT_DIR=str(repo))))
    assert store is not None
    return store


def _imported(tmp_path: Path) -> tuple[Path, RefStore, str]:
    """A repository of one commit on main, imported and packed: version 1."""
    repo = tmp_path / "r.git"
    h.git("init", "-q", "--bare", str(repo))
    a = _commit(repo, "a")
    h.git("update-ref", "refs/heads/main", a, cwd=str(repo))
    store = _store(repo)
    store.sync()
    builder.build_packs(store)
    return repo, store, a


def test_answers_name_settled_versions_only_and_follow_new_ones(tmp_path):
    repo, store, a = _imported(tmp_path)
    first = StoreHistory(store).tips(a)
    assert first.tips == ((1, "refs/heads/main"),)
    assert StoreHistory(store).tips(a) is first            # kept for the next request

    b = _commit(repo, "b", a)
    h.git("update-ref", "refs/heads/other", a, cwd=str(repo))
    h.git("update-ref", "refs/heads/main", b, cwd=str(repo))
    store.sync()                                            # version 2: done, no pack yet
    assert [v for v, _ in store.tips(a).tips] == [1, 2]    # the store has its rows ...
    unsettled = StoreHistory(store)
    assert unsettled.tips(a).tips == ((1, "refs/heads/main"),)    # ... the planner's history does not
    assert unsettled.tips(b).tips == () and unsettled.introduced_by(b) == []

    builder.build_packs(store)
    settled = StoreHistory(store)
    assert settled.tips(a).tips == ((1, "refs/heads/main"), (2, "refs/heads/other"))
    assert settled.tips(b).tips == ((2, "refs/heads/main"),)
    assert settled.introduced_by(b) == [2]
    assert settled.commit_facts([b]) == {b: ((2,), (a,))}


def test_a_store_made_again_at_the_same_path_is_another(tmp_path):
    repo, store, a = _imported(tmp_path)
    assert StoreHistory(store).tips(a).tips == ((1, "refs/heads/main"),)
    shutil.rmtree(repo / "aspen")
    h.git("update-ref", "-d", "refs/heads/main", cwd=str(repo))
    h.git("update-ref", "refs/heads/other", a, cwd=str(repo))
    again = _store(repo)
    again.sync()
    builder.build_packs(again)
    assert StoreHistory(again).tips(a).tips == ((1, "refs/heads/other"),)


def test_versions_that_settle_are_read_at_once_as_one_version_reads_them(tmp_path):
    from aspen_cgi.fetch import history
    repo, store, a = _imported(tmp_path)
    StoreHistory(store).tips(a)                              # this process has seen version 1 settle
    b = _commit(repo, "b", a)
    c = _commit(repo, "c", b)
    h.git("update-ref", "refs/heads/other", b, cwd=str(repo))
    store.sync()
    h.git("update-ref", "refs/heads/main", c, cwd=str(repo))
    h.git("update-ref", "-d", "refs/heads/other", cwd=str(repo))
    store.sync()
    builder.build_packs(store)
    hist = StoreHistory(store)
    identity = hist.identity()                               # settles versions 2 and 3 in this process
    for v in (2, 3):
        info = history.SHARED[(identity, "pack", v)]
        (name, _, _), boundary = store.version_pack(v)
        assert info == (name, tuple(boundary), store.version_refs(v))
        assert set(history.SHARED[(identity, "values", v)]) == set(store.version_values(v))
        assert history.SHARED[(identity, "introduced", v)] == frozenset(store.introduced_commits(v))
    assert history.SHARED[(identity, "pack", 3)].refs == ("refs/heads/main", "refs/heads/other")
    assert history.SHARED[(identity, "values", 3)] == (c,)   # a deletion writes no value
    assert hist.introduced_commits(2) == frozenset({b})


def test_the_versions_whose_boundary_holds_a_commit_follow_new_ones(tmp_path):
    repo, store, a = _imported(tmp_path)
    assert StoreHistory(store).bounded_by([a]) == {a: ()}
    b = _commit(repo, "b", a)
    h.git("update-ref", "refs/heads/main", b, cwd=str(repo))
    store.sync()
    assert StoreHistory(store).bounded_by([a]) == {a: ()}    # version 2 has no pack yet
    builder.build_packs(store)
    assert StoreHistory(store).bounded_by([a, b]) == {a: (2,), b: ()}
    c = _commit(repo, "c", a)
    h.git("update-ref", "refs/heads/side", c, cwd=str(repo))
    store.sync()
    builder.build_packs(store)
    assert StoreHistory(store).bounded_by([a]) == {a: (2, 3)}


class _Counting:
    """A store whose per-commit questions are counted (the rest passes through)."""

    def __init__(self, store: RefStore):
        self.store, self.asked = store, []

    def __getattr__(self, name):
        got = getattr(self.store, name)
        if name in ("tips_many", "introduced_by_many", "bounded_by_many", "commit_facts"):
            def counted(commits):
                self.asked.append((name, tuple(commits)))
                return got(commits)
            return counted
        return got


def test_the_commits_of_versions_that_settle_are_answered_without_asking_the_store_again(tmp_path):
    """The tips, introducing versions, boundaries and parents of the commits a
    newly settled version names are read when the process sees it settle;
    a request asking about them then asks the store nothing, and the
    answers equal the store's own."""
    repo, store, a = _imported(tmp_path)
    StoreHistory(store).tips(a)                              # this process has seen version 1 settle
    b = _commit(repo, "b", a)
    c = _commit(repo, "c", b)
    h.git("update-ref", "refs/heads/main", c, cwd=str(repo))
    h.git("update-ref", "refs/heads/side", b, cwd=str(repo))
    store.sync()
    builder.build_packs(store)
    StoreHistory(store).identity()                           # version 2 settles in this process
    counting = _Counting(store)
    hist = StoreHistory(counting)                            # type: ignore[arg-type]
    assert hist.tips_many([a, b, c]) == store.tips_many([a, b, c])
    assert hist.introduced_many([b, c]) == {b: [2], c: [2]}
    assert hist.bounded_by([a]) == {a: (2,)}
    assert hist.commit_facts([b, c]) == {b: ((2,), (a,)), c: ((2,), (b,))}
    assert counting.asked == []


def test_a_process_planning_first_for_a_store_reads_its_latest_pushes_at_once(tmp_path):
    """The first time a process plans for a store, the commits of its latest
    pushes (up to WARM_VERSIONS, never the import) are read at once: a
    lagging client's first fetch then asks the store nothing about them."""
    repo, store, a = _imported(tmp_path)
    b = _commit(repo, "b", a)
    h.git("update-ref", "refs/heads/main", b, cwd=str(repo))
    store.sync()
    c = _commit(repo, "c", b)
    h.git("update-ref", "refs/heads/main", c, cwd=str(repo))
    store.sync()
    builder.build_packs(store)
    StoreHistory(store).identity()                           # this process's first look: versions 1-3 settled
    counting = _Counting(store)
    hist = StoreHistory(counting)                            # type: ignore[arg-type]
    assert hist.tips_many([b, c]) == store.tips_many([b, c])
    assert hist.introduced_many([b, c]) == {b: [2], c: [3]}
    assert hist.commit_facts([b, c]) == {b: ((2,), (a,)), c: ((3,), (b,))}
    assert counting.asked == []


def test_fast_forward_answers_equal_the_stores_segment_query(tmp_path):
    """The planner's rule 2 (a ref only fast-forwarded from version j to k)
    is answered from each ref's latest update that was no fast-forward; on a
    seeded history of creations, fast-forwards, forced moves, deletions and
    re-creations of three refs it says what the store's segment query
    says, for every ref and every j <= k, and of j > k it says no."""
    import random

    from aspen_cgi.model.versions import RefChange, VersionMeta
    from aspen_cgi.refstore import db

    from .test_refstore import commits, empty_repo
    repo = empty_repo(tmp_path / "r.git")
    chain = commits(repo, 40)                     # chain[i] descends from every chain[j], j < i
    h.git("update-ref", "refs/heads/main", chain[0], cwd=str(repo))
    store = _store(repo)
    store.sync()
    rng = random.Random(7)
    at: dict[str, int] = {"refs/heads/main": 0}
    refs = ("refs/heads/main", "refs/heads/a", "refs/heads/b")
    for _ in range(60):
        ref = rng.choice(refs)
        old = at.get(ref)
        if old is None:
            new = rng.randrange(40)
            change = RefChange(ref, "0" * 40, chain[new])
        elif rng.random() < 0.15:
            new = None
            change = RefChange(ref, chain[old], "0" * 40)
        else:
            new = rng.randrange(40)
            if new == old:
                continue
            change = RefChange(ref, chain[old], chain[new], ff=new > old)
        assert store.commit([change], VersionMeta("push"), fast=True) is None
        if new is None:
            del at[ref]
        else:
            at[ref] = new
    n = store.latest()

    def record(conn) -> None:
        for v in range(1, n + 1):
            db.record_pack(conn, v, f"{v:040x}", 1, 1, 0.0, 0, 0, 0, ())
    db.write(store.conn, record)
    hist = StoreHistory(store)
    answers = 0
    for ref in refs:
        for k in range(1, n + 1):
            for j in range(1, n + 1):
                want = j <= k and store.is_ancestor(ref, j, k).ancestor
                assert hist.is_ancestor(ref, j, k).ancestor is want, (ref, j, k)
                answers += want
    assert answers > 100                          # the history has long fast-forward runs to say yes to
