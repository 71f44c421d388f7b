"""Bundles from stored bytes (fetch/bundle.py, http/staticfile.py):
`GET /repo.git/aspen/bundle[@V]` is a git v2 bundle of the refs a client
may see (at version V), served as a static file (Content-Length, ETag,
304, one byte range, 416); `git clone --bundle-uri` (git 2.39) takes it,
then fetches the rest; a download cut in the middle and resumed with
`curl -C -` is a bundle git uses; the route keeps the repository's access
rules (export, http.uploadpack, hideRefs, namespaces)."""

from __future__ import annotations

import http.client
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from . import harness as h
from . import pushkit as pk


def _get(url: str, **headers: str) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def _heads(bundle: bytes) -> dict[str, str]:
    head = bundle[:bundle.index(b"\n\n")].decode().splitlines()
    assert head[0] == "# v2 git bundle"
    return {name: oid for oid, name in (line.split(" ", 1) for line in head[1:])}


def _ls_remote(url: str) -> dict[str, str]:
    out = h.out("ls-remote", url)
    return {name: oid for oid, name in (line.split("\t") for line in out.splitlines()) if not name.endswith("^{}")}


@pytest.fixture
def served(root, server_factory, tmp_path):
    """A repository with pushes through Aspen (version packs on), packs built."""
    server = server_factory(root, ASPEN_ACCESS_LOG="1")
    repo = pk.enable_push(root / "repo.git")
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    for i in range(4):
        (work / "big.txt").write_text("".join(f"line {n} of push {i}\n" for n in range(400 * (i + 1))))
        pk.commit(work, f"push {i}", name="big.txt")
        h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    h.wait_packs_built(repo)
    return server, repo, work


def test_clone_with_bundle_uri_takes_the_bundle_then_fetches_the_rest(served, tmp_path):
    server, repo, work = served
    url = f"{server.url}/repo.git"
    v = h.versions(repo)[-1]["id"]
    bundle_url = f"{url}/aspen/bundle@{v}"          # the bundle of now: a CDN's copy, pushed past after
    status, _, first = _get(bundle_url)
    assert status == 200
    pk.commit(work, "after the bundle")
    h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    h.wait_packs_built(repo)
    client = tmp_path / "client"
    res = h.git("-c", "transfer.fsckObjects=true", "clone", "-q", f"--bundle-uri={bundle_url}", url, str(client))
    assert res.returncode == 0
    h.git("fsck", "--strict", cwd=str(client))
    assert h.out("rev-parse", "origin/main", cwd=str(client)).strip() == h.refs_of(str(repo))["refs/heads/main"]
    assert h.out("for-each-ref", "--format=%(refname)", "refs/bundles/", cwd=str(client)).strip()
    log = server.log_text()
    gets = re.findall(rf"service=bundle method=GET path=/repo.git/aspen/bundle@{v} status=200 bytes=(\d+)", log)
    assert len(gets) == 2 and int(gets[-1]) == len(first)
    # what the clone fetched after the bundle is only what came since: far smaller than the bundle
    fetched = [int(b) for b in re.findall(r"service=upload-pack method=POST \S+ status=200 bytes=(\d+)", log)]
    assert fetched and fetched[-1] < len(first) / 5, (fetched, len(first))


