"""A WSGI-to-CGI bridge: serves a CGI program (stock `git http-backend` by
default) from a WSGI server, one child process per request, so stock runs
behind the very same gunicorn as Aspen.

    ASPEN_BENCH_CGI=/usr/lib/git-core/git-http-backend \\
    GIT_PROJECT_ROOT=/srv/git GIT_HTTP_EXPORT_ALL=1 gunicorn bench.cgibridge:application

The child gets the CGI environment the way Apache gives it (REQUEST_METHOD,
PATH_INFO, QUERY_STRING, CONTENT_TYPE, CONTENT_LENGTH when the request has
one, REMOTE_USER, REMOTE_ADDR, SERVER_*, every HTTP_* header) over the
bridge's base environment. The request body is streamed into the child's
stdin by a feeder thread (read to EOF when the server de-chunks and
terminates the input), and the child's stdout is streamed back: its
`Status:` and header lines go to start_response, the rest is the body.
Nothing is buffered whole. The child's stderr is the server's stderr.
"""

from __future__ import annotations

import os
import subprocess
import threading
from typing import Callable, Iterable, Iterator, Optional

STOCK = "/usr/lib/git-core/git-http-backend"

_CHUNK = 65536
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
               "transfer-encoding", "upgrade"}
# Request-specific variables never inherited from the base environment.
_REQUEST_KEYS = ("REQUEST_METHOD", "PATH_INFO", "PATH_TRANSLATED", "QUERY_STRING", "CONTENT_TYPE",
                 "CONTENT_LENGTH", "REMOTE_USER", "REMOTE_ADDR", "REMOTE_PORT", "AUTH_TYPE", "SCRIPT_NAME",
                 "SERVER_PROTOCOL", "SERVER_NAME", "SERVER_PORT", "SERVER_SOFTWARE", "GATEWAY_INTERFACE",
                 "REQUEST_URI")


def _path(value: str) -> str:
    # PEP 3333 carries the raw path bytes as latin-1; the CGI child wants the bytes back.
    return value.encode("latin-1").decode("utf-8", "surrogateescape")


def cgi_environment(environ: dict, base: dict) -> dict[str, str]:
    """The child's environment: BASE (minus request variables) and this request's CGI variables."""
    env = {k: v for k, v in base.items() if k not in _REQUEST_KEYS and not k.startswith("HTTP_")}
    env.update({
        "GATEWAY_INTERFACE": "CGI/1.1",
        "REQUEST_METHOD": environ.get("REQUEST_METHOD", "GET"),
        "PATH_INFO": _path(environ.get("PATH_INFO", "")),
        "QUERY_STRING": _path(environ.get("QUERY_STRING", "")),
        "SCRIPT_NAME": environ.get("SCRIPT_NAME", ""),
        "SERVER_PROTOCOL": environ.get("SERVER_PROTOCOL", "HTTP/1.1"),
        "SERVER_NAME": str(environ.get("SERVER_NAME", "localhost")),
        "SERVER_PORT": str(environ.get("SERVER_PORT", "80")),
        "SERVER_SOFTWARE": "aspen-bench-cgibridge",
        "REMOTE_ADDR": str(environ.get("REMOTE_ADDR", "127.0.0.1")),
    })
    for key in ("CONTENT_TYPE", "CONTENT_LENGTH", "REMOTE_USER", "AUTH_TYPE"):
        if environ.get(key):
            env[key] = str(environ[key])
    for key, value in environ.items():
        if key.startswith("HTTP_") and isinstance(value, str) and key not in ("HTTP_AUTHORIZATION",
                                                                               "HTTP_PROXY_AUTHORIZATION"):
            env[key] = value
    if "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
        env.pop("CONTENT_LENGTH", None)
    return env


def _feed(stream, stdin, length: Optional[int]) -> None:
    """Copy the request body (LENGTH bytes, or to EOF when None) into the child's stdin."""
    try:
        remaining = length
        while remaining is None or remaining > 0:
            chunk = stream.read(_CHUNK if remaining is None else min(remaining, _CHUNK))
            if not chunk:
                break
            stdin.write(chunk)
            if remaining is not None:
                remaining -= len(chunk)
    except (BrokenPipeError, OSError, ValueError):
        pass  # the child stopped reading (an error response) or the client went away
    finally:
        try:
            stdin.close()
        except OSError:
            pass


def _body_length(environ: dict) -> Optional[int]:
    """Bytes to read from wsgi.input: the Content-Length, or None meaning "to EOF"."""
    if environ.get("CONTENT_LENGTH"):
        return int(environ["CONTENT_LENGTH"])
    if environ.get("wsgi.input_terminated") or "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
        return None
    return 0


def _parse_head(head: bytes) -> tuple[str, list[tuple[str, str]]]:
    status, headers = "", []
    for line in head.replace(b"\r\n", b"\n").split(b"\n"):
        if not line:
            continue
        name, _, value = line.decode("latin-1").partition(":")
        name, value = name.strip(), value.strip()
        if name.lower() == "status":
            status = value
        elif name.lower() not in _HOP_BY_HOP:
            headers.append((name, value))
    if not status:
        status = "302 Found" if any(k.lower() == "location" for k, _ in headers) else "200 OK"
    elif " " not in status:
        status += " Unknown"
    return status, headers


class _Exchange:
    """One running child: the response iterable handed back to the WSGI server."""

    def __init__(self, proc: subprocess.Popen, feeder: threading.Thread, rest: bytes):
        self.proc, self.feeder, self.rest = proc, feeder, rest
        self.eof = False

    def __iter__(self) -> Iterator[bytes]:
        if self.rest:
            yield self.rest
        while True:
            chunk = self.proc.stdout.read1(_CHUNK)
            if not chunk:
                self.eof = True
                return
            yield chunk

    def close(self) -> None:
        # A child that wrote its whole response is let finish; one cut short (client gone) is killed.
        if self.eof:
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()
        self.feeder.join(timeout=5)


def make_cgi_app(program: str, env: dict) -> Callable[[dict, Callable], Iterable[bytes]]:
    """A WSGI application running PROGRAM as a CGI per request over base environment ENV."""
    base = {k: str(v) for k, v in env.items()}

    def application(environ: dict, start_response: Callable) -> Iterable[bytes]:
        proc = subprocess.Popen([program], env=cgi_environment(environ, base), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE)
        feeder = threading.Thread(target=_feed, args=(environ["wsgi.input"], proc.stdin, _body_length(environ)),
                                  daemon=True)
        feeder.start()
        head = b""
        try:
            while b"\r\n\r\n" not in head and b"\n\n" not in head:
                chunk = proc.stdout.read1(_CHUNK)
                if not chunk:
                    break
                head += chunk
        except BaseException:
            _Exchange(proc, feeder, b"").close()
            raise
        crlf, lf = head.find(b"\r\n\r\n"), head.find(b"\n\n")
        if crlf < 0 and lf < 0:
            exchange = _Exchange(proc, feeder, b"")
            exchange.close()
            start_response("502 Bad Gateway", [("Content-Type", "text/plain")])
            return [b"CGI program produced no header block\n"]
        if crlf >= 0 and (lf < 0 or crlf <= lf):
            head, rest = head[:crlf], head[crlf + 4:]
        else:
            head, rest = head[:lf], head[lf + 2:]
        status, headers = _parse_head(head)
        start_response(status, headers)
        return _Exchange(proc, feeder, rest)

    return application


application = make_cgi_app(os.environ.get("ASPEN_BENCH_CGI", STOCK), dict(os.environ))
