"""The index of a small thin pack, computed in this process: for each entry
its object id, offset and CRC-32, as `git index-pack --fix-thin` would list
the pack's own entries, without starting git.

Used for a push's version pack when the pack the client sent holds exactly
the version's objects (versionpack.adopt): a background build, never a
response path, so inflating here is allowed. Each entry's zlib stream is
inflated once; a delta is applied (dulwich's native `apply_delta`) to its
base, found earlier in the pack (OFS_DELTA, or a REF_DELTA to an entry of
the pack) or in the repository (a thin base: BASES, e.g. a dulwich object
store). SHA-1 packs only.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Callable, Optional

from .packfile import (
    HASHES,
    OBJ_BLOB,
    OBJ_COMMIT,
    OBJ_OFS_DELTA,
    OBJ_TAG,
    OBJ_TREE,
    PACK_HEADER_LEN,
    PACK_SIGNATURE,
    PackError,
    read_entry_header,
)

_NAMES = {OBJ_COMMIT: b"commit", OBJ_TREE: b"tree", OBJ_BLOB: b"blob", OBJ_TAG: b"tag"}

# (type, content) of a thin base by its binary id; None when the repository lacks it
BaseReader = Callable[[bytes], Optional[tuple[int, bytes]]]


@dataclass(frozen=True)
class ThinIndex:
    entries: list[tuple[bytes, int, int]]   # (binary object id, offset, crc32), sorted by id
    thin_bases: dict[bytes, set[bytes]]     # each base read from the repository -> the ids of its deltas
    known: dict[bytes, tuple[int, bytes]]   # the pack's commits and trees: id -> (type, content)


def index_thin(data: bytes, bases: BaseReader, oid_len: int = 20) -> ThinIndex:
    """The entries of the whole pack DATA and the thin bases its deltas use.
    PackError when DATA is not a well-formed pack whose trailer matches, or
    a thin base cannot be read."""
    hasher = HASHES[oid_len]
    if len(data) < PACK_HEADER_LEN + oid_len or data[:4] != PACK_SIGNATURE:
        raise PackError("not a pack")
    if int.from_bytes(data[4:8], "big") not in (2, 3):
        raise PackError("unsupported pack version")
    if hasher(data[:-oid_len]).digest() != data[-oid_len:]:
        raise PackError("pack trailer does not match its content")
    count = int.from_bytes(data[8:12], "big")
    end = len(data) - oid_len
    view = memoryview(data)
    raw: dict[int, tuple[int, bytes, int, Optional[int], Optional[bytes]]] = {}
    order: list[int] = []
    pos = PACK_HEADER_LEN
    for _ in range(count):
        if pos >= end:
            raise PackError("pack holds fewer entries than its header says")
        head = read_entry_header(data, pos, oid_len)
        d = zlib.decompressobj()
        body = d.decompress(view[pos + head.length:end])
        if not d.eof or len(body) != head.size:
            raise PackError(f"entry at offset {pos} does not inflate to its size")
        stop = end - len(d.unused_data)
        raw[pos] = (head.type, body, zlib.crc32(view[pos:stop]), head.base_offset, head.base_oid)
        order.append(pos)
        pos = stop
    if pos != end:
        raise PackError("pack has bytes after its last entry")

    external: dict[bytes, set[bytes]] = {}
    resolved: dict[int, tuple[int, bytes, bytes]] = {}     # offset -> (type, content, id)
    by_id: dict[bytes, int] = {}

    def resolve(offset: int) -> tuple[int, bytes, bytes]:
        chain = []
        while offset not in resolved:
            type_code, body, _, base_offset, base_oid = raw[offset]
            if type_code in _NAMES:
                resolved[offset] = _object(type_code, body, hasher)
                by_id[resolved[offset][2]] = offset
                break
            chain.append(offset)
            if type_code == OBJ_OFS_DELTA:
                if base_offset not in raw:
                    raise PackError(f"OFS_DELTA at offset {offset} has no entry for its base")
                offset = base_offset
            elif base_oid in by_id:
                offset = by_id[base_oid]
            else:
                assert base_oid is not None          # neither a whole object nor an OFS_DELTA: a REF_DELTA
                inside = [o for o in order if o not in resolved and raw[o][0] in _NAMES]
                for o in inside:                 # the base may be a whole entry not reached yet
                    resolve(o)
                if base_oid in by_id:
                    offset = by_id[base_oid]
                    continue
                base = bases(base_oid)
                if base is None:
                    raise PackError(f"thin base {base_oid.hex()} is not in the repository")
                out = _apply(chain, base[0], base[1], resolved, raw, by_id, hasher)
                external.setdefault(base_oid, set()).add(resolved[chain[-1]][2])
                return out
        type_code, content, _ = resolved[offset]
        return _apply(chain, type_code, content, resolved, raw, by_id, hasher)

    for o in order:
        resolve(o)
    known = {oid: (t, content) for t, content, oid in resolved.values() if t in (OBJ_COMMIT, OBJ_TREE)}
    return ThinIndex(sorted((resolved[o][2], o, raw[o][2]) for o in order), external, known)


def _object(type_code: int, content: bytes, hasher) -> tuple[int, bytes, bytes]:
    oid = hasher(b"%s %d\0" % (_NAMES[type_code], len(content)) + content).digest()
    return type_code, content, oid


def _apply(chain: list[int], type_code: int, content: bytes, resolved, raw, by_id,
           hasher) -> tuple[int, bytes, bytes]:
    from dulwich.pack import apply_delta  # startup
    out = (type_code, content, b"")
    for offset in reversed(chain):
        delta = raw[offset][1]
        content = b"".join(apply_delta(content, delta))
        out = resolved[offset] = _object(type_code, content, hasher)
        by_id[out[2]] = offset
    return out
