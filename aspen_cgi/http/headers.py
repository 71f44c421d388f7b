"""Stock's exact header blocks: no-cache, cache-forever, and its RFC 2822 dates."""

from __future__ import annotations

import time

NOCACHE = [
    ("Expires", "Fri, 01 Jan 1980 00:00:00 GMT"),
    ("Pragma", "no-cache"),
    ("Cache-Control", "no-cache, max-age=0, must-revalidate"),
]
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
YEAR = 31536000


def date(t: float) -> str:
    """git's DATE_RFC2822 in UTC: numeric zone, day of month not zero-padded."""
    tm = time.gmtime(t)
    return (f"{_DAYS[tm.tm_wday]}, {tm.tm_mday} {_MONTHS[tm.tm_mon - 1]} {tm.tm_year} "
            f"{tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d} +0000")


def forever(now: float | None = None) -> list[tuple[str, str]]:
    now = int(time.time() if now is None else now)
    return [("Date", date(now)), ("Expires", date(now + YEAR)), ("Cache-Control", "public, max-age=31536000")]


def nocache() -> list[tuple[str, str]]:
    return list(NOCACHE)
