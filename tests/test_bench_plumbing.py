"""The bench's plumbing: the WSGI-to-CGI bridge, the counting proxy's byte and
pack counts, target start-up, and process-tree CPU/RSS. Real processes on
loopback; no timing is asserted."""

from __future__ import annotations

import random
import socket
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bench.model import RequestRecord
from bench.procstats import ProcTree, _Precise, precise_cpu_s
from bench.proxy import CountingProxy, PackCounter
from bench.targets import _gunicorn, _terminate, copy_root, running, running_targets

from .harness import git, out, refs_of

# -- a tiny upstream whose every byte is known ---------------------------------

FIXED_BODY = b"x" * 1000 + b"\n"
CHUNKED_BODY = b"5\r\nhello\r\n1a;ext=1\r\n" + b"y" * 26 + b"\r\n0\r\nX-Trailer: 1\r\n\r\n"
CLOSE_BODY = b"until the connection closes\n" * 50


def _read_message(rfile) -> tuple[bytes, bytes]:
    """(head, raw body) of one request; body per Content-Length or chunked."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        line = rfile.readline()
        if not line:
            return b"", b""
        head += line
    lower = head.lower()
    body = b""
    if b"transfer-encoding: chunked" in lower:
        while True:
            line = rfile.readline()
            body += line
            size = int(line.split(b";")[0], 16)
            if size == 0:
                while True:
                    t = rfile.readline()
                    body += t
                    if t == b"\r\n":
                        return head, body
            body += rfile.read(size + 2)
    for line in lower.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            body = rfile.read(int(line.split(b":")[1]))
    return head, body


class _Upstream(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _UpstreamHandler)
        self.responses: list[bytes] = []


class _UpstreamHandler(socketserver.StreamRequestHandler):
    def handle(self):
        while True:
            head, body = _read_message(self.rfile)
            if not head:
                return
            path = head.split(b" ")[1]
            if path.startswith(b"/fixed"):
                resp = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Seen: %d\r\n\r\n" % (len(FIXED_BODY), len(body))
                resp += FIXED_BODY
            elif path.startswith(b"/chunked"):
                resp = b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n" + CHUNKED_BODY
            elif path.startswith(b"/empty"):
                resp = b"HTTP/1.1 204 No Content\r\n\r\n"
            else:
                resp = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + CLOSE_BODY
            self.server.responses.append(resp)
            self.wfile.write(resp)
            self.wfile.flush()
            if b"Connection: close" in resp:
                return


@pytest.fixture
def upstream():
    srv = _Upstream()
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _recv_response(sock: socket.socket, buf: bytearray, expected: bytes) -> bytes:
    while len(buf) < len(expected):
        data = sock.recv(65536)
        if not data:
            break
        buf += data
    got = bytes(buf[:len(expected)])
    del buf[:len(expected)]
    return got


def test_proxy_counts_exact_bytes_on_keepalive_connection(upstream):
    with CountingProxy("127.0.0.1", upstream.server_address[1], "t") as proxy:
        requests = [
            b"GET /fixed?a=1 HTTP/1.1\r\nHost: x\r\n\r\n",
            b"POST /fixed HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nhello world",
            b"POST /chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\n\r\n",
            b"GET /empty HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /close HTTP/1.1\r\nHost: x\r\n\r\n",
        ]
        mark = proxy.mark()
        received = []
        with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
            buf = bytearray()
            for i, req in enumerate(requests):
                # send the chunked one in awkward pieces: framing must not depend on read boundaries
                for j in range(0, len(req), 7 if i == 2 else len(req)):
                    sock.sendall(req[j:j + (7 if i == 2 else len(req))])
                if i < len(requests) - 1:
                    received.append(_recv_response(sock, buf, _expected(i)))
            while True:  # the last response lasts until the server closes
                data = sock.recv(65536)
                if not data:
                    break
                buf += data
            received.append(bytes(buf))
        assert received == upstream.responses
        recs = proxy.since(mark)
    assert [(r.method, r.path, r.status) for r in recs] == [
        ("GET", "/fixed?a=1", 200), ("POST", "/fixed", 200), ("POST", "/chunked", 201), ("GET", "/empty", 204),
        ("GET", "/close", 200)]
    assert [r.request_bytes for r in recs] == [len(r) for r in requests]
    assert [r.response_bytes for r in recs] == [len(r) for r in received]
    assert all(r.target == "t" and r.pack_bytes == 0 for r in recs)
    assert b"X-Seen: 11" in received[1]


def _expected(i: int) -> bytes:
    if i in (0, 1):
        seen = 0 if i == 0 else 11
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Seen: %d\r\n\r\n" % (len(FIXED_BODY), seen) + FIXED_BODY
    if i == 2:
        return b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n" + CHUNKED_BODY
    return b"HTTP/1.1 204 No Content\r\n\r\n"


def test_proxy_many_connections_in_parallel(upstream):
    answers: list[bytes] = []            # filled by the clients; checked here, not in their threads
    failures: list[str] = []
    with CountingProxy("127.0.0.1", upstream.server_address[1], "t") as proxy:
        def client():
            try:
                with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as s:
                    buf = bytearray()
                    for _ in range(3):
                        s.sendall(b"GET /fixed HTTP/1.1\r\nHost: x\r\n\r\n")
                        answers.append(_recv_response(s, buf, _expected(0)))
            except BaseException as e:       # noqa: BLE001  (every way a client thread can end, seen here)
                failures.append(repr(e))

        threads = [threading.Thread(target=client) for _ in range(60)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        recs = proxy.records
    assert failures == []
    assert answers == [_expected(0)] * 180
    assert len(recs) == 180
    assert {r.response_bytes for r in recs} == {len(_expected(0))}


# -- pack counting ----------------------------------------------------------------

def _pkt(payload: bytes) -> bytes:
    return b"%04x" % (len(payload) + 4) + payload


def _feed_in_pieces(data: bytes, seed: int) -> int:
    rnd = random.Random(seed)
    counter = PackCounter()
    i = 0
    while i < len(data):
        n = rnd.choice([1, 3, 5, 4000, 70000])
        counter.feed(data[i:i + n])
        i += n
    return counter.pack_bytes


@pytest.mark.parametrize("seed", range(5))
def test_pack_counter_framings(seed):
    pack = b"PACK" + random.Random(seed).randbytes(140000)
    bands = b"".join(_pkt(b"\x01" + pack[i:i + 65515]) for i in range(0, len(pack), 65515))
    progress = _pkt(b"\x02counting objects\r")
    v0 = _pkt(b"NAK\n") + progress + bands + progress + b"0000"
    v2 = _pkt(b"acknowledgments\n") + _pkt(b"NAK\n") + b"0001" + _pkt(b"packfile\n") + progress + bands + b"0000"
    shallow = _pkt(b"shallow " + b"a" * 40 + b"\n") + b"0000" + v0
    raw = _pkt(b"ACK " + b"b" * 40 + b" continue\n") + _pkt(b"NAK\n") + pack
    for stream in (v0, v2, shallow, raw):
        assert _feed_in_pieces(stream, seed) == len(pack)
    assert _feed_in_pieces(_pkt(b"ERR no such thing\n"), seed) == 0


def _clone_through(url: str, dest: Path, *config: str) -> None:
    args = []
    for c in config:
        args += ["-c", c]
    git(*args, "clone", "-q", "--bare", "--no-local", url, str(dest))


@pytest.fixture
def stock_bridge(tmp_path, root):
    """stock git-http-backend behind gunicorn through bench.cgibridge, with push allowed."""
    work = tmp_path / "stock"
    work.mkdir()
    proc, port, log = _gunicorn("stock", "bench.cgibridge:application", root, work, {}, 1, 4, 60)
    yield f"http://127.0.0.1:{port}", proc
    _terminate(proc)


def test_bridge_serves_clone_and_chunked_push(stock_bridge, root, tmp_path):
    url, _ = stock_bridge
    clone = tmp_path / "clone"
    git("clone", "-q", f"{url}/repo.git", str(clone))
    assert refs_of(str(clone)) and out("rev-parse", "HEAD", cwd=str(clone)) == out(
        "rev-parse", "main", cwd=str(root / "repo.git"))
    (clone / "big.bin").write_bytes(random.Random(1).randbytes(300000))
    git("add", "big.bin", cwd=str(clone))
    git("commit", "-q", "-m", "big", cwd=str(clone))
    # a tiny postBuffer makes git send the pack chunked: the bridge must stream it to EOF
    git("-c", "http.postBuffer=4096", "push", "-q", "origin", "HEAD:refs/heads/pushed", cwd=str(clone))
    assert out("rev-parse", "refs/heads/pushed", cwd=str(root / "repo.git")) == out("rev-parse", "HEAD",
                                                                                     cwd=str(clone))


def test_bridge_passes_gzip_request_and_protocol_header(stock_bridge, root):
    """HTTP_CONTENT_ENCODING and HTTP_GIT_PROTOCOL reach the CGI program."""
    import gzip
    import http.client
    url, _ = stock_bridge
    conn = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=30)
    conn.request("GET", "/repo.git/info/refs?service=git-upload-pack", headers={"Git-Protocol": "version=2"})
    resp = conn.getresponse()
    assert resp.status == 200 and b"version 2" in resp.read()
    head = out("rev-parse", "main", cwd=str(root / "repo.git"))
    body = _pkt(f"want {head} side-band-64k ofs-delta\n".encode()) + b"0000" + _pkt(b"done\n")
    conn.request("POST", "/repo.git/git-upload-pack", body=gzip.compress(body), headers={
        "Content-Type": "application/x-git-upload-pack-request", "Content-Encoding": "gzip"})
    resp = conn.getresponse()
    data = resp.read()
    assert resp.status == 200 and resp.getheader("Content-Type") == "application/x-git-upload-pack-result"
    counter = PackCounter()
    counter.feed(data)
    assert data.startswith(_pkt(b"NAK\n")) and counter.pack_bytes > 0
    conn.close()


@pytest.mark.parametrize("version", ["2", "0"])
def test_proxy_pack_bytes_equal_cloned_pack(stock_bridge, root, tmp_path, version):
    url, _ = stock_bridge
    port = int(url.rsplit(":", 1)[1])
    # a 300 kB blob under a tag: the pack spans many side-band packets and HTTP chunks
    blob = git("hash-object", "-w", "--stdin", cwd=str(root / "repo.git"),
               input=random.Random(2).randbytes(300000)).stdout.decode().strip()
    git("update-ref", "refs/tags/big", blob, cwd=str(root / "repo.git"))
    with CountingProxy("127.0.0.1", port, "stock") as proxy:
        mark = proxy.mark()
        dest = tmp_path / f"clone-v{version}.git"
        _clone_through(f"{proxy.url}/repo.git", dest, f"protocol.version={version}", "fetch.unpackLimit=1")
        recs = proxy.since(mark)
    packs = list((dest / "objects" / "pack").glob("*.pack"))
    assert len(packs) == 1
    posts = [r for r in recs if r.method == "POST" and r.path.endswith("/git-upload-pack")]
    assert posts and all(r.status == 200 for r in recs)
    assert sum(r.pack_bytes for r in posts) == packs[0].stat().st_size
    assert all(r.request_bytes > 0 and r.response_bytes > r.pack_bytes for r in recs)
    assert all(r.pack_bytes == 0 for r in recs if r not in posts)


def test_proxy_pack_bytes_without_sideband(stock_bridge, root, tmp_path):
    """A hand-made v0 request without side-band: the pack follows NAK raw."""
    url, _ = stock_bridge
    port = int(url.rsplit(":", 1)[1])
    head = out("rev-parse", "main", cwd=str(root / "repo.git"))
    body = _pkt(f"want {head} ofs-delta\n".encode()) + b"0000" + _pkt(b"done\n")
    req = (b"POST /repo.git/git-upload-pack HTTP/1.1\r\nHost: x\r\n"
           b"Content-Type: application/x-git-upload-pack-request\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
    with CountingProxy("127.0.0.1", port, "stock") as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port)) as s:
            s.sendall(req)
            s.shutdown(socket.SHUT_WR)
            raw = bytearray()
            while data := s.recv(65536):
                raw += data
        (rec,) = proxy.records
    head_end = raw.index(b"\r\n\r\n") + 4
    assert b"chunked" in raw[:head_end].lower()
    dechunked, rest = bytearray(), bytes(raw[head_end:])
    while True:
        line, _, rest = rest.partition(b"\r\n")
        size = int(line.split(b";")[0], 16)
        if size == 0:
            break
        dechunked += rest[:size]
        rest = rest[size + 2:]
    pack = bytes(dechunked[dechunked.index(b"PACK"):])
    assert dechunked[:dechunked.index(b"PACK")] == _pkt(b"NAK\n")
    subprocess.run(["git", "index-pack", "--stdin", str(tmp_path / "x.pack")], input=pack, check=True,
                   cwd=str(root / "repo.git"), stdout=subprocess.DEVNULL)
    assert rec.pack_bytes == len(pack) == (tmp_path / "x.pack").stat().st_size
    assert rec.response_bytes == len(raw) and rec.request_bytes == len(req)


# -- targets -------------------------------------------------------------------------

def test_running_aspen_and_stock(root, tmp_path):
    """aspen and stock (and stock-apache where Apache is installed; skipped otherwise)."""
    work = tmp_path / "targets"
    with running_targets(["aspen", "stock", "stock-apache"], root, work, workers=1, threads=4,
                         warn=lambda m: None) as started:
        infos = [t.info for t in started]
        names = [i.name for i in infos]
        assert names[:2] == ["aspen", "stock"]
        assert infos[0].root != infos[1].root != root
        assert infos[0].plan_log and infos[0].plan_log.exists() and infos[0].pids
        refs = []
        for t in started:
            mark = t.proxy.mark()
            dest = tmp_path / f"clone-{t.info.name}.git"
            _clone_through(f"{t.info.url}/repo.git", dest)
            refs.append(refs_of(str(dest)))
            recs = t.proxy.since(mark)
            assert all(isinstance(r, RequestRecord) and r.target == t.info.name for r in recs)
            assert any(r.pack_bytes > 0 for r in recs)
            # push reaches this target's own copy only
            git("push", "-q", f"{t.info.url}/repo.git", f"HEAD:refs/heads/only-{t.info.name}", cwd=str(dest))
        assert all(r == refs_of(str(root / "repo.git")) for r in refs)
        for t in started:
            own = refs_of(str(t.info.root / "repo.git"))
            assert f"refs/heads/only-{t.info.name}" in own
            assert not any(k.startswith("refs/heads/only-") and k != f"refs/heads/only-{t.info.name}" for k in own)
    for t in started:
        assert t.proc.poll() is not None


def test_running_yields_target_infos_and_url_targets(root, tmp_path):
    with running(["stock"], root, tmp_path / "a", workers=1, threads=2) as (stock,):
        spec = f"url:peer=http://someone:tok@{stock.url.split('//')[1]}"
        with running([spec], None, tmp_path / "b") as (peer,):
            assert peer.name == "peer" and peer.root is None and peer.pids == []
            assert peer.url.startswith("http://someone:tok@127.0.0.1:")
            assert refs_of_remote(peer.url + "/repo.git") == refs_of_remote(stock.url + "/repo.git")


def refs_of_remote(url: str) -> str:
    return git("ls-remote", url).stdout.decode()


def test_copy_root_is_independent(root, tmp_path):
    copy = copy_root(root, tmp_path / "copy")
    git("update-ref", "refs/heads/extra", "main", cwd=str(copy / "repo.git"))
    assert "refs/heads/extra" not in refs_of(str(root / "repo.git"))


# -- process stats ----------------------------------------------------------------------

BUSY = "import time\nx = bytearray(60 << 20)\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"


def test_procstats_busy_child():
    proc = subprocess.Popen([sys.executable, "-c", BUSY + "print('done', flush=True)\ntime.sleep(30)\n"],
                            stdout=subprocess.PIPE)
    try:
        tree = ProcTree(proc.pid).start()
        assert proc.stdout.readline() == b"done\n"
        stats = tree.stop()
    finally:
        proc.kill()
        proc.wait()
    assert stats.cpu_s > 0.2
    assert stats.peak_rss_bytes > 50 << 20
    assert stats.samples > 0


def test_procstats_counts_reaped_grandchildren():
    """A short-lived child's CPU reaches the tree through its parent's cutime once waited on."""
    script = (f"import subprocess, sys, time\nsubprocess.run([sys.executable, '-c', {BUSY!r}])\n"
              "print('reaped', flush=True)\ntime.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        tree = ProcTree([proc.pid]).start()
        assert proc.stdout.readline() == b"reaped\n"
        stats = tree.stop()
    finally:
        proc.kill()
        proc.wait()
    assert stats.cpu_s > 0.2
    assert stats.peak_rss_bytes > 50 << 20


def test_procstats_asks_a_callable_root_each_time():
    """A root that is a callable (aspen-apache's resident finder) is asked at
    each sample: a process that starts after start() is counted at stop()."""
    found: list[int] = []
    tree = ProcTree([lambda: list(found)]).start()
    proc = subprocess.Popen([sys.executable, "-c", BUSY + "print('done', flush=True)\ntime.sleep(30)\n"],
                            stdout=subprocess.PIPE)
    try:
        found.append(proc.pid)
        assert proc.stdout.readline() == b"done\n"
        stats = tree.stop()
    finally:
        proc.kill()
        proc.wait()
    assert stats.cpu_s > 0.2


def test_procstats_precise_counts_live_threads_in_ns():
    """precise=True: a busy thread of a live process is counted to the nanosecond,
    a reaped child through cutime, as without it."""
    script = ("import subprocess, sys, threading, time\n"
              "def spin():\n    t = time.thread_time()\n    while time.thread_time() - t < 0.3: pass\n"
              "sys.stdin.readline()\nth = threading.Thread(target=spin)\nth.start()\nth.join()\n"
              "print('spun', flush=True)\nsys.stdin.readline()\n"
              f"subprocess.run([sys.executable, '-c', {BUSY!r}])\nprint('reaped', flush=True)\ntime.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        precise = ProcTree(proc.pid, precise=True).start()
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"spun\n"
        threads = precise.stop()          # the spinning thread has exited: its share is lost, never negative
        precise = ProcTree(proc.pid, precise=True).start()
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"reaped\n"
        child = precise.stop()
    finally:
        proc.kill()
        proc.wait()
    assert 0 <= threads.cpu_s < 0.5        # a last sample may still have caught the spinning thread
    assert child.cpu_s > 0.2


def test_precise_cpu_arithmetic():
    tick = __import__("os").sysconf("SC_CLK_TCK")
    start = {1: _Precise(total_ticks=50, children_ticks=10, threads={1: 4_000_000_000, 2: 1_000_000_000}),
             7: _Precise(total_ticks=3, children_ticks=0, threads={7: 30_000_000})}
    stop = {1: _Precise(total_ticks=60, children_ticks=10 + tick, threads={1: 4_002_000_000, 3: 500_000}),
            9: _Precise(total_ticks=0, children_ticks=0, threads={9: 1_000_000})}
    # thread 1: +2 ms; thread 2 exited: nothing; thread 3 new: +0.5 ms; process 9 new: +1 ms;
    # process 7 was reaped: its 3 ticks at start come back through process 1's children (1 s), so -3 ticks
    want = 0.002 + 0.0005 + 0.001 + 1.0 - 3 / tick
    assert precise_cpu_s(start, stop) == pytest.approx(want)
    before = {1: start[1]}
    after = {1: _Precise(total_ticks=60, children_ticks=10, threads={1: 4_000_000_000})}
    assert precise_cpu_s(before, after) == 0.0      # thread 2 exited (1 s at start): it subtracts nothing


def test_apache_absent_is_skipped_with_a_message(root, tmp_path, monkeypatch):
    import bench.targets as targets
    monkeypatch.setattr(targets, "apache_binary", lambda: None)
    with pytest.raises(targets.TargetUnavailable, match="apache2 is not installed"):
        targets.start_target("stock-apache", root, tmp_path)
    said = []
    with targets.running_targets(["stock-apache"], root, tmp_path, warn=said.append) as started:
        assert started == []
    assert said and "skipped" in said[0]
    with pytest.raises(ValueError):
        targets.parse_spec("nginx")
    assert targets.parse_spec("url:gitea=https://u:t@h/org") == ("gitea", "https://u:t@h/org")


# -- the server's metrics during a bench run --------------------------------------------------

def test_metrics_scraped_after_a_bench_workload_match_what_the_proxy_saw(tmp_path):
    """The `aspen` target with ASPEN_METRICS=1 through a quick warm-fetch over
    the tiny preset (clones, pushes, fetches through the counting proxy),
    then scraped through the same proxy: its requests by method and status
    are those the proxy forwarded, one ref-store version per push, and its
    body bytes within what the proxy carried (heads and chunk framing on top)."""
    import collections
    import urllib.request

    from aspen_cgi.runtime import metrics
    from bench import repogen
    from bench.workloads import WORKLOADS
    from bench.workloads.base import WorkloadContext

    root = tmp_path / "root"
    root.mkdir()
    repogen.generate(repogen.PRESETS["tiny"], root / "bench.git")
    with running_targets(["aspen"], root, tmp_path / "servers", workers=2, threads=4,
                         env={"ASPEN_METRICS": "1"}) as (t,):
        ctx = WorkloadContext(targets=[t.info], repo="bench.git", proxies={t.info.name: t.proxy},
                              roots={t.info.name: t.info.root}, workdir=tmp_path / "work", quick=True,
                              params={"reps": 2, "cpu_fetches": 1}, procs={t.info.name: list(t.info.pids)})
        (row,) = WORKLOADS["warm-fetch"](ctx)
        assert row.metrics["failures"] == 0 and row.metrics["verified"], row.notes

        def scrape() -> dict:
            with urllib.request.urlopen(t.info.url + metrics.PATH, timeout=30) as resp:
                return metrics.parse(resp.read().decode())

        deadline = time.monotonic() + 30
        while True:    # each request is counted as its response closes, a moment after the client's end
            values = scrape()
            records = [r for r in t.proxy.records if r.path != metrics.PATH]
            seen = collections.Counter((r.method, str(r.status)) for r in records)
            counted = collections.Counter()
            for k, v in values.items():
                lab = metrics.labels_of(k)
                if metrics.family(k) == "aspen_requests_total" and lab["service"] != "metrics":
                    counted[(lab["method"], lab["status"])] += int(v)
            if counted == seen or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert counted == seen
        pushes = [r for r in records if r.method == "POST" and r.path.endswith("/git-receive-pack")]
        assert len(pushes) == 2 and all(r.status == 200 for r in pushes)
        assert values["aspen_push_versions_total"] == 2
        fetched = [r for r in records if r.method == "POST" and r.path.endswith("/git-upload-pack")]
        body = sum(v for k, v in values.items() if metrics.family(k) == "aspen_fetch_bytes_total")
        assert sum(r.pack_bytes for r in fetched) <= body <= sum(r.response_bytes for r in fetched)
        plans = sum(v for k, v in values.items() if metrics.family(k) == "aspen_fetch_plans_total")
        assert plans >= 2 + 2 * (1 + 1)          # two clones, then each rep's fetch and its CPU copy's
        assert values["aspen_version_pack_backlog"] == 0       # warm-fetch waited for each push's pack
