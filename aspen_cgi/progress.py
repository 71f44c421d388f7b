"""A one-line progress indicator on stderr for long CLI work (only on a terminal)."""

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
