"""Unit tests of the pure protocol code (pkt-lines, v0 and v2 request
parsing), and Aspen's advertisements and ls-refs compared byte for byte
with stock git-http-backend run as a CGI on the same repository and config
(after normalising `agent=` and the length of its pkt-line)."""

from __future__ import annotations

import io
import re
import shutil

import pytest

from aspen_cgi.protocol import pktline as P
from aspen_cgi.protocol.pktline import DELIM, FLUSH, ProtocolError, encode
from aspen_cgi.protocol.requests import FetchRequest, LsRefsRequest, OtherCommand, parse_v0, parse_v2

from . import harness as h

pytestmark = pytest.mark.timeout(60)

A = "a" * 40
B = "b" * 40
C = "c" * 40
D = "d" * 40


# ---------------------------------------------------------------- pkt-line

def packets(buf: bytes):
    return [p for p, _ in P.parse(buf)]


def test_encode_adds_hex_length_including_header():
    assert encode("hello\n") == b"000ahello\n"
    assert encode(b"") == b"0004"
    assert len(encode(b"x" * P.MAX_DATA)) == P.MAX_PKT


def test_encode_refuses_data_over_65516_bytes():
    with pytest.raises(ValueError):
        encode(b"x" * (P.MAX_DATA + 1))


def test_parse_special_packets_flush_delim_response_end():
    buf = encode("a\n") + b"0000" + b"0001" + encode("b") + b"0002"
    assert packets(buf) == [b"a\n", P.FLUSH_PKT, P.DELIM_PKT, b"b", P.END_PKT]


def test_parse_reports_end_offsets():
    buf = encode("ab") + FLUSH
    assert [end for _, end in P.parse(buf)] == [6, 10]


def test_parse_accepts_uppercase_hex_length():
    assert packets(b"000AHELLO\n") == [b"HELLO\n"]


@pytest.mark.parametrize("buf,what", [
    (b"00", "truncated pkt-line length"),
    (b"000", "truncated pkt-line length"),
    (b"0009abc", "truncated pkt-line"),
    (encode("ok") + b"00ff" + b"x" * 10, "truncated pkt-line"),
    (b"zzzzhello", "bad line length character"),
    (b"00g5x", "bad line length character"),
    (b" 005x", "bad line length character"),
    (b"-005x", "bad line length character"),
    (b"0003", "bad pkt-line length 3"),
    (b"fff1" + b"x" * 65521, "over the limit"),
    (b"ffff", "over the limit"),
])
def test_parse_rejects_malformed(buf, what):
    with pytest.raises(ProtocolError, match=re.escape(what)):
        packets(buf)


def test_length_1_and_2_are_delim_and_response_end_not_data():
    assert packets(b"0001") == [P.DELIM_PKT]
    assert packets(b"0002") == [P.END_PKT]


def test_max_length_65520_is_accepted():
    buf = b"fff0" + b"y" * (65520 - 4)
    assert packets(buf) == [b"y" * 65516]


def test_reader_reads_one_packet_at_a_time_and_none_at_eof():
    r = P.Reader(io.BytesIO(encode("one\n") + FLUSH + encode("two")))
    assert r.read() == b"one\n"
    assert r.read() is P.FLUSH_PKT
    assert r.read() == b"two"
    assert r.read() is None


@pytest.mark.parametrize("buf", [b"00", b"000aabc", b"xyz1", b"0003", b"fff5" + b"x" * 70000])
def test_reader_rejects_malformed(buf):
    with pytest.raises(ProtocolError):
        P.Reader(io.BytesIO(buf)).read()


def test_sideband_splits_into_max_sized_packets():
    pkts = list(P.sideband(1, b"z" * 70000))
    assert all(len(p) <= P.MAX_PKT for p in pkts)
    assert b"".join(p[5:] for p in pkts) == b"z" * 70000
    assert all(p[4] == 1 for p in pkts)


def test_strip_lf_only_strips_one_newline():
    assert P.strip_lf(b"a\n\n") == b"a\n"
    assert P.strip_lf(b"a") == b"a"


# ---------------------------------------------------------------- v0 requests

def v0(*lines, flush_after_wants=True, rounds=(), done=False) -> bytes:
    out = b"".join(encode(l + "\n") for l in lines)
    if flush_after_wants:
        out += FLUSH
    for r in rounds:
        out += b"".join(encode(f"have {x}\n") for x in r) + FLUSH
    if done:
        out += encode("done\n")
    return out


