"""Limits: ASPEN_MAX_PUSH_BYTES (413, refs unchanged), receive.maxInputSize end
to end, the gzip bomb guard, ASPEN_IDLE_TIMEOUT and ASPEN_REQUEST_TIMEOUT
freeing a single-threaded gunicorn worker (slow body, trickle, a client that
stops reading a clone), the CGI's idle bound on its stdin pipe, and the
serving worker's peak RSS (VmHWM) not growing with the pack size."""

from __future__ import annotations

import gzip
import os
import re
import select
import signal
import socket
import subprocess
import time
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest

from . import harness as h
from . import pushkit as pk

MIB = 1 << 20


# -- a gunicorn server with one worker and N threads ----------------------------------------------

@dataclass
class OneWorker(h.Server):
    """h.Server with a single gthread worker of THREADS threads: a worker held by
    one request blocks the next, so "the next request is served" proves it was freed."""
    threads: int = 1
    workers: int = 1
    timeout: int = 300

    def start(self) -> "OneWorker":
        self.env = {"ASPEN_ACCESS_LOG": "1", **self.env}
        super().start()
        deadline = time.time() + 30
        while self.worker() is None:
            assert self.proc.poll() is None and time.time() < deadline, self.log_text()
            time.sleep(0.05)
        return self

    def worker(self):
        kids = _children(self.proc.pid)
        return kids[0] if kids else None


