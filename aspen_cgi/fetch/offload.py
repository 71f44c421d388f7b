"""What the edge carries: stored packs named by URI in a planned answer
(protocol v2 `packfile-uris`), and the bundle a `bundle-uri` command names.

packfile-uris (gitprotocol-v2, git's fetch-pack.c): a client that offers
`packfile-uris <protocols>` (git >= 2.28 with `fetch.uriProtocols`) reads a
`packfile-uris` section of `<pack hash> <uri>` lines before the `packfile`
section, indexes the inline pack first, then downloads each URI with
`git http-fetch` and indexes it with the same `index-pack` arguments, and
dies unless the pack it got has the named trailer. So:

- a pack named by URI must be whole by itself: `--fix-thin` would append
  bases and change its trailer. Of Aspen's stored packs only the import
  pack (the closure of the refs Aspen first saw) is; segment, version and
  span packs are thin. The import pack goes by URI when it is the plan's
  first extent, sent whole, and at least ASPEN_OFFLOAD_MIN_BYTES;
- the inline pack is indexed before any URI pack is there, so it may not
  take delta bases from the import pack: the rest of the plan's extents
  are spliced after the delta chains their outside bases have in the
  import pack (those entries copied from it, headers rewritten where a
  base moved; nothing inflated). Those objects then come twice, once in
  each pack, which git allows across packs;
- only where the client may see every ref (no hideRefs, no namespace): the
  import pack holds what every ref reached.

The URI is Aspen's own static route for the pack (`<repo>/aspen/pack/
pack-<name>.pack`: sendfile, ETag, Range), or under ASPEN_OFFLOAD_URL, a
base an operator points at nginx or a CDN serving the same files from
disk (nginx/aspen-offload.conf).

bundle-uri (gitprotocol-v2, git's bundle-uri.c): the answer is `bundle.*`
configuration as `key=value` pkt-lines, then a flush. Aspen names one
bundle: the repository at its last compaction (the highest version its
segment packs reach, else the import), `<repo>/aspen/bundle@V`, built from
stored packs on its first download and immutable after. A client that
takes it fetches only what came since; the bundle moves on when the
segment packs do, not at every push."""

from __future__ import annotations

import os
from bisect import bisect_left
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence

from ..packs.packfile import OBJ_OFS_DELTA, OBJ_REF_DELTA, Pack, PackIndex
from ..packs.splice import Extent, SplicePlan, plan_splice
from ..planner.plan import Plan
from ..protocol import pktline

PACK_ROUTE = "/aspen/pack/pack-{name}.pack"
BUNDLE_ROUTE = "/aspen/bundle@{version}"


@dataclass(frozen=True)
class Uri:
    name: str           # the pack's name: its trailer, in hex
    url: str
    size: int


@dataclass(frozen=True)
class Offload:
    uris: tuple[Uri, ...]
    inline: SplicePlan          # the rest, with the import pack's chains the rest's deltas need
    chain_objects: int          # objects of the import pack sent inline too


def protocols(offered: Optional[str]) -> frozenset[str]:
    """The URI schemes a `packfile-uris` argument names (`http,https`)."""
    return frozenset(p.strip().lower() for p in (offered or "").split(",") if p.strip())


def repo_base(settings, repo_url: Optional[str], repo_dir: str) -> Optional[str]:
    """Where the repository's packs are named from: ASPEN_OFFLOAD_URL and the
    repository's path, else the URL the client reached it by."""
    if settings.offload_url:
        return settings.offload_url + repo_dir
    return repo_url


def pack_url(base: str, name: str) -> str:
    return base + PACK_ROUTE.format(name=name)


def scheme_offered(url: str, offered: frozenset[str]) -> bool:
    return url.split(":", 1)[0].lower() in offered