def test_v0_caps_only_on_first_want():
    req = parse_v0(v0(f"want {A} multi_ack_detailed side-band-64k thin-pack ofs-delta agent=git/2.39.5",
                      f"want {B}", done=True))
    assert req.wants == [A, B]
    assert req.capabilities == ["multi_ack_detailed", "side-band-64k", "thin-pack", "ofs-delta", "agent=git/2.39.5"]
    assert req.agent == "git/2.39.5"
    assert req.has_capability("agent") and req.has_capability("thin-pack") and not req.has_capability("thin")
    assert req.done and req.version == 0


def test_v0_caps_on_later_want_are_ignored():
    req = parse_v0(v0(f"want {A}", f"want {B} no-progress"))
    assert req.capabilities == []


def test_v0_shallow_and_deepen_lines():
    req = parse_v0(v0(f"want {A} shallow", f"shallow {C}", f"shallow {D}", "deepen 3", "deepen-relative"))
    assert req.shallow == [C, D] and req.deepen == 3 and req.deepen_relative
    assert req.needs_fallback_reason == "shallow"


def test_v0_deepen_since_and_not_and_filter():
    req = parse_v0(v0(f"want {A}", "deepen-since 1700000000", "deepen-not refs/heads/old",
                      "deepen-not refs/tags/v1", "filter blob:none"))
    assert req.deepen_since == 1700000000
    assert req.deepen_not == ["refs/heads/old", "refs/tags/v1"]
    assert req.filter == "blob:none"
    assert req.needs_fallback_reason == "shallow"


def test_v0_filter_alone_is_filter_fallback():
    assert parse_v0(v0(f"want {A}", "filter tree:0")).needs_fallback_reason == "filter"
    assert parse_v0(v0(f"want {A}")).needs_fallback_reason is None


def test_v0_haves_in_several_flush_separated_rounds_then_done():
    req = parse_v0(v0(f"want {A}", rounds=[[B], [C, D]], done=True))
    assert req.haves == [B, C, D] and req.done


def test_v0_round_without_done():
    req = parse_v0(v0(f"want {A}", rounds=[[B]]))
    assert req.haves == [B] and not req.done


def test_v0_flush_only_has_no_wants():
    assert parse_v0(FLUSH).wants == []
    assert parse_v0(b"").wants == []


@pytest.mark.parametrize("body,match", [
    (v0("want nothex"), "expected to get object ID"),
    (v0(f"want {A[:39]}"), "expected to get object ID"),
    (v0(f"want {A}", "bogus line"), "expected to get object ID"),
    (v0(f"want {A}", "deepen 0"), "invalid deepen"),
    (v0(f"want {A}", f"deepen {1 << 31}"), "invalid deepen"),
    (v0(f"want {A}", "deepen -1"), "invalid deepen"),
    (v0(f"want {A}", "deepen x"), "invalid deepen"),
    (v0(f"want {A}", "deepen-since soon"), "invalid deepen-since"),
    (v0(f"want {A}", "shallow zz"), "expected to get object ID"),
    (v0(f"want {A}", rounds=[["nothex"]]), "expected to get object ID"),
    (v0(f"want {A}") + encode("gimme\n"), "expected SHA1 list"),
    (encode(f"want {A}\n"), "ended inside the want list"),
    (encode(f"want {A}\n") + DELIM, "unexpected delim"),
])
def test_v0_rejects_malformed(body, match):
    with pytest.raises(ProtocolError, match=match):
        parse_v0(body)


def test_v0_accepts_sha256_ids():
    oid = "e" * 64
    assert parse_v0(v0(f"want {oid}")).wants == [oid]


# ---------------------------------------------------------------- v2 requests

def v2(command, caps=(), args=None) -> bytes:
    out = encode(f"command={command}\n") + b"".join(encode(c + "\n") for c in caps)
    if args is not None:
        out += DELIM + b"".join(encode(a + "\n") for a in args)
    return out + FLUSH


