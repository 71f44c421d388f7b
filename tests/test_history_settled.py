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
