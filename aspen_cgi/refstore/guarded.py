"""The ref store opened for background work (pack builds, pre-warm,
imports) under a RepoGuard (runtime/repoguard.py): never made where it is
missing, and the files opening it made are the guard's to remove."""

from __future__ import annotations

import os

from ..runtime.repoguard import STORE_FILES, RepoGuard, RepositoryGone, abandon, identity
from ..runtime.repository import Repository
from .store import RefStore


def open_store(repo: Repository, guard: RepoGuard):
    """The repository's store for background work (None when there is none):
    never made where missing, and the files opening it made (SQLite's log
    and shared memory when no other connection had them open) are GUARD's to
    remove in undo(); removed at once, raising RepositoryGone, when the
    repository turns out gone by the time it is open."""
    base = os.path.join(guard.state_dir or "", "aspen.sqlite3")
    before = {s for s in STORE_FILES if os.path.lexists(base + s)}
    guard.check()
    store = RefStore.open(repo, create=False)
    if store is None:
        return None
    for s in STORE_FILES:
        ident = identity(base + s) if s not in before else None
        if ident is not None:
            guard.files.append((base + s, ident))
    if not guard.alive():
        abandon(store)
        guard.undo()
        raise RepositoryGone(repo.gitdir)
    guard.watch_store(store)
    return store