def test_v2_fetch_arguments():
    req = parse_v2(v2("fetch", ["agent=git/2.39.5", "object-format=sha1", "server-option=a=b"],
                      ["thin-pack", "no-progress", "include-tag", "ofs-delta", f"want {A}", f"want {B}",
                       "want-ref refs/heads/main", f"have {C}", "done", f"shallow {D}", "deepen 5",
                       "deepen-relative", "deepen-since 12", "deepen-not refs/heads/x", "filter blob:limit=1k",
                       "wait-for-done", "sideband-all", "packfile-uris https"]))
    assert isinstance(req, FetchRequest) and req.version == 2
    assert req.wants == [A, B] and req.want_refs == ["refs/heads/main"] and req.haves == [C] and req.done
    assert req.capabilities == ["thin-pack", "no-progress", "include-tag", "ofs-delta"]
    assert req.shallow == [D] and req.deepen == 5 and req.deepen_relative and req.deepen_since == 12
    assert req.deepen_not == ["refs/heads/x"] and req.filter == "blob:limit=1k"
    assert req.wait_for_done and req.sideband_all and req.packfile_uris == "https"
    assert req.agent == "git/2.39.5" and req.server_options == ["a=b"]


def test_v2_fetch_without_arguments_section():
    req = parse_v2(v2("fetch"))
    assert isinstance(req, FetchRequest) and req.wants == []


def test_v2_ls_refs_arguments():
    req = parse_v2(v2("ls-refs", ["agent=x"], ["peel", "symrefs", "unborn", "ref-prefix HEAD",
                                               "ref-prefix refs/heads/"]))
    assert req == LsRefsRequest(peel=True, symrefs=True, unborn=True, prefixes=["HEAD", "refs/heads/"], agent="x")


def test_v2_ls_refs_defaults():
    assert parse_v2(v2("ls-refs")) == LsRefsRequest()


def test_v2_object_info_is_passed_through():
    req = parse_v2(v2("object-info", [], ["size", f"oid {A}"]))
    assert isinstance(req, OtherCommand) and req.name == "object-info"


def test_v2_empty_request_is_none():
    assert parse_v2(FLUSH) is None
    assert parse_v2(b"") is None


@pytest.mark.parametrize("body,match", [
    (v2("frobnicate"), "invalid command 'frobnicate'"),
    (v2("ls-refs", [], ["bogus"]), "unexpected line"),
    (v2("fetch", [], ["want xyz"]), "expected to get object ID"),
    (v2("fetch", [], ["what-is-this"]), "unexpected line"),
    (v2("fetch", [], [f"want {A}", f"deepen {1 << 31}"]), "invalid deepen"),
    (encode("agent=x\n") + FLUSH, "no command requested"),
    (encode("command=fetch\n") + encode("command=fetch\n") + FLUSH, "command supplied twice"),
    (encode("command=fetch\n"), "ended without a flush"),
    (encode("command=fetch\n") + DELIM + encode(f"want {A}\n"), "ended without a flush"),
    (encode("command=fetch\n") + DELIM + encode(f"want {A}\n") + DELIM + FLUSH, "unexpected delim"),
    (encode("command=fetch\n") + b"0002", "unexpected response-end"),
])
def test_v2_rejects_malformed(body, match):
    with pytest.raises(ProtocolError, match=re.escape(match)):
        parse_v2(body)


# ---------------------------------------------------------------- advertisements vs stock

_AGENT = re.compile(rb"agent=[^ \n\0]*")


def normalise(body: bytes) -> list:
    """pkt-lines with `agent=` values blanked and each length recomputed; what
    Aspen adds to v2's capabilities by default (`packfile-uris` in `fetch=`,
    `bundle-uri`: docs/differences.md) left out."""
    out = []
    for pkt, _ in P.parse(body):
        if pkt == b"bundle-uri\n":
            continue
        if isinstance(pkt, bytes) and pkt.startswith(b"fetch="):
            pkt = pkt.replace(b" packfile-uris", b"")
        out.append(_AGENT.sub(b"agent=X", pkt) if isinstance(pkt, bytes) else pkt)
    return out


def cgi_env(root, **extra) -> dict:
    env = {"GIT_PROJECT_ROOT": str(root), "GIT_HTTP_EXPORT_ALL": "1"}
    env.update(extra)
    return env


def info_refs(root, protocol=None, **extra):
    env = cgi_env(root, REQUEST_METHOD="GET", PATH_INFO="/repo.git/info/refs",
                  QUERY_STRING="service=git-upload-pack", **extra)
    if protocol is not None:
        env["GIT_PROTOCOL"] = protocol
    return env


