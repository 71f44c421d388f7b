"""Hostile and broken upload-pack requests sent straight to Aspen under
gunicorn. Each one gets a clear HTTP status or an ERR pkt-line (named in the
test's docstring), never a traceback in the body, never a hang; and the
server goes on serving: every test ends with a real clone."""

from __future__ import annotations

import gzip
import http.client
import os
import socket
import threading
import time
import zlib
from pathlib import Path

import pytest

from aspen_cgi.protocol.pktline import DELIM, FLUSH, encode

from . import harness as h

pytestmark = pytest.mark.timeout(60)

CT = "application/x-git-upload-pack-request"
UNKNOWN = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad") / "root"
    root.mkdir()
    repo = h.make_history(root / "repo.git")
    h.git("update-ref", "refs/hidden/secret", "HEAD~2", cwd=str(repo))
    h.git("config", "uploadpack.hideRefs", "refs/hidden", cwd=str(repo))
    s = h.Server(root, {}).start()
    s.repo = repo
    yield s
    s.stop()
    assert "Traceback" not in s.log_text(), s.log_text()[-3000:]


def post(srv, body: bytes, *, protocol: str = "", headers: dict | None = None, path: str = "/repo.git/git-upload-pack",
         timeout: float = 30) -> tuple[int, bytes, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout)
    hdrs = {"Content-Type": CT}
    if protocol:
        hdrs["Git-Protocol"] = protocol
    hdrs.update(headers or {})
    try:
        try:
            conn.request("POST", path, body=body, headers=hdrs)
        except (BrokenPipeError, ConnectionResetError):
            pass    # the server answered before reading it all (413): the answer is still there
        r = conn.getresponse()
        return r.status, r.read(), dict(r.getheaders())
    finally:
        conn.close()


def oid(srv, rev: str) -> str:
    return h.out("rev-parse", rev, cwd=str(srv.repo))


def v0_request(*lines: str, done: bool = True) -> bytes:
    body = b"".join(encode(l + "\n") for l in lines) + FLUSH
    return body + (encode("done\n") if done else b"")


def v2_fetch(*args: str) -> bytes:
    return encode("command=fetch\n") + encode("object-format=sha1\n") + DELIM + \
        b"".join(encode(a + "\n") for a in args) + FLUSH


def still_serves(srv, tmp_path: Path) -> None:
    dest = tmp_path / f"after-{time.monotonic_ns()}"
    h.git("-c", "protocol.version=2", "clone", "-q", f"{srv.url}/repo.git", str(dest))
    h.fsck_strict(str(dest))
    assert h.out("rev-parse", "HEAD", cwd=str(dest)) == oid(srv, "main")


def clean(body: bytes) -> None:
    assert b"Traceback" not in body and b'File "' not in body


def err_lines(body: bytes) -> list[bytes]:
    """ERR pkt-lines in BODY, also inside side-band 3 messages."""
    return [line for line in body.split(b"\n") if b"ERR " in line or b"\x03" in line]


# ---------------------------------------------------------------- framing

@pytest.mark.parametrize("body", [b"zzzz", b"00g5want", b"0003", b"0009ab", b"00", encode("want x") + b"!!"],
                         ids=["nonhex", "badhex", "len3", "truncated", "short-len", "trailing-junk"])
@pytest.mark.parametrize("protocol", ["", "version=2"])
def test_malformed_pkt_line_gets_400(srv, tmp_path, body, protocol):
    """Malformed pkt-line framing -> 400 Bad Request, empty body."""
    status, data, _ = post(srv, body, protocol=protocol)
    assert status == 400
    clean(data)
    still_serves(srv, tmp_path)


def test_oversized_pkt_line_length_gets_400(srv, tmp_path):
    """A pkt-line length of 0xffff (over 65520) -> 400."""
    status, data, _ = post(srv, b"ffff" + b"a" * 70000)
    assert status == 400
    clean(data)
    still_serves(srv, tmp_path)


def test_truncated_body_does_not_hang(srv, tmp_path):
    """Content-Length 1000, 60 bytes sent, then the client half-closes -> 400 within seconds."""
    body = v0_request(f"want {oid(srv, 'main')}")
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=20) as s:
        s.sendall((f"POST /repo.git/git-upload-pack HTTP/1.1\r\nHost: x\r\nContent-Type: {CT}\r\n"
                   f"Content-Length: 1000\r\n\r\n").encode() + body)
        s.shutdown(socket.SHUT_WR)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    assert time.monotonic() - started < 15
    assert data.startswith(b"HTTP/1.1 400"), data[:200]
    clean(data)
    still_serves(srv, tmp_path)


