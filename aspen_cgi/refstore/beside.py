"""A repository's ref store made beside the request that first reads it,
not in its way: in a long-lived server, an advertisement or ls-refs of a
repository that has no store yet is answered from the refs on disk, as
stock reads them, while a thread makes the store for the fetch that follows
(measured on the bench's medium repository: making it took 9.8 ms, and a
first ls-refs cost 13.4 ms against stock's 5.6 ms). Fetches, pushes and
time-travel reads still make it at once: they need its history.

The thread runs niced, once per repository at a time, under a RepoGuard
(runtime/repoguard.py): the store's directory is made one level only, and
a repository deleted, moved or replaced meanwhile is left as that left it."""

from __future__ import annotations

import os
import threading
import time
from typing import Mapping

from .. import settings
from ..runtime.repoguard import RepoGuard, RepositoryGone, abandon
from ..runtime.statedir import state_dir
from . import db
from .guarded import open_store
from .store import release_thread

NICE = 10
RETRY_AFTER = 60.0      # seconds before a repository whose store could not be made is tried again

_lock = threading.Lock()
_making: set[str] = set()
_failed: dict[str, float] = {}


def missing(gitdir: str, env: Mapping[str, str]) -> bool:
    """The store is on, and GITDIR has none yet."""
    s = settings.of(env)
    return s.refstore and not os.path.exists(os.path.join(state_dir(gitdir, s), "aspen.sqlite3"))


def make(gitdir: str, env: Mapping[str, str]) -> None:
    """Start making GITDIR's store in a thread, unless one is at it (or one
    failed less than RETRY_AFTER seconds ago: a read-only repository)."""
    with _lock:
        if gitdir in _making or time.monotonic() < _failed.get(gitdir, 0.0):
            return
        _making.add(gitdir)
    threading.Thread(target=_run, args=(gitdir, dict(env)), daemon=True, name="aspen-store").start()


def _run(gitdir: str, env: dict) -> None:
    made = False
    try:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
        except OSError:
            pass
        made = _make(gitdir, env)
    except (RepositoryGone, OSError, db.Error, db.Busy):
        pass
    finally:
        release_thread()
        with _lock:
            _making.discard(gitdir)
            if not made:
                _failed[gitdir] = time.monotonic() + RETRY_AFTER
            else:
                _failed.pop(gitdir, None)


def _make(gitdir: str, env: dict) -> bool:
    sdir = state_dir(gitdir, settings.of(env))
    guard = RepoGuard.take(gitdir, None)
    if guard is None:
        return False
    if not os.path.isdir(sdir):
        if sdir == os.path.join(gitdir, "aspen"):
            guard.mkdir(sdir)
        else:
            os.makedirs(sdir, exist_ok=True)     # ASPEN_STATE_DIR: outside the repository
    guard.state_dir = sdir
    guard.watch(sdir)
    with db.patience(db.READ_WAIT):
        store = open_store(gitdir, env, guard)
        if store is None:
            return False
        db.retry(store.sync)
    if not guard.alive():
        abandon(store)
        guard.undo()
        return False
    return True
