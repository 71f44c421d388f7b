"""Ref updates for a push: one version in the ref store with compare-and-swap
on every old value (the store drives git's lock-file protocol), or, where a
repository has no store, the same transaction through `git update-ref`
alone. Of two racing pushes to one ref exactly one wins; the loser gets git's
own error text, as stock's receive-pack reports it."""

from __future__ import annotations

from typing import Optional, Sequence

from ..model.versions import ZERO, RefChange, VersionMeta
from ..refstore import db, diskrefs
from ..refstore.registry import replica_mode
from ..refstore.store import RefStore
from ..runtime import pollfiles
from ..runtime.repository import Repository

__all__ = ["ZERO", "RefChange", "VersionMeta", "transaction"]


def in_process_ok(config, bare: bool) -> bool:
    """Whether refs may be written without git: no reflog to append (bare
    repositories log nothing unless core.logAllRefUpdates says so) and no
    shared-repository permissions to apply."""
    false = ("false", "no", "off", "0")
    lau = config.get("core.logallrefupdates")
    shared = config.get("core.sharedrepository")
    logs = (not bare) if lau is None else lau.strip().lower() not in false
    return not logs and (shared is None or shared.strip().lower() in false + ("umask",))


def transaction(store: Optional[RefStore], repo: Repository, changes: Sequence[RefChange],
                meta: VersionMeta, log: Optional[list] = None, fast: bool = False,
                trace: Optional[dict] = None) -> Optional[str]:
    """Apply CHANGES all or nothing. None on success, else git's error text
    (without its `fatal: ` prefix), as stock's rp_error shows it. TRACE (the
    request's) counts `pushed_versions`: versions the store committed.

    Whatever the outcome, the repository's poll files (runtime/pollfiles.py)
    are removed before this returns, so before the push is acknowledged."""
    if not changes:
        return None
    try:
        return _transaction(store, repo, changes, meta, log, fast, trace)
    finally:
        if not pollfiles.invalidate(repo.gitdir, repo.settings) and log is not None:
            log.append(f"aspen: poll files of {repo.gitdir} not removed (ASPEN_POLL_DIR cannot be written)\n")


def _transaction(store: Optional[RefStore], repo: Repository, changes: Sequence[RefChange],
                 meta: VersionMeta, log: Optional[list], fast: bool, trace: Optional[dict]) -> Optional[str]:
    replica = replica_mode(repo.settings)
    if store is None and replica:
        if log is not None:
            log.append("aspen: ref log unavailable for this push; refused\n")
        return "failed to update ref (the ref log is unavailable)"
    if store is not None:
        try:
            err = store.commit(changes, meta, fast)
            if err is None and trace is not None:
                trace["pushed_versions"] = trace.get("pushed_versions", 0) + 1
            return err
        except (db.Error, db.Busy) as e:
            if replica:     # the log is the truth: nothing is written, the client is told
                if log is not None:
                    log.append(f"aspen: ref log unavailable for this push ({e}); refused\n")
                return "failed to update ref (the ref log is unavailable)"
            # the disk is the truth: the next request records what happened as an external version
            if log is not None:
                log.append(f"aspen: ref store unavailable for this push ({e}); refs written by git alone\n")
    return diskrefs.apply(repo, changes)
