"""Keeping the cache within its byte bound: entries of superseded ref-store
versions go first (oldest version first), then the least recently used;
leftovers of dead producers go too."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from .entries import SUFFIX, Header, _lock_held


@dataclass(frozen=True)
class EntryInfo:
    path: str
    repo: str
    version: int
    size: int
    used: float         # access time: set on every hit


def _open_quietly(path: str) -> int:
    """Open without touching the access time (the LRU clock) where allowed."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOATIME)
    except PermissionError:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


def entries(directory: str) -> list[EntryInfo]:
    """Every complete entry: its repository (from the name), ref-store
    version (from the header), size and last use."""
    out: list[EntryInfo] = []
    try:
        it = os.scandir(directory)
    except OSError:
        return out
    with it:
        for d in it:
            if not d.name.endswith(SUFFIX):
                continue
            try:
                st = d.stat()
                fd = _open_quietly(d.path)
                try:
                    header = Header.read(fd)
                finally:
                    os.close(fd)
            except OSError:
                continue
            out.append(EntryInfo(d.path, d.name.split("-")[0], header.version if header else 0, st.st_size,
                                 st.st_atime))
    return out


def order(items: list[EntryInfo]) -> list[EntryInfo]:
    """Eviction order: superseded versions of each repository, oldest
    version first, then every entry by last use."""
    newest: dict[str, int] = {}
    for e in items:
        newest[e.repo] = max(newest.get(e.repo, 0), e.version)
    old = sorted((e for e in items if e.version < newest[e.repo]), key=lambda e: (e.version, e.used))
    current = sorted((e for e in items if e.version >= newest[e.repo]), key=lambda e: e.used)
    return old + current


def evict(directory: str, max_bytes: int, need: int = 0, keep: str = "") -> tuple[int, int]:
    """Remove entries until they total at most MAX_BYTES - NEED (never KEEP).
    (entries removed, bytes freed)."""
    items = entries(directory)
    total = sum(e.size for e in items)
    removed = freed = 0
    for e in order(items):
        if total + need <= max_bytes:
            break
        if e.path == keep:
            continue
        try:
            os.unlink(e.path)
        except OSError:
            continue
        total -= e.size
        removed += 1
        freed += e.size
    return removed, freed


def sweep_parts(directory: str, older_than: float = 60.0) -> int:
    """Remove `.part` files no producer holds and that never finished."""
    n = 0
    now = time.time()
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    for name in names:
        if not (name.endswith(".part") or name.endswith(".tmp")):
            continue
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if now - st.st_mtime > older_than and not _lock_held(fd) and Header.read(fd) is None:
                os.unlink(path)
                n += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return n
