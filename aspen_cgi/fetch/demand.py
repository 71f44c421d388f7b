"""Whether anyone clones a repository with `--depth 1`, or takes its
bundles: upload.py notes each such request by touching DEMAND_FILE (depth-1)
or BUNDLE_DEMAND_FILE (a bundle-uri answer or a bundle download) in the
repository's state directory (at most once a minute), and a push pre-warms
(fetch/prewarm.py) or keeps the bundle current (fetch/bundlekeep.py) only
where one came within ASPEN_PREWARM_DEMAND_S."""

from __future__ import annotations

import os
import time

from .. import settings

DEMAND_FILE = "depth1.asked"
BUNDLE_DEMAND_FILE = "bundle.asked"
NOTE_EVERY_S = 60.0


def demand_effect(sdir: str) -> tuple[str, str, str]:
    """note_demand as a replayed request does it (http/replay.py): the file's mtime now."""
    return ("touch", os.path.join(sdir, DEMAND_FILE), "")


def note_demand(sdir: str, name: str = DEMAND_FILE) -> None:
    """A client asked for a depth-1 clone (NAME: or a bundle) of the repository whose state lives in SDIR."""
    path = os.path.join(sdir, name)
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


def demanded(sdir: str, s: settings.Settings, name: str = DEMAND_FILE) -> bool:
    """Whether a client asked for a depth-1 clone (NAME: or a bundle) within the demand window."""
    window = s.prewarm_demand
    try:
        return time.time() - os.stat(os.path.join(sdir, name)).st_mtime <= window
    except OSError:
        return False
