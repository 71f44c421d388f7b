"""Claims on the ref lock files the in-process writer (diskrefs.LooseWrite)
holds while its version is written to the store, which may wait for the
store (ASPEN_STORE_WAIT). A claim names its owner (host, pid, start time)
and each lock's inode, written before the lock exists (Claim), so that the
next push removes the locks of a writer killed at any point: git would
refuse the ref until someone deleted the `.lock` by hand. (Claimed after
the lock was made, a writer killed between the two left an unclaimed lock:
a kill -9 of a whole server under four pushers did, once in some ten runs
of tests/test_faults.py.) A git update-ref child needs no claim: it drops its own
locks when its writer dies and its input ends."""

from __future__ import annotations

import os
import threading
from typing import Optional

from ..runtime.owners import owner_alive, owner_id

DIR = "reflocks"


class Claim:
    """This thread's claim on the locks it is taking, written before each
    lock exists: the writer claims a side name (`<ref>.aspen-<owner>.lock`,
    which git's ref iteration skips as it skips every `*.lock`, and which
    no other process ever makes), makes the lock's content under it,
    records that file's inode here, and only then links it to `<ref>.lock`
    (the exclusive step: it fails when the lock is held). A writer killed at
    any point leaves nothing that the next sweep cannot tell for its own: a
    lock with another inode is someone else's. (Claimed after it was made, a
    side name of a writer killed between the two stayed: once in a kill -9
    of a whole server under pushers, tests/test_faults.py.)"""

    def __init__(self, state_dir: str):
        owner = owner_id()          # host:pid:start
        self.path: Optional[str] = os.path.join(state_dir, DIR, f"{owner}+{threading.get_ident()}")
        # the owner's start time in the name: no other process, now or later, makes this file
        self.side = f".aspen-{owner.split(':', 1)[1].replace(':', '-')}-{threading.get_ident()}.lock"

    def side_name(self, ref_path: str) -> str:
        return ref_path + self.side

    def add_side(self, side: str) -> bool:
        """Record SIDE before it is made: whatever file has that name is this
        owner's (`-` for its inode); False when the claim cannot be written."""
        return self._write(f"- {side}\n")

    def add(self, ino: int, lock: str, side: str) -> bool:
        """Record LOCK (and its side name) as this thread's; False when the claim cannot be written."""
        return self._write(f"{ino} {lock}\n{ino} {side}\n")

    def _write(self, lines: str) -> bool:
        if self.path is None:
            return False
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(self.path, "a") as f:      # a line cut short by a kill names no file of that inode
                f.write(lines)
        except OSError:
            return False
        return True

    def release(self) -> None:
        if self.path is not None:
            release(self.path)
            self.path = None


def release(claim_path: Optional[str]) -> None:
    if claim_path is not None:
        try:
            os.unlink(claim_path)
        except OSError:
            pass


def sweep(state_dir: str) -> list[str]:
    """Remove the lock files claimed by dead owners (the same inode only:
    a lock taken since by a live writer is another file); the locks removed."""
    where = os.path.join(state_dir, DIR)
    try:
        names = os.listdir(where)
    except OSError:
        return []
    removed = []
    for name in names:
        if owner_alive(name.rsplit("+", 1)[0]):
            continue
        path = os.path.join(where, name)
        try:
            with open(path) as f:
                entries = [line.rstrip("\n").split(" ", 1) for line in f if " " in line]
        except OSError:
            continue
        for ino, lock in entries:
            try:
                if (_whole_side_name(lock) if ino == "-" else str(os.stat(lock).st_ino) == ino):
                    os.unlink(lock)
                    removed.append(lock)
            except OSError:
                pass
        release(path)
    return removed


def _whole_side_name(path: str) -> bool:
    """PATH is a side name as Claim makes them, not a line a kill cut short
    (which may name the ref itself)."""
    name = os.path.basename(path)
    return ".aspen-" in name and name.endswith(".lock")
