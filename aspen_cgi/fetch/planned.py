"""The response to a planned fetch, written by Aspen itself from stored
version packs spliced into one pack (one header, stored entries copied, a
new trailer; nothing is inflated or deflated).

- Protocol v2: the `packfile` section (after `acknowledgments` + `ready`
  when the client had not said `done`).
- Protocol v0/v1, one stateless round (upload-pack.c get_common_commits):
  `ACK <have> common` for each have, then at `done` `ACK <last>` (or `NAK`
  without haves) and the pack; at a flush `ACK <last> ready`, `NAK`, and
  with no-done `ACK <last>` and the pack, else nothing more (the client says
  `done` next).

The pack goes on band 1 (side-band-64k: 65515 data bytes a packet;
side-band: 995) after one progress line on band 2, ending with a flush as
stock does; without side-band it is the raw pack and nothing after.
"""

from __future__ import annotations

import os
from typing import Iterator, Mapping, Optional, Sequence

from ..packs.packfile import PackIndex
from ..packs.splice import Extent, SplicePlan, plan_splice
from ..planner.plan import Plan
from ..protocol import pktline

BAND_DATA = 65515     # largest side-band-64k payload: 65520 - 4 (length) - 1 (band)
SIDEBAND_DATA = 995   # side-band (not 64k): packets of at most 1000 bytes


def prepare(packs_dir: str, plan: Plan, indexes: Optional[Mapping[str, PackIndex]] = None,
            oid_len: int = 20) -> SplicePlan:
    """Open and check the plan's packs, version and segment packs alike (all
    kept in PACKS_DIR), in stream order; INDEXES: those already loaded, by
    pack name; OID_LEN: the repository's hash (32 for SHA-256). Raises
    PackError or OSError (a pack removed since planning) before any byte."""
    thin = plan.thin or tuple(v != 1 for v in plan.versions)
    indexes = dict(indexes or {})
    only = plan.only
    if only is not None:
        for name in plan.packs:
            if name and name not in indexes:
                indexes[name] = PackIndex.load(os.path.join(packs_dir, f"pack-{name}.idx"))

    def include(name: str) -> Optional[frozenset[bytes]]:
        return None if only is None else frozenset(o for o in indexes[name].oids if o in only)
    return plan_splice((Extent(os.path.join(packs_dir, f"pack-{name}.pack"), index=indexes.get(name), thin=t,
                               include=include(name))
                        for name, t in zip(plan.packs, thin) if name), oid_len)


def v2_packfile(splice: SplicePlan, plan: Plan, progress: bool, ready: bool = False) -> Iterator[bytes]:
    """READY: the client is still negotiating (no `done`): answer that the
    negotiation is over -- `acknowledgments`, `ready` (the ACK lines may be
    left out once ready is sent, gitprotocol-v2) -- then the packfile."""
    if ready:
        yield pktline.encode(b"acknowledgments\n") + pktline.encode(b"ready\n") + pktline.DELIM
    yield pktline.encode(b"packfile\n")
    yield from banded_pack(splice, plan, BAND_DATA, progress)
    yield pktline.FLUSH


def v0_acks(common: Sequence[str], done: bool, no_done: bool) -> tuple[bytes, bool]:
    """The negotiation answer to one stateless v0 round whose haves COMMON
    are all known (multi_ack_detailed), and whether the pack follows it.
    Without `done` the round ends ready, which needs a common have."""
    out = [f"ACK {h} common\n" for h in common]
    if done:
        out.append(f"ACK {common[-1]}\n" if common else "NAK\n")
    else:
        out += [f"ACK {common[-1]} ready\n", "NAK\n"]
        if no_done:
            out.append(f"ACK {common[-1]}\n")
    return b"".join(pktline.encode(line) for line in out), done or no_done


def v0_pack(splice: SplicePlan, plan: Plan, sideband: int, progress: bool) -> Iterator[bytes]:
    """SIDEBAND: the data bytes per band-1 packet, or 0 for the raw pack."""
    if not sideband:
        yield from splice.chunks()
        return
    yield from banded_pack(splice, plan, sideband, progress)
    yield pktline.FLUSH


def banded_pack(splice: SplicePlan, plan: Plan, size: int, progress: bool, uris: int = 0) -> Iterator[bytes]:
    """URIS: stored packs named by URI before it (fetch/offload.py), said in its progress line."""
    if progress:
        mib = splice.size / (1 << 20)
        by_uri = f" ({uris} more by URI)" if uris else ""
        yield _band(2, f"Aspen: {len(plan.versions)} stored packs{by_uri}, {splice.objects} objects, "
                       f"{mib:.1f} MiB\n".encode())
    for chunk in splice.chunks(size):
        # the last chunk carries the trailer and may be longer than asked
        yield b"".join(pktline.sideband(1, chunk, size))


def _band(n: int, data: bytes) -> bytes:
    return pktline.encode(bytes([n]) + data)
