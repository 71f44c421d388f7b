"""`application`: Aspen as a WSGI app for gunicorn and mod_wsgi, configured
from the environment exactly as the CGI is (GIT_PROJECT_ROOT,
GIT_HTTP_EXPORT_ALL, ...), whether set on the process or by the server.
ASPEN_REMOTE_USER_HEADER=X-Remote-User: REMOTE_USER comes from that request
header, set by an authenticating proxy (nginx/README.md), and from nowhere else."""

from __future__ import annotations

import os
import time
from typing import Callable, Iterable

from .accesslog import Counted, CountedFile, enabled, write_messages
from .http import dumb
from .http.backend import handle
from .http.message import Request
from .packs import background

_PATH_KEYS = ("PATH_INFO", "PATH_TRANSLATED", "QUERY_STRING")
REMOTE_USER_HEADER = "ASPEN_REMOTE_USER_HEADER"   # opt in: a trusted proxy names the user in this header

background.IN_PROCESS = True   # this process lives on: version packs are built in a thread


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
    header = env.get(REMOTE_USER_HEADER, "").strip()
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


def application(environ: dict, start_response: Callable) -> Iterable[bytes]:
    started = time.monotonic()
    env = cgi_env(environ)
    stream = environ["wsgi.input"]
    if not environ.get("CONTENT_LENGTH") and not environ.get("wsgi.input_terminated"):
        # PEP 3333: without a length the body may not be read to EOF unless the server terminates it.
        stream = _Empty() if environ.get("HTTP_TRANSFER_ENCODING", "").lower() != "chunked" else stream
    resp = handle(Request(env, stream, None))
    errors = environ["wsgi.errors"]
    write_messages(errors, resp.log)
    headers = [(k, v) for k, v in resp.headers if k != "Status"]
    start_response(f"{resp.status} {resp.reason}", headers)
    body = resp.body
    counted = Counted(body, errors, env.get("REQUEST_METHOD", "-"), env.get("PATH_INFO", ""),
                      resp.status, resp.trace, started, enabled(env), resp.late)
    wrapper = environ.get("wsgi.file_wrapper")
    if wrapper is not None and isinstance(body, dumb.FileBody):
        return wrapper(CountedFile(body.file, body.size, counted), 65536)
    return counted
