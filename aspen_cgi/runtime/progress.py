"""One-line progress indicators on stderr for long CLI work (only on a terminal)."""

from __future__ import annotations

import sys
import time


class Spinner:
    def __init__(self, label: str, enabled: bool = True):
        self.label = label
        self.enabled = enabled and sys.stderr.isatty()
        self.t0 = time.monotonic()

    def __enter__(self) -> "Spinner":
        self.step("")
        return self

    def step(self, what: str) -> None:
        if self.enabled:
            sys.stderr.write(f"\r\033[K{self.label}: {what} ({time.monotonic() - self.t0:.1f} s)")
            sys.stderr.flush()

    def __exit__(self, *exc) -> None:
        if self.enabled:
            sys.stderr.write(f"\r\033[K{self.label}: done in {time.monotonic() - self.t0:.1f} s\n")


class Bar:
    """[#####.....] done/total, redrawn in place."""

    def __init__(self, label: str, enabled: bool = True, width: int = 30):
        self.label = label
        self.enabled = enabled and sys.stderr.isatty()
        self.width = width
        self.t0 = time.monotonic()

    def update(self, done: int, total: int, what: str = "") -> None:
        if not self.enabled:
            return
        filled = int(self.width * done / total) if total else self.width
        sys.stderr.write(f"\r\033[K{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} {what}"
                         f" ({time.monotonic() - self.t0:.1f} s)")
        sys.stderr.flush()

    def finish(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
