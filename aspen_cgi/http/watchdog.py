"""One thread per process that calls a request's callback when its deadline
passes (ASPEN_REQUEST_TIMEOUT under a long-lived server): the callback shuts
the client socket, so a worker blocked reading a trickling body or writing to
a client that does not read is freed. Cheap per request: no thread each."""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from typing import Callable


class Watch:
    """A pending deadline; cancel() it when the request ends in time."""

    def __init__(self, when: float, callback: Callable[[], None]):
        self.when = when
        self.callback = callback
        self.cancelled = False
        self.fired = False

    def cancel(self) -> None:
        self.cancelled = True
        self.callback = _nothing     # the request's objects are not held (nor in a cycle) until the deadline


def _nothing() -> None:
    pass


class Watchdog:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Watch]] = []
        self._count = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def watch(self, when: float, callback: Callable[[], None]) -> Watch:
        """Call CALLBACK (from the watchdog thread) at monotonic time WHEN unless cancelled first."""
        w = Watch(when, callback)
        with self._cond:
            heapq.heappush(self._heap, (when, next(self._count), w))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="aspen-watchdog", daemon=True)
                self._thread.start()
            self._cond.notify()
        return w

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0][2].cancelled:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                delay = self._heap[0][0] - time.monotonic()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                w = heapq.heappop(self._heap)[2]
            w.fired = True
            try:
                w.callback()
            except Exception:  # noqa: BLE001  (a socket already gone: nothing left to free)
                pass


WATCHDOG = Watchdog()
