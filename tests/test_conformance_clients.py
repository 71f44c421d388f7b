"""Checklist lines (docs/http-backend-checklist.md) that need real git clients: large chunked
requests with the probe POST, gzip-encoded upload-pack requests,
shallow/filter clones, protocol v0/v2 clones, pushes with hook output.

Each scenario runs against stock http-backend (as a CGI behind the test's
CGI host), aspen-cgi (same host) and Aspen's WSGI app (gunicorn), each over
its own copy of the same repositories, and compares what the client sees."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from . import differential as d
from . import harness as h


def _three(root: Path, cgi_server_factory, server_factory, **env):
    """(name, url, root copy) for stock CGI, aspen CGI and aspen WSGI (gunicorn)."""
    rs, ra, rw = d.triplicate(root)
    return [("stock", cgi_server_factory(rs, "stock", **env).url, rs),
            ("aspen-cgi", cgi_server_factory(ra, "aspen", **env).url, ra),
            ("aspen-wsgi", server_factory(rw, **env).url, rw)]


def _git(*args, cwd=None, env=None, check=True):
    e = {"GIT_TRACE_CURL_NO_DATA": "1"}
    e.update(env or {})
    return h.git(*args, cwd=cwd, env=e, check=check)


def _objects(repo: Path) -> set[str]:
    out = h.git("cat-file", "--batch-all-objects", "--batch-check=%(objectname)", cwd=str(repo)).stdout
    return set(out.decode().split())


def _many_branches(root: Path, n: int) -> None:
    repo = root / "repo.git"
    base = h.out("rev-parse", "main", cwd=str(repo))
    tree = h.out("rev-parse", "main^{tree}", cwd=str(repo))
    lines = []
    for i in range(n):
        c = h.git("commit-tree", "-p", base, "-m", f"branch {i}", tree, cwd=str(repo)).stdout.decode().strip()
        lines.append(f"create refs/heads/branch-with-a-long-name-{i:05d} {c}\n")
    h.git("update-ref", "--stdin", cwd=str(repo), input="".join(lines).encode())


@pytest.mark.timeout(300)
def test_large_chunked_upload_pack_request_with_probe_post(root, tmp_path, cgi_server_factory, server_factory):
    """A clone wanting ~1800 refs sends a request over http.postBuffer
    (64 KiB minimum): the client first POSTs a probe `0000`, then the
    request with Transfer-Encoding: chunked and no Content-Length."""
    _many_branches(root, 1800)
    results = {}
    for name, url, r in _three(root, cgi_server_factory, server_factory):
        dest = tmp_path / f"clone-{name}"
        p = _git("-c", "http.postBuffer=65536", "clone", "--mirror", f"{url}/repo.git", str(dest),
                 env={"GIT_TRACE_CURL": "1"})
        trace = p.stderr.decode(errors="replace")
        assert "Transfer-Encoding: chunked" in trace, f"{name}: the request was not chunked"
        assert "Send header: Content-Length: 4\n" in trace, f"{name}: no probe POST"
        h.fsck_strict(str(dest))
        results[name] = (h.refs_of(str(dest)), _objects(dest))
    assert results["aspen-cgi"] == results["stock"]
    assert results["aspen-wsgi"] == results["stock"]
    assert len(results["stock"][0]) > 1800


@pytest.mark.timeout(300)
def test_gzip_encoded_upload_pack_requests_from_a_real_client(root, tmp_path, cgi_server_factory, server_factory):
    """Requests over 1024 bytes that fit the post buffer are sent with Content-Encoding: gzip (v0 and v2)."""
    _many_branches(root, 60)
    results = {}
    for name, url, r in _three(root, cgi_server_factory, server_factory):
        for version in ("0", "2"):
            dest = tmp_path / f"clone-{name}-{version}"
            p = _git("-c", f"protocol.version={version}", "clone", "--mirror", f"{url}/repo.git", str(dest),
                     env={"GIT_TRACE_CURL": "1"})
            assert "Content-Encoding: gzip" in p.stderr.decode(errors="replace"), name
            h.fsck_strict(str(dest))
            results[(name, version)] = (h.refs_of(str(dest)), _objects(dest))
    for version in ("0", "2"):
        assert results[("aspen-cgi", version)] == results[("stock", version)]
        assert results[("aspen-wsgi", version)] == results[("stock", version)]


@pytest.mark.timeout(300)
def test_large_chunked_receive_pack_request_with_probe_post(root, tmp_path, cgi_server_factory, server_factory):
    """A push over http.postBuffer is sent chunked after a probe POST `0000`; receive-pack requests are never
    gzipped."""
    h.git("config", "http.receivepack", "true", cwd=str(root / "repo.git"))
    outcome = {}
    data = os.urandom(400 * 1024)
    for name, url, r in _three(root, cgi_server_factory, server_factory):
        work = tmp_path / f"work-{name}"
        h.git("clone", "-q", f"{url}/repo.git", str(work))
        (work / "big.bin").write_bytes(data)
        h.git("add", "big.bin", cwd=str(work))
        h.git("-c", "user.name=P", "-c", "user.email=p@x", "commit", "-q", "-m", "big", "--date", "@1700000000 +0000",
              cwd=str(work), env={"GIT_COMMITTER_DATE": "@1700000000 +0000"})
        p = _git("-c", "http.postBuffer=65536", "push", "origin", "HEAD:refs/heads/big", cwd=str(work),
                 env={"GIT_TRACE_CURL": "1"})
        trace = p.stderr.decode(errors="replace")
        assert "Transfer-Encoding: chunked" in trace, name
        assert "Send header: Content-Length: 4\n" in trace, f"{name}: no probe POST"
        assert "Content-Encoding: gzip" not in trace.split("git-receive-pack")[-1], name
        repo = r / "repo.git"
        h.fsck_strict(str(repo))
        outcome[name] = h.out("rev-parse", "big^{tree}", cwd=str(repo))
    assert outcome["aspen-cgi"] == outcome["stock"] and outcome["aspen-wsgi"] == outcome["stock"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("args", [["--depth", "1"], ["--shallow-since", "2000-01-01"],
                                  ["--shallow-exclude", "topic"], ["--filter=blob:none"], ["--filter=tree:0"],
                                  ["--depth", "2", "--no-single-branch"]])
@pytest.mark.parametrize("version", ["0", "2"])
def test_shallow_deepen_and_filter_clones_over_http(root, tmp_path, cgi_server_factory, server_factory, args,
                                                    version):
    h.git("config", "uploadpack.allowFilter", "true", cwd=str(root / "repo.git"))
    results = {}
    for name, url, r in _three(root, cgi_server_factory, server_factory):
        dest = tmp_path / f"c-{name}"
        _git("-c", f"protocol.version={version}", "clone", "-q", "--bare", *args, f"{url}/repo.git", str(dest))
        shallow = (dest / "shallow").read_text() if (dest / "shallow").exists() else ""
        results[name] = (h.refs_of(str(dest)), sorted(shallow.split()), _objects(dest))
        if "--depth" in args:
            # deepen by one more commit
            _git("-c", f"protocol.version={version}", "fetch", "-q", "--deepen=1", cwd=str(dest))
            results[name] += (sorted((dest / "shallow").read_text().split()) if (dest / "shallow").exists()
                              else [],)
    assert results["aspen-cgi"] == results["stock"]
    assert results["aspen-wsgi"] == results["stock"]


@pytest.mark.timeout(300)
def test_incremental_fetch_negotiates_over_several_posts(root, tmp_path, cgi_server_factory, server_factory):
    """A client with many local-only commits negotiates in several stateless rounds."""
    servers = _three(root, cgi_server_factory, server_factory)
    for name, url, r in servers:
        work = tmp_path / f"w-{name}"
        h.git("clone", "-q", f"{url}/repo.git", str(work))
        for i in range(120):
            (work / "local.txt").write_text(f"{i}\n")
            h.git("add", "local.txt", cwd=str(work))
            h.git("-c", "user.name=L", "-c", "user.email=l@x", "commit", "-q", "-m", f"local {i}", cwd=str(work))
        srv = r / "repo.git"
        for version in ("0", "2"):
            # move the server on, then fetch: the client has 120 commits the server lacks
            tree = h.out("rev-parse", "main^{tree}", cwd=str(srv))
            c = h.git("commit-tree", "-p", "main", "-m", f"server moved {version}", tree, cwd=str(srv),
                      env={"GIT_AUTHOR_DATE": "@1700000000 +0000", "GIT_COMMITTER_DATE": "@1700000000 +0000"})
            new = c.stdout.decode().strip()
            h.git("update-ref", "refs/heads/main", new, cwd=str(srv))
            p = _git("-c", f"protocol.version={version}", "fetch", "origin", cwd=str(work),
                     env={"GIT_TRACE_PACKET": "1", "GIT_TRACE_CURL": "1", "GIT_TRACE_CURL_NO_DATA": "1"})
            trace = p.stderr.decode(errors="replace")
            posts = trace.count("=> Send header: POST ")
            # v0: two or more negotiation POSTs; v2: ls-refs, then two or more fetch rounds
            assert "have " in trace and posts >= (2 if version == "0" else 3), (name, version, posts)
            assert h.out("rev-parse", "origin/main", cwd=str(work)) == new
        h.fsck_strict(str(work))


@pytest.mark.timeout(300)
def test_push_hook_output_as_remote_lines_and_reflog_identity_real_client(root, tmp_path, cgi_server_factory,
                                                                         server_factory, monkeypatch):
    # gunicorn inherits the test process environment: a GIT_COMMITTER_* there would (rightly) win
    for k in ("GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL"):
        monkeypatch.delenv(k, raising=False)
    repo = root / "repo.git"
    h.git("config", "http.receivepack", "true", cwd=str(repo))
    h.git("config", "core.logAllRefUpdates", "true", cwd=str(repo))
    hook = repo / "hooks" / "post-receive"
    hook.write_text("#!/bin/sh\necho \"hello from post-receive\"\necho 'to stderr' >&2\ncat >/dev/null\n")
    hook.chmod(0o755)
    seen = {}
    for name, url, r in _three(root, cgi_server_factory, server_factory):
        work = tmp_path / f"p-{name}"
        h.git("clone", "-q", f"{url}/repo.git", str(work))
        h.git("-c", "user.name=P", "-c", "user.email=p@x", "commit", "-q", "--allow-empty", "-m", "x",
              cwd=str(work))
        p = _git("push", "origin", "HEAD:main", cwd=str(work))
        err = p.stderr.decode(errors="replace")
        assert "remote: hello from post-receive" in err and "remote: to stderr" in err, (name, err)
        log = (r / "repo.git" / "logs" / "refs" / "heads" / "main").read_text().splitlines()[-1]
        seen[name] = log.split("> ")[0].split(" ", 2)[2] + ">"
    assert seen["stock"] == "anonymous <anonymous@http.127.0.0.1>"
    assert seen["aspen-cgi"] == seen["stock"]
    assert seen["aspen-wsgi"] == seen["stock"]


@pytest.mark.timeout(300)
def test_dumb_http_clone_works_against_both(root, tmp_path, cgi_server_factory, server_factory):
    """The dumb protocol end to end (t5550-style): info/refs, objects/info/packs, loose objects and packs."""
    repo = root / "repo.git"
    h.git("repack", "-q", "-d", cwd=str(repo))
    h.git("update-server-info", cwd=str(repo))
    results = {}
    for name, url, r in _three(root, cgi_server_factory, server_factory):
        dest = tmp_path / f"d-{name}"
        _git("clone", "-q", "--bare", f"{url}/repo.git", str(dest), env={"GIT_SMART_HTTP": "0"})
        h.fsck_strict(str(dest))
        results[name] = h.refs_of(str(dest))
    assert results["aspen-cgi"] == results["stock"] == results["aspen-wsgi"]


# t5560 / t5561: the access matrix, checked for every URL those scripts use.

T5560_URLS = [("GET", "/repo.git/HEAD", None), ("GET", "/repo.git/info/refs", None),
              ("GET", "/repo.git/objects/info/packs", None), ("GET", "/repo.git/objects/info/alternates", None),
              ("GET", "/repo.git/objects/info/http-alternates", None), ("GET", "/repo.git/LOOSE", None),
              ("GET", "/repo.git/PACK", None), ("GET", "/repo.git/IDX", None),
              ("GET", "/repo.git/info/refs", "service=git-upload-pack"),
              ("POST", "/repo.git/git-upload-pack", None),
              ("GET", "/repo.git/info/refs", "service=git-receive-pack"),
              ("POST", "/repo.git/git-receive-pack", None)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("getanyfile,uploadpack,receivepack", [(None, None, None), ("false", None, None),
                                                               (None, "false", None), (None, None, "true"),
                                                               ("true", "true", "false"), ("false", "false", "false")])
def test_passes_t5560_t5561_access_matrix_partial(root, getanyfile, uploadpack, receivepack):
    """Checklist line `Passes t5560, t5561, ...` (partially covered: git's
    own scripts need its source tree). This runs the t5560 URL set under each
    enable/disable configuration, with and without REMOTE_USER and export
    settings, and requires stock's status, headers, body and (t5561's access
    log) zero-byte error bodies from Aspen."""
    repo = root / "repo.git"
    h.git("repack", "-q", "-d", cwd=str(repo))
    pack = sorted(p.name for p in (repo / "objects" / "pack").glob("*.pack"))[0][:-5]
    oid = h.git("hash-object", "-w", "--stdin", cwd=str(repo), input=b"t5560 loose\n").stdout.decode().strip()
    (repo / "objects" / "info").mkdir(exist_ok=True)
    (repo / "objects" / "info" / "alternates").write_text("")
    for key, value in (("http.getanyfile", getanyfile), ("http.uploadpack", uploadpack),
                       ("http.receivepack", receivepack)):
        if value is not None:
            h.git("config", key, value, cwd=str(repo))
    for method, path, query in T5560_URLS:
        path = path.replace("LOOSE", f"objects/{oid[:2]}/{oid[2:]}").replace("PACK", f"objects/pack/{pack}.pack") \
            .replace("IDX", f"objects/pack/{pack}.idx")
        for extra in ({}, {"REMOTE_USER": "user"}, {"GIT_HTTP_EXPORT_ALL": None}):
            if method == "POST":
                svc = path.rsplit("git-", 1)[1]
                env = d.post_env(root, "repo.git", svc, b"0000", **extra)
                env = {k: v for k, v in env.items() if v is not None}
                body = b"0000"
            else:
                env = d.env_for(root, path, method, query, **extra)
                body = b""
            t = d.compare(env, body, mode="advert" if query else "exact")
            if t.stock.status != 200:
                assert t.cgi.body == b"" or t.stock.status == 415
