"""Whether a push should run `git gc --auto`, decided in-process.

Stock's receive-pack runs `git gc --auto --quiet` after every push and gc
decides in C (need_to_gc) whether there is work: more loose objects in
objects/17 than gc.auto/256, or more local packs without a .keep than
gc.autoPackLimit. Asking the same two questions here saves a process on the
common answer, "nothing"; when either says yes, git's own gc --auto runs and
decides again.
"""

from __future__ import annotations

import os

from ..git.repoconfig import RepoConfig

_HEX = set("0123456789abcdef")


def needed(gitdir: str, config: RepoConfig) -> bool:
    threshold = config.int("gc.auto", 6700)
    if threshold <= 0:
        return False
    objects = os.environ.get("GIT_OBJECT_DIRECTORY") or os.path.join(gitdir, "objects")
    limit = (threshold + 255) // 256
    loose = 0
    try:
        with os.scandir(os.path.join(objects, "17")) as it:
            for e in it:
                if len(e.name) in (38, 62) and set(e.name) <= _HEX:
                    loose += 1
                    if loose > limit:
                        return True
    except OSError:
        pass
    pack_limit = config.int("gc.autopacklimit", 50)
    if pack_limit <= 0:
        return False
    try:
        names = os.listdir(os.path.join(objects, "pack"))
    except OSError:
        return False
    present = set(names)
    packs = sum(1 for n in names if n.endswith(".pack") and n[:-5] + ".keep" not in present
                and n[:-5] + ".idx" in present)
    return packs > pack_limit
