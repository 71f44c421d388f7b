"""Raw HTTP framing over a socket to a running gunicorn Aspen: chunked
bodies with fuzzed chunk sizes and extensions, wrong or doubled
Content-Length, both framings at once, truncated requests, mangled heads.
A crash is a hang, a traceback or a dead worker in the server's log, an
undeliberate 5xx, or a server that stops answering; at the end a real
`git ls-remote` must still work."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import Iterator, Optional

from hypothesis import strategies as st

from ..targets import _gunicorn, _terminate
from . import strategies as S
from .corpus import REPO
from .model import Crash, Run, Session, Target

READ_TIMEOUT = 60.0      # seconds for one answer after the request was sent and half-closed
WORKERS = 2
PROBE_EVERY = 25         # inputs between two checks that the server still serves a real request


@dataclass(frozen=True)
class WireInput:
    raw: bytes            # the request exactly as written to the socket (then half-closed)


def _chunked(draw, body: bytes) -> bytes:
    """BODY as chunks with fuzzed sizes: right, off by some, uppercase, padded,
    with extensions, not hex; sometimes no last chunk, sometimes trailers."""
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=4)))
    pieces = [body[a:b] for a, b in zip([0] + cuts, cuts + [len(body)]) if b > a] or [b""]
    out = []
    for piece in pieces:
        if not piece:
            continue
        kind = draw(st.integers(0, 9))
        size = b"%x" % len(piece)
        if kind == 1:
            size = b"%X" % len(piece)
        elif kind == 2:
            size = b"000" + size
        elif kind == 3:
            size += draw(st.sampled_from([b";ext", b";a=b", b" ;x=\"y\"", b";" + b"e" * 200, b"\t;z"]))
        elif kind == 4:
            size = b"%x" % max(0, len(piece) + draw(st.integers(-8, 8)))
        elif kind == 5:
            size = draw(st.sampled_from([b"", b"-1", b"zz", b"0x10", b"ffffffffffffffffffff", b" 5", b"+5", b"5 "]))
        out.append(size + b"\r\n" + piece + draw(st.sampled_from([b"\r\n"] * 6 + [b"\n", b"", b"XX"])))
    end = draw(st.integers(0, 5))
    if end == 0:
        pass                                          # no last chunk
    elif end == 1:
        out.append(b"0\r\nX-Trailer: 1\r\n\r\n")
    elif end == 2:
        out.append(b"0;end\r\n\r\n")
    else:
        out.append(b"0\r\n\r\n")
    return b"".join(out)


@st.composite
def _inputs(draw, s: Session) -> WireInput:
    posts = [r for r in s.corpus.requests if r.method == "POST"]
    seed = draw(st.sampled_from(posts))
    body = draw(st.just(seed.body) | S.mutated([seed.body], max_ops=2))
    method = draw(st.sampled_from(["POST"] * 8 + ["GET", "PUT", "POST\0", "P0ST"]))
    version = draw(st.sampled_from(["HTTP/1.1"] * 8 + ["HTTP/1.0", "HTTP/2.0", "HTTP/1.1x", ""]))
    path = seed.path if draw(st.integers(0, 7)) else draw(st.sampled_from(
        [seed.path + "?x=%zz", "/" + "a" * 5000, f"/{REPO}/info/refs?service=git-upload-pack", "*", "%"]))
    # sometimes a second request follows on the same connection: a body framed wrong must not
    # leak into it (request smuggling) nor break the connection's next answer
    pipelined = draw(st.integers(0, 7)) == 0
    headers = [b"Host: 127.0.0.1", f"Content-Type: {seed.content_type}".encode()]
    if not pipelined:
        headers.append(b"Connection: close")
    if seed.git_protocol:
        headers.append(f"Git-Protocol: {seed.git_protocol}".encode())
    if seed.content_encoding:
        headers.append(f"Content-Encoding: {seed.content_encoding}".encode())
    framing = draw(st.integers(0, 6))
    if framing == 0:
        headers.append(b"Content-Length: %d" % len(body))
        payload = body
    elif framing == 1:
        value = draw(st.sampled_from([b"%d" % (len(body) + d) for d in (-20, -1, 1, 20, 100000)]
                                     + [b"-1", b"abc", b"0x10", b"1e3", b" 5", b"99999999999999999999999", b""]))
        headers.append(b"Content-Length: " + value)
        if draw(st.booleans()):
            headers.append(b"Content-Length: %d" % len(body))
        payload = body
    elif framing in (2, 3):
        headers.append(b"Transfer-Encoding: chunked")
        payload = _chunked(draw, body)
    elif framing == 4:
        headers += [b"Transfer-Encoding: chunked", b"Content-Length: %d" % len(body)]
        payload = _chunked(draw, body)
    elif framing == 5:
        headers.append(b"Transfer-Encoding: " + draw(st.sampled_from(
            [b"chunked, gzip", b"gzip, chunked", b"identity", b"Chunked", b"chunked, chunked", b"x"])))
        payload = _chunked(draw, body) if draw(st.booleans()) else body
    else:
        payload = body                                  # no length at all: the body ends at the half-close
    if draw(st.integers(0, 4)) == 0:
        headers.append(b"Expect: 100-continue")
    if draw(st.integers(0, 6)) == 0:
        headers.append(draw(st.sampled_from([b"X-Bad: \x00", b"Bad Header", b"X: " + b"v" * 9000, b": empty",
                                             b"X-Folded: a\r\n b"])))
    order = draw(st.permutations(headers))
    raw = f"{method} {path} {version}".encode().rstrip() + b"\r\n" + b"\r\n".join(order) + b"\r\n\r\n" + payload
    if pipelined:
        raw += (f"GET /{REPO}/info/refs?service=git-upload-pack HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                "Connection: close\r\n\r\n").encode()
    twist = draw(st.integers(0, 7))
    if twist == 0:
        raw = raw[:draw(st.integers(0, len(raw)))]
    elif twist == 1:
        raw = draw(S.mutated([raw], max_ops=3))
    return WireInput(raw)


def _exchange(port: int, raw: bytes) -> Optional[bytes]:
    """Send RAW, half-close, read the answer to EOF; None when the server never ended it."""
    with socket.create_connection(("127.0.0.1", port), timeout=READ_TIMEOUT) as sock:
        try:
            sock.sendall(raw)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass                              # the server answered (and closed) before reading it all
        chunks = []
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                chunks.append(data)
        except socket.timeout:
            return None
        except ConnectionResetError:
            chunks.append(b"(reset)")
        return b"".join(chunks)


_STATUS = re.compile(rb"\AHTTP/1\.[01] (\d{3})")
_NEXT = re.compile(rb"HTTP/1\.[01] (\d{3}) ")        # answers after the first on a kept-alive connection
_BAD_LOG = re.compile(r"Traceback|WORKER TIMEOUT|Worker \(pid:\d+\) (was sent|exited)|Exception in worker|"
                      r"internal error|Error handling request")


def deliberate_5xx(status: int, log: str) -> bool:
    """Aspen's deliberate 5xx (503, and 500 with a `fatal:` message as stock), and
    gunicorn's own 501 for a transfer coding it does not know (RFC 9112 6.1)."""
    if status == 501:
        return "Invalid request from" in log and "Unsupported transfer coding" in log
    return status == 503 or (status == 500 and "fatal:" in log and "internal error" not in log)


