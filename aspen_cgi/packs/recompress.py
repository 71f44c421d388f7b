"""Streaming pack rewriter: the same objects, deflated harder.

Role: the depth-1 path (`aspen_cgi.fetch.packobjectshook`) pipes git's pack through this
module before it reaches the client. Each entry keeps its type, its header
size and its place in the pack; only its zlib stream is replaced, by
libdeflate's level-12 stream when that is smaller (the inflated bytes are
identical). OFS_DELTA distances are re-encoded for the entries' new
positions (a base always precedes its delta, so one pass with a map
old offset -> new offset suffices); REF_DELTA bases are ids and stay as they
are. The input's trailer is checked and a new trailer of the same hash
(SHA-1, or SHA-256) is written.

Memory is bounded by the largest single entry (its compressed and inflated
bytes) plus one input chunk and an offset map, never by the whole pack. An
entry's end is found by inflating it (`zlib.decompressobj`, which stops at the
end of the stream). Malformed input raises `RecompressError` -- possibly after
some output has been produced, but always before the output's trailer, so a
reader of a failed rewrite never sees a pack that checks out.
"""

from __future__ import annotations

import zlib
from typing import BinaryIO, Iterable, Iterator, Union

import deflate

from .packfile import (
    HASHES,
    OBJ_OFS_DELTA,
    OBJ_REF_DELTA,
    OID_LEN,
    PACK_HEADER_LEN,
    PACK_SIGNATURE,
    TYPE_NAMES,
    PackError,
    decode_ofs_distance,
    decode_type_size,
    encode_ofs_distance,
    encode_type_size,
)

LEVEL = 12                  # libdeflate's strongest level
CHUNK = 65536               # read size, and the size of output chunks
_MAX_HEADER = 10 + 20       # type/size varint (<= 10 bytes) + a REF_DELTA id (or OFS varint <= 10)

Source = Union[BinaryIO, Iterable[bytes]]


class RecompressError(PackError):
    """The input is not a well-formed pack: bad signature or version, a
    truncated or corrupt entry, an inflated size differing from its header, a
    delta whose base is not an earlier entry, a wrong trailer, or bytes after it."""


def _chunks(src: Source) -> Iterator[bytes]:
    read = getattr(src, "read1", None) or getattr(src, "read", None)
    if read is None:
        yield from src  # type: ignore[misc]
        return
    while True:
        chunk = read(CHUNK)
        if not chunk:
            return
        yield chunk


class _Input:
    """The input as a sliding buffer; every consumed byte is hashed."""

    def __init__(self, src: Source, oid_len: int):
        self._it = _chunks(src)
        self.buf = bytearray()
        self.pos = 0
        self.offset = 0         # pack offset of buf[pos]
        self.sha = HASHES[oid_len]()

    def more(self) -> bool:
        """Drop consumed bytes and append the next chunk; False at end of input."""
        for chunk in self._it:
            if chunk:
                del self.buf[:self.pos]
                self.pos = 0
                self.buf += chunk
                return True
        return False

    def fill(self, n: int) -> bool:
        while len(self.buf) - self.pos < n:
            if not self.more():
                return False
        return True

    def take(self, n: int, what: str) -> bytes:
        if not self.fill(n):
            raise RecompressError(f"pack truncated in {what} at offset {self.offset}")
        data = bytes(self.buf[self.pos:self.pos + n])
        self.consume(data)
        return data

    def consume(self, data: bytes) -> None:
        self.sha.update(data)
        self.pos += len(data)
        self.offset += len(data)

    def inflate(self, size: int, offset: int) -> tuple[bytes, bytes]:
        """Read one zlib stream: (its compressed bytes, the inflated bytes)."""
        d = zlib.decompressobj()
        compressed: list[bytes] = []
        inflated: list[bytes] = []
        step = size + 64            # a stream rarely exceeds its content: one call, a small leftover
        while not d.eof:
            if self.pos == len(self.buf) and not self.more():
                raise RecompressError(f"pack truncated inside the entry at offset {offset}")
            piece = bytes(self.buf[self.pos:self.pos + step])
            try:
                inflated.append(d.decompress(piece))
            except zlib.error as e:
                raise RecompressError(f"corrupt zlib stream in the entry at offset {offset}: {e}") from None
            if d.eof:
                piece = piece[:len(piece) - len(d.unused_data)]
            compressed.append(piece)
            self.consume(piece)
            step = CHUNK
        data = b"".join(inflated)
        if len(data) != size:
            raise RecompressError(f"entry at offset {offset} inflates to {len(data)} bytes, "
                                  f"its header says {size}")
        return b"".join(compressed), data


