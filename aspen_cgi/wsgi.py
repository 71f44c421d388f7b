"""`application`: Aspen as a WSGI app for gunicorn and mod_wsgi, configured
from the environment exactly as the CGI is (GIT_PROJECT_ROOT,
GIT_HTTP_EXPORT_ALL, ...), whether set on the process or by the server.
ASPEN_REMOTE_USER_HEADER=X-Remote-User: REMOTE_USER comes from that request
header, set by an authenticating proxy (nginx/README.md), and from nowhere else.

Limits (http/limits.py): under gunicorn the client socket (`gunicorn.socket`)
gets ASPEN_IDLE_TIMEOUT for every read of the body and write of the answer,
and is shut at the ASPEN_REQUEST_TIMEOUT deadline, which frees a worker held
by a trickling or non-reading client; the access line says `ended=...` when
an answer was cut short. Under mod_wsgi, Apache's Timeout bounds reads and
writes (the deadline is still checked at each body read and answer chunk).

Settings (settings.py) are parsed as the application loads: a value in the
process environment that cannot be parsed stops it loading (gunicorn's
worker fails to boot, mod_wsgi logs the error), with a message naming the
setting, the value and what is accepted. One that arrives with a request
(mod_wsgi's SetEnv) gets that request a 500, the message in the server's log."""

from __future__ import annotations

# Everything a worker's first requests would load, loaded now, before _settle() freezes the heap
import gc
import os
import socket
import sys
import time
import uuid  # noqa: F401
from typing import Callable, Iterable, Iterator, Optional

from dulwich import object_store  # noqa: F401   (a push's version pack reads the repository through it)

from . import settings
from .cache import responses  # noqa: F401
from .fetch import (  # noqa: F401  # noqa: F401   (a depth-1 clone's hook: recompress, deflate)
    depth1,
    history,  # noqa: F401
    packobjectshook,
    planned,
    prewarm,
    upload,
)
from .http import dumb
from .http import headers as H
from .http.accesslog import Counted, CountedFile, write_messages
from .http.backend import handle
from .http.limits import Limits
from .http.message import Request
from .http.watchdog import WATCHDOG
from .packs import background, spanpack, splice  # noqa: F401
from .planner import plan  # noqa: F401
from .push import receive  # noqa: F401
from .push.flow import Push  # noqa: F401
from .refstore import db_schema as _db_schema

_db_schema.schema_tools()      # a repository's first request makes its store (sqlite_utils, without numpy)

_PATH_KEYS = ("PATH_INFO", "PATH_TRANSLATED", "QUERY_STRING")


# The process environment's settings, before the application settles: a value that cannot be
# parsed stops the load here, the SettingsError naming it (gunicorn and mod_wsgi log it).
settings.of(os.environ)

background.IN_PROCESS = True   # this process lives on: version packs are built in a thread

if settings.of(os.environ).node_url:
    from .refstore import peers
    peers.heartbeat(settings.of(os.environ))    # a cluster's node: the others send it packs from now on


def _settle() -> None:
    """A long-lived process: import what requests import on first use (the CGI
    defers it to keep its start-up short), then move the whole start-up heap
    out of the collector's reach (gc.freeze). Otherwise every full collection
    walks it with the GIL held: pauses of up to 25 ms were measured in the
    middle of planning (random-fetch, small preset)."""
    gc.collect()
    gc.freeze()


_settle()


def cgi_env(environ: dict) -> dict[str, str]:
    """The process environment overlaid with the request's CGI variables."""
    env = dict(os.environ)
    for key, value in environ.items():
        if isinstance(value, str) and "." not in key:
            if key in _PATH_KEYS:
                value = value.encode("latin-1").decode("utf-8", "surrogateescape")
            env[key] = value
    if not environ.get("CONTENT_LENGTH"):
        env.pop("CONTENT_LENGTH", None)
    if environ.get("wsgi.url_scheme") == "https" and "HTTPS" not in environ:
        env["HTTPS"] = "on"                 # as a CGI server says it (the URLs fetch/offload.py names)
    header = settings.of(env).remote_user_header
    if header:
        # Behind a proxy that authenticates (nginx's auth_basic) and always sets the header: the
        # header alone names the user, and it is not passed on as a request header.
        user = env.pop("HTTP_" + header.upper().replace("-", "_"), "")
        env.pop("REMOTE_USER", None)
        if user:
            env["REMOTE_USER"] = user
    return env


