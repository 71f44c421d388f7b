"""Typed reading of a stored git pack and its `.idx` (version 2), without
inflating anything.

Role: the splicer (and later the compactor and `aspen verify`) needs to know
where each stored object's bytes begin and end and what its entry header
says -- type, size, and for deltas which base -- but it must never touch the
zlib streams: hot paths copy stored bytes. The `.idx` gives object id <->
offset; sorting the offsets gives every entry's byte extent
[offset, next offset), the last one ending at the trailer (len(pack) - the
hash's length).
Only the variable-length entry header at each offset is parsed.

Pack entry header (git's `pack-format.txt`):

- type and inflated size: first byte `MTTTSSSS` (M = more, T = type, S = the
  low 4 size bits), then bytes `MSSSSSSS` carrying 7 more size bits each,
  least significant group first;
- OFS_DELTA (type 6): then the distance back to the base entry, big-endian
  base-128 with git's "+1" bias on every continuation (so each length covers
  a disjoint range and 128 is `80 00`, not `81 00`);
- REF_DELTA (type 7): then the base's object id (20 bytes, 32 for SHA-256);
- then the zlib stream, which this module never reads.

SHA-1 and SHA-256 repositories: an index's hash is the one whose checksum
its last bytes are (`oid_len` 20 or 32); its pack's ids and trailer are of
that hash.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import sys
from array import array
from bisect import bisect_left
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterator, Optional, Sequence, Union

OBJ_COMMIT = 1
OBJ_TREE = 2
OBJ_BLOB = 3
OBJ_TAG = 4
OBJ_OFS_DELTA = 6
OBJ_REF_DELTA = 7

TYPE_NAMES = {
    OBJ_COMMIT: "commit", OBJ_TREE: "tree", OBJ_BLOB: "blob", OBJ_TAG: "tag",
    OBJ_OFS_DELTA: "ofs-delta", OBJ_REF_DELTA: "ref-delta",
}

OID_LEN = 20                     # SHA-1's; SHA-256 ids and trailers take 32 (HASHES)
PACK_HEADER_LEN = 12
TRAILER_LEN = 20
HASHES = {20: hashlib.sha1, 32: hashlib.sha256}
PACK_SIGNATURE = b"PACK"
IDX_SIGNATURE = b"\377tOc"

# Longest varints accepted when parsing (a 64-bit value needs at most 10).
_MAX_VARINT = 10

PathLike = Union[str, "os.PathLike[str]"]


class PackError(ValueError):
    """A stored pack or index is malformed, truncated, or does not belong to
    the pack it was given with. Raised before any output is produced whenever
    the problem is detectable from headers, sizes and checksums."""


# --------------------------------------------------------------------------
# entry header varints


def encode_type_size(type_code: int, size: int) -> bytes:
    """The type-and-size varint that starts every pack entry."""
    if type_code not in TYPE_NAMES:
        raise PackError(f"invalid pack object type {type_code}")
    if size < 0:
        raise PackError(f"negative object size {size}")
    c = (type_code << 4) | (size & 0x0F)
    size >>= 4
    out = bytearray()
    while size:
        out.append(c | 0x80)
        c = size & 0x7F
        size >>= 7
    out.append(c)
    return bytes(out)


def decode_type_size(buf: Union[Sequence[int], mmap.mmap], pos: int) -> tuple[int, int, int]:
    """Parse the type-and-size varint at `pos`: (type, size, position after)."""
    try:
        c = buf[pos]
        type_code = (c >> 4) & 0x07
        size = c & 0x0F
        shift = 4
        n = 1
        while c & 0x80:
            if n >= _MAX_VARINT:
                raise PackError(f"entry header at offset {pos} is too long")
            c = buf[pos + n]
            size |= (c & 0x7F) << shift
            shift += 7
            n += 1
    except IndexError:
        raise PackError(f"entry header at offset {pos} runs past the end of the pack") from None
    return type_code, size, pos + n


def encode_ofs_distance(distance: int) -> bytes:
    """OFS_DELTA's distance back to its base, as git writes it."""
    if distance <= 0:
        raise PackError(f"OFS_DELTA distance must be positive, not {distance}")
    out = bytearray([distance & 0x7F])
    distance >>= 7
    while distance:
        distance -= 1
        out.append(0x80 | (distance & 0x7F))
        distance >>= 7
    out.reverse()
    return bytes(out)


