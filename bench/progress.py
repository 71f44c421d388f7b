"""A dependency-free progress bar on stderr.

    [#####.....] 12/200 storm-depth1 aspen

On a terminal the bar redraws in place; when the stream is not a TTY (CI, a
log file) it stays quiet and writes only one final line per bar.
A `Progress` is also callable as `progress(done, total, label)`, so workloads
may report without knowing the class.
"""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

WIDTH = 20


def render(done: int, total: int, label: str = "", width: int = WIDTH) -> str:
    """The bar's text for `done` of `total` (total <= 0 means unknown)."""
    if total > 0:
        filled = min(width, max(0, int(width * done / total)))
        bar = "#" * filled + "." * (width - filled)
        text = f"[{bar}] {done}/{total}"
    else:
        text = f"[{'?' * width}] {done}"
    return f"{text} {label}".rstrip()


class Progress:
    """One progress bar; `update`/`advance` move it, `close` ends it."""

    def __init__(self, total: int = 0, label: str = "", stream: Optional[TextIO] = None,
                 tty: Optional[bool] = None, min_interval: float = 0.05) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if tty is None:
            isatty = getattr(self.stream, "isatty", None)
            tty = bool(isatty and isatty())
        self.tty = tty
        self.total = total
        self.done = 0
        self.label = label
        self.min_interval = min_interval
        self._last_draw = 0.0
        self._last_len = 0
        self._closed = False
        self._started = time.monotonic()

    def __call__(self, done: int, total: Optional[int] = None, label: Optional[str] = None) -> None:
        self.update(done, total, label)

    def start(self, total: int, label: str = "") -> "Progress":
        """Reset for a new phase (ends the previous one with its final line)."""
        if self.done or self._last_len:
            self.close()
        self.total, self.done, self.label = total, 0, label
        self._closed = False
        self._last_len = 0
        self._started = time.monotonic()
        self._draw(force=True)
        return self

    def update(self, done: int, total: Optional[int] = None, label: Optional[str] = None) -> None:
        if total is not None:
            self.total = total
        if label is not None:
            self.label = label
        self.done = done
        self._closed = False
        self._draw(force=self.total > 0 and done >= self.total)

    def advance(self, n: int = 1, label: Optional[str] = None) -> None:
        self.update(self.done + n, None, label)

    def _draw(self, force: bool = False) -> None:
        if not self.tty:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < self.min_interval:
            return
        self._last_draw = now
        text = render(self.done, self.total, self.label)
        pad = " " * max(0, self._last_len - len(text))
        self.stream.write("\r" + text + pad)
        self.stream.flush()
        self._last_len = len(text)

    def close(self, note: str = "") -> None:
        """Write the final line (always, TTY or not) once."""
        if self._closed:
            return
        self._closed = True
        secs = time.monotonic() - self._started
        text = render(self.done, self.total, self.label) + f" ({secs:.1f}s)"
        if note:
            text += f" {note}"
        if self.tty:
            pad = " " * max(0, self._last_len - len(text))
            self.stream.write("\r" + text + pad + "\n")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self._last_len = 0

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def say(message: str, stream: Optional[TextIO] = None) -> None:
    """One status line on stderr."""
    s = stream if stream is not None else sys.stderr
    s.write(message + "\n")
    s.flush()
