"""`aspen-cgi`: the CGI program. It starts once per request under Apache, so it
imports only the request pipeline and writes stock's exact header block.

Limits (http/limits.py): the body is read from the pipe Apache gives us with
ASPEN_IDLE_TIMEOUT between bytes, and the answer written with the same idle
bound; ASPEN_REQUEST_TIMEOUT is checked at every read and answer chunk.
Apache's own Timeout (300 s as Debian ships it) also bounds both sides of the client.

Its first steps (the settings, a recorded answer: http/replay.py) use posix,
the builtin os is made of, and not os itself, whose import costs about a
millisecond of every request; the pipeline imports os as it needs it.

Settings (settings.py) arrive with each request: a value that cannot be
parsed gets the request a 500, the message naming it in Apache's error log."""

from __future__ import annotations

import posix
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
        return posix.read(self.fd, n if n > 0 else 65536)


def write_all(fd: int, data: bytes, limits) -> None:
    """Write DATA to FD (non-blocking), waiting at most the idle timeout for room each time."""
    view = memoryview(data)
    pipe = PipeInput(fd, limits)
    while view:
        try:
            view = view[posix.write(fd, view):]
        except BlockingIOError:
            pipe._wait([], [fd])


class Prefixed:
    """A body whose first bytes were already read (a small request looked up in http/replay.py)."""

    def __init__(self, prefix: bytes, rest: PipeInput):
        self.prefix = prefix
        self.rest = rest

    def read(self, n: int = -1) -> bytes:
        if self.prefix:
            out = self.prefix if n < 0 else self.prefix[:n]
            self.prefix = self.prefix[len(out):]
            return out
        return self.rest.read(n)


def _read_small(n: int) -> bytes:
    """The first N bytes of the body, as a small request arrives whole; what
    came within a second of quiet otherwise (the pipeline reads the rest)."""
    out = b""
    while len(out) < n and select.select([0], [], [], 1.0)[0]:
        chunk = posix.read(0, n - len(out))
        if not chunk:
            break
        out += chunk
    return out


def _refused(error: Exception) -> int:
    """A 500 for a request whose settings cannot be parsed: what is wrong in
    the server's log, a short body that names nothing."""
    from .http.headers import NOCACHE  # startup
    from .settings import REFUSED_BODY  # startup
    sys.stderr.write(f"{error}\n")
    head = "Status: 500 Internal Server Error\r\n" + "".join(f"{k}: {v}\r\n" for k, v in NOCACHE)
    head += f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(REFUSED_BODY)}\r\n\r\n"
    sys.stdout.buffer.write(head.encode() + REFUSED_BODY)
    sys.stdout.flush()
    return 0


def _replayed(env, body: bytes, started: float, config) -> bool:
    """Send the recorded answer to this request (http/replay.py), if there is one."""
    from .http import replay  # startup
    hit = replay.lookup(env, body)
    if hit is None:
        return False
    from .http.limits import Limits  # startup
    limits = Limits.from_env(env, started)
    trace = dict(hit.trace, replayed=1)
    try:
        posix.set_blocking(1, False)
    except OSError:
        pass
    try:
        write_all(1, hit.head + hit.body, limits)
        if hit.file is not None:
            path, offset, length = hit.file
            with open(path, "rb", buffering=0) as f:
                while length > 0:
                    chunk = posix.pread(f.fileno(), min(length, 1 << 20), offset)
                    if not chunk:
                        trace["ended"] = "entry-truncated"
                        break
                    write_all(1, chunk, limits)
                    offset += len(chunk)
                    length -= len(chunk)
    except BrokenPipeError:
        trace["ended"] = "client-gone"
    except TimeoutError:
        trace["ended"] = "idle-timeout" if not limits.expired() else "request-timeout"
    except OSError:
        trace["ended"] = "entry-gone"
    hit.apply_effects()
    if config.metrics:
        from .runtime import metrics  # startup
        metrics.count(metrics.prepare(config), env.get("REQUEST_METHOD", "-"), 200, hit.length, trace)
    from .http.accesslog import line  # startup
    if config.access_log:
        sys.stderr.write(line(env.get("REQUEST_METHOD", "-"), env.get("PATH_INFO", ""), 200, hit.length,
                              started, trace))
    return True