def plan_offload(packs_dir: str, plan: Plan, import_name: Optional[str], base: str, min_bytes: int,
                 indexes, oid_len: int) -> Optional[Offload]:
    """The answer with the import pack by URI, or None when it does not
    qualify (not the plan's first extent, a subset of it, too small)."""
    names = [n for n in plan.packs if n]
    if (not names or import_name is None or names[0] != import_name or plan.only is not None
            or (plan.firsts or plan.versions)[0] != 1):
        return None
    path = os.path.join(packs_dir, f"pack-{import_name}.pack")
    size = os.path.getsize(path)
    if size < min_bytes:
        return None
    indexes = dict(indexes or {})
    thin = plan.thin or tuple(v != 1 for v in plan.versions)
    rest = [(n, t) for n, t in zip(plan.packs, thin) if n][1:]
    for n, _ in rest:
        if n not in indexes:
            indexes[n] = PackIndex.load(os.path.join(packs_dir, f"pack-{n}.idx"))

    def import_index() -> PackIndex:       # read only when the rest has deltas on outside bases
        if import_name not in indexes:
            indexes[import_name] = PackIndex.load(os.path.join(packs_dir, f"pack-{import_name}.idx"))
        return indexes[import_name]
    chains = _chains(path, import_index, [os.path.join(packs_dir, f"pack-{n}.pack") for n, _ in rest],
                     [indexes[n] for n, _ in rest])
    extents = ([Extent(path, index=indexes[import_name], include=chains)] if chains else []) + \
        [Extent(os.path.join(packs_dir, f"pack-{n}.pack"), index=indexes[n], thin=t) for n, t in rest]
    inline = plan_splice(extents, oid_len)
    return Offload((Uri(import_name, pack_url(base, import_name), size),), inline, len(chains))


def _by_offset(index: PackIndex) -> tuple[list[int], list[int]]:
    """The import pack's entries in pack order: (offsets, index positions)."""
    return index.sorted_offsets, index.pack_order


def _chains(import_path: str, import_index: Callable[[], PackIndex], rest_paths: Sequence[str],
            rest_indexes: Sequence[PackIndex]) -> frozenset[bytes]:
    """The import pack's objects the rest's deltas need: each outside
    REF_DELTA base of the rest that the import pack holds, and the entries
    its delta chain there goes through (headers read, nothing inflated)."""
    own: set[bytes] = set()
    for ix in rest_indexes:
        own.update(ix.oids)
    outside: set[bytes] = set()
    for p, ix in zip(rest_paths, rest_indexes):
        with Pack(p, ix) as pack:
            outside.update(e.base_oid for e in pack.entries()
                           if e.type == OBJ_REF_DELTA and e.base_oid is not None and e.base_oid not in own)
    if not outside:
        return frozenset()
    index = import_index()
    wanted = {o for o in outside if o in index}
    if not wanted:
        return frozenset()
    out: set[bytes] = set()
    offsets: Optional[list[int]] = None
    order: Optional[list[int]] = None
    with Pack(import_path, index) as pack:
        todo = list(wanted)
        while todo:
            oid = todo.pop()
            if oid in out:
                continue
            out.add(oid)
            h = pack.header_at(index.offset_of(oid))
            if h.type == OBJ_REF_DELTA and h.base_oid is not None:
                todo.append(h.base_oid)
            elif h.type == OBJ_OFS_DELTA and h.base_offset is not None:
                if offsets is None:
                    offsets, order = _by_offset(index)
                k = bisect_left(offsets, h.base_offset)
                todo.append(index.oid(order[k]))        # type: ignore[index]
    return frozenset(out)


def v2_offloaded(off: Offload, plan: Plan, progress: bool, ready: bool = False):
    """The v2 answer: acknowledgments + ready (still negotiating), the
    `packfile-uris` section, then the inline pack."""
    from . import planned as responder  # startup
    if ready:
        yield pktline.encode(b"acknowledgments\n") + pktline.encode(b"ready\n") + pktline.DELIM
    yield (pktline.encode(b"packfile-uris\n")
           + b"".join(pktline.encode(f"{u.name} {u.url}\n") for u in off.uris) + pktline.DELIM)
    yield pktline.encode(b"packfile\n")
    yield from responder.banded_pack(off.inline, replace(plan, versions=plan.versions[1:] or plan.versions),
                                     responder.BAND_DATA, progress, uris=len(off.uris))
    yield pktline.FLUSH


# -- bundle-uri


def bundle_version(store) -> int:
    """The version the advertised bundle is of: the last compaction's (the
    highest version the segment packs reach), else the import; never past
    what is built."""
    reach = max((s.hi for s in store.segment_packs() if s.name), default=1)
    return min(reach, store.settled()[1])


def bundle_uri_answer(base: Optional[str], version: int) -> bytes:
    """The `bundle-uri` command's answer: `bundle.*` key=value lines, a flush
    (none when there is no bundle to name)."""
    if base is None or version < 1:
        return pktline.FLUSH
    lines = ["bundle.version=1", "bundle.mode=all",
             f"bundle.aspen-{version}.uri={base}{BUNDLE_ROUTE.format(version=version)}"]
    return b"".join(pktline.encode(line) for line in lines) + pktline.FLUSH
