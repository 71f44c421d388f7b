"""The checklist (docs/http-backend-checklist.md), upload-pack over HTTP at the request level: stateless
negotiation, shallow/deepen/filter, protocol v2 commands, GIT_PROTOCOL and
GIT_NAMESPACE, repository config, and what happens when the child fails.
Packs are compared as object sets (never byte for byte)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from . import differential as d
from . import harness as h
from .differential import compare, env_for, pkt, post_env, v0_request, v2_request

CAPS = "multi_ack_detailed side-band-64k ofs-delta no-progress"


def _rev(root: Path, what: str) -> str:
    return h.out("rev-parse", what, cwd=str(root / "repo.git"))


def _upload(root, body, repo="repo.git", **extra):
    return post_env(root, repo, "upload-pack", body, **extra)


def _v2(root, body, **extra):
    return _upload(root, body, HTTP_GIT_PROTOCOL="version=2", **extra)


def _grow(root: Path, n: int = 6) -> None:
    """More history on main so negotiation has something to find."""
    work = root.parent / "grow"
    h.git("clone", "-q", str(root / "repo.git"), str(work))
    for i in range(n):
        (work / f"g{i}.txt").write_text(f"grow {i}\n" * (i + 3))
        h.git("add", "-A", cwd=str(work))
        h.git("commit", "-q", "-m", f"grow {i}", cwd=str(work))
    h.git("push", "-q", "origin", "main", cwd=str(work))


@pytest.mark.timeout(120)
def test_stateless_negotiation_across_posts_multi_ack_detailed_no_done_ack_ready_with_pack(root):
    _grow(root)
    repo = str(root / "repo.git")
    tip = _rev(root, "main")
    old = _rev(root, "main~4")
    older = _rev(root, "main~5")
    unknown = "%040x" % 12345
    # round 1: haves, flush -> ACK common / NAK, no pack
    body = v0_request([tip], haves=[unknown, old], caps=CAPS, done=False)
    t = compare(_upload(root, body), body, status=200, mode="pack", repo=repo)
    r1 = d.parse_upload_response(t.cgi.body, repo)
    assert ("pkt", f"ACK {old} common\n".encode()) in r1.control and not r1.pack
    # round 2 repeats the wants and the common haves; with no-done the server may answer ready + pack
    body = v0_request([tip], haves=[old, older], caps=CAPS + " no-done", done=False)
    t = compare(_upload(root, body), body, status=200, mode="pack", repo=repo)
    # a final round with done gets ACK + pack
    body = v0_request([tip], haves=[old], caps=CAPS)
    t = compare(_upload(root, body), body, status=200, mode="pack", repo=repo)
    r3 = d.parse_upload_response(t.cgi.body, repo)
    assert r3.pack and ("pkt", f"ACK {old}\n".encode()) in r3.control
    # multi_ack (not detailed) and plain (no multi_ack)
    for caps in ("multi_ack side-band-64k", "side-band", "ofs-delta", "multi_ack_detailed no-done side-band-64k"):
        body = v0_request([tip], haves=[unknown, old], caps=caps, done=False)
        compare(_upload(root, body), body, status=200, mode="pack", repo=repo)
        body = v0_request([tip], haves=[old], caps=caps)
        compare(_upload(root, body), body, status=200, mode="pack", repo=repo)


@pytest.mark.timeout(120)
def test_stateless_negotiation_ack_ready_and_pack_in_one_response_with_no_done(root):
    _grow(root, 40)
    repo = str(root / "repo.git")
    tip = _rev(root, "main")
    haves = [_rev(root, f"main~{i}") for i in range(1, 35)]
    body = v0_request([tip], haves=haves, caps="multi_ack_detailed no-done side-band-64k ofs-delta", done=False)
    t = compare(_upload(root, body), body, status=200, mode="pack", repo=repo)
    r = d.parse_upload_response(t.cgi.body, repo)
    ready = [c for c in r.control if c[0] == "pkt" and c[1].endswith(b" ready\n")]
    assert ready and r.pack, r.control


@pytest.mark.timeout(120)
def test_wants_reachable_but_not_advertised_are_allowed_over_http(root):
    repo = str(root / "repo.git")
    body = v0_request([_rev(root, "main~2")], caps=CAPS)
    t = compare(_upload(root, body), body, status=200, mode="pack", repo=repo)
    assert d.parse_upload_response(t.cgi.body, repo).objects


@pytest.mark.timeout(120)
@pytest.mark.parametrize("extra", [["deepen 1"], ["deepen 2"], ["deepen-since 1"], ["deepen-since 4102444800"],
                                   ["deepen-not refs/heads/topic"], ["deepen 1", "deepen-relative"],
                                   ["filter blob:none"], ["filter tree:0"], ["filter blob:limit=10"],
                                   ["deepen 1", "filter blob:none"]])
def test_shallow_deepen_since_deepen_not_and_filter_fetches(root, extra):
    repo = str(root / "repo.git")
    h.git("config", "uploadpack.allowFilter", "true", cwd=repo)
    tip = _rev(root, "main")
    caps = CAPS + " shallow" + (" filter" if any(e.startswith("filter") for e in extra) else "")
    body = v0_request([tip], caps=caps, extra=extra)
    t = compare(_upload(root, body), body, status=200, mode="pack", repo=repo)
    r = d.parse_upload_response(t.cgi.body, repo)
    if extra in (["deepen 1"], ["deepen 2"], ["deepen-not refs/heads/topic"]):
        assert any(c[0] == "pkt" and c[1].startswith(b"shallow ") for c in r.control)
    # an incremental deepen from a shallow client
    if extra == ["deepen 1"]:
        body = v0_request([tip], caps=caps, extra=[f"shallow {tip}", "deepen 3"])
        compare(_upload(root, body), body, status=200, mode="pack", repo=repo)


def test_filter_without_allow_filter_is_refused_like_stock(root):
    body = v0_request([_rev(root, "main")], caps=CAPS + " filter", extra=["filter blob:none"])
    t = compare(_upload(root, body), body, mode="exact")
    assert t.cgi.status == t.stock.status


def test_v2_ls_refs_variants(root):
    repo = str(root / "repo.git")
    h.git("update-ref", "refs/heads/zz", _rev(root, "main"), cwd=repo)
    for args in ([], ["peel"], ["symrefs"], ["peel", "symrefs"], ["ref-prefix refs/tags/"],
                 ["ref-prefix refs/heads/", "ref-prefix HEAD", "symrefs"], ["unborn", "symrefs"],
                 ["ref-prefix refs/nothing/"]):
        body = v2_request("ls-refs", ["agent=git/2.39.5", "object-format=sha1"], args)
        t = compare(_v2(root, body), body, status=200)
        assert t.cgi.body.endswith(b"0000")
    # unborn HEAD in an empty repository
    h.git("init", "-q", "--bare", str(root / "empty.git"))
    body = v2_request("ls-refs", [], ["unborn", "symrefs"])
    t = compare(_v2(root, body, PATH_INFO="/empty.git/git-upload-pack"), body, status=200)
    head = h.out("symbolic-ref", "HEAD", cwd=str(root / "empty.git"))    # init.defaultBranch decides it
    assert t.cgi.body == pkt(f"unborn HEAD symref-target:{head}\n") + b"0000"


@pytest.mark.timeout(120)
def test_v2_fetch_including_wait_for_done_and_packfile_uris(root):
    _grow(root)
    repo = str(root / "repo.git")
    tip = _rev(root, "main")
    old = _rev(root, "main~3")
    cases = [
        ["no-progress", f"want {tip}", "done"],
        ["ofs-delta", f"want {tip}", f"have {old}", "done"],
        [f"want {tip}", f"have {old}"],                                  # negotiation only: acknowledgments
        ["wait-for-done", f"want {tip}", f"have {old}"],                # no pack until done
        ["wait-for-done", f"want {tip}", f"have {old}", "done"],
        [f"want {tip}", "deepen 1", "done"],
        [f"want {tip}", "deepen-since 1", "done"],
        [f"want {tip}", "deepen-not refs/heads/topic", "done"],
        ["include-tag", f"want {tip}", "done"],
        ["thin-pack", "ofs-delta", f"want {tip}", f"have {old}", "done"],
    ]
    for args in cases:
        body = v2_request("fetch", ["agent=git/2.39.5"], args)
        t = compare(_v2(root, body), body, status=200, mode="pack", repo=repo)
        r = d.parse_upload_response(t.cgi.body, repo)
        if "done" in args:
            assert ("pkt", b"packfile\n") in r.control and r.objects
    # filter and packfile-uris need configuration
    h.git("config", "uploadpack.allowFilter", "true", cwd=repo)
    blob = h.out("rev-parse", "main:README", cwd=repo)
    h.git("config", "uploadpack.blobPackfileUri", f"{blob} {'0' * 40} https://example.com/p.pack", cwd=repo)
    for args in ([f"want {tip}", "filter blob:none", "done"],
                 ["packfile-uris https", f"want {tip}", "done"]):
        body = v2_request("fetch", [], args)
        t = compare(_v2(root, body), body, status=200, mode="pack", repo=repo)
        assert t.cgi.status == 200


@pytest.mark.timeout(60)
def test_v2_object_info_and_empty_request_one_command_per_post(root):
    tip = _rev(root, "main")
    blob = h.out("rev-parse", "main:README", cwd=str(root / "repo.git"))
    body = v2_request("object-info", [], ["size", f"oid {tip}", f"oid {blob}"])
    t = compare(_v2(root, body), body, status=200)
    assert t.cgi.body.startswith(pkt("size")) and tip.encode() in t.cgi.body
    # an empty request: 0000 -> empty 200
    t = compare(_v2(root, b"0000"), b"0000", status=200)
    assert t.cgi.body == b""
    # one command per POST: a second command after the first is not answered (stock reads one request)
    body = v2_request("ls-refs", [], []) + v2_request("ls-refs", [], ["peel"])
    compare(_v2(root, body), body, status=200)


@pytest.mark.timeout(60)
def test_v2_unknown_command_and_bad_args(root):
    """INTENDED DEVIATION (4) where stock dies: stock answers 200 with an
    empty body (or an ERR packet) and `fatal:` on stderr; Aspen must not
    send a pack and must say `fatal:` or ERR too."""
    for body in (v2_request("frobnicate"), v2_request("fetch", [], ["bogus-arg"]),
                 v2_request("ls-refs", [], ["bogus"])):
        env = _v2(root, body)
        s = h.stock(env, body)
        assert s.status == 200 and (b"fatal:" in s.stderr or b"ERR" in s.body)
        a, w = d.aspen_both(env, body)
        assert a.status in (200, 400) and b"PACK" not in a.body
        assert b"fatal:" in a.stderr or b"ERR " in a.body


def test_http_git_protocol_copied_to_git_protocol_only_if_absent(root):
    env = env_for(root, "/repo.git/info/refs", "GET", "service=git-upload-pack", HTTP_GIT_PROTOCOL="version=2")
    t = compare(env, status=200, mode="advert")
    assert t.cgi.body.startswith(b"000eversion 2\n")
    # an empty GIT_PROTOCOL set by the server blocks the copy (t5551 /smart_v0/)
    t = compare(dict(env, GIT_PROTOCOL=""), status=200, mode="advert")
    assert t.cgi.body.startswith(b"001e# service=git-upload-pack\n")
    t = compare(dict(env, GIT_PROTOCOL="version=1"), status=200, mode="advert")
    assert b"000eversion 1\n" in t.cgi.body
    # and for POSTs: an ls-refs request under a v0-pinning server is not understood as v2
    body = v2_request("ls-refs", [], [])
    env = _v2(root, body)
    compare(env, body, status=200)
    s = h.stock(dict(env, GIT_PROTOCOL=""), body)
    assert s.status == 200 and b"refs/heads/main" not in s.body
    a, _ = d.aspen_both(dict(env, GIT_PROTOCOL=""), body)
    assert b"refs/heads/main" not in a.body


@pytest.mark.timeout(120)
def test_git_namespace_honoured_smart_and_dumb(root):
    repo = str(root / "repo.git")
    topic = _rev(root, "topic")
    main = _rev(root, "main")
    h.git("update-ref", "refs/namespaces/ns/refs/heads/inside", topic, cwd=repo)
    h.git("update-ref", "refs/namespaces/ns/refs/tags/t", _rev(root, "v1.0"), cwd=repo)
    h.git("symbolic-ref", "refs/namespaces/ns/HEAD", "refs/namespaces/ns/refs/heads/inside", cwd=repo)
    for q in ("service=git-upload-pack", None):
        t = compare(env_for(root, "/repo.git/info/refs", "GET", q, GIT_NAMESPACE="ns"), status=200,
                    mode="advert" if q else "exact")
        assert b"refs/heads/inside" in t.cgi.body and b"refs/heads/main" not in t.cgi.body
    t = compare(env_for(root, "/repo.git/info/refs", "GET", "service=git-upload-pack", GIT_NAMESPACE="ns",
                        HTTP_GIT_PROTOCOL="version=2"), status=200, mode="advert")
    body = v2_request("ls-refs", [], ["symrefs", "peel", "unborn"])
    t = compare(_v2(root, body, GIT_NAMESPACE="ns"), body, status=200)
    assert b"refs/heads/inside" in t.cgi.body and b"refs/heads/main" not in t.cgi.body
    body = v0_request([topic], caps=CAPS)
    compare(_upload(root, body, GIT_NAMESPACE="ns"), body, status=200, mode="pack", repo=repo)
    # a want outside the namespace is not ours there (unless reachable: main is not)
    body = v0_request([main], caps=CAPS)
    compare(_upload(root, body, GIT_NAMESPACE="ns"), body, status=200, mode="pack", repo=repo)
    h.git("config", "http.receivepack", "true", cwd=repo)
    compare(env_for(root, "/repo.git/info/refs", "GET", "service=git-receive-pack", GIT_NAMESPACE="ns"),
            status=200, mode="advert")


@pytest.mark.timeout(120)
def test_upload_pack_repo_config_hiderefs_allow_sha1_in_want_filter_advertise(root):
    repo = str(root / "repo.git")
    adv = env_for(root, "/repo.git/info/refs", "GET", "service=git-upload-pack")
    adv2 = dict(adv, HTTP_GIT_PROTOCOL="version=2")
    loose = h.git("commit-tree", "-m", "unreachable", _rev(root, "main^{tree}"), cwd=repo).stdout.decode().strip()
    for key, value in (("uploadpack.hideRefs", "refs/tags"), ("transfer.hideRefs", "!refs/tags/v1.0"),
                       ("uploadpack.allowTipSHA1InWant", "true"), ("uploadpack.allowReachableSHA1InWant", "true"),
                       ("uploadpack.allowAnySHA1InWant", "true"), ("uploadpack.allowFilter", "true"),
                       ("uploadpack.allowRefInWant", "true"), ("uploadpack.allowSidebandAll", "true"),
                       ("transfer.advertiseSID", "false"), ("lsrefs.unborn", "ignore")):
        h.git("config", "--add", key, value, cwd=repo)
        compare(adv, status=200, mode="advert")
        compare(adv2, status=200, mode="advert")
        body = v2_request("ls-refs", [], ["symrefs", "peel", "unborn"])
        compare(_v2(root, body), body, status=200)
        body = v0_request([loose], caps=CAPS)
        compare(_upload(root, body), body, mode="pack", repo=repo)
    h.git("update-ref", "refs/hidden/x", _rev(root, "topic"), cwd=repo)
    h.git("config", "uploadpack.hideRefs", "refs/hidden", cwd=repo)
    h.git("config", "--unset-all", "uploadpack.allowAnySHA1InWant", cwd=repo)
    h.git("config", "--unset-all", "uploadpack.allowReachableSHA1InWant", cwd=repo)
    t = compare(adv, status=200, mode="advert")
    assert b"refs/hidden/x" not in t.cgi.body
    body = v0_request([_rev(root, "refs/hidden/x")], caps=CAPS)
    compare(_upload(root, body), body, mode="pack", repo=repo)


@pytest.mark.timeout(120)
def test_errors_after_headers_leave_200_truncated_body_never_second_status(root):
    """The child dies after headers went out: a missing blob in the repository makes pack-objects fail."""
    repo = root / "repo.git"
    blob = h.out("rev-parse", "main:README", cwd=str(repo))
    obj = repo / "objects" / blob[:2] / blob[2:]
    assert obj.exists(), "make_history should leave loose objects"
    os.unlink(obj)
    tip = _rev(root, "main")
    for caps in (CAPS, "ofs-delta"):
        body = v0_request([tip], caps=caps)
        env = _upload(root, body)
        s = h.stock(env, body)
        a = h.aspen(env, body)
        w = h.wsgi(env, body)
        for r in (s, a, w):
            assert r.status == 200
            assert b"Status:" not in r.body and b"\r\n\r\n" not in r.body
            assert r.header("Content-Type") == "application/x-git-upload-pack-result"
        for r in (s, a):
            assert b"fatal:" in r.stderr or b"error:" in r.stderr or b"\x03" in r.body


def test_child_stderr_forwarded_to_server_log(root):
    body = v0_request(["1" * 40], caps=CAPS)
    t = compare(_upload(root, body), body, status=200, with_wsgi=False,
                stderr=f"fatal: git upload-pack: not our ref {'1' * 40}")
    assert t.cgi.body.startswith(b"0049ERR upload-pack: not our ref")
    # under WSGI the child's stderr goes to the server process's stderr (the error log); the answer is the same
    w = h.wsgi(_upload(root, body), body)
    assert (w.status, w.body) == (t.stock.status, t.stock.body)


@pytest.mark.timeout(60)
def test_child_killed_if_the_backend_goes_away(root):
    """Closing the WSGI response early (client gone) kills the upload-pack child."""
    _grow(root, 3)
    from aspen_cgi import wsgi as app
    body = v0_request([_rev(root, "main")], caps="side-band-64k ofs-delta")
    environ = h.wsgi_environ(_upload(root, body), body)

    def children() -> set[int]:
        out = set()
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                stat = open(f"/proc/{pid}/stat").read()
                cmd = open(f"/proc/{pid}/cmdline", "rb").read()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == os.getpid() and b"upload-pack" in cmd:
                out.add(int(pid))
        return out

    before = children()
    it = app.application(environ, lambda status, headers, exc=None: None)
    chunk = next(iter(it))
    assert chunk
    it.close()
    deadline = time.time() + 10
    while time.time() < deadline and children() - before:
        time.sleep(0.1)
    assert not (children() - before)


def test_a_served_process_loads_the_request_path_and_freezes_its_start_up_heap():
    """Under gunicorn and mod_wsgi the request path is imported as the app
    loads, and the collector's full passes leave that heap alone (gc.freeze):
    they had paused planning by up to 25 ms."""
    import subprocess
    import sys
    probe = ("import gc, sys; import aspen_cgi.wsgi; "
             "print(gc.get_freeze_count() > 10000, 'aspen_cgi.planner.plan' in sys.modules, "
             "'aspen_cgi.packs.splice' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=h.REPO_DIR)
    assert out.stdout.split() == ["True", "True", "True"], out.stderr