def decode_ofs_distance(buf: Union[Sequence[int], mmap.mmap], pos: int) -> tuple[int, int]:
    """Parse an OFS_DELTA distance at `pos`: (distance, position after)."""
    try:
        c = buf[pos]
        value = c & 0x7F
        n = 1
        while c & 0x80:
            if n >= _MAX_VARINT:
                raise PackError(f"OFS_DELTA offset at {pos} is too long")
            c = buf[pos + n]
            value = ((value + 1) << 7) | (c & 0x7F)
            n += 1
    except IndexError:
        raise PackError(f"OFS_DELTA offset at {pos} runs past the end of the pack") from None
    return value, pos + n


def encode_entry_header(type_code: int, size: int, *, ofs_distance: Optional[int] = None,
                        base_oid: Optional[bytes] = None, oid_len: int = OID_LEN) -> bytes:
    """A complete entry header: type/size, then the base reference of a delta."""
    head = encode_type_size(type_code, size)
    if type_code == OBJ_OFS_DELTA:
        if ofs_distance is None or base_oid is not None:
            raise PackError("an OFS_DELTA header needs a distance and no base id")
        return head + encode_ofs_distance(ofs_distance)
    if type_code == OBJ_REF_DELTA:
        if base_oid is None or len(base_oid) != oid_len or ofs_distance is not None:
            raise PackError(f"a REF_DELTA header needs a {oid_len}-byte base id and no distance")
        return head + bytes(base_oid)
    if ofs_distance is not None or base_oid is not None:
        raise PackError(f"a {TYPE_NAMES[type_code]} entry has no base")
    return head


@dataclass(frozen=True, slots=True)
class EntryHeader:
    """What an entry header says. `length` counts every header byte (the
    compressed data starts at offset + length); `size` is the inflated size of
    the object, or of the delta for OFS/REF deltas."""
    type: int
    size: int
    length: int
    base_offset: Optional[int] = None   # OFS_DELTA: absolute offset of the base entry
    base_oid: Optional[bytes] = None    # REF_DELTA: the base's object id


def read_entry_header(buf: Union[Sequence[int], mmap.mmap], offset: int, oid_len: int = OID_LEN) -> EntryHeader:
    """Parse the pack entry header at `offset` of a whole pack `buf` whose ids are OID_LEN bytes."""
    type_code, size, pos = decode_type_size(buf, offset)
    if type_code in (OBJ_COMMIT, OBJ_TREE, OBJ_BLOB, OBJ_TAG):
        return EntryHeader(type_code, size, pos - offset)
    if type_code == OBJ_OFS_DELTA:
        distance, pos = decode_ofs_distance(buf, pos)
        base = offset - distance
        if distance <= 0 or base < PACK_HEADER_LEN:
            raise PackError(f"OFS_DELTA at offset {offset} points outside the pack "
                            f"(distance {distance})")
        return EntryHeader(type_code, size, pos - offset, base_offset=base)
    if type_code == OBJ_REF_DELTA:
        base_oid = bytes(buf[pos:pos + oid_len])
        if len(base_oid) != oid_len:
            raise PackError(f"REF_DELTA at offset {offset} runs past the end of the pack")
        return EntryHeader(type_code, size, pos + oid_len - offset, base_oid=base_oid)
    raise PackError(f"invalid object type {type_code} at offset {offset}")


@dataclass(frozen=True, slots=True)
class Entry:
    """One stored object: its id, its byte extent [offset, end) in the pack,
    and its parsed header."""
    oid: bytes
    offset: int
    end: int
    type: int
    size: int
    header_length: int
    base_offset: Optional[int] = None
    base_oid: Optional[bytes] = None
    crc32: Optional[int] = None

    @property
    def data_offset(self) -> int:
        """Where the compressed data starts."""
        return self.offset + self.header_length

    @property
    def length(self) -> int:
        return self.end - self.offset

    @property
    def is_delta(self) -> bool:
        return self.type in (OBJ_OFS_DELTA, OBJ_REF_DELTA)


# --------------------------------------------------------------------------
# .idx version 2