def test_wrong_content_type_gets_415(srv, tmp_path):
    """Content-Type text/plain -> 415 with stock's message."""
    status, data, _ = post(srv, v0_request(f"want {oid(srv, 'main')}"), headers={"Content-Type": "text/plain"})
    assert status == 415
    assert data == (b"Expected POST with Content-Type 'application/x-git-upload-pack-request', "
                    b"but received 'text/plain' instead.\n")
    still_serves(srv, tmp_path)


@pytest.mark.parametrize("body,what", [
    (b"\x1f\x8b\x08\x00garbage-not-deflate", "corrupt"),
    (gzip.compress(v0_request("want " + "a" * 40))[:20], "truncated"),
], ids=["corrupt", "truncated"])
def test_broken_gzip_gets_400(srv, tmp_path, body, what):
    """A corrupt or truncated gzip body with Content-Encoding: gzip -> 400."""
    status, data, _ = post(srv, body, headers={"Content-Encoding": "gzip"})
    assert status == 400
    clean(data)
    still_serves(srv, tmp_path)


# ---------------------------------------------------------------- size limits

def worker_pids(srv) -> list[int]:
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == srv.proc.pid:
                        pids.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return pids


def peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def bomb(inflated: int) -> bytes:
    """A gzip stream of INFLATED zero bytes (about 1/1000 of that on the wire)."""
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b"\0" * (1 << 20)
    out = [c.compress(block) for _ in range(inflated >> 20)]
    out.append(c.flush())
    return b"".join(out)


@pytest.fixture
def small_buffer_server(tmp_path, server_factory, root):
    return server_factory(root, GIT_HTTP_MAX_REQUEST_BUFFER="4m")


def test_gzip_bomb_refused_quickly_without_memory_growth(small_buffer_server, tmp_path):
    """~2 MB of gzip (under the 4 MiB limit) inflating to 2 GiB, Content-Encoding: gzip
    -> 413 in seconds; no worker's peak RSS grows by more than 4x the limit."""
    srv = small_buffer_server
    payload = bomb(2 << 30)
    assert len(payload) < 4 << 20
    before = {p: peak_rss_kib(p) for p in worker_pids(srv)}
    assert before
    started = time.monotonic()
    status, data, _ = post(srv, payload, headers={"Content-Encoding": "gzip"},
                           path="/repo.git/git-upload-pack")
    elapsed = time.monotonic() - started
    assert status == 413, data[:200]
    clean(data)
    assert elapsed < 10
    growth = max(peak_rss_kib(p) - before[p] for p in before if os.path.exists(f"/proc/{p}"))
    assert growth < 16 * 1024, f"a worker's peak RSS grew by {growth} KiB for a 4 MiB request limit"
    dest = tmp_path / "after"
    h.git("clone", "-q", f"{srv.url}/repo.git", str(dest))
    h.fsck_strict(str(dest))


def test_small_gzip_bomb_over_the_buffer_gets_413(srv, tmp_path):
    """~100 KB of gzip inflating to 128 MiB (over 10 MiB) -> 413, quickly."""
    started = time.monotonic()
    status, data, _ = post(srv, bomb(128 << 20), headers={"Content-Encoding": "gzip"})
    assert status == 413
    assert time.monotonic() - started < 10
    clean(data)
    still_serves(srv, tmp_path)


def test_body_over_max_request_buffer_gets_413(small_buffer_server, tmp_path):
    """A 5 MiB request with Content-Length and GIT_HTTP_MAX_REQUEST_BUFFER=4m -> 413."""
    srv = small_buffer_server
    body = v0_request(*[f"want {UNKNOWN}"] * 100000)
    assert len(body) > 4 << 20
    status, data, _ = post(srv, body)
    assert status == 413
    clean(data)
    dest = tmp_path / "after"
    h.git("clone", "-q", f"{srv.url}/repo.git", str(dest))


