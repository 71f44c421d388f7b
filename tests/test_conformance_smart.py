"""The checklist (docs/http-backend-checklist.md), smart HTTP at the request level: advertisements,
service selection, query strings, POST checks, request bodies (length, EOF,
gzip, buffer limit) and the intended deviations from stock."""

from __future__ import annotations

import gzip
import os
import select
import subprocess
import time

import pytest

from . import differential as d
from . import harness as h
from .differential import NOCACHE, compare, env_for, pkt, post_env


def _adv_env(root, svc="upload-pack", **kw):
    return env_for(root, "/repo.git/info/refs", "GET", f"service=git-{svc}", **kw)


def _head(root) -> str:
    return h.out("rev-parse", "main", cwd=str(root / "repo.git"))


def test_info_refs_upload_pack_is_200_advertisement_nocache_no_content_length_streamed(root):
    t = compare(_adv_env(root), status=200, mode="advert")
    for r in (t.stock, t.cgi):
        assert r.headers == NOCACHE + [("Content-Type", "application/x-git-upload-pack-advertisement")]
    assert t.wsgi.header("Content-Length") is None
    assert t.cgi.body.endswith(b"0000")


def test_v0_advertisement_starts_with_service_line_and_flush(root):
    t = compare(_adv_env(root), status=200, mode="advert")
    assert t.cgi.body.startswith(b"001e# service=git-upload-pack\n0000")
    first = d.tokens(t.cgi.body)[2][1]
    assert first.startswith(_head(root).encode() + b" HEAD\0") and b" no-done " in first
    t = compare(_adv_env(root, "receive-pack", REMOTE_USER="alice"), status=200, mode="advert")
    assert t.cgi.body.startswith(b"001f# service=git-receive-pack\n0000")
    assert t.cgi.header("Content-Type") == "application/x-git-receive-pack-advertisement"


def test_v0_advertisement_of_empty_repository(root):
    h.git("init", "-q", "--bare", str(root / "empty.git"))
    for svc, user in (("upload-pack", None), ("receive-pack", "u")):
        t = compare(env_for(root, "/empty.git/info/refs", "GET", f"service=git-{svc}", REMOTE_USER=user),
                    status=200, mode="advert")
        assert t.cgi.body.startswith(pkt(f"# service=git-{svc}\n") + b"0000")


@pytest.mark.parametrize("proto", ["version=1", "version=1:foo=bar", "x:version=1"])
def test_v1_adds_version_1_after_the_flush(root, proto):
    for svc, user in (("upload-pack", None), ("receive-pack", "u")):
        t = compare(_adv_env(root, svc, HTTP_GIT_PROTOCOL=proto, REMOTE_USER=user), status=200, mode="advert")
        assert t.cgi.body.startswith(pkt(f"# service=git-{svc}\n") + b"0000000eversion 1\n")


@pytest.mark.parametrize("proto", ["version=2", "version=1:version=2", "version=2:version=1", "foo:version=2"])
def test_v2_omits_service_prefix_and_returns_version_2_capabilities(root, proto):
    t = compare(_adv_env(root, HTTP_GIT_PROTOCOL=proto), status=200, mode="advert")
    assert t.cgi.body.startswith(b"000eversion 2\n")
    caps = [tk[1] for tk in d.tokens(t.cgi.body) if tk[0] == "pkt"]
    assert b"ls-refs=unborn\n" in caps and any(c.startswith(b"fetch=shallow wait-for-done") for c in caps)
    assert d.tokens(t.cgi.body)[-1] == ("flush",)


@pytest.mark.parametrize("proto", ["version=3", "version=", "version=02", "Version=2"])
def test_unknown_protocol_versions_fall_back_to_v0(root, proto):
    t = compare(_adv_env(root, HTTP_GIT_PROTOCOL=proto), status=200, mode="advert")
    assert t.cgi.body.startswith(b"001e# service")


