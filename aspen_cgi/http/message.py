"""The typed request and response that cross the boundary between the CGI or
WSGI adapter and the backend."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Optional, Protocol

from ..model.trace import Trace

if TYPE_CHECKING:
    from .limits import Limits


class Readable(Protocol):
    """What a request body is read through (WSGI's wsgi.input, aspen-cgi's pipe, a file)."""
    def read(self, n: int = -1, /) -> bytes: ...


@dataclass
class Request:
    env: Mapping[str, str]      # CGI meta-variables and server settings, as stock sees its environment
    input: Readable             # the request body as sent; readers stop at Content-Length or EOF
    content_length: Optional[int] = None  # None: read to EOF (chunked)
    limits: Optional["Limits"] = None     # the adapter's request limits (http/limits.py); None: from env


@dataclass
class Response:
    status: int = 200
    reason: str = "OK"
    # In emission order. ("Status", "...") sits where stock writes it, so
    # that a CGI response is byte-for-byte stock's; WSGI lifts it out.
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: Iterable[bytes] = ()
    log: list[str] = field(default_factory=list)    # stderr messages, as stock writes them
    trace: Trace = field(default_factory=Trace)     # fields for the one request log line (model/trace.py)
    # stderr messages known only once the body has been sent (e.g. a request body that broke mid-stream)
    late: Optional[Callable[[], list[str]]] = None

    def close(self) -> None:
        close = getattr(self.body, "close", None)
        if close is not None:
            close()


class HttpError(Exception):
    """Ends a request before any body: a status, its headers, a body, and a log message."""

    def __init__(self, status: int, reason: str, log: str = "", headers: Optional[list[tuple[str, str]]] = None,
                 body: bytes = b"", extra: Optional[list[tuple[str, str]]] = None):
        super().__init__(log or reason)
        self.status = status
        self.reason = reason
        self.log = log
        self.prefix = headers or []     # headers the handler had already added
        self.extra = extra or []        # headers after Status (e.g. Allow)
        self.body = body