def test_chunked_body_over_max_request_buffer_gets_413(small_buffer_server, tmp_path):
    """The same 5 MiB request sent chunked (no Content-Length) -> 413, read
    while the body is still being sent (the server answers at the limit)."""
    srv = small_buffer_server
    body = v0_request(*[f"want {UNKNOWN}"] * 100000)
    head = (f"POST /repo.git/git-upload-pack HTTP/1.1\r\nHost: x\r\nContent-Type: {CT}\r\n"
            "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n").encode()
    chunks = [b"%x\r\n%s\r\n" % (len(body[i:i + 65536]), body[i:i + 65536]) for i in range(0, len(body), 65536)]
    answer = h.send_and_answer(srv.port, head, chunks + [b"0\r\n\r\n"])
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:300]
    clean(answer.split(b"\r\n\r\n", 1)[1])
    dest = tmp_path / "after"
    h.git("clone", "-q", f"{srv.url}/repo.git", str(dest))


def million_haves(srv) -> bytes:
    main = oid(srv, "main")
    line = encode(f"have {main}\n")
    return encode(f"want {main} multi_ack_detailed side-band-64k\n") + FLUSH + line * 1_000_000 + encode("done\n")


def test_a_million_haves_is_bounded_by_the_buffer(srv, tmp_path):
    """1,000,000 have lines (~50 MB) with Content-Length -> 413 before reading them."""
    started = time.monotonic()
    status, data, _ = post(srv, million_haves(srv))
    assert status == 413
    assert time.monotonic() - started < 20
    clean(data)
    still_serves(srv, tmp_path)


def test_a_million_gzipped_haves_is_bounded_by_the_buffer(srv, tmp_path):
    """1,000,000 have lines, gzip-encoded (~200 KB on the wire, ~50 MB inflated,
    over the 10 MiB buffer) -> 413, not a 50 MB parse."""
    started = time.monotonic()
    status, data, _ = post(srv, gzip.compress(million_haves(srv), 1), headers={"Content-Encoding": "gzip"})
    assert status == 413
    assert time.monotonic() - started < 20
    clean(data)
    still_serves(srv, tmp_path)


def test_many_haves_within_the_buffer_are_served(srv, tmp_path):
    """100,000 haves (5 MB, under 10 MiB) of one known commit -> 200 with a pack."""
    main, old = oid(srv, "main"), oid(srv, "main~1")
    body = encode(f"want {main} side-band-64k ofs-delta\n") + FLUSH + encode(f"have {old}\n") * 100_000 + \
        encode("done\n")
    status, data, _ = post(srv, body, timeout=60)
    assert status == 200
    assert b"PACK" in data
    clean(data)
    still_serves(srv, tmp_path)


# ---------------------------------------------------------------- request content

@pytest.mark.parametrize("protocol", ["", "version=2"])
def test_want_of_unknown_object_gets_err_not_our_ref(srv, tmp_path, protocol):
    """want <unknown id> -> 200 with `ERR upload-pack: not our ref <id>`."""
    body = v2_fetch(f"want {UNKNOWN}", "done") if protocol else v0_request(f"want {UNKNOWN} side-band-64k")
    status, data, _ = post(srv, body, protocol=protocol)
    assert status == 200
    assert b"ERR upload-pack: not our ref " + UNKNOWN.encode() in data
    clean(data)
    still_serves(srv, tmp_path)


@pytest.mark.parametrize("protocol", ["", "version=1"])
def test_want_of_hidden_refs_object_gets_err_not_our_ref(srv, tmp_path, protocol):
    """v0/v1 want of a hidden ref's commit that no advertised ref reaches
    -> 200 with `ERR upload-pack: not our ref <id>`, as stock."""
    repo = str(srv.repo)
    secret = h.git("commit-tree", "-m", "secret", "main^{tree}", cwd=repo).stdout.decode().strip()
    h.git("update-ref", "refs/hidden/unreachable", secret, cwd=repo)
    body = v0_request(f"want {secret} side-band-64k")
    status, data, _ = post(srv, body, protocol=protocol)
    assert status == 200
    assert b"ERR upload-pack: not our ref " + secret.encode() in data
    clean(data)
    env = {"GIT_PROJECT_ROOT": str(srv.root), "GIT_HTTP_EXPORT_ALL": "1", "REQUEST_METHOD": "POST",
           "PATH_INFO": "/repo.git/git-upload-pack", "CONTENT_TYPE": CT, "CONTENT_LENGTH": str(len(body))}
    if protocol:
        env["GIT_PROTOCOL"] = protocol
    assert h.stock(env, body).body == data
    still_serves(srv, tmp_path)


