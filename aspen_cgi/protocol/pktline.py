"""pkt-line framing (gitprotocol-common): encode, and decode from bytes or a stream."""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO, Iterator, Optional, Union

FLUSH = b"0000"
DELIM = b"0001"
RESPONSE_END = b"0002"
MAX_PKT = 65520
MAX_DATA = MAX_PKT - 4


class ProtocolError(ValueError):
    """The client's bytes are not valid pkt-lines or not a valid request."""


@dataclass(frozen=True)
class Special:
    kind: str  # "flush", "delim" or "response-end"

    def __repr__(self) -> str:
        return f"<{self.kind}>"


FLUSH_PKT = Special("flush")
DELIM_PKT = Special("delim")
END_PKT = Special("response-end")
_SPECIAL = {0: FLUSH_PKT, 1: DELIM_PKT, 2: END_PKT}

Packet = Union[bytes, Special]


def encode(data: bytes | str) -> bytes:
    if isinstance(data, str):
        data = data.encode()
    if len(data) > MAX_DATA:
        raise ValueError("pkt-line too long")
    return b"%04x" % (len(data) + 4) + data


def sideband(band: int, data: bytes, max_data: int = MAX_DATA - 1) -> Iterator[bytes]:
    """Frame DATA on a side-band channel, split into pkt-lines."""
    for i in range(0, len(data), max_data):
        yield encode(bytes([band]) + data[i:i + max_data])


def _length(head: bytes) -> int:
    try:
        if len(head) != 4 or not all(c in b"0123456789abcdefABCDEF" for c in head):
            raise ValueError
        return int(head, 16)
    except ValueError:
        raise ProtocolError(f"bad line length character: {head[:4]!r}") from None


def parse(buf: bytes, pos: int = 0) -> Iterator[tuple[Packet, int]]:
    """Yield (packet, end offset) from a whole buffer; raise on truncation."""
    n = len(buf)
    while pos < n:
        if n - pos < 4:
            raise ProtocolError("truncated pkt-line length")
        size = _length(buf[pos:pos + 4])
        if size < 4:
            if size == 3:
                raise ProtocolError("bad pkt-line length 3")
            pos += 4
            yield _SPECIAL[size], pos
            continue
        if size > MAX_PKT:
            raise ProtocolError(f"pkt-line length {size} over the limit")
        if pos + size > n:
            raise ProtocolError("truncated pkt-line")
        yield buf[pos + 4:pos + size], pos + size
        pos += size


class Reader:
    """Reads pkt-lines one at a time from a binary stream."""

    def __init__(self, stream: IO[bytes]):
        self.stream = stream

    def _exact(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.stream.read(n - len(out))
            if not chunk:
                break
            out += chunk
        return bytes(out)

    def read(self) -> Optional[Packet]:
        """Next packet, or None at a clean end of stream."""
        head = self._exact(4)
        if not head:
            return None
        if len(head) < 4:
            raise ProtocolError("truncated pkt-line length")
        size = _length(head)
        if size < 4:
            if size == 3:
                raise ProtocolError("bad pkt-line length 3")
            return _SPECIAL[size]
        if size > MAX_PKT:
            raise ProtocolError(f"pkt-line length {size} over the limit")
        data = self._exact(size - 4)
        if len(data) < size - 4:
            raise ProtocolError("truncated pkt-line")
        return data


def strip_lf(data: bytes) -> bytes:
    return data[:-1] if data.endswith(b"\n") else data
