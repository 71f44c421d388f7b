"""Waiting for an flock with a deadline: the kernel's lock (released when
its holder dies) taken without blocking, looked at again with a sleep that
doubles up to a most."""

from __future__ import annotations

import fcntl
import time


def release(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)


def take(fd: int, deadline: float, first: float, most: float, shared: bool = False) -> bool:
    """LOCK_EX (SHARED: LOCK_SH) on FD by DEADLINE (time.monotonic()); False
    when the deadline passed. OSError (other than the lock being held) is the caller's."""
    pause = first
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() + pause > deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, most)