@pytest.mark.parametrize("protocol", ["", "version=2"])
def test_deepen_2_pow_31_gets_400(srv, tmp_path, protocol):
    """deepen 2147483648 -> 400 (invalid deepen), nothing run."""
    main = oid(srv, "main")
    body = v2_fetch(f"want {main}", "deepen 2147483648", "done") if protocol else \
        v0_request(f"want {main} shallow", "deepen 2147483648")
    status, data, _ = post(srv, body, protocol=protocol)
    assert status == 400
    clean(data)
    still_serves(srv, tmp_path)


def test_deepen_2_pow_31_minus_1_is_a_full_shallow_clone(srv, tmp_path):
    """deepen 2147483647 (the largest valid) -> 200 with a pack."""
    main = oid(srv, "main")
    status, data, _ = post(srv, v0_request(f"want {main} shallow side-band-64k", "deepen 2147483647"))
    assert status == 200 and b"PACK" in data
    still_serves(srv, tmp_path)


@pytest.mark.parametrize("body", [
    v0_request("want nothex"),
    v0_request(f"want {UNKNOWN}", "have-not this"),
    v0_request(f"want {UNKNOWN}", "deepen-since yesterday"),
    v0_request(f"want {UNKNOWN}", "shallow 1234"),
    encode("command=rm -rf\n") + FLUSH,
    encode("command=ls-refs\n") + DELIM + encode("sudo\n") + FLUSH,
    encode("command=fetch\n") + DELIM + encode(f"want {UNKNOWN}\n"),
], ids=["want-nonhex", "bad-have-line", "bad-deepen-since", "bad-shallow", "bad-v2-command",
        "bad-ls-refs-arg", "v2-no-flush"])
def test_invalid_request_lines_get_400(srv, tmp_path, body):
    """Lines that are not valid upload-pack requests -> 400."""
    protocol = "version=2" if body.startswith(b"0") and b"command=" in body else ""
    status, data, _ = post(srv, body, protocol=protocol)
    assert status == 400
    clean(data)
    still_serves(srv, tmp_path)


def test_deepen_not_of_unknown_ref_gets_an_error_not_a_hang(srv, tmp_path):
    """deepen-not refs/heads/nope -> git's `ERR`/fatal inside a 200 (stock semantics), promptly."""
    main = oid(srv, "main")
    status, data, _ = post(srv, v0_request(f"want {main} shallow side-band-64k", "deepen-not refs/heads/nope"))
    assert status == 200
    assert b"PACK" not in data
    clean(data)
    still_serves(srv, tmp_path)


def test_empty_body_gets_400_and_lone_flush_gets_empty_200(srv, tmp_path):
    """An empty body -> 400 (stock's upload-pack dies on it: Aspen says so with a
    status); a lone flush, v0 or v2 -> 200 with an empty body (stock)."""
    assert post(srv, b"")[:2] == (400, b"")
    for proto in ("", "version=2"):
        assert post(srv, FLUSH, protocol=proto)[:2] == (200, b"")
    still_serves(srv, tmp_path)


def test_bad_content_length_gets_400(srv, tmp_path):
    """Content-Length: abc -> 400 from the HTTP server or Aspen, never a hang."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=20) as s:
        s.sendall(f"POST /repo.git/git-upload-pack HTTP/1.1\r\nHost: x\r\nContent-Type: {CT}\r\n"
                  f"Content-Length: abc\r\n\r\n0000".encode())
        s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 400") or data.startswith(b"HTTP/1.0 400"), data[:100]
    still_serves(srv, tmp_path)


def test_concurrent_garbage_does_not_starve_clones(srv, tmp_path):
    """20 parallel malformed requests while a clone runs -> all 400, the clone succeeds."""
    results = []

    def bad():
        results.append(post(srv, b"zzzz" * 1000)[0])

    threads = [threading.Thread(target=bad) for _ in range(20)]
    for t in threads:
        t.start()
    still_serves(srv, tmp_path)
    for t in threads:
        t.join(30)
    assert results == [400] * 20
