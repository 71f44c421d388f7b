"""Marks of proc-receive hooks running. The refs such a hook moves on disk
are its push's version, recorded when the hook ends (push/flow.py); while a
mark stands, another process's or thread's sync records no `external`
version from the disk (RefStore._sync_disk), so a fetch or a builder
looking meanwhile does not take the hook's changes from its push. A mark
names its owner (host, pid, start time, thread); one whose owner is dead
is removed by the next look."""

from __future__ import annotations

import os
import threading
from typing import Optional

from ..runtime.owners import owner_alive, owner_id

DIR = "hookruns"


class Mark:
    """This thread's mark in STATE_DIR while its hook runs (a context manager)."""

    def __init__(self, state_dir: str):
        self.path = os.path.join(state_dir, DIR, f"{owner_id()}+{threading.get_ident()}")
        self.made: Optional[str] = None

    def __enter__(self) -> "Mark":
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(self.path, "w"):
                pass
            self.made = self.path
        except OSError:
            pass                # then a sync meanwhile may record the hook's changes as external
        return self

    def __exit__(self, *exc) -> None:
        if self.made is not None:
            try:
                os.unlink(self.made)
            except OSError:
                pass


def running(state_dir: str) -> bool:
    """Whether a live owner's hook is running in STATE_DIR."""
    where = os.path.join(state_dir, DIR)
    try:
        names = os.listdir(where)
    except OSError:
        return False
    live = False
    for name in names:
        if owner_alive(name.rsplit("+", 1)[0]):
            live = True
            continue
        try:
            os.unlink(os.path.join(where, name))
        except OSError:
            pass
    return live
