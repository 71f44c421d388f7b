"""Whether anyone clones a repository with `--depth 1`: upload.py notes each
such request by touching DEMAND_FILE in the repository's state directory (at
most once a minute), and a push pre-warms (fetch/prewarm.py) only where one
came within ASPEN_PREWARM_DEMAND_S."""

from __future__ import annotations

import os
import time

from .. import settings

DEMAND_FILE = "depth1.asked"
NOTE_EVERY_S = 60.0


def demand_effect(sdir: str) -> tuple[str, str, str]:
    """note_demand as a replayed request does it (http/replay.py): the file's mtime now."""
    return ("touch", os.path.join(sdir, DEMAND_FILE), "")


def note_demand(sdir: str) -> None:
    """A client asked for a depth-1 clone of the repository whose state lives in SDIR."""
    path = os.path.join(sdir, DEMAND_FILE)
    try:
        if time.time() - os.stat(path).st_mtime < NOTE_EVERY_S:
            return
        os.utime(path)
    except FileNotFoundError:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
        except OSError:
            pass             # no state directory (yet): the next request notes it
    except OSError:
        pass


def demanded(sdir: str, s: settings.Settings) -> bool:
    """Whether a client asked for a depth-1 clone within the demand window."""
    window = s.prewarm_demand
    try:
        return time.time() - os.stat(os.path.join(sdir, DEMAND_FILE)).st_mtime <= window
    except OSError:
        return False