def test_receive_pack_with_version_2_is_v0_advertisement_without_service_prefix(root):
    t = compare(_adv_env(root, "receive-pack", REMOTE_USER="u", HTTP_GIT_PROTOCOL="version=2"),
                status=200, mode="advert")
    assert not t.cgi.body.startswith(b"001f# service")
    assert t.cgi.body.startswith(_head(root).encode()[:0] + b"00")
    first = d.tokens(t.cgi.body)[0][1]
    assert b" refs/heads/main\0report-status" in first


@pytest.mark.parametrize("value", ["upload-pack", "git-foo", "git-upload-archive", "git-", "", "GIT-upload-pack",
                                   "git-upload-pack ", "git-upload-pack\n", "xgit-upload-pack",
                                   "git-receive-pack-x"])
def test_service_not_starting_with_git_or_unknown_is_403_unsupported_service(root, value):
    from urllib.parse import quote
    t = compare(env_for(root, "/repo.git/info/refs", "GET", "service=" + quote(value)), status=403,
                stderr=f"Unsupported service: '{value}'")
    assert t.cgi.body == b"" and t.wsgi.body == b""


def test_disabled_service_is_403_service_not_enabled(root):
    h.git("config", "http.uploadpack", "false", cwd=str(root / "repo.git"))
    compare(_adv_env(root), status=403, stderr="Service not enabled: 'upload-pack'")
    compare(_adv_env(root, "receive-pack"), status=403, stderr="Service not enabled: 'receive-pack'")
    body = b"0000"
    for svc in ("upload-pack", "receive-pack"):
        t = compare(post_env(root, "repo.git", svc, body), body, status=403,
                    stderr=f"Service not enabled: '{svc}'")
        assert t.stock.headers == [("Status", "403 Forbidden")] + NOCACHE


def test_403_on_info_refs_carries_the_nocache_block_twice(root):
    t = compare(_adv_env(root, "receive-pack"), status=403)
    assert t.stock.headers == NOCACHE + [("Status", "403 Forbidden")] + NOCACHE
    t = compare(env_for(root, "/repo.git/info/refs", "GET", "service=nope"), status=403)
    assert t.cgi.headers == NOCACHE + [("Status", "403 Forbidden")] + NOCACHE
    h.git("config", "http.getanyfile", "false", cwd=str(root / "repo.git"))
    t = compare(env_for(root, "/repo.git/info/refs"), status=403)
    assert t.cgi.headers == NOCACHE + [("Status", "403 Forbidden")] + NOCACHE


QUERIES = [
    ("service=git-upload-pack", "smart"),
    ("service=git%2Dupload%2dpack", "smart"),              # %XX decoding, either case
    ("service=git-upload+pack", "Unsupported service: 'git-upload pack'"),  # + is a space
    ("service=git-upload%00pack", "Unsupported service: 'git-upload%00pack'"),  # %00 left as is
    ("service=git-receive-pack&service=git-upload-pack", "smart"),   # last duplicate wins
    ("service=git-upload-pack&service=bogus", "Unsupported service: 'bogus'"),
    ("foo&service=git-upload-pack", "dumb"),               # name swallows the next item
    ("foo=bar&service=git-upload-pack", "smart"),
    ("&service=git-upload-pack", "dumb"),                  # the empty name swallows the next item too
    ("service", "Unsupported service: ''"),
    ("service=", "Unsupported service: ''"),
    ("servic%65=git-upload-pack", "smart"),
    ("SERVICE=git-upload-pack", "dumb"),
    ("%%%", "dumb"),
    ("=&&==&", "dumb"),
    ("a=b=c", "dumb"),
    ("service=git-upload-pack%", "Unsupported service: 'git-upload-pack%'"),
    ("service=git-upload-pack%4", "Unsupported service: 'git-upload-pack%4'"),
    ("service=%67it-upload-pack&x", "smart"),
]


@pytest.mark.parametrize("query,expect", QUERIES)
def test_query_string_parsing_matches_stock(root, query, expect):
    t = compare(env_for(root, "/repo.git/info/refs", "GET", query), mode="advert" if expect == "smart" else "exact")
    if expect == "smart":
        assert t.cgi.status == 200 and t.cgi.header("Content-Type").startswith("application/x-git-")
    elif expect == "dumb":
        assert t.cgi.status == 200 and t.cgi.header("Content-Type") == "text/plain"
    else:
        assert t.cgi.status == 403 and expect.encode() in t.stock.stderr and expect.encode() in t.cgi.stderr


