"""Claims on the ref lock files the in-process writer (diskrefs.LooseWrite)
holds while its version is written to the store, which may wait for the
store (ASPEN_STORE_WAIT). A claim names its owner (host, pid, start time)
and each lock's inode, so that the next push removes the locks of a writer
killed in that wait: git would refuse the ref until someone deleted the
`.lock` by hand. A git update-ref child needs no claim: it drops its own
locks when its writer dies and its input ends."""

from __future__ import annotations

import os
import threading
from typing import Optional, Sequence

from ..runtime.owners import owner_alive, owner_id

DIR = "reflocks"


def claim(state_dir: str, lock_paths: Sequence[str]) -> Optional[str]:
    """Record LOCK_PATHS as held by this thread; the claim's path, or None when it cannot be written."""
    lines = []
    for path in lock_paths:
        try:
            lines.append(f"{os.stat(path).st_ino} {path}\n")
        except OSError:
            pass
    where = os.path.join(state_dir, DIR)
    name = os.path.join(where, f"{owner_id()}+{threading.get_ident()}")
    try:
        os.makedirs(where, exist_ok=True)
        with open(name, "w") as f:
            f.writelines(lines)
    except OSError:
        return None
    return name


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
                if str(os.stat(lock).st_ino) == ino:
                    os.unlink(lock)
                    removed.append(lock)
            except OSError:
                pass
        release(path)
    return removed