class _Wire:
    def __init__(self, s: Session):
        self.session = s
        s.workdir.mkdir(parents=True, exist_ok=True)
        self.proc, self.port, self.log = _gunicorn("fuzz-aspen", "aspen_cgi.wsgi:application", s.root, s.workdir,
                                                   {"ASPEN_ACCESS_LOG": "1"}, WORKERS, 4, 60.0)
        self.offset = 0
        self.boots = 0
        self.count = 0
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self._log_text().count("Booting worker") >= WORKERS and self._probe():
                self.boots = self._log_text().count("Booting worker")
                self.offset = len(self._log_text())
                return
            time.sleep(0.1)
        raise RuntimeError(f"gunicorn did not answer:\n{self._log_text()[-3000:]}")

    def _log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def _probe(self) -> bool:
        try:
            ans = _exchange(self.port, f"GET /{REPO}/info/refs?service=git-upload-pack HTTP/1.1\r\n"
                                       "Host: x\r\nConnection: close\r\n\r\n".encode())
        except OSError:
            return False
        return bool(ans) and ans.startswith(b"HTTP/1.1 200")

    def _new_log(self) -> str:
        text = self._log_text()
        new, self.offset = text[self.offset:], len(text)
        return new

    def __call__(self, inp: WireInput) -> str:
        self.count += 1
        try:
            ans = _exchange(self.port, inp.raw)
        except OSError as e:
            ans = f"(connect failed: {e})".encode()
        log = self._new_log()
        if ans is None:
            raise Crash("hang", f"no end of answer within {READ_TIMEOUT:.0f}s after the request was half-closed")
        if _BAD_LOG.search(log):
            raise Crash("server log", log[-4000:])
        if self.proc.poll() is not None:
            raise Crash("server died", log[-4000:])
        boots = self._log_text().count("Booting worker")
        if boots != self.boots:
            self.boots = boots
            raise Crash("worker restarted", log[-4000:])
        m = _STATUS.match(ans)
        while m and m.group(1).startswith(b"1"):          # 100 Continue: the answer follows
            rest = ans[ans.find(b"\r\n\r\n") + 4:]
            m2 = _STATUS.match(rest)
            if not m2:
                break
            ans, m = rest, m2
        status = int(m.group(1)) if m else 0
        if status >= 500 and not deliberate_5xx(status, log):
            raise Crash(f"status {status}", ans[:2000].decode("latin-1") + "\n" + log[-2000:])
        if self.count % PROBE_EVERY == 0 and not self._probe():
            raise Crash("server not answering", self._new_log()[-4000:])
        if not m:
            return "no answer" if not ans else "not HTTP"
        more = _NEXT.findall(ans, m.end())
        return "+".join([str(status)] + [x.decode() for x in more[:2]])

    def end_check(self) -> None:
        url = f"http://127.0.0.1:{self.port}/{REPO}"
        res = subprocess.run(["git", "ls-remote", url], capture_output=True, timeout=120)
        if res.returncode != 0:
            raise Crash("ls-remote failed", res.stderr.decode(errors="replace") + self._new_log()[-3000:])
        disk = subprocess.run(["git", "for-each-ref", "--format=%(objectname)\t%(refname)"],
                              cwd=str(self.session.root / REPO), capture_output=True, check=True).stdout
        served = {line for line in res.stdout.splitlines() if not line.endswith((b"^{}", b"\tHEAD"))}
        if served != set(disk.splitlines()):
            raise Crash("ls-remote differs from the repository",
                        f"served {sorted(served)[:20]}\non disk {sorted(disk.splitlines())[:20]}")
        log = self._new_log()
        if _BAD_LOG.search(log):
            raise Crash("server log", log[-4000:])

    def stop(self) -> None:
        _terminate(self.proc)


@contextlib.contextmanager
def _open(s: Session) -> Iterator[Run]:
    w = _Wire(s)
    try:
        yield w
        w.end_check()
    finally:
        w.stop()


TARGETS = [
    Target("http-wire", "raw HTTP to gunicorn Aspen: chunked sizes/extensions, bad Content-Length, truncation",
           lambda s: _inputs(s), _open, slow=True),
]