@pytest.mark.parametrize("config,user,enabled", [(None, None, False), (None, "", False), (None, "alice", True),
                                                 ("true", None, True), ("true", "alice", True),
                                                 ("false", "alice", False), ("false", None, False),
                                                 ("1", None, True), ("yes", None, True), ("0", "bob", False)])
def test_receive_pack_enabled_iff_config_true_or_unset_with_remote_user(root, config, user, enabled):
    if config is not None:
        h.git("config", "http.receivepack", config, cwd=str(root / "repo.git"))
    compare(_adv_env(root, "receive-pack", REMOTE_USER=user), status=200 if enabled else 403, mode="advert")
    body = b"0000"
    env = post_env(root, "repo.git", "receive-pack", body, REMOTE_USER=user)
    t = compare(env, body, status=200 if enabled else 403)
    if not enabled:
        assert b"Service not enabled: 'receive-pack'" in t.cgi.stderr


@pytest.mark.parametrize("config,enabled", [(None, True), ("true", True), ("false", False), ("no", False),
                                            ("off", False), ("yes", True)])
def test_upload_pack_enabled_unless_config_false(root, config, enabled):
    if config is not None:
        h.git("config", "http.uploadpack", config, cwd=str(root / "repo.git"))
    compare(_adv_env(root), status=200 if enabled else 403, mode="advert")
    compare(_adv_env(root, REMOTE_USER="someone"), status=200 if enabled else 403, mode="advert")


def test_upload_archive_route_absent_in_2_39_reference(root):
    """Contract line (2.47) `upload-archive POST route`: the 2.39.5 binary on
    this machine is the reference, and it has no upload-archive route: a POST
    is `Request not supported` and the service name is unsupported on info/refs,
    whatever http.uploadarchive and REMOTE_USER say."""
    h.git("config", "http.uploadarchive", "true", cwd=str(root / "repo.git"))
    body = pkt("argument HEAD\n") + b"0000"
    env = post_env(root, "repo.git", "upload-archive", body, REMOTE_USER="alice")
    compare(env, body, status=404, stderr=f"Request not supported: '{root}/repo.git/git-upload-archive'")
    compare(_adv_env(root, "upload-archive", REMOTE_USER="alice"), status=403,
            stderr="Unsupported service: 'git-upload-archive'")


def test_post_service_check_403_comes_before_content_type_check_415(root):
    body = b"0000"
    env = post_env(root, "repo.git", "receive-pack", body, CONTENT_TYPE="text/plain")
    compare(env, body, status=403, stderr="Service not enabled: 'receive-pack'")
    env = post_env(root, "repo.git", "receive-pack", body, CONTENT_TYPE="text/plain", REMOTE_USER="u")
    compare(env, body, status=415)


@pytest.mark.parametrize("svc", ["upload-pack", "receive-pack"])
def test_415_has_no_content_type_and_expected_body(root, svc):
    body = b"0000"
    env = post_env(root, "repo.git", svc, body, CONTENT_TYPE="application/x-git-upload-pack-request"
                   if svc == "receive-pack" else "application/octet-stream", REMOTE_USER="u")
    t = compare(env, body, status=415)
    got = env["CONTENT_TYPE"]
    assert t.cgi.body == (f"Expected POST with Content-Type 'application/x-git-{svc}-request', "
                          f"but received '{got}' instead.\n").encode()
    assert t.stock.headers == [("Status", "415 Unsupported Media Type")] + NOCACHE
    assert t.wsgi.header("Content-Type") is None


@pytest.mark.parametrize("ctype", ["application/x-git-upload-pack-request; charset=utf-8",
                                   "Application/x-git-upload-pack-request", " application/x-git-upload-pack-request",
                                   "application/x-git-upload-pack-request ", "", None])
