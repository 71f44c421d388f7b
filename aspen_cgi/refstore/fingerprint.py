"""A cheap fingerprint of a repository's ref files, to notice changes made
outside Aspen (stock server, `git update-ref`, `git gc --prune`/`pack-refs`).

It is the identity and modification time of HEAD, packed-refs and every
directory under refs/: git writes every loose ref by creating a `.lock` file
and renaming it into place, and a rename, create or unlink changes the
directory's mtime. Listing a directory is skipped when its stat is unchanged.

File-system timestamps are coarse (a kernel tick), so, like git's index, a
fingerprint whose newest mtime is within RACY_NS of the moment it was taken is
"racy": a change in the same tick could leave it unchanged. A racy fingerprint
is never trusted; the caller compares ref contents instead.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from dataclasses import dataclass

from ..model.racy import COARSE_RACY_NS, RACY_NS

# (path) -> (dir stat key, subdirectory names); only filled from non-racy listings
_listings: dict[str, tuple[tuple[int, int, int], list[str]]] = {}


@dataclass(frozen=True)
class Fingerprint:
    digest: str
    newest_ns: int
    taken_ns: int
    coarse: bool = False    # every timestamp seen was a whole second

    @property
    def trusted(self) -> bool:
        return self.taken_ns - self.newest_ns > (COARSE_RACY_NS if self.coarse else RACY_NS)


def _key(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def take(gitdir: str) -> Fingerprint:
    taken = time.time_ns()
    h = hashlib.sha1()
    newest = 0
    coarse = True
    for name in ("HEAD", "packed-refs"):
        try:
            st = os.stat(os.path.join(gitdir, name))
            h.update(f"{name} {_key(st)}\n".encode())
            newest = max(newest, st.st_mtime_ns, st.st_ctime_ns)
            coarse = coarse and st.st_mtime_ns % 1_000_000_000 == 0
        except OSError:
            h.update(f"{name} -\n".encode())
    stack = [os.path.join(gitdir, "refs")]
    while stack:
        path = stack.pop()
        try:
            st = os.stat(path)
        except OSError:
            h.update(f"{path} -\n".encode())
            continue
        if not stat.S_ISDIR(st.st_mode):
            continue
        key = _key(st)
        h.update(f"{path} {key}\n".encode())
        newest = max(newest, st.st_mtime_ns)
        coarse = coarse and st.st_mtime_ns % 1_000_000_000 == 0
        cached = _listings.get(path)
        if cached is not None and cached[0] == key:
            subdirs = cached[1]
        else:
            try:
                with os.scandir(path) as it:
                    subdirs = sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
            except OSError:
                subdirs = []
            if taken - st.st_mtime_ns > COARSE_RACY_NS:
                _listings[path] = (key, subdirs)
        stack.extend(os.path.join(path, s) for s in reversed(subdirs))
    return Fingerprint(h.hexdigest(), newest, taken, coarse and newest > 0)
