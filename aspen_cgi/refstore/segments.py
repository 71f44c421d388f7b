"""The geometric schedule of segments, as pure arithmetic.

Versions are numbered 1, 2, 3, ... A segment node (level l, index i) covers
versions i·2^l + 1 … (i+1)·2^l; level 0 is a single version. When version v
lands, the nodes that end at v are built from their two halves (a binary
counter: on average one node per version, never a cascade of rewrites), so
the live stack of top nodes always has geometric sizes and at most log2(N)
entries. Old nodes are kept: any range of versions is covered by at most
2·log2(N) + 2 aligned nodes, which is what bounds an ancestry query.

Nodes with index 0 are never built: they would contain version 1 (the import,
which creates every ref) and no query range (j, k] with j ≥ 1 can use them.
Create/delete churn cannot grow the stack either: node sizes count versions,
not bytes, so tombstones neither shrink a node nor outlive it.

`inside()` is the same arithmetic for the runs of versions segment packs
cover: a run inside a larger one is dropped once that one is built.
"""

from __future__ import annotations

from typing import Iterator


def span(level: int, idx: int) -> tuple[int, int]:
    """First and last version of node (LEVEL, IDX)."""
    return (idx << level) + 1, (idx + 1) << level


def built(level: int, idx: int, compacted_through: int) -> bool:
    if level == 0:
        return idx >= 0
    return idx >= 1 and span(level, idx)[1] <= compacted_through


def nodes_ending_at(v: int) -> Iterator[tuple[int, int]]:
    """The nodes of level >= 1 that version V completes, lowest level first."""
    level = 1
    while v % (1 << level) == 0:
        idx = (v >> level) - 1
        if idx >= 1:
            yield level, idx
        level += 1


def cover(lo: int, hi: int, compacted_through: int) -> list[tuple[int, int]]:
    """Aligned, built nodes covering versions LO … HI exactly, in order."""
    out = []
    while lo <= hi:
        level = 0
        while True:
            up = level + 1
            size = 1 << up
            if (lo - 1) % size or lo - 1 + size > hi or not built(up, (lo - 1) >> up, compacted_through):
                break
            level = up
        out.append((level, (lo - 1) >> level))
        lo += 1 << level
    return out


def levels(n: int) -> int:
    return max(0, n.bit_length() - 1)


def inside(run: tuple[int, int], other: tuple[int, int]) -> bool:
    """RUN (first and last version) lies within OTHER and is not OTHER."""
    return run != other and other[0] <= run[0] and run[1] <= other[1]