def main() -> int:
    started = time.monotonic()
    started_ns = time.time_ns()
    enc = sys.getfilesystemencoding()
    # os.environ's values, decoded as it decodes them, without importing os (~1 ms of every request)
    env = {k.decode(enc, "surrogateescape"): v.decode(enc, "surrogateescape") for k, v in posix.environ.items()}
    from . import settings  # startup
    try:
        config = settings.of(env)
    except settings.SettingsError as e:
        return _refused(e)
    from .http.replay import kind as replay_kind  # startup
    kind = replay_kind(env)
    prefix = _read_small(int(env["CONTENT_LENGTH"])) if kind == "post" else b""
    if kind is not None and _replayed(env, prefix, started, config):
        return 0
    flight = None
    if kind is not None:
        from .http.replay import Flight, is_listing  # startup
        if is_listing(kind, prefix):
            flight = Flight.begin(env, prefix)
            # a leader too looks again: one that finished between our first look and our lock recorded it
            if flight is not None and _replayed(env, prefix, started, config):
                flight.end()
                return 0
    try:
        if config.cgi_resident:
            from .handoff import hand_off  # startup
            status = hand_off(config.run_dir, config.cgi_resident_idle, config.cgi_resident_workers, kind, prefix,
                              started, started_ns)
            if status is not None:
                return status
        return _pipeline(env, kind, prefix, started, started_ns, config)
    finally:
        if flight is not None:
            flight.end()


def _pipeline(env: dict, kind, prefix: bytes, started: float, started_ns: int, config,
              resident: bool = False, traces: list | None = None) -> int:
    """Answer the request through the whole pipeline (aspen-cgi's, or a
    resident worker's: RESIDENT); TRACES, when given, gets its trace."""
    from .http.accesslog import Counted, write_messages  # startup
    from .http.backend import handle  # startup
    from .http.limits import Limits  # startup
    from .http.message import Request  # startup
    from .http.replay import MAX_ANSWER  # startup

    limits = Limits.from_env(env, started)
    body_in = Prefixed(prefix, PipeInput(0, limits)) if prefix else PipeInput(0, limits)
    resp = handle(Request(env, body_in, None, limits))
    if resident:
        resp.trace["resident"] = 1
    write_messages(sys.stderr, resp.log)
    head = ("".join(f"{k}: {v}\r\n" for k, v in resp.headers) + "\r\n").encode("utf-8", "surrogateescape")
    body = Counted(resp.body, sys.stderr, env.get("REQUEST_METHOD", "-"), env.get("PATH_INFO", ""),
                   resp.status, resp.trace, started, config.access_log, resp.late)
    recordable = kind is not None and resp.status == 200 and not resp.log and resp.trace.get("replayable")
    kept: list[bytes] | None = [] if recordable and "replay_file" not in resp.trace else None
    sys.stdout.flush()
    try:
        posix.set_blocking(1, False)
    except OSError:
        pass
    try:
        write_all(1, head, limits)
        for chunk in body:
            if limits.expired():
                resp.trace["ended"] = "request-timeout"
                break
            write_all(1, chunk, limits)
            if kept is not None:
                kept.append(chunk)
                if body.nbytes > MAX_ANSWER:
                    kept = None
    except BrokenPipeError:
        resp.trace["ended"] = "client-gone"
    except TimeoutError:
        resp.trace["ended"] = "idle-timeout" if not limits.expired() else "request-timeout"
    finally:
        body.close_body()
        try:
            if recordable and "ended" not in resp.trace and (kept is not None or "replay_file" in resp.trace):
                from .http import replay  # startup
                why = replay.record(env, prefix, resp.trace["gitdir"], head, b"".join(kept or ()), resp.trace,
                                    started_ns)
                if why:
                    resp.trace["unrecorded"] = why
        finally:
            body.close()
    if traces is not None:
        traces.append(resp.trace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
