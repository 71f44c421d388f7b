"""Request bodies as stock reads them: Content-Length or EOF, gzip, and the
upload-pack request buffer limit. Sane where stock is not: a short body is
an error, never a spin; a gzip bomb stops at a bound."""

from __future__ import annotations

import io
import zlib
from typing import TYPE_CHECKING, Optional

from ..model.gitvalues import ConfigError, parse_size
from .limits import INFLATE_FREE, UNLIMITED, Limits

if TYPE_CHECKING:
    from .message import Readable

DEFAULT_MAX_BUFFER = 10 * 1024 * 1024
CHUNK = 65536
INFLATE_FACTOR = 1    # an inflated upload-pack request is bounded by the same buffer limit (gzip bombs get 413)


class BodyError(OSError):
    """A request body that cannot be read as sent (short, bad gzip, too large).

    An OSError so that a thread feeding the body to a child (which stops on
    OSError) ends quietly; the error is also recorded on the Body, so the
    pipeline can still report it."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message

    def __str__(self) -> str:
        return self.message


SSIZE_MAX = (1 << 63) - 1
_UNIT = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_SPACE = " \t\n\v\f\r"


def _strtoimax(s: str) -> tuple[Optional[int], str]:
    """C strtoimax(s, &end, 0): leading space, a sign, 0x/0 prefixes. Returns (value or None, rest)."""
    i = 0
    while i < len(s) and s[i] in _SPACE:
        i += 1
    sign = 1
    if i < len(s) and s[i] in "+-":
        sign = -1 if s[i] == "-" else 1
        i += 1
    base, digits = 10, "0123456789"
    if s[i:i + 2].lower() == "0x" and s[i + 2:i + 3].lower() in tuple("0123456789abcdef"):
        base, digits, i = 16, "0123456789abcdef", i + 2
    elif s[i:i + 1] == "0":
        base, digits = 8, "01234567"
    j = i
    while j < len(s) and s[j].lower() in digits:
        j += 1
    if j == i:
        return None, s
    if len(s[i:j].lstrip("0")) > 64:   # past intmax_t in any base, and past the digits int() converts
        return sign * (1 << 256), s[j:]
    return sign * int(s[i:j], base), s[j:]


def parse_content_length(value: Optional[str]) -> Optional[int]:
    """CONTENT_LENGTH as stock's get_content_length() reads it with
    git_parse_ssize_t (strtoimax base 0, optional k/m/g unit). None means
    read to EOF: unset, empty, or negative."""
    if value is None or value == "":
        return None
    n, rest = _strtoimax(value)
    factor = _UNIT.get(rest.lower()) if n is not None else None
    if n is None or factor is None or not (-SSIZE_MAX - 1 <= n <= SSIZE_MAX) or abs(n) > SSIZE_MAX // factor:
        raise BodyError(400, "Bad Request", f"failed to parse CONTENT_LENGTH: {value}")
    n *= factor
    return n if n >= 0 else None


def max_request_buffer(env_value: Optional[str], config_value: Optional[str]) -> int:
    for source, value in (("GIT_HTTP_MAX_REQUEST_BUFFER", env_value), ("http.maxrequestbuffer", config_value)):
        if value is not None:
            try:
                return parse_size(value)
            except ConfigError:
                raise BodyError(500, "Internal Server Error", f"failed to parse {source}: {value}") from None
    return DEFAULT_MAX_BUFFER


class Body:
    """A readable request body: bounded by Content-Length, optionally gunzipped,
    and held to LIMITS (ASPEN_MAX_PUSH_BYTES on the raw and inflated bytes, the
    idle and wall-clock timeouts)."""

    def __init__(self, stream: Readable, length: Optional[int], gzip: bool, limits: Limits = UNLIMITED):
        self.stream = stream
        self.length = length
        self.remaining = length
        self.raw_bytes = 0
        self.inflated = 0
        self.limits = limits
        self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzip else None
        self._pending = b""
        self._eof = False
        self.error: Optional[BodyError] = None

    def _fail(self, status: int, reason: str, message: str) -> BodyError:
        self.error = BodyError(status, reason, message)
        return self.error

    def _timeout(self, idle: bool) -> BodyError:
        if idle:
            return self._fail(408, "Request Timeout", f"no data from the client for {self.limits.idle_timeout:g} s "
                                                      f"(ASPEN_IDLE_TIMEOUT)")
        return self._fail(408, "Request Timeout", f"request took longer than {self.limits.request_timeout:g} s "
                                                  f"(ASPEN_REQUEST_TIMEOUT)")

    def _too_large(self, what: str) -> BodyError:
        return self._fail(413, "Payload Too Large", f"{what} is larger than the server's limit of "
                                                    f"{self.limits.max_push_bytes} bytes (ASPEN_MAX_PUSH_BYTES)")

    def _raw(self, n: int) -> bytes:
        if self.remaining is not None:
            n = min(n, self.remaining)
            if n == 0:
                return b""
        if self.limits.expired():
            raise self._timeout(idle=False)
        try:
            data = self.stream.read(n)
        except BodyError:
            raise
        except TimeoutError:
            raise self._timeout(idle=not self.limits.expired()) from None
        except Exception as e:   # the server's reader gave up (a socket shut by the request's deadline, a bad chunk)
            if self.limits.expired():
                raise self._timeout(idle=False) from None
            raise self._fail(400, "Bad Request", f"request body could not be read after {self.raw_bytes} bytes: "
                                                 f"{type(e).__name__}") from None
        if not data:
            if self.limits.expired():
                raise self._timeout(idle=False)
            if self.remaining:
                raise self._fail(400, "Bad Request",
                                 f"request body ended after {self.raw_bytes} of {self.length} bytes")
            self.remaining = 0 if self.remaining is not None else None
            return b""
        self.raw_bytes += len(data)
        if self.remaining is not None:
            self.remaining -= len(data)
        if self.limits.max_push_bytes and self.raw_bytes > self.limits.max_push_bytes:
            raise self._too_large("push")
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
                raise self._fail(400, "Bad Request", "request ended in the middle of the gzip stream")
            try:
                self._pending = self._inflate.decompress(raw, CHUNK)
            except zlib.error as e:
                raise self._fail(400, "Bad Request", f"corrupt gzip request body: {e}") from None
            self._check_inflated()
        out, self._pending = self._pending[:n], self._pending[n:]
        return out

    def _check_inflated(self) -> None:
        assert self._inflate is not None            # called as it inflates
        self.inflated += len(self._pending)
        if self.limits.max_push_bytes and self.inflated > self.limits.max_push_bytes:
            raise self._too_large("inflated push")
        consumed = self.raw_bytes - len(self._inflate.unconsumed_tail)
        ratio = self.limits.inflate_ratio
        if ratio and self.inflated > INFLATE_FREE and self.inflated > ratio * max(consumed, 1):
            raise self._fail(413, "Payload Too Large", f"gzip request body inflates more than {ratio} times its size")

    def discard(self, most: int) -> int:
        """Read and drop up to MOST more bytes the client is still sending (past
        any limit; its timeouts still hold), as a server's lingering close does:
        a connection closed with unread bytes is reset, and a client still
        sending would see the reset instead of the answer (a push over
        ASPEN_MAX_PUSH_BYTES would say `Broken pipe`, not `HTTP 413`). How
        many bytes were dropped."""
        dropped = 0
        while dropped < most and self.remaining != 0 and not self.limits.expired():
            n = CHUNK if self.remaining is None else min(CHUNK, self.remaining)
            try:
                data = self.stream.read(n)
            except Exception:   # noqa: BLE001  (idle, reset: nothing more to wait for)
                break
            if not data:
                break
            dropped += len(data)
            if self.remaining is not None:
                self.remaining -= len(data)
        return dropped

    def read_all(self, limit: int) -> bytes:
        """The whole body, refusing more than LIMIT bytes after inflation."""
        out = bytearray()
        while True:
            chunk = self.read(CHUNK)
            if not chunk:
                return bytes(out)
            out += chunk
            if len(out) > limit:
                raise self._fail(413, "Payload Too Large",
                                 f"request was larger than our maximum size ({limit}); "
                                 "try setting GIT_HTTP_MAX_REQUEST_BUFFER")


def read_upload_request(stream: Readable, length: Optional[int], gzip: bool, max_buffer: int,
                        limits: Limits = UNLIMITED) -> bytes:
    """Buffer an upload-pack request in full, as stock does, with its limits
    (and LIMITS' timeouts; ASPEN_MAX_PUSH_BYTES is for pushes)."""
    limits = limits.for_fetch()
    if length is not None and length > max_buffer:
        raise BodyError(413, "Payload Too Large",
                        f"request was larger than our maximum size ({max_buffer}): {length}; "
                        "try setting GIT_HTTP_MAX_REQUEST_BUFFER")
    raw = Body(stream, length, False, limits).read_all(max(max_buffer, 8192))
    if not gzip:
        return raw
    return Body(io.BytesIO(raw), None, True).read_all(max_buffer * INFLATE_FACTOR)