def rewrite(src: Source, level: int = LEVEL, oid_len: int = OID_LEN) -> Iterator[bytes]:
    """The pack read from SRC (a binary file or an iterable of chunks),
    rewritten as described above, as chunks of about CHUNK bytes. OID_LEN:
    the hash of its ids and trailer (20 SHA-1, 32 SHA-256)."""
    inp = _Input(src, oid_len)
    head = inp.take(PACK_HEADER_LEN, "the pack header")
    if head[:4] != PACK_SIGNATURE:
        raise RecompressError("not a pack (bad signature)")
    version = int.from_bytes(head[4:8], "big")
    if version not in (2, 3):
        raise RecompressError(f"unsupported pack version {version}")
    count = int.from_bytes(head[8:12], "big")
    out_sha = HASHES[oid_len]()
    out = bytearray(head)
    written = 0                      # output bytes before `out`
    new_offsets: dict[int, int] = {}
    for _ in range(count):
        offset = inp.offset
        new_offset = written + len(out)
        new_offsets[offset] = new_offset
        inp.fill(_MAX_HEADER + oid_len - OID_LEN)   # fewer at the end of input: the parsers below report it
        try:
            type_code, size, p = decode_type_size(inp.buf, inp.pos)
            if type_code not in TYPE_NAMES:
                raise RecompressError(f"invalid object type {type_code} at offset {offset}")
            header = bytearray(encode_type_size(type_code, size))
            if type_code == OBJ_OFS_DELTA:
                distance, p = decode_ofs_distance(inp.buf, p)
                new_base = new_offsets.get(offset - distance)
                if new_base is None:
                    raise RecompressError(f"OFS_DELTA at offset {offset} does not point at an "
                                          f"earlier entry (distance {distance})")
                header += encode_ofs_distance(new_offset - new_base)
            elif type_code == OBJ_REF_DELTA:
                if len(inp.buf) - p < oid_len:
                    raise RecompressError(f"pack truncated in the REF_DELTA at offset {offset}")
                header += inp.buf[p:p + oid_len]
                p += oid_len
        except RecompressError:
            raise
        except PackError as e:
            raise RecompressError(str(e)) from None
        inp.consume(bytes(inp.buf[inp.pos:p]))
        compressed, data = inp.inflate(size, offset)
        smaller = deflate.zlib_compress(data, level)
        out += header
        out += smaller if len(smaller) < len(compressed) else compressed
        if len(out) >= CHUNK:
            out_sha.update(out)
            written += len(out)
            yield bytes(out)
            out.clear()
    digest = inp.sha.digest()
    trailer = inp.take(oid_len, "the pack trailer")
    if trailer != digest:
        raise RecompressError(f"pack trailer {trailer.hex()} is not the checksum of the pack "
                              f"({digest.hex()})")
    if inp.fill(1):
        raise RecompressError(f"data after the pack trailer at offset {inp.offset}")
    out_sha.update(out)
    out += out_sha.digest()
    yield bytes(out)


def rewrite_to(src: Source, dst: BinaryIO, level: int = LEVEL, oid_len: int = OID_LEN) -> int:
    """Rewrite the pack from SRC into DST; the number of bytes written."""
    n = 0
    for chunk in rewrite(src, level, oid_len):
        dst.write(chunk)
        n += len(chunk)
    return n