class _Empty:
    def read(self, n: int = -1) -> bytes:
        return b""


class _Guard:
    """The client socket held to the request's limits: the idle timeout on each
    read and write, and a shutdown at the deadline."""

    def __init__(self, sock: Optional[socket.socket], limits: Limits):
        self.sock = sock
        self.limits = limits
        self.fired = False
        self._watch = None
        if sock is None:
            return
        try:
            sock.settimeout(limits.idle_timeout or None)
        except OSError:
            pass
        if limits.deadline is not None:
            self._watch = WATCHDOG.watch(limits.deadline, self.drop)

    def drop(self) -> None:
        """Shut the connection: blocked reads see its end, writes fail, the worker is free."""
        self.fired = True
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def done(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.cancel()


class _Guarded:
    """The answer's chunks, cut at the deadline; notes in the access line why an
    answer ended early (`ended=request-timeout`, `idle-timeout`, `client-gone`)."""

    def __init__(self, body: Counted, guard: _Guard, trace: dict):
        self.body = body
        self.guard = guard
        self.trace = trace
        self.finished = False
        self.last = time.monotonic()

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.body:
            if self.guard.limits.expired():
                self.trace["ended"] = "request-timeout"
                self.guard.drop()
                return
            yield chunk
            self.last = time.monotonic()
        self.finished = True

    def close(self) -> None:
        self.guard.done()
        if not self.finished and "ended" not in self.trace:
            idle = self.guard.limits.idle_timeout
            if self.guard.fired:
                self.trace["ended"] = "request-timeout"
            elif idle and time.monotonic() - self.last >= idle * 0.9:
                self.trace["ended"] = "idle-timeout"
            else:
                self.trace["ended"] = "client-gone"
        self.body.close()


def _refused(error: Exception, environ: dict, start_response: Callable) -> Iterable[bytes]:
    """A 500 for a request whose settings (SetEnv) cannot be parsed: what is
    wrong in the server's log, a short body that names nothing."""
    errors = environ.get("wsgi.errors") or sys.stderr
    write_messages(errors, [str(error)])
    body = settings.REFUSED_BODY
    start_response("500 Internal Server Error", H.nocache() + [
        ("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))])
    return [body]


def application(environ: dict, start_response: Callable) -> Iterable[bytes]:
    started = time.monotonic()
    try:
        env = cgi_env(environ)
        config = settings.of(env)
    except settings.SettingsError as e:
        return _refused(e, environ, start_response)
    limits = Limits.from_env(env, started)
    guard = _Guard(environ.get("gunicorn.socket"), limits)
    stream = environ["wsgi.input"]
    if not environ.get("CONTENT_LENGTH") and not environ.get("wsgi.input_terminated"):
        # PEP 3333: without a length the body may not be read to EOF unless the server terminates it.
        stream = _Empty() if environ.get("HTTP_TRANSFER_ENCODING", "").lower() != "chunked" else stream
    try:
        resp = handle(Request(env, stream, None, limits))
    except BaseException:
        guard.done()
        raise
    errors = environ["wsgi.errors"]
    write_messages(errors, resp.log)
    headers = [(k, v) for k, v in resp.headers if k != "Status"]
    start_response(f"{resp.status} {resp.reason}", headers)
    body = resp.body
    counted = Counted(body, errors, env.get("REQUEST_METHOD", "-"), env.get("PATH_INFO", ""),
                      resp.status, resp.trace, started, config.access_log, resp.late)
    wrapper = environ.get("wsgi.file_wrapper")
    if wrapper is not None and isinstance(body, dumb.FileBody):
        guard.done()    # sendfile() under the socket's idle timeout
        return wrapper(CountedFile(body.file, body.size, counted), 65536)
    return _Guarded(counted, guard, resp.trace)
