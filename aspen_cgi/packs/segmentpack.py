"""Segment packs (DESIGN §5, compaction): runs of consecutive versions
merged into one pack, re-deltified by `git pack-objects`, so that a full
clone is the import pack plus O(log N) stored extents.

The segment pack of versions a … b holds closure(S_b) − closure(S_{a-1})
(S_v: every ref value after version v) as a thin pack whose deltas may use
bases in closure(S_{a-1}). Any run of such packs and version packs that
partitions 2 … N, after the import pack Q_1 = closure(S_1), holds
closure(S_N), every thin base coming from an earlier extent. Objects made
and dropped inside a run are not in its pack.

The schedule is a binary counter over the versions after the import: the
runs kept for versions 2 … M are the blocks of M − 1's binary digits,
largest first ([2 … 2^k+1], then the next power of two, ...), so there are
at most log2(M) of them, and a run of 2^t versions is built once every 2^t
versions. The import is never re-deltified: counting from version 2 keeps
it out of every run (a repository imported big stays Q_1 as built once).
"""

from __future__ import annotations

from typing import Sequence

from ..runtime.repository import Repository
from . import versionpack
from .versionpack import BuiltPack, DeltaSearch


def schedule(through: int) -> list[tuple[int, int]]:
    """The runs (lo, hi) of two or more versions that compact versions 2 … THROUGH, in order."""
    out = []
    lo, count = 2, max(0, through - 1)
    for bit in range(count.bit_length() - 1, -1, -1):
        size = 1 << bit
        if count & size:
            if size > 1:
                out.append((lo, lo + size - 1))
            lo += size
    return out


def build(repo: Repository, after: Sequence[str], before: Sequence[str], outdir: str,
          search: DeltaSearch = DeltaSearch(), guard=None) -> BuiltPack:
    """The pack of what the ref values AFTER reach beyond the ref values BEFORE
    (thin against them); GUARD as for versionpack.build."""
    return versionpack.build(repo, sorted(set(after)), sorted(set(before)), outdir, search, guard)