def test_the_bundle_is_a_static_file_with_etag_and_ranges(served):
    server, repo, _ = served
    url = f"{server.url}/repo.git/aspen/bundle"
    status, hdrs, body = _get(url)
    assert status == 200 and int(hdrs["Content-Length"]) == len(body)
    assert hdrs["Accept-Ranges"] == "bytes" and hdrs["ETag"].startswith('"')
    assert "max-age=60" in hdrs["Cache-Control"]
    assert _heads(body) == {**_ls_remote(f"{server.url}/repo.git")}
    etag, size, hdrs0 = hdrs["ETag"], len(body), hdrs
    assert _get(url, **{"If-None-Match": etag})[0] == 304
    status, hdrs, part = _get(url, Range="bytes=0-99")
    assert status == 206 and part == body[:100] and hdrs["Content-Range"] == f"bytes 0-99/{size}"
    status, hdrs, part = _get(url, Range="bytes=-10")
    assert status == 206 and part == body[-10:]
    status, hdrs, part = _get(url, Range=f"bytes={size // 2}-")
    assert status == 206 and part == body[size // 2:]
    status, hdrs, _ = _get(url, Range=f"bytes={size}-")
    assert status == 416 and hdrs["Content-Range"] == f"bytes */{size}"
    assert _get(url, Range="bytes=0-9", **{"If-Range": '"other"'})[2] == body          # changed: the whole file
    assert _get(url, Range="bytes=0-1,5-9")[2] == body                                # several ranges: whole
    assert _get(url, Range="pages=1")[2] == body                                      # malformed: whole
    again = _get(url)
    assert again[2] == body and again[1]["Last-Modified"] == hdrs0["Last-Modified"]    # the same file, unchanged
    status, hdrs, _ = _get(f"{server.url}/repo.git/aspen/bundle@2")
    assert status == 200 and "immutable" in hdrs["Cache-Control"]


def _cut_download(url: str, dest: Path, keep: int) -> None:
    """A download that breaks off: the connection is closed after KEEP body bytes."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    conn.request("GET", parts.path)
    resp = conn.getresponse()
    assert resp.status == 200
    dest.write_bytes(resp.read(keep))
    conn.close()


def test_a_cut_download_resumed_with_curl_is_a_bundle_git_uses(served, tmp_path):
    server, repo, _ = served
    url = f"{server.url}/repo.git/aspen/bundle"
    size = len(_get(url)[2])
    part = tmp_path / "repo.bundle"
    _cut_download(url, part, size // 2)
    assert part.stat().st_size == size // 2
    assert h.git("clone", "-q", str(part), str(tmp_path / "broken"), check=False).returncode != 0
    subprocess.run(["curl", "-sS", "-f", "-C", "-", "-o", str(part), url], check=True, timeout=60)
    assert part.stat().st_size == size
    h.git("bundle", "verify", str(part))
    client = tmp_path / "client.git"
    h.git("clone", "-q", "--bare", str(part), str(client))
    h.git("-C", str(client), "fetch", "-q", f"{server.url}/repo.git", "+refs/heads/*:refs/heads/*",
          "+refs/tags/*:refs/tags/*")
    h.git("fsck", "--strict", cwd=str(client))
    assert h.out("rev-parse", "refs/heads/main", cwd=str(client)).strip() == h.refs_of(str(repo))["refs/heads/main"]
    assert re.search(r"method=GET path=/repo.git/aspen/bundle status=206", server.log_text())


def test_a_bundle_of_a_version_lists_the_refs_of_then(served, tmp_path):
    server, repo, work = served
    v = h.versions(repo)[2]["id"]
    then = _ls_remote(f"{server.url}/repo.git@{v}")
    for url in (f"{server.url}/repo.git/aspen/bundle@{v}", f"{server.url}/repo.git@{v}/aspen/bundle"):
        status, _, body = _get(url)
        assert status == 200 and _heads(body) == then
    (tmp_path / "v.bundle").write_bytes(body)
    h.git("bundle", "verify", str(tmp_path / "v.bundle"))


def test_the_bundle_keeps_the_repositorys_access_rules(served, tmp_path):
    server, repo, work = served
    url = f"{server.url}/repo.git/aspen/bundle"
    secret = pk.commit(work, "secret")
    h.git("push", "-q", "origin", "HEAD:refs/hidden/secret", cwd=str(work))
    h.wait_packs_built(repo)
    pk.set_config(repo, "uploadpack.hideRefs", "refs/hidden")
    status, _, body = _get(url)
    assert status == 200 and "refs/hidden/secret" not in _heads(body)
    (tmp_path / "b.bundle").write_bytes(body)
    client = tmp_path / "client"
    h.git("clone", "-q", str(tmp_path / "b.bundle"), str(client))
    assert h.git("cat-file", "-e", secret, cwd=str(client), check=False).returncode != 0
    pk.set_config(repo, "http.uploadpack", "false")
    assert _get(url)[0] == 403
    pk.set_config(repo, "http.uploadpack", "true")
    assert _get(f"{url}@999")[0] == 404
    assert _get(f"{url}@yesterday")[0] == 404
    assert "Traceback" not in server.log_text()


def test_through_aspen_cgi_and_not_exported(served):
    """aspen-cgi sends the file (a range too); without GIT_HTTP_EXPORT_ALL or
    git-daemon-export-ok the repository has no bundle, as it has no fetch."""
    _, repo, _ = served
    env = {"GIT_PROJECT_ROOT": str(repo.parent), "REQUEST_METHOD": "GET", "PATH_INFO": "/repo.git/aspen/bundle"}
    r = h.aspen({**env, "GIT_HTTP_EXPORT_ALL": "1"})
    assert r.status == 200 and dict(r.headers)["Content-Length"] == str(len(r.body))
    h.git("bundle", "list-heads", "/dev/stdin", input=r.body)
    part = h.aspen({**env, "GIT_HTTP_EXPORT_ALL": "1", "HTTP_RANGE": "bytes=10-19"})
    assert part.status == 206 and part.body == r.body[10:20]
    assert h.aspen(env).status == 404


def test_a_namespace_gets_the_bundle_of_its_own_refs(served, server_factory, tmp_path):
    _, repo, work = served
    only = pk.commit(work, "namespaced")
    h.git("push", "-q", str(repo), "HEAD:refs/namespaces/ns/refs/heads/main", cwd=str(work))
    ns = server_factory(repo.parent, GIT_NAMESPACE="ns")
    _get(f"{ns.url}/repo.git/aspen/bundle")         # records the push made beside Aspen, starts its build
    h.wait_packs_built(repo)
    status, _, body = _get(f"{ns.url}/repo.git/aspen/bundle")
    assert status == 200
    assert _heads(body) == {"refs/heads/main": only}
    (tmp_path / "ns.bundle").write_bytes(body)
    h.git("bundle", "verify", str(tmp_path / "ns.bundle"))


def test_without_built_packs_the_bundle_is_503_and_a_bundle_uri_clone_still_works(root, server_factory, tmp_path):
    server = server_factory(root, ASPEN_VERSION_PACKS="off")
    status, hdrs, body = _get(f"{server.url}/repo.git/aspen/bundle")
    assert status == 503 and hdrs["Retry-After"] == "30"
    assert b"packs are being built; retry later" in body
    client = tmp_path / "client"
    h.git("clone", "-q", f"--bundle-uri={server.url}/repo.git/aspen/bundle", f"{server.url}/repo.git", str(client))
    h.git("fsck", "--strict", cwd=str(client))
    assert h.out("rev-parse", "origin/main", cwd=str(client)).strip() == h.refs_of(str(root / "repo.git"))["refs/heads/main"]