def compare(env, body=b""):
    s, a = h.stock(env, body), h.aspen(env, body)
    assert s.status == a.status == 200, (s.stderr, a.stderr)
    assert normalise(a.body) == normalise(s.body), f"\nstock: {s.body!r}\naspen: {a.body!r}"
    return a


def tricky_repo(root):
    """Tags of tags, a symref under refs/, a ref to a missing object, a non-ASCII ref."""
    r = str(root / "repo.git")
    h.git("tag", "-a", "-m", "tag of tag", "tag2", "v1.0", cwd=r)
    h.git("tag", "-a", "-m", "tag of tag of tag", "tag3", "tag2", cwd=r)
    h.git("tag", "-a", "-m", "tag of tree", "treetag", "HEAD^{tree}", cwd=r)
    h.git("symbolic-ref", "refs/remotes/origin/HEAD", "refs/heads/topic", cwd=r)
    h.git("update-ref", "refs/heads/caf\u00e9", "HEAD", cwd=r)
    (root / "repo.git" / "refs" / "heads" / "broken").write_text("1" * 40 + "\n")
    h.git("update-ref", "refs/hidden/secret", "HEAD~1", cwd=r)
    h.git("update-ref", "refs/namespaces/ns/refs/heads/main", "HEAD~2", cwd=r)
    h.git("symbolic-ref", "refs/namespaces/ns/HEAD", "refs/namespaces/ns/refs/heads/main", cwd=r)
    return r


CONFIGS = [
    {},
    {"uploadpack.allowTipSHA1InWant": "true"},
    {"uploadpack.allowReachableSHA1InWant": "true"},
    {"uploadpack.allowAnySHA1InWant": "true"},
    {"uploadpack.allowFilter": "true"},
    {"uploadpack.allowRefInWant": "true", "uploadpack.allowSidebandAll": "true"},
    {"uploadpack.allowTipSHA1InWant": "true", "uploadpack.allowReachableSHA1InWant": "true",
     "uploadpack.allowFilter": "true", "uploadpack.allowRefInWant": "true"},
    {"uploadpack.hideRefs": "refs/hidden"},
    {"transfer.hideRefs": "refs/tags", "uploadpack.hideRefs": "!refs/tags/v1.0"},
    {"uploadpack.hideRefs": "HEAD"},
    {"lsrefs.unborn": "ignore"},
    {"lsrefs.unborn": "allow"},
    # allow_uor bits are set and cleared in config order
    {"uploadpack.allowAnySHA1InWant": "true", "uploadpack.allowTipSHA1InWant": "false"},
    {"uploadpack.allowTipSHA1InWant": "yes", "uploadpack.allowAnySHA1InWant": "off"},
    {"uploadpack.allowReachableSHA1InWant": "1", "uploadpack.allowTipSHA1InWant": "on"},
    {"uploadpack.allowFilter": "0", "uploadpack.allowRefInWant": "no"},
    {"uploadpack.blobPackfileUri": "a b https://example.invalid/p.pack"},
    {"uploadpack.hideRefs": "refs/heads/main"},
    {"uploadpack.hideRefs": "^refs/namespaces/ns"},
]


@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    base = tmp_path_factory.mktemp("templates")
    plain = base / "plain"
    plain.mkdir()
    h.make_history(plain / "repo.git")
    tricky = base / "tricky"
    shutil.copytree(plain, tricky, symlinks=True)
    tricky_repo(tricky)
    return {"plain": plain, "tricky": tricky}


@pytest.fixture
def root(templates, tmp_path):
    """A copy of a small repository with history (faster than building one per test)."""
    r = tmp_path / "root"
    shutil.copytree(templates["plain"], r, symlinks=True)
    return r


@pytest.fixture
def tricky_root(templates, tmp_path):
    r = tmp_path / "root"
    shutil.copytree(templates["tricky"], r, symlinks=True)
    return r


def set_config(root, cfg):
    for k, v in cfg.items():
        h.git("config", "--add", k, v, cwd=str(root / "repo.git"))


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "default")
@pytest.mark.parametrize("protocol", [None, "version=1", "version=2"])
def test_upload_pack_advertisement_matches_stock(tricky_root, cfg, protocol):
    set_config(tricky_root, cfg)
    compare(info_refs(tricky_root, protocol))


