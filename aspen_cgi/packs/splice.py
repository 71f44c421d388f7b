"""Splice stored packs into one response pack (DESIGN §5 "Splicing").

The output is one pack header ("PACK", version 2, the total object count),
then each extent's entries copied byte for byte in stored order, then a new
SHA-1 trailer over everything written. Nothing is inflated or deflated: only
entry headers are ever parsed, and only re-encoded where they must change.

- OFS_DELTA offsets stay valid inside an extent because its entries stay
  contiguous and in order.
- No object appears twice (strict clients reject that). An object already
  written by an earlier extent is dropped from a later one, as is an object
  outside an extent's `include` subset. An OFS_DELTA whose base was dropped
  becomes a REF_DELTA to the base's object id; an OFS_DELTA whose distance to
  its base changed (entries between them dropped or re-encoded) gets a header
  with the new distance -- its varint may get shorter, which moves everything
  after it, so positions are tracked entry by entry. The compressed delta
  data is copied untouched either way.
- An extent with nothing dropped is one verbatim byte range, its entry
  headers not even parsed. An extent with drops is copied verbatim up to its
  first dropped entry; headers are parsed from there on.
- Thin output is allowed: a REF_DELTA whose base is not in the output is the
  client's to supply (`index-pack --fix-thin`).

Order extents so that the objects a thin extent's deltas rely on come earlier
(oldest version first) or are in the client's store: REF_DELTA rewrites always
point backwards, so with that order delta chains in the output cannot form a
cycle.

Everything that can be checked without reading payloads is checked while
planning, before the first byte is produced (see `packfile.Pack`): planning
errors are `PackError`, and `plan_splice()`/`iter_splice()` raise them when
called, so an HTTP layer can still answer with an error status.

A stored thin pack cannot be indexed by git as it stands (`index-pack` needs
the bases; `pack-objects --thin` refuses to write an index). Store the pack
completed by `index-pack --stdin --fix-thin` (git appends the missing bases
after the original entries, whose offsets do not move) and splice it with
`include` = the thin pack's own objects: the appended bases are then a
dropped tail and the rest is copied verbatim.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, Optional, Sequence, Union

from .packfile import (
    HASHES,
    OBJ_OFS_DELTA,
    OBJ_REF_DELTA,
    OID_LEN,
    PACK_HEADER_LEN,
    Pack,
    PackError,
    PackIndex,
    PathLike,
    encode_entry_header,
)

CHUNK = 65536

# A piece of output: stored bytes (extent number, start, end) or new header bytes.
_Piece = Union[tuple[int, int, int], bytes]


def _oid(value: Union[bytes, str]) -> bytes:
    if isinstance(value, str):
        try:
            raw = bytes.fromhex(value)
        except ValueError:
            raw = b""
        if len(raw) not in HASHES:
            raise PackError(f"not an object id: {value!r}")
        return raw
    if isinstance(value, (bytes, bytearray, memoryview)) and len(value) in HASHES:
        return bytes(value)
    raise PackError(f"not a 20- or 32-byte object id: {value!r}")


@dataclass(frozen=True)
class Extent:
    """A stored pack and its index (loaded from `<pack>.idx` when not given),
    optionally restricted to a subset of its objects (`include`: ids as bytes
    or hex strings; every one must be in the pack)."""
    pack: PathLike
    index: Optional[PackIndex] = None
    include: Optional[frozenset[bytes]] = field(default=None)
    thin: bool = False      # its REF_DELTA bases outside it are in the client's store

    def __post_init__(self) -> None:
        object.__setattr__(self, "pack", Path(self.pack))
        if self.include is not None:
            object.__setattr__(self, "include", frozenset(_oid(o) for o in self.include))

    def open(self) -> Pack:
        return Pack(self.pack, self.index)


@dataclass(frozen=True)
class SpliceResult:
    objects: int            # entries written (the header's count)
    bytes: int              # total bytes, header and trailer included
    duplicates: int         # entries dropped because an earlier extent wrote the object
    excluded: int           # entries left out because not in their extent's `include`
    rewritten: int          # entries whose header was re-encoded (data still copied)
    ofs_to_ref: int         # ...of which OFS_DELTA turned REF_DELTA (base dropped)
    verbatim_extents: int   # extents copied without parsing a single entry header
    headers_parsed: int     # entry headers read (only after an extent's first drop)
    checksum: builtins.bytes    # the trailer: the hash (the packs' own) of everything before it


class SplicePlan:
    """The layout of a splice, computed before the first byte is produced:
    the object count and total size are known up front (a Content-Length is
    possible). `chunks()` streams it once; `result` is then available."""

    def __init__(self, extents: Sequence[Extent], oid_len: int = OID_LEN):
        """OID_LEN: the repository's hash (20 SHA-1, 32 SHA-256), the one every extent must have."""
        self.oid_len = oid_len
        self._packs: list[Pack] = []
        self._pieces: list[_Piece] = []
        self.objects = 0
        self.duplicates = 0
        self.excluded = 0
        self.rewritten = 0
        self.ofs_to_ref = 0
        self.verbatim_extents = 0
        self.headers_parsed = 0
        self.result: Optional[SpliceResult] = None
        self._streamed = False
        try:
            self._plan(list(extents))
        except BaseException:
            self.close()
            raise
        self.size = PACK_HEADER_LEN + self._body + oid_len

    # -- planning

    def _plan(self, extents: list[Extent]) -> None:
        seen: set[bytes] = set()
        # Bases a thin extent takes from the client's store: a later extent
        # must not send them again, or a delta cycle can form (a thin
        # REF_DELTA in an earlier extent whose base comes later as a delta on
        # it), which index-pack rejects.
        assumed: set[bytes] = set()
        pos = PACK_HEADER_LEN  # output position of the next byte
        for n, ext in enumerate(extents):
            pack = ext.open()
            self._packs.append(pack)
            if pack.trailer_len != self.oid_len:
                raise PackError(f"{pack.path}: ids of {pack.trailer_len} bytes in a splice of {self.oid_len}")
            oids = pack.index.oids
            drop: set[bytes] = set()
            if ext.include is not None:
                missing = ext.include.difference(oids)
                if missing:
                    raise PackError(f"{pack.path}: {len(missing)} included objects are not in "
                                    f"the pack (e.g. {min(missing).hex()})")
                drop = set(oids).difference(ext.include)
                self.excluded += len(drop)
            if ext.thin and n + 1 < len(extents):
                own = set(oids)
                assumed.update(e.base_oid for e in pack.entries()
                               if e.type == OBJ_REF_DELTA and e.base_oid is not None and e.base_oid not in own
                               and e.base_oid not in seen and e.oid not in drop)
            dups = seen.intersection(oids) if seen else set()
            if assumed:
                dups |= assumed.intersection(oids)
            dups -= drop
            self.duplicates += len(dups)
            drop |= dups
            kept = pack.count - len(drop)
            self.objects += kept
            if n + 1 < len(extents):
                if drop:
                    seen.update(o for o in oids if o not in drop)
                else:
                    seen.update(oids)
            parsed = self.headers_parsed
            if not drop:
                self._copy(n, PACK_HEADER_LEN, pack.entries_end)
                pos += pack.entries_end - PACK_HEADER_LEN
            else:
                pos = self._plan_with_drops(n, pack, drop, pos)
            if self.headers_parsed == parsed:
                self.verbatim_extents += 1
        self._body = pos - PACK_HEADER_LEN

    def _copy(self, n: int, start: int, end: int) -> None:
        if start == end:
            return
        pieces = self._pieces
        if pieces and isinstance(pieces[-1], tuple):
            last_n, last_start, last_end = pieces[-1]
            if last_n == n and last_end == start:
                pieces[-1] = (n, last_start, end)
                return
        pieces.append((n, start, end))

    def _plan_with_drops(self, n: int, pack: Pack, drop: set[bytes], out: int) -> int:
        """Lay out one extent with dropped entries; returns the next output position."""
        index = pack.index
        extents = index.extents(pack.size)
        all_offsets = set(index.sorted_offsets)
        first_drop = next(i for i, (p, _, _) in enumerate(extents) if index.oid(p) in drop)
        first_drop_offset = extents[first_drop][1]
        # Entries before the first drop: verbatim, their output position a fixed shift.
        shift = out - PACK_HEADER_LEN
        self._copy(n, PACK_HEADER_LEN, first_drop_offset)
        out += first_drop_offset - PACK_HEADER_LEN
        new_pos: dict[int, int] = {}       # source offset -> output position (after first drop)
        dropped_at: dict[int, bytes] = {}  # source offset -> object id of a dropped entry
        for p, off, end in extents[first_drop:]:
            oid = index.oid(p)
            if oid in drop:
                dropped_at[off] = oid
                continue
            h = pack.header_at(off, end)
            self.headers_parsed += 1
            header: Optional[bytes] = None
            if h.type == OBJ_OFS_DELTA:
                base = h.base_offset
                assert base is not None
                if base not in all_offsets:
                    raise PackError(f"{pack.path}: OFS_DELTA at offset {off} points at offset "
                                    f"{base}, which is not an entry")
                if base in dropped_at:
                    header = encode_entry_header(OBJ_REF_DELTA, h.size, base_oid=dropped_at[base],
                                                 oid_len=self.oid_len)
                    self.ofs_to_ref += 1
                else:
                    base_out = base + shift if base < first_drop_offset else new_pos[base]
                    if out - base_out != off - base:
                        header = encode_entry_header(OBJ_OFS_DELTA, h.size,
                                                     ofs_distance=out - base_out)
            new_pos[off] = out
            if header is None:
                self._copy(n, off, end)
                out += end - off
            else:
                self.rewritten += 1
                self._pieces.append(header)
                self._copy(n, off + h.length, end)
                out += len(header) + end - off - h.length
        return out

    # -- streaming

    def chunks(self, chunk_size: int = CHUNK) -> Iterator[bytes]:
        """Yield the spliced pack in pieces of about `chunk_size` bytes; the
        trailer (SHA-1 or SHA-256) is computed as the bytes go by. Closes the packs at the
        end. One pass only."""
        if self._streamed:
            raise RuntimeError("a SplicePlan streams once")
        self._streamed = True
        return self._chunks(max(1, chunk_size))

    def _chunks(self, chunk_size: int) -> Iterator[bytes]:
        sha = HASHES[self.oid_len]()
        written = 0
        buf = bytearray(b"PACK" + (2).to_bytes(4, "big") + self.objects.to_bytes(4, "big"))
        maps = [p.data for p in self._packs]
        try:
            for piece in self._pieces:
                if isinstance(piece, bytes):
                    buf += piece
                else:
                    n, a, b = piece
                    m = maps[n]
                    if buf:
                        take = min(b - a, chunk_size - len(buf))
                        buf += m[a:a + take]
                        a += take
                        if len(buf) >= chunk_size:
                            out = bytes(buf)
                            buf.clear()
                            sha.update(out)
                            written += len(out)
                            yield out
                    while b - a >= chunk_size:
                        out = m[a:a + chunk_size]
                        a += chunk_size
                        sha.update(out)
                        written += len(out)
                        yield out
                    if a < b:
                        buf += m[a:b]
                if len(buf) >= chunk_size:
                    out = bytes(buf)
                    buf.clear()
                    sha.update(out)
                    written += len(out)
                    yield out
            sha.update(buf)
            written += len(buf)
            if written != self.size - self.oid_len:  # pragma: no cover - an internal invariant
                raise PackError(f"splice wrote {written} bytes, planned {self.size - self.oid_len}")
            checksum = sha.digest()
            buf += checksum
            self.result = SpliceResult(self.objects, self.size, self.duplicates, self.excluded,
                                       self.rewritten, self.ofs_to_ref, self.verbatim_extents,
                                       self.headers_parsed, checksum)
            yield bytes(buf)
        finally:
            del maps
            self.close()

    def close(self) -> None:
        for p in self._packs:
            if not p.closed:
                p.close()

    def __enter__(self) -> "SplicePlan":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def plan_splice(extents: Iterable[Extent], oid_len: int = OID_LEN) -> SplicePlan:
    """Open and check every extent (of the hash OID_LEN names) and lay out the
    output; raises PackError before anything is produced."""
    return SplicePlan(list(extents), oid_len)


def iter_splice(extents: Iterable[Extent], chunk_size: int = CHUNK) -> Iterator[bytes]:
    """The spliced pack as chunks of about `chunk_size` bytes (for HTTP
    responses). Planning happens here, so PackError is raised by this call,
    not by the first `next()`."""
    return plan_splice(extents).chunks(chunk_size)


def splice(extents: Iterable[Extent], out: BinaryIO) -> SpliceResult:
    """Write the spliced pack to `out`; nothing is written when the input is bad."""
    plan = plan_splice(extents)
    for chunk in plan.chunks():
        out.write(chunk)
    assert plan.result is not None
    return plan.result