def test_content_type_compared_exactly_and_unset_is_empty(root, ctype):
    body = b"0000"
    env = post_env(root, "repo.git", "upload-pack", body, CONTENT_TYPE=ctype)
    t = compare(env, body, status=415)
    assert t.cgi.body.endswith(f"but received '{ctype or ''}' instead.\n".encode())


def test_post_response_is_result_type_nocache_streamed_no_content_length(root):
    body = d.v0_request([_head(root)])
    t = compare(post_env(root, "repo.git", "upload-pack", body), body, status=200, mode="pack",
                repo=str(root / "repo.git"))
    for r in (t.stock, t.cgi):
        assert r.headers == NOCACHE + [("Content-Type", "application/x-git-upload-pack-result")]
    assert t.wsgi.header("Content-Length") is None
    assert len(d.parse_upload_response(t.cgi.body, str(root / "repo.git")).objects) > 10


@pytest.mark.parametrize("body", [b"0000", b"0000\n", b"0000trailing bytes never read"])
@pytest.mark.parametrize("svc", ["upload-pack", "receive-pack"])
def test_post_flush_only_body_gives_200_with_zero_byte_body(root, svc, body):
    """Stock's rule: upload-pack (v0 and v2) and receive-pack stop reading at
    a flush that ends an empty request, so what follows it (git's own t5562
    sends `0000\n` with no CONTENT_LENGTH) is never an error."""
    t = compare(post_env(root, "repo.git", svc, body, REMOTE_USER="u"), body, status=200)
    assert t.cgi.body == b"" and t.wsgi.body == b"" and t.stock.body == b""
    assert t.cgi.header("Content-Type") == f"application/x-git-{svc}-result"
    t = compare(post_env(root, "repo.git", svc, body, REMOTE_USER="u", HTTP_GIT_PROTOCOL="version=2"), body,
                status=200)
    assert t.cgi.body == b"" and t.stock.body == b""
    env = post_env(root, "repo.git", svc, body, REMOTE_USER="u")
    env.pop("CONTENT_LENGTH", None)
    a, s = h.aspen(env, body), h.stock(env, body)
    assert a.status == s.status == 200 and a.body == s.body == b"", (a.status, a.stderr)


def test_403_and_404_bodies_are_zero_bytes(root):
    cases = [env_for(root, "/repo.git/nope"), env_for(root, "/nope.git/HEAD"),
             env_for(root, "/repo.git/HEAD", GIT_HTTP_EXPORT_ALL=None), _adv_env(root, "receive-pack"),
             env_for(root, "/repo.git/info/refs", "GET", "service=x"),
             env_for(root, "/repo.git/objects/info/alternates"),
             env_for(root, "/repo.git/objects/ab/" + "c" * 38)]
    for env in cases:
        t = compare(env)
        assert t.stock.status in (403, 404)
        assert t.cgi.body == b"" and t.wsgi.body == b""


