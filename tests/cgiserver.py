"""A tiny CGI host for tests: serves one CGI program (stock git-http-backend
or aspen-cgi) over HTTP on loopback, so real git clients can talk to stock
and Aspen side by side.

The handler gives the program the CGI environment the way Apache does:
REQUEST_METHOD, PATH_INFO, QUERY_STRING, CONTENT_TYPE, CONTENT_LENGTH (absent
for chunked requests, whose body is de-chunked and piped to EOF), HTTP_*
headers (so HTTP_GIT_PROTOCOL and HTTP_CONTENT_ENCODING arrive), plus the
server settings given at start (GIT_PROJECT_ROOT, GIT_HTTP_EXPORT_ALL, ...).
The program's `Status:` and headers are relayed, then its body is streamed
until EOF (the connection is closed after each response).

Use the `cgi_server_factory` fixture (import it into a test module):

    from .cgiserver import cgi_server_factory  # noqa: F401

    def test_x(cgi_server_factory, root):
        stock = cgi_server_factory(root)                        # stock http-backend
        aspen = cgi_server_factory(root, program="aspen")       # aspen-cgi
        ... f"{stock.url}/repo.git" ...
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional

import pytest

from .harness import ASPEN_CGI, BASE_ENV, STOCK


def _dechunk(rfile, sink) -> None:
    while True:
        line = rfile.readline(65537)
        if not line:
            return
        size = int(line.split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            while rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                pass
            return
        remaining = size
        while remaining:
            chunk = rfile.read(min(remaining, 65536))
            if not chunk:
                return
            sink(chunk)
            remaining -= len(chunk)
        rfile.readline(3)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_CgiHTTPServer"

    def log_message(self, fmt, *args):  # quiet
        pass

    def _env(self) -> dict[str, str]:
        path, _, query = self.path.partition("?")
        env = dict(BASE_ENV)
        env.update(self.server.settings)
        env.update({
            "GATEWAY_INTERFACE": "CGI/1.1",
            "SERVER_PROTOCOL": self.request_version,
            "SERVER_SOFTWARE": "aspen-test-cgiserver",
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": str(self.server.server_address[1]),
            "REMOTE_ADDR": self.client_address[0],
            "REQUEST_METHOD": self.command,
            "PATH_INFO": urllib.parse.unquote(path),
            "QUERY_STRING": query,
            "SCRIPT_NAME": "",
        })
        for key, value in self.headers.items():
            k = key.upper().replace("-", "_")
            if k == "CONTENT_TYPE":
                env["CONTENT_TYPE"] = value
            elif k == "CONTENT_LENGTH":
                env["CONTENT_LENGTH"] = value
            elif k not in ("AUTHORIZATION", "PROXY_AUTHORIZATION"):
                env["HTTP_" + k] = value
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            env.pop("CONTENT_LENGTH", None)
        return env

    def _run(self) -> None:
        env = self._env()
        chunked = "chunked" in (self.headers.get("Transfer-Encoding") or "").lower()
        length = int(self.headers.get("Content-Length") or 0) if not chunked else None
        proc = subprocess.Popen(self.server.argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=self.server.stderr)

        def feed() -> None:
            try:
                if chunked:
                    _dechunk(self.rfile, proc.stdin.write)
                else:
                    remaining = length
                    while remaining:
                        chunk = self.rfile.read(min(remaining, 65536))
                        if not chunk:
                            break
                        proc.stdin.write(chunk)
                        remaining -= len(chunk)
            except (BrokenPipeError, OSError, ValueError):
                pass
            finally:
                try:
                    proc.stdin.close()
                except OSError:
                    pass

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        try:
            head = b""
            while b"\r\n\r\n" not in head and b"\n\n" not in head:
                chunk = proc.stdout.read1(65536)
                if not chunk:
                    break
                head += chunk
            sep = b"\r\n\r\n" if b"\r\n\r\n" in head else b"\n\n"
            head, _, rest = head.partition(sep)
            status, reason, headers = 200, "OK", []
            for line in head.replace(b"\r\n", b"\n").split(b"\n"):
                if not line:
                    continue
                k, _, v = line.decode("latin-1").partition(":")
                v = v.strip()
                if k.lower() == "status":
                    code, _, reason = v.partition(" ")
                    status = int(code)
                else:
                    headers.append((k, v))
            if not head and not rest:
                status, reason = 502, "Bad Gateway"
            self.send_response(status, reason or None)
            for k, v in headers:
                if k.lower() not in ("connection", "transfer-encoding"):
                    self.send_header(k, v)
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            if self.command != "HEAD":
                if rest:
                    self.wfile.write(rest)
                while True:
                    chunk = proc.stdout.read1(65536)
                    if not chunk:
                        break
                    self.wfile.write(chunk)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.stdout.close()
            feeder.join(timeout=5)

    do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = _run


class _CgiHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr, argv: list[str], settings: dict[str, str], stderr):
        super().__init__(addr, _Handler)
        self.argv = argv
        self.settings = settings
        self.stderr = stderr


@dataclass
class CgiServer:
    """A CGI PROGRAM ("stock", "aspen" or a path) serving ROOT on loopback."""
    root: Path
    env: dict = field(default_factory=dict)
    program: str = "stock"
    httpd: Optional[_CgiHTTPServer] = None
    log: Optional[Path] = None
    done: bool = False

    def __post_init__(self) -> None:
        if self.program == "aspen":
            from . import harness
            harness.track(self)    # its repositories' ref stores are verified after it stops

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> "CgiServer":
        argv = {"stock": [STOCK], "aspen": [ASPEN_CGI]}.get(self.program, [self.program])
        settings = {"GIT_PROJECT_ROOT": str(self.root), "GIT_HTTP_EXPORT_ALL": "1"}
        for k in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL"):
            settings.pop(k, None)
        settings.update({k: str(v) for k, v in self.env.items()})
        self.log = self.root.parent / f"cgiserver-{self.program.replace('/', '_')}-{id(self)}.log"
        self._logf = open(self.log, "wb")
        self.httpd = _CgiHTTPServer(("127.0.0.1", 0), argv, settings, self._logf)
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self._logf.close()
        self.done = True

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log else ""


@pytest.fixture
def cgi_server_factory():
    """start(root, program="stock"|"aspen"|path, **env) -> CgiServer on loopback."""
    servers: list[CgiServer] = []

    def start(root: Path, program: str = "stock", **env: str) -> CgiServer:
        s = CgiServer(Path(root), env, program).start()
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


assert shutil.which("git") and os.path.exists(STOCK)
