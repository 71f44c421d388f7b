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

from . import harness as h


def _commit(repo: Path, message: str, *parents: str) -> str:
    tree = h.git("mktree", cwd=str(repo), input=b"").stdout.decode().strip()
    args = [x for p in parents for x in ("-p", p)]
    return h.out("commit-tree", tree, *args, "-m", message, cwd=str(repo))


def _store(repo: Path) -> RefStore:
    store = RefStore.open(str(repo), dict(os.environ, GIT_DIR=str(repo)))
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
