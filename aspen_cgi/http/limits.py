"""Per-request limits, from the request's settings (settings.py):

    ASPEN_MAX_PUSH_BYTES   bound on a receive-pack request body (raw, and inflated
                           when gzipped); 0 = unlimited, as stock (git size units: 500m, 2g)
    ASPEN_IDLE_TIMEOUT     seconds without a byte from the client while reading the body,
                           or without the client taking response bytes (default 60; 0 = none)
    ASPEN_REQUEST_TIMEOUT  wall-clock seconds per request (default 3600; 0 = none)

A gzip request body that inflates to more than INFLATE_RATIO times its raw
size past the first INFLATE_FREE bytes is refused: pack data is already
compressed, so such a body is a bomb, whatever the size bound."""

from __future__ import annotations

import time

from .. import settings

TYPE_CHECKING = False   # typing itself costs a CGI start-up milliseconds
if TYPE_CHECKING:
    from typing import Mapping, Optional

DEFAULT_IDLE_TIMEOUT = settings.default("ASPEN_IDLE_TIMEOUT")
DEFAULT_REQUEST_TIMEOUT = settings.default("ASPEN_REQUEST_TIMEOUT")
INFLATE_RATIO = 1000
INFLATE_FREE = 1 << 20


class Limits:
    """max_push_bytes (0: unlimited), idle_timeout and request_timeout
    (seconds; 0: none), started (time.monotonic() when the request began),
    inflate_ratio (gzip bomb guard; 0: none)."""
    __slots__ = ("max_push_bytes", "idle_timeout", "request_timeout", "started", "inflate_ratio")

    def __init__(self, max_push_bytes: int = 0, idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
                 request_timeout: float = DEFAULT_REQUEST_TIMEOUT, started: float = 0.0,
                 inflate_ratio: int = INFLATE_RATIO):
        self.max_push_bytes = max_push_bytes
        self.idle_timeout = idle_timeout
        self.request_timeout = request_timeout
        self.started = started
        self.inflate_ratio = inflate_ratio

    def for_fetch(self) -> "Limits":
        """The same limits less the push bound (ASPEN_MAX_PUSH_BYTES is for pushes)."""
        return Limits(0, self.idle_timeout, self.request_timeout, self.started, self.inflate_ratio)

    @classmethod
    def from_env(cls, env: Mapping[str, str], started: Optional[float] = None) -> "Limits":
        s = settings.of(env)
        return cls(s.max_push_bytes, s.idle_timeout, s.request_timeout,
                   time.monotonic() if started is None else started)

    @property
    def deadline(self) -> Optional[float]:
        """The monotonic time the request must end by, or None."""
        return self.started + self.request_timeout if self.request_timeout > 0 else None

    def remaining(self) -> Optional[float]:
        d = self.deadline
        return None if d is None else d - time.monotonic()

    def expired(self) -> bool:
        left = self.remaining()
        return left is not None and left <= 0


UNLIMITED = Limits(0, 0.0, 0.0, 0.0, 0)
