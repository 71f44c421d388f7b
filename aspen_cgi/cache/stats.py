"""Cache counters shared by every process serving a repository: each event
is one short line appended (O_APPEND, atomic) to `events.log` in the cache
directory; `summary()` adds them up, folding a long log into `totals.json`
under a lock so the log stays small."""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass, field

EVENTS = ("hit", "shared", "cold", "uncached", "prewarm", "evicted", "overloaded", "abandoned",
          "depth1_wide", "depth1_kept",      # depth-1 entries made wide in the background, or kept git's
          "superseded")                      # git's answers dropped once the stored packs could answer
LOG, TOTALS, LOCK = "events.log", "totals.json", "stats.mutex"
FOLD_AT = 1 << 20


def record(directory: str, event: str, nbytes: int = 0) -> None:
    """Count EVENT (one of EVENTS) with NBYTES; never fails a request."""
    try:
        fd = os.open(os.path.join(directory, LOG), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        return
    try:
        os.write(fd, f"{event} {int(nbytes)}\n".encode())
    except OSError:
        pass
    finally:
        os.close(fd)


@dataclass
class Counters:
    counts: dict[str, int] = field(default_factory=lambda: {e: 0 for e in EVENTS})
    bytes: dict[str, int] = field(default_factory=lambda: {e: 0 for e in EVENTS})

    def add(self, event: str, nbytes: int, n: int = 1) -> None:
        self.counts[event] = self.counts.get(event, 0) + n
        self.bytes[event] = self.bytes.get(event, 0) + nbytes

    @property
    def requests(self) -> int:
        return sum(self.counts.get(e, 0) for e in ("hit", "shared", "cold", "uncached"))

    @property
    def hit_rate(self) -> float:
        served = self.counts.get("hit", 0) + self.counts.get("shared", 0)
        return served / self.requests if self.requests else 0.0


def _parse_log(text: str, into: Counters) -> None:
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            into.add(parts[0], int(parts[1]))


def totals(directory: str) -> Counters:
    """Every event recorded so far (the folded totals plus the log)."""
    out = Counters()
    log, tot = os.path.join(directory, LOG), os.path.join(directory, TOTALS)
    try:
        lock = os.open(os.path.join(directory, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        return out
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            saved = json.loads(open(tot).read())
            for event, (n, b) in saved.items():
                out.add(event, b, n)
        except (OSError, ValueError, TypeError):
            pass
        try:
            with open(log, "r+") as f:
                _parse_log(f.read(), out)
                if f.tell() >= FOLD_AT:
                    tmp = tot + ".tmp"
                    with open(tmp, "w") as t:
                        json.dump({e: [out.counts[e], out.bytes[e]] for e in out.counts}, t)
                    os.replace(tmp, tot)
                    f.truncate(0)
        except OSError:
            pass
    finally:
        os.close(lock)
    return out
