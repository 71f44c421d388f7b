"""Where services read refs: from the repository's ref store, brought up to
the disk first, or straight from the disk when there is no store (turned
off, read-only repository) or it fails."""

from __future__ import annotations

from typing import Optional

from ..git.reader import read_refs
from ..model.refs import RefSnapshot
from ..runtime.repository import Repository
from . import db
from .store import RefStore


def open_store(repo: Repository, log: Optional[list] = None) -> Optional[RefStore]:
    """The store brought up to the disk, or None. A store another process holds
    locked is waited for db.READ_WAIT seconds (or the enclosing patience, a
    push's), never longer: then the refs come from the disk."""
    try:
        with db.patience(db.READ_WAIT, keep_outer=True):
            store = RefStore.open(repo, log=log)
            if store is None:
                return None
            db.retry(store.sync)
    except (db.Error, db.Busy, OSError) as e:
        if log is not None:
            log.append(f"aspen: ref store unavailable ({e}); serving refs from disk\n")
        return None
    return store


def snapshot(store: Optional[RefStore], repo: Repository, namespace: Optional[str]) -> RefSnapshot:
    if store is not None:
        try:
            return store.snapshot(namespace)
        except (db.Error, db.Busy):
            pass
    return read_refs(repo.gitdir, repo.git_env, namespace)
