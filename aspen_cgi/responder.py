"""The response to a planned fetch, written by Aspen itself: for protocol v2,
the `packfile` section (after `acknowledgments` + `ready` when the client
had not said `done`), with a progress line on band 2 and the pack on band 1, spliced
from stored version packs (one header, stored entries copied, a new
trailer). Nothing is inflated or deflated."""

from __future__ import annotations

import os
from typing import Iterator

from .packs.splice import Extent, SplicePlan, plan_splice
from .planner.plan import Plan
from .protocol import pktline

BAND_DATA = 65515     # largest side-band-64k payload: 65520 - 4 (length) - 1 (band)


def prepare(packs_dir: str, plan: Plan) -> SplicePlan:
    """Open and check the plan's packs (raises PackError before any byte)."""
    return plan_splice(Extent(os.path.join(packs_dir, f"pack-{name}.pack"), thin=version != 1)
                       for version, name in zip(plan.versions, plan.packs) if name)


def v2_packfile(splice: SplicePlan, plan: Plan, progress: bool, ready: bool = False) -> Iterator[bytes]:
    """READY: the client is still negotiating (no `done`): answer that the
    negotiation is over -- `acknowledgments`, `ready` (the ACK lines may be
    left out once ready is sent, gitprotocol-v2) -- then the packfile."""
    if ready:
        yield pktline.encode(b"acknowledgments\n") + pktline.encode(b"ready\n") + pktline.DELIM
    yield pktline.encode(b"packfile\n")
    if progress:
        mib = splice.size / (1 << 20)
        yield _band(2, f"Aspen: {len(plan.versions)} stored packs, {splice.objects} objects, {mib:.1f} MiB\n".encode())
    for chunk in splice.chunks(BAND_DATA):
        yield _band(1, chunk)
    yield pktline.FLUSH


def _band(n: int, data: bytes) -> bytes:
    return pktline.encode(bytes([n]) + data)
