"""`aspen-cgi`: the CGI program. It starts once per request under Apache, so it
imports only the request pipeline and writes stock's exact header block.

Limits (http/limits.py): the body is read from the pipe Apache gives us with
ASPEN_IDLE_TIMEOUT between bytes, and the answer written with the same idle
bound; ASPEN_REQUEST_TIMEOUT is checked at every read and answer chunk.
Apache's own Timeout (default 60 s) also bounds both sides of the client."""

from __future__ import annotations

import os
import select
import sys
import time


class PipeInput:
    """Fd 0 read with select(): no byte for the idle timeout, or the deadline
    passing while we wait, raises TimeoutError (the body reports 408)."""

    def __init__(self, fd: int, limits):
        self.fd = fd
        self.limits = limits

    def _wait(self, fds_r: list, fds_w: list) -> None:
        while True:
            waits = [t for t in (self.limits.idle_timeout or None, self.limits.remaining()) if t is not None]
            timeout = max(0.0, min(waits)) if waits else None
            r, w, _ = select.select(fds_r, fds_w, [], timeout)
            if r or w:
                return
            raise TimeoutError("client idle" if not self.limits.expired() else "request deadline")

    def read(self, n: int = -1) -> bytes:
        self._wait([self.fd], [])
        return os.read(self.fd, n if n > 0 else 65536)


def write_all(fd: int, data: bytes, limits) -> None:
    """Write DATA to FD (non-blocking), waiting at most the idle timeout for room each time."""
    view = memoryview(data)
    pipe = PipeInput(fd, limits)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            pipe._wait([], [fd])


def main() -> int:
    started = time.monotonic()
    from .accesslog import Counted, enabled, write_messages
    from .http.backend import handle
    from .http.limits import Limits
    from .http.message import Request

    env = dict(os.environ)
    limits = Limits.from_env(env, started)
    resp = handle(Request(env, PipeInput(0, limits), None, limits))
    write_messages(sys.stderr, resp.log)
    head = "".join(f"{k}: {v}\r\n" for k, v in resp.headers) + "\r\n"
    body = Counted(resp.body, sys.stderr, env.get("REQUEST_METHOD", "-"), env.get("PATH_INFO", ""),
                   resp.status, resp.trace, started, enabled(env), resp.late)
    sys.stdout.flush()
    try:
        os.set_blocking(1, False)
    except OSError:
        pass
    try:
        write_all(1, head.encode("utf-8", "surrogateescape"), limits)
        for chunk in body:
            if limits.expired():
                resp.trace["ended"] = "request-timeout"
                break
            write_all(1, chunk, limits)
    except BrokenPipeError:
        resp.trace["ended"] = "client-gone"
    except TimeoutError:
        resp.trace["ended"] = "idle-timeout" if not limits.expired() else "request-timeout"
    finally:
        body.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