def _run_open_stdin(argv, env, body, timeout=20):
    """Run a CGI, write BODY, keep stdin open; return (stdout, stderr, seconds)."""
    full = dict(h.BASE_ENV)
    full.update(env)
    p = subprocess.Popen(argv, env=full, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    started = time.monotonic()
    p.stdin.write(body)
    p.stdin.flush()
    out = b""
    try:
        while True:
            r, _, _ = select.select([p.stdout], [], [], max(0.0, timeout - (time.monotonic() - started)))
            if not r:
                raise AssertionError(f"{argv[0]} waited for EOF on stdin with CONTENT_LENGTH set")
            chunk = os.read(p.stdout.fileno(), 65536)
            if not chunk:
                break
            out += chunk
    finally:
        p.stdin.close()
        p.kill()
        err = p.stderr.read()
        p.wait()
    return out, err, time.monotonic() - started


@pytest.mark.timeout(90)
@pytest.mark.parametrize("svc", ["upload-pack", "receive-pack"])
def test_content_length_honoured_reads_exactly_n_bytes_and_never_waits_for_eof(root, svc):
    body = d.v0_request([_head(root)]) if svc == "upload-pack" else b"0000"
    env = post_env(root, "repo.git", svc, body, REMOTE_USER="u")
    outs = []
    for argv in ([h.STOCK], [h.ASPEN_CGI]):
        out, err, secs = _run_open_stdin(argv, env, body + b"trailing garbage that must not be read")
        assert secs < 15
        outs.append(h.parse_cgi(out, err))
    d.check_trio(outs[0], outs[1], None, status=200, mode="pack" if svc == "upload-pack" else "exact",
                 repo=str(root / "repo.git"))
    # the in-process WSGI app reads no further than CONTENT_LENGTH either
    w = h.wsgi(env, body + b"garbage")
    assert w.status == 200


@pytest.mark.timeout(120)
@pytest.mark.parametrize("length", [None, ""])
def test_unset_or_empty_content_length_reads_body_to_eof(root, length):
    body = d.v0_request([_head(root)])
    env = post_env(root, "repo.git", "upload-pack", body, CONTENT_LENGTH=length)
    if length is None:
        env.pop("CONTENT_LENGTH", None)
    t = compare(env, body, status=200, mode="pack", repo=str(root / "repo.git"))
    assert t.cgi.body and len(d.parse_upload_response(t.cgi.body, str(root / "repo.git")).objects) > 10
    # a GET with an empty CONTENT_LENGTH (t5562) is fine too
    compare(_adv_env(root, CONTENT_LENGTH=length), status=200, mode="advert")


@pytest.mark.parametrize("value", ["abc", "12abc", "99999999999999999999", "1x", "08", "0x", "4 ", "1kb",
                                   "9223372036854775807k"])
@pytest.mark.parametrize("svc", ["upload-pack", "receive-pack"])
def test_unparsable_or_overflowing_content_length_is_400_with_fatal_message(root, value, svc):
    """INTENDED DEVIATION (2): stock answers 200 and writes a second header
    block (`Status: 500 ...`) into the body; Aspen answers 400 with an empty
    body. Both write `fatal: failed to parse CONTENT_LENGTH: <v>` to stderr."""
    body = b"0000"
    env = post_env(root, "repo.git", svc, body, CONTENT_LENGTH=value, REMOTE_USER="u")
    s = h.stock(env, body, timeout=20)
    assert s.status == 200 and b"Status: 500 Internal Server Error\r\n" in s.body
    assert f"fatal: failed to parse CONTENT_LENGTH: {value}".encode() in s.stderr
    a, w = d.aspen_both(env, body)
    assert a.status == 400 and a.body == b""
    assert a.headers == [("Status", "400 Bad Request")] + NOCACHE
    for r in (a, w):
        assert f"fatal: failed to parse CONTENT_LENGTH: {value}".encode() in r.stderr


@pytest.mark.parametrize("value,same_as", [("+4", "4"), (" 4", "4"), ("\t4", "4"), ("0x4", "4"), ("04", "4"),
                                           ("0X4", "4"), ("0k", "0"), ("0M", "0"), ("-1", None), ("-0x10", None)])
def test_content_length_is_parsed_like_git_parse_ssize_t(root, value, same_as):
    """strtoimax with base 0 (sign, leading space, 0x hex, 0 octal) and a k/m/g unit; a negative length
    means read to EOF. Each form must behave exactly like its plain decimal equivalent, in stock and Aspen."""
    body = b"0000" if same_as != "0" else b""
    for svc in ("upload-pack", "receive-pack"):
        env = post_env(root, "repo.git", svc, body, CONTENT_LENGTH=value, REMOTE_USER="u")
        plain = dict(env)
        if same_as is None:
            plain.pop("CONTENT_LENGTH")
        else:
            plain["CONTENT_LENGTH"] = same_as
        s, s_plain = h.stock(env, body, timeout=20), h.stock(plain, body, timeout=20)
        assert (s.status, s.headers, s.body) == (s_plain.status, s_plain.headers, s_plain.body)
        a, _ = d.aspen_both(env, body)
        a_plain, _ = d.aspen_both(plain, body)
        assert (a.status, a.headers, a.body) == (a_plain.status, a_plain.headers, a_plain.body)
        assert b"failed to parse" not in a.stderr


@pytest.mark.parametrize("encoding", ["gzip", "x-gzip"])
def test_gzip_and_x_gzip_request_bodies_are_inflated(root, encoding):
    repo = root / "repo.git"
    body = gzip.compress(d.v0_request([_head(root)], haves=["1" * 40] * 40))
    t = compare(post_env(root, "repo.git", "upload-pack", body, HTTP_CONTENT_ENCODING=encoding), body,
                status=200, mode="pack", repo=str(repo))
    assert len(d.parse_upload_response(t.cgi.body, str(repo)).objects) > 10


def test_gzip_receive_pack_flush_is_inflated(root):
    body = gzip.compress(b"0000")
    compare(post_env(root, "repo.git", "receive-pack", body, HTTP_CONTENT_ENCODING="gzip", REMOTE_USER="u"), body,
            status=200)


def test_truncated_gzip_upload_pack_request_fails(root):
    """INTENDED DEVIATION (4): stock gives 200, an empty body and
    `fatal: request ended in the middle of the gzip stream`; Aspen gives 400
    with the same message."""
    body = gzip.compress(d.v0_request([_head(root)]))[:-12]
    env = post_env(root, "repo.git", "upload-pack", body, HTTP_CONTENT_ENCODING="gzip")
    s = h.stock(env, body)
    assert s.status == 200 and s.body == b""
    assert b"fatal: request ended in the middle of the gzip stream" in s.stderr
    a, w = d.aspen_both(env, body)
    assert a.status == 400 and a.body == b""
    for r in (a, w):
        assert b"fatal: request ended in the middle of the gzip stream" in r.stderr


@pytest.mark.timeout(60)
def test_truncated_gzip_receive_pack_request_fails_with_fatal_and_no_traceback(root):
    body = gzip.compress(b"0000")[:-6]
    env = post_env(root, "repo.git", "receive-pack", body, HTTP_CONTENT_ENCODING="gzip", REMOTE_USER="u")
    s = h.stock(env, body)
    assert s.status == 200 and s.body == b""
    assert b"fatal: request ended in the middle of the gzip stream" in s.stderr
    a = h.aspen(env, body, timeout=30)
    w = h.wsgi(env, body)
    for r in (a, w):
        assert r.status in (200, 400) and b"Status:" not in r.body
        assert b"fatal: request ended in the middle of the gzip stream" in r.stderr, r.stderr
        assert b"Traceback" not in r.stderr


@pytest.mark.parametrize("encoding", ["identity", "deflate", "GZIP", "gzip ", "br", ""])
def test_other_content_encodings_are_passed_through_raw(root, encoding):
    body = d.v0_request([_head(root)])
    compare(post_env(root, "repo.git", "upload-pack", body, HTTP_CONTENT_ENCODING=encoding), body,
            status=200, mode="pack", repo=str(root / "repo.git"))


def test_truncated_or_empty_plain_upload_pack_bodies_fail_with_fatal(root):
    """INTENDED DEVIATION (4): bad requests to upload-pack. Stock answers 200
    with an empty body and `fatal: ...` on stderr (t5562 checks the fatal);
    Aspen answers 400 with a `fatal:` message."""
    full = d.v0_request([_head(root)])
    for body in (b"", full[:30], full[:-3], b"zzzz", b"0032want " + b"x" * 40 + b"\n0000"):
        env = post_env(root, "repo.git", "upload-pack", body)
        s = h.stock(env, body)
        assert s.status == 200 and s.body == b""
        if body != full[:-3]:    # a flush-ended round followed by a cut `done` pkt: stock is silent
            assert b"fatal:" in s.stderr
        a, w = d.aspen_both(env, body)
        assert a.status == 400 and a.body == b"", (body, a.status, a.stderr)
        for r in (a, w):
            assert b"fatal:" in r.stderr and b"Traceback" not in r.stderr


@pytest.mark.timeout(60)
def test_truncated_or_empty_plain_receive_pack_bodies_fail_with_fatal(root):
    """Stock: 200, empty body, `fatal:` from receive-pack on stderr. Aspen may
    answer 400 (its push intake reads the commands before any output) but must
    also leave an empty body and a `fatal:` message."""
    for body in (b"", b"00", b"zzzz", b"0067" + b"0" * 40):
        env = post_env(root, "repo.git", "receive-pack", body, REMOTE_USER="u")
        s = h.stock(env, body)
        assert s.status == 200 and s.body == b"" and b"fatal:" in s.stderr
        a = h.aspen(env, body)
        w = h.wsgi(env, body)
        for r in (a, w):
            assert r.status in (200, 400) and r.body == b"", (body, r.status, r.body)
            assert b"fatal:" in r.stderr and b"Traceback" not in r.stderr, (body, r.stderr)


def _big_request(root, nbytes: int) -> bytes:
    haves = ["%040x" % (i + 1) for i in range(nbytes // 50 + 1)]
    return d.v0_request([_head(root)], haves=haves)


@pytest.mark.timeout(120)
def test_upload_pack_request_over_buffer_limit_is_413(root):
    """INTENDED DEVIATION (3): stock emits a 200 whose body carries a stray
    `Status: 500` header block; Aspen answers 413 with the same
    `request was larger than our maximum size` message on stderr. Covers the
    default 10 MiB, GIT_HTTP_MAX_REQUEST_BUFFER with unit suffixes,
    http.maxRequestBuffer, and the 8 KiB floor for reads to EOF."""
    repo = root / "repo.git"
    body = _big_request(root, 20000)
    cases = [
        ({"GIT_HTTP_MAX_REQUEST_BUFFER": "10k"}, True, "(10240): %d" % len(body)),
        ({"GIT_HTTP_MAX_REQUEST_BUFFER": "10240"}, True, "(10240): %d" % len(body)),
        ({"GIT_HTTP_MAX_REQUEST_BUFFER": "1m"}, False, None),
        ({"GIT_HTTP_MAX_REQUEST_BUFFER": "10k", "CONTENT_LENGTH": None}, True, "(10240); try setting"),
        ({"GIT_HTTP_MAX_REQUEST_BUFFER": "1k", "CONTENT_LENGTH": None}, True, "(8192); try setting"),
    ]
    for extra, too_big, message in cases:
        env = post_env(root, "repo.git", "upload-pack", body, **extra)
        env = {k: v for k, v in env.items() if v is not None}
        if too_big:
            s = h.stock(env, body)
            assert s.status == 200 and (s.body == b"" or s.body.startswith(b"Status: 500"))
            assert b"request was larger than our maximum size " + message.encode() in s.stderr, s.stderr
            a, w = d.aspen_both(env, body)
            assert a.status == 413 and a.body == b""
            for r in (a, w):
                assert b"fatal: request was larger than our maximum size " + message.encode() in r.stderr
                assert b"try setting GIT_HTTP_MAX_REQUEST_BUFFER" in r.stderr
        else:
            compare(env, body, status=200, mode="pack", repo=str(repo))
    # a small request under the 8 KiB floor with a 1k limit and no length is accepted
    small = _big_request(root, 4000)
    env = post_env(root, "repo.git", "upload-pack", small, GIT_HTTP_MAX_REQUEST_BUFFER="1k")
    env.pop("CONTENT_LENGTH")
    compare(env, small, status=200, mode="pack", repo=str(repo))
    # http.maxRequestBuffer in the repository config, overridden by the environment
    h.git("config", "http.maxRequestBuffer", "10k", cwd=str(repo))
    env = post_env(root, "repo.git", "upload-pack", body)
    assert b"request was larger than our maximum size (10240)" in h.stock(env, body).stderr
    a, _ = d.aspen_both(env, body)
    assert a.status == 413
    env["GIT_HTTP_MAX_REQUEST_BUFFER"] = "100k"
    compare(env, body, status=200, mode="pack", repo=str(repo))


@pytest.mark.timeout(120)
def test_default_request_buffer_is_10_mib(root):
    """INTENDED DEVIATION (3), default limit: a CONTENT_LENGTH of 10 MiB + 1 is refused before any read."""
    body = b"0000"
    env = post_env(root, "repo.git", "upload-pack", body, CONTENT_LENGTH=str(10 * 1024 * 1024 + 1))
    s = h.stock(env, body)
    assert b"request was larger than our maximum size (10485760): 10485761" in s.stderr
    a, w = d.aspen_both(env, body)
    assert a.status == 413
    assert b"request was larger than our maximum size (10485760): 10485761" in a.stderr


def test_bad_max_request_buffer_dies_500_before_headers(root):
    body = b"0000"
    for value in ("abc", "10q", ""):
        env = post_env(root, "repo.git", "upload-pack", body, GIT_HTTP_MAX_REQUEST_BUFFER=value)
        t = compare(env, body, status=500, stderr="fatal: failed to parse GIT_HTTP_MAX_REQUEST_BUFFER")
        assert t.cgi.body == b""


@pytest.mark.timeout(120)
def test_receive_pack_body_is_streamed_with_no_size_limit(root):
    """A receive-pack request far above GIT_HTTP_MAX_REQUEST_BUFFER is still
    accepted: a push of a 300 KiB incompressible blob with a 10k limit."""
    from .test_conformance_receive import push_body
    body, ref, new = push_body(root, size=300 * 1024)
    assert len(body) > 100 * 1024

    def env(r):
        return post_env(r, "repo.git", "receive-pack", body, REMOTE_USER="u", GIT_HTTP_MAX_REQUEST_BUFFER="10k")
    t, roots = d.compare_mutating(root, env, body, status=200, mode="sideband")
    for r in roots:
        assert h.refs_of(str(r / "repo.git")).get(ref) == new


@pytest.mark.timeout(60)
def test_short_body_with_content_length_set_does_not_hang(root):
    """INTENDED DEVIATION (1): a body shorter than CONTENT_LENGTH. Stock's
    receive-pack spins forever (not run here); stock's upload-pack passes what
    arrived. Aspen answers 400 promptly for both."""
    body = b"0000"
    for svc in ("upload-pack", "receive-pack"):
        env = post_env(root, "repo.git", svc, body, CONTENT_LENGTH="1000", REMOTE_USER="u")
        started = time.monotonic()
        a, w = d.aspen_both(env, body, timeout=20)
        assert time.monotonic() - started < 15
        assert a.status == 400 and a.body == b""
        for r in (a, w):
            assert b"fatal:" in r.stderr
    env = post_env(root, "repo.git", "upload-pack", body, CONTENT_LENGTH="1000")
    s = h.stock(env, body, timeout=20)
    assert s.status == 200


def test_die_before_headers_is_500_nocache_empty_body_with_fatal(root):
    cases = [env_for(root, "/x", REQUEST_METHOD=None), env_for(root, "//x"),
             env_for(root, "/repo.git/HEAD", GIT_PROJECT_ROOT=None),
             post_env(root, "repo.git", "upload-pack", b"", GIT_HTTP_MAX_REQUEST_BUFFER="bogus")]
    for env in cases:
        t = compare(env, status=500, stderr="fatal: ")
        assert t.stock.headers == [("Status", "500 Internal Server Error")] + NOCACHE
        assert t.cgi.body == b"" and t.wsgi.body == b""


def test_internal_error_is_500_with_empty_body_and_traceback_only_in_the_log(root, monkeypatch):
    """INTENDED DEVIATION (5): where Aspen itself fails (a bug, not a stock
    die), the answer is a 500 with the no-cache block and an empty body; the
    traceback goes to the error log only, never into a body."""
    from aspen_cgi.http import dumb

    def boom(*a, **k):
        raise RuntimeError("simulated internal failure")
    monkeypatch.setattr(dumb, "info_refs_body", boom)
    w = h.wsgi(env_for(root, "/repo.git/info/refs"))
    assert w.status == 500 and w.body == b""
    assert sorted(w.headers) == sorted(NOCACHE)
    assert b"Traceback" in w.stderr and b"simulated internal failure" in w.stderr
