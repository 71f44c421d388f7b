"""Request bodies as stock reads them: Content-Length or EOF, gzip, and the
upload-pack request buffer limit. Sane where stock is not: a short body is
an error, never a spin; a gzip bomb stops at a bound."""

from __future__ import annotations

import zlib
from typing import IO, Optional

from ..repoconfig import ConfigError, parse_size

DEFAULT_MAX_BUFFER = 10 * 1024 * 1024
CHUNK = 65536
INFLATE_FACTOR = 10   # an inflated upload-pack request may be this many times the buffer limit


class BodyError(Exception):
    def __init__(self, status: int, reason: str, message: str):
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message


def parse_content_length(value: Optional[str]) -> Optional[int]:
    """CONTENT_LENGTH as git_parse_ssize_t reads it; None means read to EOF."""
    if value is None or value == "":
        return None
    try:
        n = parse_size(value.lstrip("+"))
    except ConfigError:
        raise BodyError(400, "Bad Request", f"failed to parse CONTENT_LENGTH: {value}") from None
    if n >= 1 << 63:
        raise BodyError(400, "Bad Request", f"failed to parse CONTENT_LENGTH: {value}")
    return n


def max_request_buffer(env_value: Optional[str], config_value: Optional[str]) -> int:
    for source, value in (("GIT_HTTP_MAX_REQUEST_BUFFER", env_value), ("http.maxrequestbuffer", config_value)):
        if value is not None:
            try:
                return parse_size(value)
            except ConfigError:
                raise BodyError(500, "Internal Server Error", f"failed to parse {source}: {value}") from None
    return DEFAULT_MAX_BUFFER


class Body:
    """A readable request body: bounded by Content-Length, optionally gunzipped."""

    def __init__(self, stream: IO[bytes], length: Optional[int], gzip: bool):
        self.stream = stream
        self.length = length
        self.remaining = length
        self.raw_bytes = 0
        self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzip else None
        self._pending = b""
        self._eof = False

    def _raw(self, n: int) -> bytes:
        if self.remaining is not None:
            n = min(n, self.remaining)
            if n == 0:
                return b""
        data = self.stream.read(n)
        if not data:
            if self.remaining:
                raise BodyError(400, "Bad Request",
                                f"request body ended after {self.raw_bytes} of {self.length} bytes")
            self.remaining = 0 if self.remaining is not None else None
            return b""
        self.raw_bytes += len(data)
        if self.remaining is not None:
            self.remaining -= len(data)
        return data

    def read(self, n: int = CHUNK) -> bytes:
        if self._inflate is None:
            return self._raw(n)
        while not self._pending and not self._eof:
            if self._inflate.eof:
                self._eof = True
                break
            raw = self._inflate.unconsumed_tail or self._raw(CHUNK)
            if not raw:
                raise BodyError(400, "Bad Request", "request ended in the middle of the gzip stream")
            try:
                self._pending = self._inflate.decompress(raw, CHUNK)
            except zlib.error as e:
                raise BodyError(400, "Bad Request", f"corrupt gzip request body: {e}") from None
        out, self._pending = self._pending[:n], self._pending[n:]
        return out

    def read_all(self, limit: int) -> bytes:
        """The whole body, refusing more than LIMIT bytes after inflation."""
        out = bytearray()
        while True:
            chunk = self.read(CHUNK)
            if not chunk:
                return bytes(out)
            out += chunk
            if len(out) > limit:
                raise BodyError(413, "Payload Too Large",
                                f"request was larger than our maximum size ({limit}); "
                                "try setting GIT_HTTP_MAX_REQUEST_BUFFER")


def read_upload_request(stream: IO[bytes], length: Optional[int], gzip: bool, max_buffer: int) -> bytes:
    """Buffer an upload-pack request in full, as stock does, with its limits."""
    if length is not None and length > max_buffer:
        raise BodyError(413, "Payload Too Large",
                        f"request was larger than our maximum size ({max_buffer}): {length}; "
                        "try setting GIT_HTTP_MAX_REQUEST_BUFFER")
    raw = Body(stream, length, False).read_all(max(max_buffer, 8192))
    if not gzip:
        return raw
    import io
    return Body(io.BytesIO(raw), None, True).read_all(max_buffer * INFLATE_FACTOR)
