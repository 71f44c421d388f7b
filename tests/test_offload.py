"""What the edge carries (fetch/offload.py): a protocol v2 client that offers
`packfile-uris` (git 2.39 with `fetch.uriProtocols=http`) gets the stored
import pack by URI and the rest inline, downloads the pack from Aspen's
static route (`aspen/pack/pack-<name>.pack`) or from ASPEN_OFFLOAD_URL's
server, and ends with a repository `git fsck --strict` passes and the
server's refs; the `bundle-uri` command (asked by git >= 2.40, which this
machine does not have) is checked at the protocol level as git's own
t/lib-bundle-uri-protocol.sh expects it, and the bundle it names is one
`git clone --bundle-uri` takes."""

from __future__ import annotations

import hashlib
import http.server
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from aspen_cgi.protocol.pktline import DELIM, FLUSH, encode

from . import harness as h
from . import pushkit as pk
from .cgiserver import cgi_server_factory  # noqa: F401

FAST = {"ASPEN_ACCESS_LOG": "1", "ASPEN_OFFLOAD_MIN_BYTES": "1", "ASPEN_COMPACT_QUIET_MS": "0", "ASPEN_METRICS": "1"}


def _get(url: str, **headers: str) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def _post_v2(url: str, lines: list[bytes]) -> tuple[int, bytes]:
    req = urllib.request.Request(url + "/git-upload-pack", data=b"".join(lines), method="POST", headers={
        "Content-Type": "application/x-git-upload-pack-request", "Git-Protocol": "version=2"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _pkt_lines(body: bytes) -> list[bytes]:
    out, i = [], 0
    while i < len(body):
        n = int(body[i:i + 4], 16)
        out.append(b"<flush>" if n == 0 else b"<delim>" if n == 1 else body[i + 4:i + n])
        i += 4 if n < 4 else n
    return out


@pytest.fixture
def served(root, server_factory, tmp_path):
    """A repository imported, then pushed to through Aspen (4 pushes), packs built
    and compacted, the import's pack as it stays."""
    server = server_factory(root, **FAST, ASPEN_RUN_DIR=str(tmp_path / "run"))     # its own metrics
    repo = pk.enable_push(root / "repo.git")
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    for i in range(4):
        (work / "big.txt").write_text("".join(f"line {n} of push {i}\n" for n in range(400 * (i + 1))))
        pk.commit(work, f"push {i}", name="big.txt")
        h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    h.wait_builder_done(repo)
    return server, repo, work


def _clone(url: str, dest: Path, *config: str) -> str:
    args = []
    for c in config:
        args += ["-c", c]
    res = h.git(*args, "-c", "protocol.version=2", "-c", "transfer.fsckObjects=true", "clone", "--mirror", url,
                str(dest), env={"GIT_TRACE_PACKET": str(dest) + ".trace"})
    assert res.returncode == 0
    return Path(str(dest) + ".trace").read_text(errors="replace")


def _got_uris(trace: str) -> bool:
    """The answer had a packfile-uris section (the clone read its header line)."""
    return re.search(r"clone< packfile-uris$", trace, re.M) is not None


def _commit(work: Path, name: str, text: str, msg: str) -> None:
    (work / name).write_text(text)
    h.git("add", "-A", cwd=str(work))
    h.git("commit", "-q", "-m", msg, cwd=str(work))


def _correct(client: Path, repo: Path) -> None:
    h.fsck_strict(str(client))
    assert h.refs_of(str(client)) == h.refs_of(str(repo))


def _import_pack(repo: Path) -> str:
    return h.store_rows(repo, "SELECT name FROM version_packs WHERE version = 1")[0][0]


def test_a_packfile_uri_clone_downloads_the_import_pack_and_gets_the_rest_inline(served, tmp_path):
    server, repo, _ = served
    url = f"{server.url}/repo.git"
    name = _import_pack(repo)
    client = tmp_path / "client.git"
    trace = _clone(url, client, "fetch.uriProtocols=http")
    _correct(client, repo)
    # the answer named the import pack by its trailer and Aspen's route; the client fetched it there
    assert _got_uris(trace)
    assert f"{name} {url}/aspen/pack/pack-{name}.pack" in trace
    log = server.log_text()
    assert re.search(rf"service=pack method=GET path=/repo.git/aspen/pack/pack-{name}.pack status=200", log)
    line = [x for x in log.splitlines() if "offload=uri" in x][-1]
    stored = (repo / "aspen" / "packs" / f"pack-{name}.pack").stat().st_size
    assert f"offload_bytes={stored}" in line
    inline = int(re.search(r"bytes=(\d+)", line).group(1))
    assert inline < stored, (inline, stored)
    # the client keeps the downloaded pack as it is (same trailer), beside the inline one
    assert (client / "objects" / "pack" / f"pack-{name}.pack").exists()
    metrics = _get(f"{server.url}/_aspen/metrics")[2].decode()
    assert re.search(r"^aspen_offload_answers_total 1$", metrics, re.M)
    assert re.search(rf"^aspen_offload_bytes_total {stored}$", metrics, re.M)


def test_without_uri_protocols_or_under_the_threshold_the_answer_is_inline(served, tmp_path, server_factory):
    server, repo, _ = served
    url = f"{server.url}/repo.git"
    plain = tmp_path / "plain.git"
    trace = _clone(url, plain)                                     # git's default: no fetch.uriProtocols
    _correct(plain, repo)
    assert "packfile-uris" in trace.split("> command=fetch")[0]   # advertised in fetch=
    assert not _got_uris(trace) and "service=pack " not in server.log_text()
    https_only = tmp_path / "https.git"
    trace = _clone(url, https_only, "fetch.uriProtocols=https")  # a scheme the URL has not
    _correct(https_only, repo)
    assert not _got_uris(trace)
    big = server_factory(server.root, ASPEN_ACCESS_LOG="1")         # the default threshold: 1 MiB
    small = tmp_path / "small.git"
    trace = _clone(f"{big.url}/repo.git", small, "fetch.uriProtocols=http")
    _correct(small, repo)
    assert not _got_uris(trace) and "offload=inline" in big.log_text()


def test_offload_url_names_packs_on_another_server(served, tmp_path, server_factory):
    """ASPEN_OFFLOAD_URL: the URIs name another server (here a static file server over the
    packs directory, as nginx/aspen-offload.conf maps it), which the client downloads from."""
    server, repo, _ = served
    packs = repo / "aspen" / "packs"
    asked: list[str] = []

    class Files(http.server.SimpleHTTPRequestHandler):
        def translate_path(self, path: str) -> str:
            asked.append(path)
            m = re.fullmatch(r"/cdn/repo\.git/aspen/pack/(pack-[0-9a-f]{40}\.pack)", path)
            return str(packs / m.group(1)) if m else "/nonexistent"

        def log_message(self, *args) -> None:
            pass

    files = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Files)
    threading.Thread(target=files.serve_forever, daemon=True).start()
    try:
        edge = server_factory(server.root, **dict(FAST, ASPEN_OFFLOAD_URL=f"http://127.0.0.1:{files.server_port}/cdn"))
        client = tmp_path / "client.git"
        _clone(f"{edge.url}/repo.git", client, "fetch.uriProtocols=http")
        _correct(client, repo)
        assert asked == [f"/cdn/repo.git/aspen/pack/pack-{_import_pack(repo)}.pack"]
        assert "service=pack " not in edge.log_text()
        # bundles are made by Aspen on their first download: bundle-uri names Aspen's own route
        status, body = _post_v2(f"{edge.url}/repo.git", [encode("command=bundle-uri\n"), FLUSH])
        assert status == 200 and f"uri={edge.url}/repo.git/aspen/bundle@".encode() in body
    finally:
        files.shutdown()


def test_the_pack_route_is_a_static_file_under_the_fetch_rules(served):
    server, repo, _ = served
    name = _import_pack(repo)
    url = f"{server.url}/repo.git/aspen/pack/pack-{name}.pack"
    status, hdrs, body = _get(url)
    assert status == 200 and body[:4] == b"PACK" and body[-20:].hex() == name
    assert hdrs["ETag"] == f'"{name}"' and "immutable" in hdrs["Cache-Control"]
    status, hdrs, part = _get(url, Range="bytes=4-11")
    assert status == 206 and part == body[4:12]
    assert _get(url, **{"If-None-Match": f'"{name}"'})[0] == 304
    assert _get(f"{server.url}/repo.git/aspen/pack/pack-{'0' * 40}.pack")[0] == 404          # no such pack
    assert _get(f"{server.url}/repo.git/aspen/pack/pack-{name[:39]}.pack")[0] == 404          # not a name
    assert _get(f"{server.url}/nope.git/aspen/pack/pack-{name}.pack")[0] == 404
    h.git("config", "uploadpack.hideRefs", "refs/tags", cwd=str(repo))
    assert _get(url)[0] == 404                                     # some refs hidden: no pack by URL
    h.git("config", "--unset", "uploadpack.hideRefs", cwd=str(repo))
    h.git("config", "http.getanyfile", "false", cwd=str(repo))
    assert _get(url)[0] == 403                                     # as stock's objects/pack/ files
    h.git("config", "--unset", "http.getanyfile", cwd=str(repo))
    h.git("config", "http.uploadpack", "false", cwd=str(repo))
    assert _get(url)[0] == 403


def test_hidden_refs_get_no_uris(served, tmp_path):
    server, repo, _ = served
    h.git("config", "uploadpack.hideRefs", "refs/heads/topic", cwd=str(repo))
    client = tmp_path / "client.git"
    trace = _clone(f"{server.url}/repo.git", client, "fetch.uriProtocols=http")
    assert not _got_uris(trace)
    assert "refs/heads/topic" not in h.refs_of(str(client))


def test_git_s_own_blob_packfile_uri_config_is_git_s(served, tmp_path):
    """uploadpack.blobPackfileUri configured: the request goes to git's upload-pack, as stock."""
    server, repo, _ = served
    h.git("config", "uploadpack.blobPackfileUri", f"{'1' * 40} {'2' * 40} http://127.0.0.1:9/p.pack", cwd=str(repo))
    client = tmp_path / "client.git"
    trace = _clone(f"{server.url}/repo.git", client, "fetch.uriProtocols=http")
    _correct(client, repo)
    assert not _got_uris(trace)
    assert "why=packfile-uris" in server.log_text()


def test_bundle_uri_command_answers_as_git_s_tests_expect(served, tmp_path):
    server, repo, work = served
    url = f"{server.url}/repo.git"
    status, adv = _get(f"{url}/info/refs?service=git-upload-pack", **{"Git-Protocol": "version=2"})[::2]
    assert status == 200 and b"bundle-uri\n" in _pkt_lines(adv)                 # advertised
    status, body = _post_v2(url, [encode("command=bundle-uri\n"), encode("object-format=sha1\n"), DELIM, FLUSH])
    assert status == 200
    lines = _pkt_lines(body)
    assert lines[-1] == b"<flush>"
    pairs = dict(line.decode().split("=", 1) for line in lines[:-1])
    assert pairs["bundle.version"] == "1" and pairs["bundle.mode"] == "all"
    ids = {k.split(".")[1] for k in pairs if k.count(".") == 2}
    assert len(ids) == 1
    uri = pairs[f"bundle.{ids.pop()}.uri"]
    m = re.fullmatch(rf"{re.escape(url)}/aspen/bundle@(\d+)", uri)
    assert m
    # the version of the last compaction: the segment packs' reach (4 pushes after the import: 2 … 5)
    segs = h.store_rows(repo, "SELECT MAX(hi) FROM segment_packs WHERE name != ''")[0][0]
    assert int(m.group(1)) == (segs or 1)
    # the bundle it names is one git takes, and a clone from it fetches the rest
    client = tmp_path / "client"
    res = h.git("-c", "transfer.fsckObjects=true", "clone", "-q", f"--bundle-uri={uri}", url, str(client))
    assert res.returncode == 0
    h.fsck_strict(str(client))
    assert "aspen_bundle_uri_answers_total{bundle=\"advertised\"} 1" in _get(f"{server.url}/_aspen/metrics")[2].decode()
    # the bundle moves on with compaction: more pushes, their segment packs built, a later bundle
    for i in range(4):
        pk.commit(work, f"later {i}")
        h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    h.wait_packs_built(repo)
    deadline = time.time() + 60
    while True:
        reach = h.store_rows(repo, "SELECT MAX(hi) FROM segment_packs WHERE name != ''")[0][0]
        if reach and reach > int(m.group(1)) or time.time() > deadline:
            break
        time.sleep(0.1)
    body = _post_v2(url, [encode("command=bundle-uri\n"), FLUSH])[1]
    later = [re.search(r"/aspen/bundle@(\d+)$", x.decode()) for x in _pkt_lines(body) if b".uri=" in x]
    assert len(later) == 1 and int(later[0].group(1)) == reach > int(m.group(1)), (body, reach)
    _kept_before_its_download(server, repo, url, int(m.group(1)))
    # bad input: an argument (git dies on any) -> 400; the same request without a delim is fine
    status, _ = _post_v2(url, [encode("command=bundle-uri\n"), DELIM, encode("extra\n"), FLUSH])
    assert status == 400
    status, body = _post_v2(url, [encode("command=bundle-uri\n"), FLUSH])
    assert status == 200 and _pkt_lines(body)[-1] == b"<flush>"


def _kept_before_its_download(server, repo: Path, url: str, past: int) -> None:
    """Clients took bundles, so the pushes' compaction made the bundle it
    moved the advertisement to (past PAST: fetch/bundlekeep.py) before anyone
    downloaded it: it is there, and its first download is a static file (no
    `cache=cold`: not built then)."""
    bundles = repo / "aspen" / "bundles"
    deadline = time.time() + 60
    while True:
        body = _post_v2(url, [encode("command=bundle-uri\n"), FLUSH])[1]
        version = [int(x.rsplit(b"@", 1)[1]) for x in _pkt_lines(body) if b".uri=" in x][0]
        if version > past and list(bundles.glob(f"bundle-{version}-*.bundle")) or time.time() > deadline:
            break
        time.sleep(0.1)
    assert version > past and list(bundles.glob(f"bundle-{version}-*.bundle")), sorted(p.name for p in bundles.iterdir())
    status, _, data = _get(f"{url}/aspen/bundle@{version}")
    assert status == 200 and data.startswith(b"# v2 git bundle\n")
    deadline = time.time() + 10        # the client has the bytes (Content-Length) before the line is written
    while not (lines := [x for x in server.log_text().splitlines() if f"path=/repo.git/aspen/bundle@{version}" in x]):
        assert time.time() < deadline, [x for x in server.log_text().splitlines() if "bundle" in x]
        time.sleep(0.05)
    line = lines[-1]
    assert "service=bundle" in line and "cache=cold" not in line


def test_a_cgi_push_keeps_the_advertised_bundle_built(root, cgi_server_factory, tmp_path):
    """Under CGI the keeper is a detached program (python -m aspen_cgi.fetch.bundlekeep):
    a repository whose bundles clients take gets the next one built after its
    pushes are compacted; one nobody took a bundle from gets none."""
    repo = pk.enable_push(root / "repo.git")
    server = cgi_server_factory(root, "aspen", **FAST)
    url = f"{server.url}/repo.git"
    work = tmp_path / "work"
    h.git("clone", "-q", url, str(work))

    def pushes(n: int, past: int) -> int:
        """N pushes, then the segment packs' reach once compaction moved it past PAST."""
        for i in range(n):
            pk.commit(work, f"push {i} {time.time()}")
            h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
        h.wait_packs_built(repo)
        deadline = time.time() + 60
        while time.time() < deadline:
            reach = h.store_rows(repo, "SELECT MAX(hi) FROM segment_packs WHERE name != ''")[0][0]
            if reach and reach > past:
                return reach
            time.sleep(0.1)
        raise AssertionError("compaction did not move")

    reach = pushes(2, 1)
    time.sleep(1.0)      # any keeper a push started would have found no demand; none made a bundle
    assert not list((repo / "aspen").glob("bundles/bundle-*.bundle"))
    status, body = _post_v2(url, [encode("command=bundle-uri\n"), FLUSH])
    assert status == 200 and f"/aspen/bundle@{reach}".encode() in body
    pushes(4, reach)
    _kept_before_its_download(server, repo, url, reach)


def test_bundle_uri_names_no_bundle_with_hidden_refs_and_is_off_when_asked(served, server_factory):
    server, repo, _ = served
    url = f"{server.url}/repo.git"
    h.git("config", "uploadpack.hideRefs", "refs/heads/topic", cwd=str(repo))
    status, body = _post_v2(url, [encode("command=bundle-uri\n"), FLUSH])
    assert status == 200 and body == FLUSH
    h.git("config", "--unset", "uploadpack.hideRefs", cwd=str(repo))
    off = server_factory(server.root, ASPEN_BUNDLE_URI="0", ASPEN_OFFLOAD="0")
    adv = _get(f"{off.url}/repo.git/info/refs?service=git-upload-pack", **{"Git-Protocol": "version=2"})[2]
    lines = _pkt_lines(adv)
    assert b"bundle-uri\n" not in lines and not any(b"packfile-uris" in x for x in lines)


def test_a_2_39_client_is_unaffected_by_the_bundle_uri_capability(served, tmp_path):
    """git 2.39 does not know bundle-uri: it never sends the command, with transfer.bundleURI or not."""
    server, repo, _ = served
    client = tmp_path / "client.git"
    trace = _clone(f"{server.url}/repo.git", client, "transfer.bundleURI=true")
    _correct(client, repo)
    assert "< bundle-uri" in trace and "command=bundle-uri" not in trace


def test_the_inline_part_carries_the_import_objects_its_deltas_need(root, server_factory, tmp_path):
    """Pushes that edit a big file the import holds: their packs are deltas on the
    import's blob. The client indexes the inline pack before it downloads the
    import pack, so the inline pack carries that blob's entries (its chain)
    too; the clone is whole either way."""
    repo = pk.enable_push(root / "repo.git")
    seed = tmp_path / "seed"
    h.git("clone", "-q", str(repo), str(seed))
    lines = [hashlib.sha1(str(n).encode()).hexdigest() + "\n" for n in range(3000)]     # no zlib shortcut
    for i in range(3):                          # before Aspen sees the repository: the import's history
        _commit(seed, "big.txt", "".join(lines[:2000 + 300 * i]), f"seed {i}")
    h.git("push", "-q", "origin", "HEAD:main", cwd=str(seed))
    server = server_factory(root, **FAST, ASPEN_RUN_DIR=str(tmp_path / "run"))
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    for i in range(4):
        lines[10 * i] = f"edited by push {i}\n"
        _commit(work, "big.txt", "".join(lines), f"push {i}")
        h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    h.wait_packs_built(repo)
    client = tmp_path / "client.git"
    trace = _clone(f"{server.url}/repo.git", client, "fetch.uriProtocols=http")
    assert _got_uris(trace)
    _correct(client, repo)
    line = [x for x in server.log_text().splitlines() if "offload=uri" in x][-1]
    assert int(re.search(r"offload_chain=(\d+)", line).group(1)) >= 1, line


def test_nginx_serves_the_packs_from_disk_with_the_shipped_config(served, tmp_path, server_factory):
    """nginx/aspen-offload.conf, its placeholders filled in, serves the packs an
    Aspen with ASPEN_OFFLOAD_URL names: the clone downloads from nginx."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    h.need_system("nginx", nginx)
    server, repo, _ = served
    base = tmp_path / "nginx"
    base.mkdir()
    port = h.free_port()
    conf = (Path(__file__).resolve().parent.parent / "nginx" / "aspen-offload.conf").read_text()
    (base / "offload.conf").write_text(conf.replace("@LISTEN@", f"127.0.0.1:{port}")
                                       .replace("@PACKS_ROOT@", str(server.root)))
    user = "user root root;\n" if os.geteuid() == 0 else ""     # the test's files are its own (0700 dirs)
    (base / "nginx.conf").write_text(
        f"{user}worker_processes 1;\npid {base}/nginx.pid;\nerror_log {base}/error.log info;\nevents {{}}\n"
        f"http {{\n    access_log {base}/access.log;\n    client_body_temp_path {base}/body;\n"
        f"    proxy_temp_path {base}/proxy;\n    fastcgi_temp_path {base}/fastcgi;\n"
        f"    uwsgi_temp_path {base}/uwsgi;\n    scgi_temp_path {base}/scgi;\n"
        f"    include {base}/offload.conf;\n}}\n")
    proc = subprocess.Popen([nginx, "-p", str(base), "-c", str(base / "nginx.conf"), "-e", str(base / "error.log"),
                             "-g", "daemon off;"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, proc.communicate()[0]
                time.sleep(0.05)
        edge = server_factory(server.root, **dict(FAST, ASPEN_OFFLOAD_URL=f"http://127.0.0.1:{port}/offload"))
        client = tmp_path / "client.git"
        assert _got_uris(_clone(f"{edge.url}/repo.git", client, "fetch.uriProtocols=http"))
        _correct(client, repo)
        name = _import_pack(repo)
        access = (base / "access.log").read_text()
        assert f"GET /offload/repo.git/aspen/pack/pack-{name}.pack HTTP/1.1\" 200" in access
        status, hdrs, body = _get(f"http://127.0.0.1:{port}/offload/repo.git/aspen/pack/pack-{name}.pack",
                                  Range="bytes=0-3")
        assert status == 206 and body == b"PACK" and "immutable" in hdrs["Cache-Control"]
        assert _get(f"http://127.0.0.1:{port}/offload/repo.git/config")[0] == 404
        assert _get(f"http://127.0.0.1:{port}/offload/repo.git/aspen/pack/../../config")[0] == 404
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_the_keeper_waits_for_a_build_still_to_come(root, server_factory, tmp_path):
    """A CGI push starts its builder and its keeper as two programs; the
    keeper can look before the builder holds its lock. It waits while a
    version has no pack (or a segment run is due), so that it builds the
    bundle of the compaction to come, not the one before. Made here by a
    push to a server that builds nothing (ASPEN_VERSION_PACKS=off), a keeper
    in this process, and the build done here after it looked."""
    from aspen_cgi.fetch import bundlekeep
    from aspen_cgi.refstore.store import RefStore
    from aspen_cgi.runtime.repository import Repository
    repo = pk.enable_push(root / "repo.git")
    server = server_factory(root, **FAST)
    url = f"{server.url}/repo.git"
    work = tmp_path / "work"
    h.git("clone", "-q", url, str(work))
    for i in range(2):
        pk.commit(work, f"built {i}")
        h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    h.wait_packs_built(repo)
    env = {**os.environ, **FAST}
    store = RefStore.open(Repository.of(str(repo), env), create=False)
    before = _compacted(store)
    assert before > 1
    server.stop()
    unbuilt = server_factory(root, **FAST, ASPEN_VERSION_PACKS="off")
    for i in range(4):
        pk.commit(work, f"not built {i}")
        h.git("push", "-q", f"{unbuilt.url}/repo.git", "HEAD:main", cwd=str(work))
    store.sync()
    assert not store.all_packs_built()
    out: list[list[str]] = []
    keeper = threading.Thread(target=lambda: out.append(bundlekeep.run(str(repo), env)), daemon=True)
    keeper.start()
    time.sleep(1.5)
    bundles = repo / "aspen" / "bundles"
    assert keeper.is_alive() and not list(bundles.glob("bundle-*.bundle")), "it built before the build"
    after = _compacted(store)
    keeper.join(60)
    assert not keeper.is_alive() and after > before
    assert [Path(p).name.split("-")[1] for p in out[0]] == [str(after)], out


def _compacted(store) -> int:
    """Build what STORE's repository lacks (here, or waiting out a server's
    builder) until nothing is due; the bundle version then."""
    from aspen_cgi.fetch.offload import bundle_version
    from aspen_cgi.packs import background, builder
    deadline = time.time() + 60
    while True:
        store.sync()
        if not background.running(store.packs_dir) and store.all_packs_built() and not builder.segments_to_build(store):
            return bundle_version(store)
        assert time.time() < deadline, "compaction did not end"
        background.build(store)
        time.sleep(0.1)