def _children(pid: int) -> list[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def _hwm(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.fixture
def one_worker(tmp_path):
    servers = []

    def start(root: Path, **env: str) -> OneWorker:
        s = OneWorker(root, env).start()
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


def _wait(cond, what: str, guard: float = 60.0):
    """Hang guard: poll COND until true; fail after GUARD seconds."""
    end = time.monotonic() + guard
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"still waiting after {guard}s: {what}")


def _quarantines(repo: Path) -> list[str]:
    return [n for n in os.listdir(repo / "objects") if n.startswith("incoming-")]


def _big_commit(work: Path, name: str, size: int) -> str:
    with open(work / name, "wb") as f:
        for _ in range(size // MIB):
            f.write(os.urandom(MIB))
    h.git("-c", "core.compression=0", "add", name, cwd=str(work))
    return pk.commit(work, name)


def _client(url: str, tmp: Path) -> Path:
    work = tmp / f"work-{uuid.uuid4().hex[:6]}"
    h.git("-c", "core.compression=0", "clone", "-q", url, str(work))
    h.git("config", "core.compression", "0", cwd=str(work))
    h.git("config", "pack.compression", "0", cwd=str(work))
    return work


def _http(port: int, head: str, body: bytes = b"", rcvbuf: int = 0) -> socket.socket:
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(60)     # hang guard on every read
    s.connect(("127.0.0.1", port))
    s.sendall(head.encode() + body)
    return s


def _read_all(s: socket.socket) -> bytes:
    out = bytearray()
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    except (ConnectionResetError, BrokenPipeError):
        pass
    return bytes(out)


def _post_head(path: str, length=None, extra: str = "") -> str:
    svc = path.rsplit("/", 1)[1]
    size = f"Content-Length: {length}\r\n" if length is not None else "Transfer-Encoding: chunked\r\n"
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-{svc}-request\r\n{size}{extra}\r\n")


def _push_body(repo: Path, tmp: Path, size: int) -> tuple[bytes, str, str]:
    """A receive-pack request creating refs/heads/big with a SIZE-byte random file."""
    work = tmp / f"src-{uuid.uuid4().hex[:6]}"
    h.git("clone", "-q", str(repo), str(work))
    base = pk.rev(work, "HEAD")
    tip = _big_commit(work, "big.bin", size)
    body = pk.request([("0" * 40, tip, "refs/heads/big")], pack=pk.pack_for(work, [tip, "^" + base]))
    return body, base, tip


# -- ASPEN_MAX_PUSH_BYTES ---------------------------------------------------------------------------

def test_push_over_max_push_bytes_is_413_and_changes_nothing(root, tmp_path, server_factory):
    repo = pk.enable_push(root / "repo.git")
    before = h.refs_of(str(repo))
    s = server_factory(root, ASPEN_MAX_PUSH_BYTES="1m", ASPEN_ACCESS_LOG="1")
    work = _client(f"{s.url}/repo.git", tmp_path)
    # The server refuses after 1 MiB and reads and drops the rest before it answers (Body.discard):
    # closing with unread bytes resets the connection, and a client still sending then says
    # "curl 55 Send failure: Broken pipe" instead of the 413 (seen once, a clean-clone run under load).
    _big_commit(work, "big.bin", 8 * MIB)
    p = pk.push(work, "origin", "main", check=False)
    err = p.stderr.decode()
    assert p.returncode != 0
    assert "HTTP 413" in err, err           # git shows the status: "RPC failed; HTTP 413"
    assert h.refs_of(str(repo)) == before
    assert _quarantines(repo) == []
    assert "push is larger than the server's limit of 1048576 bytes (ASPEN_MAX_PUSH_BYTES)" in s.log_text()
    # a push under the bound still lands
    h.git("reset", "-q", "--hard", "origin/main", cwd=str(work))
    tip = pk.commit(work, "small")
    pk.push(work, "origin", "main")
    assert h.refs_of(str(repo))["refs/heads/main"] == tip
    h.fsck_strict(str(repo))


def test_declared_length_over_the_bound_is_refused_before_reading(root, tmp_path):
    repo = pk.enable_push(root / "repo.git")
    before = h.refs_of(str(repo))
    body, _, _ = _push_body(repo, tmp_path, 2 * MIB)
    env = {"GIT_PROJECT_ROOT": str(root), "GIT_HTTP_EXPORT_ALL": "1", "REQUEST_METHOD": "POST",
           "PATH_INFO": "/repo.git/git-receive-pack", "CONTENT_TYPE": "application/x-git-receive-pack-request",
           "CONTENT_LENGTH": str(len(body)), "REMOTE_USER": "u", "ASPEN_MAX_PUSH_BYTES": "1m"}
    r = h.aspen(env, body)
    assert r.status == 413
    assert f"push of {len(body)} bytes is larger than the server's limit" in r.stderr.decode()
    assert b"Traceback" not in r.body + r.stderr
    assert h.refs_of(str(repo)) == before and _quarantines(repo) == []
    # without the setting (stock's default) the same push lands
    env.pop("ASPEN_MAX_PUSH_BYTES")
    r = h.aspen(env, body)
    assert r.status == 200 and pk.report_lines(r.body) == ["unpack ok", "ok refs/heads/big"]


def test_receive_max_input_size_shows_what_stock_shows(root, tmp_path, server_factory, cgi_server_factory):
    """receive.maxInputSize: the client shows index-pack's fatal line and the
    unpacker error, through Aspen as through stock."""
    repo = pk.enable_push(root / "repo.git", **{"receive.maxInputSize": "100k"})
    stock_root = tmp_path / "stock"
    stock_root.mkdir()
    h.git("clone", "-q", "--bare", str(repo), str(stock_root / "repo.git"))
    pk.enable_push(stock_root / "repo.git", **{"receive.maxInputSize": "100k"})
    aspen = server_factory(root)
    stock = cgi_server_factory(stock_root)
    outs = {}
    for name, url, gitdir in (("aspen", aspen.url, repo), ("stock", stock.url, stock_root / "repo.git")):
        before = h.refs_of(str(gitdir))
        work = _client(f"{url}/repo.git", tmp_path)
        _big_commit(work, "big.bin", 1 * MIB)
        p = pk.push(work, "origin", "main", check=False)
        outs[name] = p.stderr.decode()
        assert p.returncode != 0
        assert h.refs_of(str(gitdir)) == before
        assert _quarantines(gitdir) == []
    for name, err in outs.items():
        assert "remote: fatal: pack exceeds maximum allowed size" in err, (name, err)
        assert "error: remote unpack failed: unpack-objects abnormal exit" in err, (name, err)


# -- the gzip bomb guard -------------------------------------------------------------------------------

def test_gzip_bomb_push_is_refused_with_flat_memory(root, tmp_path, one_worker):
    repo = pk.enable_push(root / "repo.git")
    before = h.refs_of(str(repo))
    s = one_worker(root, ASPEN_MAX_PUSH_BYTES="0")
    tip = pk.rev(repo, "main")
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [z.compress(pk.request([(tip, tip, "refs/heads/bomb")], pack=b"PACK\0\0\0\2\0\0\0\1"))]
    zeros = b"\0" * MIB
    parts += [z.compress(zeros) for _ in range(512)]      # 512 MiB of zeros in 0.5 MiB of gzip
    bomb = b"".join(parts) + z.flush()
    _read_all(_http(s.port, "GET /repo.git/info/refs?service=git-receive-pack HTTP/1.0\r\nHost: x\r\n\r\n"))
    base = _hwm(s.worker())
    head = _post_head("/repo.git/git-receive-pack", len(bomb), "Content-Encoding: gzip\r\nConnection: close\r\n")
    resp = h.send_and_answer(s.port, head.encode(), [bomb[i:i + 65536] for i in range(0, len(bomb), 65536)])
    assert resp.startswith(b"HTTP/1.1 413 "), resp[:200]
    assert "gzip request body inflates more than 1000 times its size" in s.log_text()
    assert _hwm(s.worker()) - base < 20 * MIB
    assert h.refs_of(str(repo)) == before and _quarantines(repo) == []


# -- ASPEN_IDLE_TIMEOUT / ASPEN_REQUEST_TIMEOUT under gunicorn -----------------------------------------------

def _served(s: OneWorker) -> bool:
    """A following request is answered (the single worker thread is free)."""
    resp = _read_all(_http(s.port, "GET /repo.git/info/refs?service=git-upload-pack HTTP/1.0\r\nHost: x\r\n\r\n"))
    assert re.match(rb"HTTP/1\.[01] 200 ", resp), resp[:300]
    return True


def _git_children_gone(s: OneWorker) -> bool:
    return not _children(s.worker())


def test_idle_client_mid_body_frees_the_worker(root, tmp_path, one_worker):
    repo = pk.enable_push(root / "repo.git")
    before = h.refs_of(str(repo))
    s = one_worker(root, ASPEN_IDLE_TIMEOUT="2")
    body, _, _ = _push_body(repo, tmp_path, 1 * MIB)
    half = len(body) // 2
    slow = _http(s.port, _post_head("/repo.git/git-receive-pack", len(body)), body[:half])
    _wait(lambda: _quarantines(repo) or _children(s.worker()), "the push to start")
    resp = _read_all(slow)            # nothing more is sent: the server gives up on us
    assert resp.startswith(b"HTTP/1.1 408 Request Timeout"), resp[:200]
    assert _served(s)
    _wait(lambda: _git_children_gone(s), "index-pack to be killed")
    assert h.refs_of(str(repo)) == before and _quarantines(repo) == []
    assert "no data from the client for 2 s (ASPEN_IDLE_TIMEOUT)" in s.log_text()
    slow.close()


def test_trickling_client_is_ended_at_the_request_timeout(root, tmp_path, one_worker):
    repo = pk.enable_push(root / "repo.git")
    before = h.refs_of(str(repo))
    s = one_worker(root, ASPEN_IDLE_TIMEOUT="2", ASPEN_REQUEST_TIMEOUT="3")
    body, _, _ = _push_body(repo, tmp_path, 1 * MIB)
    slow = _http(s.port, _post_head("/repo.git/git-receive-pack", len(body)), body[:4096])
    sent, ended = 4096, False
    end = time.monotonic() + 60          # hang guard: never idle 2 s, so only the deadline ends it
    while time.monotonic() < end and sent < len(body):
        try:
            slow.sendall(body[sent:sent + 1])
        except OSError:
            ended = True
            break
        sent += 1
        r, _, _ = select.select([slow], [], [], 0.3)
        if r:
            ended = True
            break
    assert ended, "the server kept reading a trickle for 60 s"
    assert sent < len(body)
    assert _read_all(slow)[:12] in (b"", b"HTTP/1.1 408")
    assert _served(s)
    _wait(lambda: _git_children_gone(s), "index-pack to be killed")
    assert h.refs_of(str(repo)) == before and _quarantines(repo) == []
    assert "request took longer than 3 s (ASPEN_REQUEST_TIMEOUT)" in s.log_text()
    slow.close()


def test_client_that_stops_reading_a_clone_frees_the_worker(root, tmp_path, one_worker):
    repo = root / "repo.git"
    work = tmp_path / "w"
    h.git("clone", "-q", str(repo), str(work))
    _big_commit(work, "big.bin", 16 * MIB)
    h.git("-c", "pack.compression=0", "push", "-q", str(repo), "HEAD:refs/heads/main", cwd=str(work))
    tip = pk.rev(repo, "main")
    s = one_worker(root, ASPEN_IDLE_TIMEOUT="2", ASPEN_CACHE="off")
    want = f"want {tip} side-band-64k\n"
    req = f"{len(want) + 4:04x}{want}00000009done\n".encode()
    stalled = _http(s.port, _post_head("/repo.git/git-upload-pack", len(req)), req, rcvbuf=4096)
    assert stalled.recv(64).startswith(b"HTTP/1.1 200 ")      # then we stop reading
    _wait(lambda: "ended=idle-timeout" in s.log_text(), "the stalled clone to be dropped")
    assert _served(s)
    _wait(lambda: _git_children_gone(s), "upload-pack to be killed")
    _wait(lambda: not [p for p in os.listdir("/proc") if p.isdigit() and _is_upload_for(int(p), repo)],
          "no upload-pack or pack-objects left for the repository")
    stalled.close()


def _is_upload_for(pid: int, repo: Path) -> bool:
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return False
    return (b"upload-pack" in cmd or b"pack-objects" in cmd) and cwd == str(repo)


# -- the CGI: fd 0 is Apache's pipe ----------------------------------------------------------------------------

def test_cgi_gives_up_on_an_idle_stdin(root, tmp_path):
    repo = pk.enable_push(root / "repo.git")
    before = h.refs_of(str(repo))
    body, _, _ = _push_body(repo, tmp_path, 1 * MIB)
    env = dict(h.BASE_ENV, GIT_PROJECT_ROOT=str(root), GIT_HTTP_EXPORT_ALL="1", REQUEST_METHOD="POST",
               PATH_INFO="/repo.git/git-receive-pack", CONTENT_TYPE="application/x-git-receive-pack-request",
               CONTENT_LENGTH=str(len(body)), REMOTE_USER="u", ASPEN_IDLE_TIMEOUT="1")
    proc = subprocess.Popen([h.ASPEN_CGI], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdin.write(body[:len(body) // 2])
    proc.stdin.flush()                   # and the pipe stays open, silent
    try:
        proc.wait(timeout=60)      # hang guard; its output fits the pipes
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        raise AssertionError("aspen-cgi kept waiting on an idle stdin")
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.stdin.close()
    r = h.parse_cgi(out, err)
    assert r.status == 408
    assert "no data from the client for 1 s (ASPEN_IDLE_TIMEOUT)" in err.decode()
    assert h.refs_of(str(repo)) == before and _quarantines(repo) == []


# -- bounded memory: the worker's peak RSS does not grow with the pack ---------------------------------------

def test_worker_peak_rss_does_not_grow_with_pack_size(root, tmp_path, one_worker):
    repo = pk.enable_push(root / "repo.git")
    s = one_worker(root, ASPEN_CACHE="off")
    url = f"{s.url}/repo.git"
    work = _client(url, tmp_path)                       # a small clone and a small push warm the worker up
    (work / "warm.txt").write_text("warm\n")
    h.git("add", "warm.txt", cwd=str(work))
    pk.commit(work, "warm")
    pk.push(work, "origin", "main")
    base = _hwm(s.worker())
    marks = {}
    for mib in (50, 250):
        _big_commit(work, f"big{mib}.bin", mib * MIB)
        pk.push(work, "origin", "main")
        marks[f"push {mib} MiB"] = _hwm(s.worker())
    big = tmp_path / "big-clone"
    h.git("clone", "-q", "--bare", url, str(big))      # ~300 MiB of pack
    marks["clone ~300 MiB"] = _hwm(s.worker())
    h.fsck_strict(str(big))
    assert h.refs_of(str(big)) == h.refs_of(str(repo))
    grown = {k: round((v - base) / MIB, 1) for k, v in marks.items()}
    assert all(v < 20 for v in grown.values()), f"worker VmHWM grew (MiB over {base / MIB:.0f}): {grown}"


def test_inflated_push_is_held_to_max_push_bytes():
    """A gzip push under the bound on the wire but over it inflated is refused
    (413) as it inflates, without holding it."""
    import io

    from aspen_cgi.http.body import Body, BodyError
    from aspen_cgi.http.limits import Limits
    plain = os.urandom(3 * MIB // 2).hex().encode()           # 3 MiB that gzip halves
    packed = gzip.compress(plain)
    limits = Limits.from_env({"ASPEN_MAX_PUSH_BYTES": "2m"})
    assert len(packed) < 2 * MIB
    body = Body(io.BytesIO(packed), len(packed), True, limits)
    with pytest.raises(BodyError) as e:
        while body.read(65536):
            pass
    assert e.value.status == 413 and "inflated push is larger than the server's limit" in e.value.message
    assert 2 * MIB < body.inflated <= 2 * MIB + 65536
    # the same body under a larger bound reads whole
    body = Body(io.BytesIO(packed), len(packed), True, Limits.from_env({"ASPEN_MAX_PUSH_BYTES": "4m"}))
    out = bytearray()
    while chunk := body.read(65536):
        out += chunk
    assert bytes(out) == plain


def test_a_body_refused_as_too_large_is_read_and_dropped_up_to_a_bound():
    """Body.discard: after the 413, what the client still sends is read and
    dropped (no more than asked, never past Content-Length), so the server
    closes with nothing unread and the client reads the answer."""
    import io

    from aspen_cgi.http.body import Body, BodyError
    from aspen_cgi.http.limits import Limits
    data = b"x" * 300_000
    body = Body(io.BytesIO(data), None, False, Limits(max_push_bytes=100_000, started=time.monotonic()))
    with pytest.raises(BodyError) as e:
        while body.read(65536):
            pass
    assert e.value.status == 413
    stream = body.stream
    assert body.discard(50_000) >= 50_000 and stream.tell() < len(data)       # stops at its bound
    assert body.discard(1 << 20) > 0 and stream.tell() == len(data)            # then reads to the end
    assert body.discard(1 << 20) == 0
    sized = Body(io.BytesIO(data + b"next request"), len(data), False, Limits(max_push_bytes=100_000, started=time.monotonic()))
    with pytest.raises(BodyError):
        while sized.read(65536):
            pass
    sized.discard(1 << 30)
    assert sized.stream.read() == b"next request"                             # never past Content-Length