LS_REFS_ARGS = [
    [],
    ["peel"],
    ["symrefs"],
    ["peel", "symrefs"],
    ["symrefs", "unborn"],
    ["unborn"],
    ["peel", "symrefs", "ref-prefix refs/tags/"],
    ["ref-prefix HEAD", "ref-prefix refs/heads/", "symrefs"],
    ["ref-prefix refs/remotes/", "symrefs"],
    ["ref-prefix refs/heads/ma"],
    ["ref-prefix nothing/"],
]


def ls_refs(root, args, **extra):
    body = encode("command=ls-refs\n") + encode("agent=git/2.39.5\n") + encode("object-format=sha1\n") + DELIM
    body += b"".join(encode(a + "\n") for a in args) + FLUSH
    env = cgi_env(root, REQUEST_METHOD="POST", PATH_INFO="/repo.git/git-upload-pack", GIT_PROTOCOL="version=2",
                  CONTENT_TYPE="application/x-git-upload-pack-request", CONTENT_LENGTH=str(len(body)), **extra)
    return env, body


@pytest.mark.parametrize("args", LS_REFS_ARGS, ids=lambda a: "+".join(a) or "none")
def test_ls_refs_matches_stock(tricky_root, args):
    a = compare(*ls_refs(tricky_root, args))
    assert a.body.endswith(FLUSH)