class PackIndex:
    """A pack index (`.idx` v2): object ids sorted, their CRC-32s and pack
    offsets, and the checksum of the pack it indexes."""

    def __init__(self, names: bytes, crcs: Sequence[int], offsets: Sequence[int],
                 pack_checksum: bytes, path: Optional[PathLike] = None):
        self.oid_len = len(pack_checksum)             # 20: SHA-1, 32: SHA-256
        if self.oid_len not in HASHES:
            raise PackError(f"a pack checksum of {self.oid_len} bytes is no known hash's")
        if len(names) % self.oid_len or len(names) // self.oid_len != len(offsets) or len(crcs) != len(offsets):
            raise PackError("index tables disagree in length")
        self._names = names
        self._crcs = crcs
        self._offsets = offsets
        self.pack_checksum = bytes(pack_checksum)
        self.path = Path(path) if path is not None else None

    @classmethod
    def load(cls, path: PathLike) -> "PackIndex":
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise PackError(f"cannot read pack index {path}: {e}") from e
        return cls.from_bytes(data, path=path)

    @classmethod
    def from_bytes(cls, data: bytes, path: Optional[PathLike] = None) -> "PackIndex":
        where = str(path) if path is not None else "pack index"
        fixed = 8 + 256 * 4
        if len(data) < fixed + 2 * min(HASHES):
            raise PackError(f"{where}: truncated ({len(data)} bytes)")
        if data[:4] != IDX_SIGNATURE:
            raise PackError(f"{where}: not a version 2 pack index (version 1 is not supported)")
        version = int.from_bytes(data[4:8], "big")
        if version != 2:
            raise PackError(f"{where}: unsupported index version {version}")
        oid_len = next((n for n, h in HASHES.items() if len(data) >= fixed + 2 * n
                        and h(data[:-n]).digest() == data[-n:]), None)
        if oid_len is None:
            raise PackError(f"{where}: index checksum mismatch (corrupt or truncated)")
        fanout = _be_array("I", data[8:fixed])
        if any(fanout[i] > fanout[i + 1] for i in range(255)):
            raise PackError(f"{where}: fan-out table is not monotonic")
        n = fanout[255]
        names_end = fixed + n * oid_len
        crc_end = names_end + n * 4
        off_end = crc_end + n * 4
        large_bytes = len(data) - 2 * oid_len - off_end
        if large_bytes < 0 or large_bytes % 8:
            raise PackError(f"{where}: size {len(data)} does not fit {n} objects (truncated)")
        names = data[fixed:names_end]
        crcs = _be_array("I", data[names_end:crc_end])
        small = _be_array("I", data[crc_end:off_end])
        large = _be_array("Q", data[off_end:off_end + large_bytes])
        offsets: Sequence[int] = small
        if any(o & 0x80000000 for o in small):
            resolved = []
            for o in small:
                if o & 0x80000000:
                    i = o & 0x7FFFFFFF
                    if i >= len(large):
                        raise PackError(f"{where}: large-offset reference {i} out of range")
                    resolved.append(large[i])
                else:
                    resolved.append(o)
            offsets = resolved
        checksum = data[len(data) - 2 * oid_len:len(data) - oid_len]
        return cls(names, crcs, offsets, checksum, path=path)

    # -- lookups, in index (object id) order

    @property
    def count(self) -> int:
        return len(self._offsets)

    def __len__(self) -> int:
        return len(self._offsets)

    @cached_property
    def oids(self) -> list[bytes]:
        """Object ids (oid_len bytes), sorted; position i matches `offset(i)`."""
        names, n = self._names, self.oid_len
        return [names[i:i + n] for i in range(0, len(names), n)]

    def oid(self, i: int) -> bytes:
        return self._names[i * self.oid_len:(i + 1) * self.oid_len]

    def offset(self, i: int) -> int:
        return self._offsets[i]

    def crc32(self, i: int) -> int:
        return self._crcs[i]

    def position(self, oid: bytes) -> int:
        """Index position of `oid`; KeyError when absent."""
        oids = self.oids
        i = bisect_left(oids, oid)
        if i == len(oids) or oids[i] != oid:
            raise KeyError(oid.hex() if isinstance(oid, bytes) else oid)
        return i

    def __contains__(self, oid: object) -> bool:
        try:
            self.position(oid)  # type: ignore[arg-type]
        except (KeyError, TypeError):
            return False
        return True

    def offset_of(self, oid: bytes) -> int:
        return self._offsets[self.position(oid)]

    # -- pack order

    @cached_property
    def pack_order(self) -> list[int]:
        """Index positions sorted by pack offset (the order entries are stored)."""
        offs = self._offsets
        return sorted(range(len(offs)), key=offs.__getitem__)

    @cached_property
    def sorted_offsets(self) -> list[int]:
        offs = self._offsets
        return [offs[i] for i in self.pack_order]

    def extents(self, pack_size: int) -> list[tuple[int, int, int]]:
        """(position, offset, end) for every entry in pack order; the last
        entry ends where the trailer starts (pack_size - oid_len)."""
        order = self.pack_order
        offs = self.sorted_offsets
        ends = offs[1:] + [pack_size - self.oid_len]
        return list(zip(order, offs, ends))


def _be_array(code: str, raw: bytes) -> array:
    a = array(code)
    if a.itemsize != {"I": 4, "Q": 8}[code]:  # pragma: no cover - exotic platforms
        raise PackError("unsupported platform integer sizes")
    a.frombytes(raw)
    if sys.byteorder == "little":
        a.byteswap()
    return a


# --------------------------------------------------------------------------
# a stored pack


