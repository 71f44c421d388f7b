"""Span packs: one pack over the objects a plan of several small version
packs would splice, with git's delta search across all of them.

Each version pack was deltified alone (its deltas reach only its boundary),
so a splice of many small ones can carry more bytes than git's one pack over
the same objects: measured in the bench's lagging-clients workload, plans of
4 to 10 extents of a few KiB each carried 1.02x to 1.08x stock's pack bytes.
When a thin plan has at least MIN_EXTENTS extents and splices to at most
MAX_BYTES, the request builds that one pack (pack-objects over the plan's
ref values, thin against the commits the plan proved the client holds:
git's own window, its deltas reused) and sends whichever is smaller (the
span is indexed only when it is: in random-fetch the splice was no larger
in 53 of 69 plans). The choice is kept (`span-<key>` beside the packs, the key naming the plan's
packs in order), so the next client in the same state gets it without a
build; an unused span pack and its record are swept like any unrecorded
pack (builder.sweep_packs)."""

from __future__ import annotations

import hashlib
import os
from typing import Optional, Sequence

from ..runtime.repository import Repository
from . import versionpack
from .versionpack import BuildError, DeltaSearch

MIN_EXTENTS = 2
MAX_BYTES = 256 << 10
PREFIX = "span-"
SPLICE = "splice"          # recorded when the splice was no larger than the span
GIT_SEARCH = DeltaSearch(window=10, depth=50, compression=-1, reuse_deltas=True, threads=1)


def worth(thin: Sequence[bool], names: Sequence[str], size: int) -> bool:
    """A plan whose splice (SIZE bytes, NAMES in order, THIN flags) may lose to one pack."""
    extents = [t for t, n in zip(thin, names) if n]
    return len(extents) >= MIN_EXTENTS and all(extents) and size <= MAX_BYTES


def key(names: Sequence[str]) -> str:
    return hashlib.sha1("\n".join(n for n in names if n).encode()).hexdigest()


def recorded(packs_dir: str, k: str) -> Optional[str]:
    """The span pack's name when one was kept for key K, SPLICE when the splice
    won, None when no choice is recorded (or its pack is gone)."""
    try:
        with open(os.path.join(packs_dir, PREFIX + k), encoding="ascii") as f:
            name = f.read().strip()
    except (OSError, ValueError):
        return None
    if name == SPLICE:
        return name
    if len(name) in (40, 64) and all(os.path.exists(os.path.join(packs_dir, f"pack-{name}.{ext}")) for ext in ("pack", "idx")):
        return name
    return None


def record(packs_dir: str, k: str, name: str) -> None:
    path = os.path.join(packs_dir, PREFIX + k)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="ascii") as f:
            f.write(name + "\n")
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def make(repo: Repository, packs_dir: str, values: Sequence[str],
         held: Sequence[str], smaller_than: int) -> Optional[versionpack.BuiltPack]:
    """The pack of what VALUES reach beyond the commits HELD, thin against
    them, installed in PACKS_DIR when it has fewer than SMALLER_THAN bytes
    (the splice's); else None, as when git cannot make it (a commit pruned
    since its version, say)."""
    if not values:
        return None
    try:
        return versionpack.build_smaller(repo, sorted(set(values)), sorted(set(held)), packs_dir, GIT_SEARCH,
                                         smaller_than=smaller_than)
    except (BuildError, OSError):
        return None
