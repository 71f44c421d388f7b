"""A time-travel pin: a client reads a repository as it was at version V,
or at time T (the latest version committed by then).

Two ways to ask, both parsed here:
- the URL: `http://host/repo.git@V/…` or `…/repo.git@2026-11-30T12:00Z/…`
  (`split_url`), which every client and CI system can send;
- protocol v2 server options: `aspen-version=V` or `aspen-at=T`
  (`from_server_options`).

Times are ISO 8601; without a zone they are UTC. Imports nothing heavy."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Optional, Sequence

OPTION_VERSION = "aspen-version"
OPTION_AT = "aspen-at"
_VERSION = re.compile(r"[1-9][0-9]{0,17}")
_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}(?:T[0-9:.]+)?(?:Z|[+-][0-9]{2}:?[0-9]{2})?")


class PinError(ValueError):
    """A pin that names no version: its text says why, for the client."""


@dataclass(frozen=True)
class Pin:
    """VERSION, or the latest version committed at or before AT (seconds since the epoch)."""
    version: Optional[int] = None
    at: Optional[float] = None
    text: str = ""              # as the client wrote it, for messages and the access line

    def __str__(self) -> str:
        return self.text or (str(self.version) if self.version is not None else "")


def parse_time(text: str) -> float:
    """ISO 8601 (`2026-11-30T12:00Z`, `…T12:00:00+01:00`, a date alone) -> epoch seconds; UTC when no zone."""
    if not _TIME.fullmatch(text):
        raise PinError(f"not a time: {text[:60]!r} (ISO 8601, e.g. 2026-11-30T12:00Z)")
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise PinError(f"not a time: {text[:60]!r} (ISO 8601, e.g. 2026-11-30T12:00Z)") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t.timestamp()


def parse(text: str) -> Pin:
    """`V` or `T` -> Pin; PinError when it is neither."""
    if _VERSION.fullmatch(text):
        return Pin(version=int(text), text=text)
    return Pin(at=parse_time(text), text=text)


def split_url(repo_dir: str) -> Optional[tuple[str, Pin]]:
    """`…/repo.git@V` -> (`…/repo.git`, Pin), or None when the last path
    component has no `@` suffix that parses as a version or a time."""
    slash = repo_dir.rfind("/")
    at = repo_dir.rfind("@")
    if at <= slash + 1 or at == len(repo_dir) - 1:
        return None
    try:
        return repo_dir[:at], parse(repo_dir[at + 1:])
    except PinError:
        return None


def from_server_options(options: Sequence[str]) -> Optional[Pin]:
    """The pin protocol v2 server options ask for (the last one wins), or None;
    PinError for a malformed one."""
    pin = None
    for opt in options:
        name, eq, value = opt.partition("=")
        if name == OPTION_VERSION:
            if not eq or not _VERSION.fullmatch(value):
                raise PinError(f"{OPTION_VERSION} takes a version number, not {value[:60]!r}")
            pin = Pin(version=int(value), text=value)
        elif name == OPTION_AT:
            pin = Pin(at=parse_time(value), text=value)
    return pin