class Pack:
    """A stored pack (memory-mapped) checked against its index.

    Opening checks, without reading the entries: the "PACK" signature and
    version (2 or 3), that the header's object count equals the index's, that
    the pack's trailer equals the checksum the index records (a truncated pack
    or a foreign index fails here), and that every offset lies inside the
    entry area. `verify_checksum()` re-hashes the whole pack (cold path).
    """

    def __init__(self, path: PathLike, index: Optional[PackIndex] = None):
        self.path = Path(path)
        if index is None:
            index = PackIndex.load(self.path.with_suffix(".idx"))
        self.index = index
        self.trailer_len = index.oid_len
        try:
            with open(self.path, "rb") as f:
                self.size = os.fstat(f.fileno()).st_size
                if self.size < PACK_HEADER_LEN + self.trailer_len:
                    raise PackError(f"{self.path}: truncated pack ({self.size} bytes)")
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise PackError(f"cannot read pack {self.path}: {e}") from e
        try:
            self._check()
        except BaseException:
            self._map.close()
            raise

    def _check(self) -> None:
        m = self._map
        if m[:4] != PACK_SIGNATURE:
            raise PackError(f"{self.path}: not a pack (bad signature)")
        self.version = int.from_bytes(m[4:8], "big")
        if self.version not in (2, 3):
            raise PackError(f"{self.path}: unsupported pack version {self.version}")
        count = int.from_bytes(m[8:12], "big")
        if count != self.index.count:
            raise PackError(f"{self.path}: header says {count} objects, index has "
                            f"{self.index.count}: the index does not belong to this pack")
        trailer = m[self.size - self.trailer_len:self.size]
        if trailer != self.index.pack_checksum:
            raise PackError(f"{self.path}: trailer {trailer.hex()} is not the checksum "
                            f"{self.index.pack_checksum.hex()} recorded in the index "
                            "(truncated pack, or an index of another pack)")
        if count:
            offs = self.index.sorted_offsets
            if offs[0] != PACK_HEADER_LEN or offs[-1] >= self.size - self.trailer_len:
                raise PackError(f"{self.path}: index offsets fall outside the pack's entries")
            if any(a == b for a, b in zip(offs, offs[1:])):
                raise PackError(f"{self.path}: index lists two objects at one offset")
        elif self.size != PACK_HEADER_LEN + self.trailer_len:
            raise PackError(f"{self.path}: empty pack with trailing data")

    # -- access

    @property
    def data(self) -> mmap.mmap:
        return self._map

    @property
    def count(self) -> int:
        return self.index.count

    @property
    def entries_end(self) -> int:
        """Where the trailer starts."""
        return self.size - self.trailer_len

    def trailer(self) -> bytes:
        return self._map[self.size - self.trailer_len:self.size]

    def header_at(self, offset: int, end: Optional[int] = None) -> EntryHeader:
        h = read_entry_header(self._map, offset, self.trailer_len)
        if end is not None and offset + h.length >= end:
            raise PackError(f"{self.path}: entry at offset {offset} has no room for data "
                            f"(header {h.length} bytes, extent {end - offset})")
        return h

    def _entry(self, pos: int, offset: int, end: int) -> Entry:
        h = self.header_at(offset, end)
        return Entry(self.index.oid(pos), offset, end, h.type, h.size, h.length,
                     h.base_offset, h.base_oid, self.index.crc32(pos))

    def entries(self) -> Iterator[Entry]:
        """Every entry in pack order, headers parsed, data untouched."""
        for pos, off, end in self.index.extents(self.size):
            yield self._entry(pos, off, end)

    def entry(self, oid: bytes) -> Entry:
        pos = self.index.position(oid)
        off = self.index.offset(pos)
        offs = self.index.sorted_offsets
        k = bisect_left(offs, off)
        end = offs[k + 1] if k + 1 < len(offs) else self.entries_end
        return self._entry(pos, off, end)

    def raw(self, entry: Entry) -> bytes:
        """The entry's stored bytes (header and compressed data)."""
        return self._map[entry.offset:entry.end]

    def verify_checksum(self) -> None:
        """Re-hash the pack and compare with its trailer (reads every byte;
        for build-time and `verify`, not for serving)."""
        h = HASHES[self.trailer_len]()
        step = 1 << 20
        end = self.entries_end
        for a in range(0, end, step):
            h.update(self._map[a:min(a + step, end)])
        if h.digest() != self.trailer():
            raise PackError(f"{self.path}: pack checksum mismatch")

    # -- lifetime

    def close(self) -> None:
        self._map.close()

    @property
    def closed(self) -> bool:
        return self._map.closed

    def __enter__(self) -> "Pack":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