@pytest.mark.parametrize("cfg", [{"uploadpack.hideRefs": "refs/hidden"}, {"uploadpack.hideRefs": "HEAD"},
                                 {"lsrefs.unborn": "ignore"}, {"transfer.hideRefs": "refs/heads"}],
                         ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_ls_refs_with_config_matches_stock(tricky_root, cfg):
    set_config(tricky_root, cfg)
    compare(*ls_refs(tricky_root, ["peel", "symrefs", "unborn"]))


def test_ls_refs_tag_of_tag_peels_fully(tricky_root):
    a = compare(*ls_refs(tricky_root, ["peel", "ref-prefix refs/tags/tag3"]))
    commit = h.out("rev-parse", "v1.0^{commit}", cwd=str(tricky_root / "repo.git"))
    assert f"peeled:{commit}".encode() in a.body


@pytest.mark.parametrize("protocol", [None, "version=2"])
def test_namespace_advertisement_matches_stock(tricky_root, protocol):
    env = info_refs(tricky_root, protocol, GIT_NAMESPACE="ns")
    compare(env)
    a = compare(*ls_refs(tricky_root, ["peel", "symrefs", "unborn"], GIT_NAMESPACE="ns"))
    assert b"refs/heads/topic" not in a.body and b"refs/heads/main" in a.body
    compare(*ls_refs(tricky_root, ["symrefs", "ref-prefix refs/heads/"], GIT_NAMESPACE="ns"))
    compare(*ls_refs(tricky_root, ["symrefs", "ref-prefix HEAD"], GIT_NAMESPACE="ns"))


def test_namespace_with_detached_head_matches_stock(tricky_root):
    r = str(tricky_root / "repo.git")
    oid = h.out("rev-parse", "refs/namespaces/ns/refs/heads/main", cwd=r)
    h.git("update-ref", "--no-deref", "refs/namespaces/ns/HEAD", oid, cwd=r)
    a = compare(info_refs(tricky_root, GIT_NAMESPACE="ns"))
    assert f"{oid} HEAD\0".encode() in a.body
    compare(*ls_refs(tricky_root, ["symrefs", "peel"], GIT_NAMESPACE="ns"))


def test_ref_to_missing_object_is_advertised_like_stock(tricky_root):
    a = compare(info_refs(tricky_root))
    assert b"1" * 40 + b" refs/heads/broken" in a.body


def empty_repo(root):
    shutil.rmtree(root / "repo.git")
    h.git("init", "-q", "--bare", "-b", "main", str(root / "repo.git"))


@pytest.mark.parametrize("protocol", [None, "version=1", "version=2"])
def test_empty_repo_advertisement_matches_stock(root, protocol):
    empty_repo(root)
    compare(info_refs(root, protocol))


@pytest.mark.parametrize("args", [["symrefs", "unborn"], ["unborn"], ["symrefs"], ["peel", "symrefs", "unborn",
                                                                                 "ref-prefix HEAD"]],
                         ids=lambda a: "+".join(a))
def test_empty_repo_ls_refs_unborn_matches_stock(root, args):
    empty_repo(root)
    compare(*ls_refs(root, args))


def test_unborn_head_with_other_branches_matches_stock(root):
    r = str(root / "repo.git")
    h.git("symbolic-ref", "HEAD", "refs/heads/nowhere", cwd=r)
    compare(info_refs(root))
    a = compare(*ls_refs(root, ["symrefs", "unborn", "peel"]))
    assert b"unborn HEAD symref-target:refs/heads/nowhere" in a.body


def test_detached_head_matches_stock(root):
    r = str(root / "repo.git")
    oid = h.out("rev-parse", "HEAD~1", cwd=r)
    (root / "repo.git" / "HEAD").write_text(oid + "\n")
    a = compare(info_refs(root))
    assert b"symref=" not in a.body and f"{oid} HEAD\0".encode() in a.body
    compare(info_refs(root, "version=2"))
    compare(*ls_refs(root, ["symrefs", "peel", "unborn"]))


def test_head_symref_to_a_tag_is_peeled_like_stock(root):
    r = str(root / "repo.git")
    h.git("symbolic-ref", "HEAD", "refs/tags/v1.0", cwd=r)
    compare(info_refs(root))
    compare(*ls_refs(root, ["symrefs", "peel"]))


def test_shallow_server_repo_sends_shallow_lines_like_stock(root, tmp_path):
    src = root / "repo.git"
    shallow = root / "shallow.git"
    h.git("clone", "-q", "--bare", "--depth", "2", f"file://{src}", str(shallow))
    shutil.rmtree(src)
    shallow.rename(src)
    assert (src / "shallow").exists()
    a = compare(info_refs(root))
    assert b"shallow " in a.body
    compare(info_refs(root, "version=2"))
    compare(*ls_refs(root, ["peel", "symrefs"]))


def test_symref_chains_resolve_to_the_end_like_stock(root):
    r = str(root / "repo.git")
    h.git("symbolic-ref", "refs/heads/alias", "refs/heads/main", cwd=r)
    h.git("symbolic-ref", "refs/heads/alias2", "refs/heads/alias", cwd=r)
    h.git("symbolic-ref", "HEAD", "refs/heads/alias2", cwd=r)
    h.git("symbolic-ref", "refs/remotes/origin/HEAD", "refs/heads/alias", cwd=r)
    a = compare(info_refs(root))
    assert b"symref=HEAD:refs/heads/main " in a.body
    a = compare(*ls_refs(root, ["symrefs", "peel", "unborn"]))
    assert b"refs/heads/alias2 symref-target:refs/heads/main" in a.body
    compare(info_refs(root, "version=2"))


def test_packed_refs_with_peeled_tags_match_stock(tricky_root):
    h.git("pack-refs", "--all", cwd=str(tricky_root / "repo.git"))
    compare(info_refs(tricky_root))
    compare(*ls_refs(tricky_root, ["peel", "symrefs"]))


def test_session_id_advertised_when_configured(root):
    set_config(root, {"transfer.advertiseSID": "true"})
    for protocol in (None, "version=2"):
        s, a = h.stock(info_refs(root, protocol)), h.aspen(info_refs(root, protocol))
        assert (b"session-id=" in s.body) and (b"session-id=" in a.body)
        sid = re.compile(rb"session-id=[^ \n\0]*")
        norm = [lambda b: [sid.sub(b"session-id=S", p) if isinstance(p, bytes) else p for p in normalise(b)]][0]
        assert norm(a.body) == norm(s.body)


def test_object_info_matches_stock(tricky_root):
    r = str(tricky_root / "repo.git")
    oids = [h.out("rev-parse", rev, cwd=r) for rev in ("HEAD", "HEAD^{tree}", "v1.0")]
    body = encode("command=object-info\n") + encode("object-format=sha1\n") + DELIM + encode("size\n")
    body += b"".join(encode(f"oid {o}\n") for o in oids) + FLUSH
    env = cgi_env(tricky_root, REQUEST_METHOD="POST", PATH_INFO="/repo.git/git-upload-pack", GIT_PROTOCOL="version=2",
                  CONTENT_TYPE="application/x-git-upload-pack-request", CONTENT_LENGTH=str(len(body)))
    a = compare(env, body)
    assert a.body.startswith(encode("size")) and oids[0].encode() in a.body
