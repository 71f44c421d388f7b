"""A file served as a static response: `Content-Length`, `ETag`,
`Last-Modified`, conditional GETs (`If-None-Match` -> 304) and one byte
range (`Range: bytes=…`, `If-Range`) -> 206, or 416 when it cannot be
satisfied. Several ranges, or a malformed Range, get the whole file (200),
as RFC 9110 allows. Used for bundles (fetch/bundle.py)."""

from __future__ import annotations

import re
from typing import Mapping, Optional

from ..service import FileBody
from . import headers as H
from .message import HttpError, Response

_RANGE = re.compile(r"bytes=([0-9]{0,18})-([0-9]{0,18})")


def _range(value: str, size: int) -> Optional[tuple[int, int]]:
    """(first, last) byte of a single range; None: serve it whole; HttpError 416: unsatisfiable."""
    m = _RANGE.fullmatch(value.strip())
    if m is None or (not m.group(1) and not m.group(2)):
        return None
    first, last = m.group(1), m.group(2)
    if not first:                                     # the last N bytes
        n = int(last)
        if n == 0 or size == 0:
            raise _unsatisfiable(size)
        return max(0, size - n), size - 1
    start = int(first)
    end = size - 1 if not last else min(int(last), size - 1)
    if start >= size or (last and int(last) < start):
        raise _unsatisfiable(size)
    return start, end


def _unsatisfiable(size: int) -> HttpError:
    return HttpError(416, "Range Not Satisfiable", extra=[("Content-Range", f"bytes */{size}")])


def serve(env: Mapping[str, str], path: str, size: int, etag: str, mtime: float, cache: list[tuple[str, str]],
          content_type: str) -> Response:
    common = cache + [("ETag", etag), ("Last-Modified", H.date(mtime)), ("Accept-Ranges", "bytes")]
    match = env.get("HTTP_IF_NONE_MATCH")
    if match is not None and (match.strip() == "*" or etag in (t.strip() for t in match.split(","))):
        return Response(304, "Not Modified", [("Status", "304 Not Modified")] + common, [])
    span = None
    if_range = env.get("HTTP_IF_RANGE")
    if env.get("HTTP_RANGE") and (if_range is None or if_range.strip() == etag):
        span = _range(env["HTTP_RANGE"], size)
    f = open(path, "rb")
    try:
        if span is None:
            hdrs = common + [("Content-Length", str(size)), ("Content-Type", content_type)]
            return Response(200, "OK", hdrs, FileBody(f, size))
        first, last = span
        f.seek(first)
        hdrs = [("Status", "206 Partial Content")] + common + [("Content-Length", str(last - first + 1)),
                                                                ("Content-Type", content_type),
                         ("Content-Range", f"bytes {first}-{last}/{size}")]
        return Response(206, "Partial Content", hdrs, FileBody(f, last - first + 1))
    except BaseException:
        f.close()
        raise
