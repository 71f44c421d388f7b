"""What background work (pack builds, pre-warm, depth-1 wide answers) was
started for: a repository that may be deleted, moved or replaced at any
moment. A `RepoGuard` taken at the start records the (st_dev, st_ino) of
the repository, its objects/ and refs/, its state directory and the store's
files (HEAD and config present); `check()` raises `RepositoryGone` once
they differ. Work makes directories through it one level at a time (never
`makedirs`), so a deleted repository's directories are never re-created,
and `undo()` removes what the work made (the same inodes only) and, when the
repository is being deleted where it stands, what Aspen keeps in it.
`refstore/guarded.open_store()` opens the ref store for such work without making its
directory. A store whose repository went is never closed (`abandon`):
SQLite's close would delete the write-ahead log by name, a new
repository's if one replaced it."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Optional


class RepositoryGone(Exception):
    """The repository was deleted, moved or replaced while work for it ran."""


def identity(path: str) -> Optional[tuple[int, int]]:
    try:
        st = os.stat(path)
        return (st.st_dev, st.st_ino)
    except OSError:
        return None


class RepoGuard:
    """The repository background work was started for: its directories'
    identities, taken at the start and compared again by `alive()`. Files and
    directories the work makes go through `check()` first; directories made
    through `mkdir()` are removed again by `undo()` (when still empty and the
    same) once the repository is gone."""

    SETTLE = 2.0       # seconds undo() waits for a deletion under way to take HEAD, objects and refs

    def __init__(self, gitdir: str, state_dir: Optional[str] = None):
        self.gitdir = gitdir
        self.state_dir = state_dir
        self.present = [os.path.join(gitdir, "HEAD"), os.path.join(gitdir, "config")]   # rewritten by rename
        self.marks: list[tuple[str, tuple[int, int]]] = []
        self.made: list[tuple[str, tuple[int, int]]] = []      # directories made through mkdir()
        self.files: list[tuple[str, tuple[int, int]]] = []     # files made meanwhile (the store's, see open_store)
        for path in (gitdir, os.path.join(gitdir, "objects"), os.path.join(gitdir, "refs"), state_dir):
            if path:
                self.watch(path)
        if state_dir:
            for name in ("aspen.sqlite3", "aspen.sqlite3-writer"):      # the store's, made on first use
                self.watch(os.path.join(state_dir, name), optional=True)
        if not all(os.path.exists(p) for p in self.present):
            raise RepositoryGone(gitdir)

    def watch(self, path: str, optional: bool = False) -> None:
        """Count PATH (a directory or file the work uses, which keeps its
        inode while the repository lives) as part of the repository from now
        on; OPTIONAL: not when it does not exist."""
        if all(p != path for p, _ in self.marks):
            ident = identity(path)
            if ident is None:
                if optional:
                    return
                raise RepositoryGone(self.gitdir)
            self.marks.append((path, ident))

    def watch_store(self, store) -> None:
        """The store's files too, once its connection has read: SQLite keeps
        the write-ahead log and shared memory while a connection is open, so
        a `rm -rf` that starts with them is seen at once."""
        for suffix in ("", "-wal", "-shm", "-writer"):
            self.watch(store.path + suffix, optional=True)

    def alive(self) -> bool:
        return all(identity(p) == ident for p, ident in self.marks) and all(os.path.exists(p) for p in self.present)

    def check(self) -> None:
        if not self.alive():
            raise RepositoryGone(self.gitdir)

    def mkdir(self, path: str) -> None:
        """Make directory PATH (its parent must exist: nothing above it is re-created)."""
        self.check()
        try:
            os.mkdir(path)
        except FileExistsError:
            return
        ident = identity(path)
        if ident is not None:
            self.made.append((path, ident))

    def mkdtemp(self, prefix: str, dir: str) -> str:
        self.check()
        return tempfile.mkdtemp(prefix=prefix, dir=dir)

    def undo(self) -> None:
        """Once the repository is gone: remove the directories this work made,
        deepest first, if still empty and the same; then, when the repository
        is being deleted where it is (its directory the same one, and HEAD,
        objects and refs gone, waiting up to SETTLE seconds for them to go),
        what Aspen keeps inside it (`aspen/`), and its directory if that
        leaves it empty: what a `rm -rf` that ran meanwhile meant to delete,
        whatever this process (or the request pipeline it ran) made in it."""
        for path, ident in self.files:
            if identity(path) == ident:
                try:
                    os.unlink(path)
                except OSError:
                    pass
        self.files.clear()
        for path, ident in sorted(self.made, key=lambda m: -len(m[0])):
            if identity(path) == ident:
                try:
                    os.rmdir(path)
                except OSError:
                    pass
        self.made.clear()
        _clear_deleted(self.gitdir, self.marks[0][1], self.state_dir, self.SETTLE)

    @classmethod
    def take(cls, gitdir: str, state_dir: Optional[str]) -> Optional["RepoGuard"]:
        """The guard of the repository at GITDIR, or None when it is gone
        already (then what a deletion under way left of Aspen's state in it
        is cleared: `clear_leftovers`)."""
        try:
            return cls(gitdir, state_dir)
        except RepositoryGone:
            cls.clear_leftovers(gitdir, state_dir)
            return None

    @staticmethod
    def clear_leftovers(gitdir: str, state_dir: Optional[str], settle: float = SETTLE) -> None:
        """For work that found its repository gone before it started: what
        undo() does, for whatever directory is at GITDIR now, if it lacks
        HEAD, objects or refs."""
        ident = identity(gitdir)
        if ident is not None and not all(os.path.lexists(os.path.join(gitdir, n)) for n in ("HEAD", "objects", "refs")):
            _clear_deleted(gitdir, ident, state_dir, settle)


def _clear_deleted(gitdir: str, ident: tuple[int, int], state_dir: Optional[str], settle: float) -> None:
    """When the directory IDENT at GITDIR is a repository being deleted where it
    is (HEAD, objects and refs gone, waiting up to SETTLE seconds for them),
    remove Aspen's state inside it, then the directory if that leaves it empty."""
    if not state_dir or os.path.dirname(state_dir.rstrip("/")) != gitdir.rstrip("/"):
        return                  # the store lives elsewhere (ASPEN_STATE_DIR): nothing of it is in the way
    deadline = time.monotonic() + settle
    while any(os.path.lexists(os.path.join(gitdir, n)) for n in ("HEAD", "objects", "refs")):
        if identity(gitdir) != ident or time.monotonic() >= deadline:
            return              # moved, replaced, or not being deleted: not ours to touch
        time.sleep(0.02)
    if identity(gitdir) != ident or not os.path.isdir(state_dir):
        return
    shutil.rmtree(state_dir, ignore_errors=True)
    if identity(gitdir) == ident:
        try:
            os.rmdir(gitdir)        # only when nothing else is left in it
        except OSError:
            pass


_abandoned: list = []      # connections of stores whose repository went: never closed (see the module's note)


def abandon(store) -> None:
    _abandoned.append(store.conn)


STORE_FILES = ("", "-wal", "-shm", "-writer")
