"""Unit tests of the pure push protocol pieces: commands, capabilities, push
options, pack header, report-status framing, ref name rules and receive.*
settings."""

from __future__ import annotations

import io
import subprocess

import pytest

from aspen_cgi.protocol import pktline, push
from aspen_cgi.protocol.push import ZERO, Command, RefResult
from aspen_cgi.pushpolicy import IGNORE, REFUSE, UNCONFIGURED, UPDATE_INSTEAD, WARN, PushPolicy
from aspen_cgi.refname import check_refname_format
from aspen_cgi.repoconfig import RepoConfig

from .differential import pkt

A = "a" * 40
B = "b" * 40


def reader(data: bytes) -> pktline.Reader:
    return pktline.Reader(io.BytesIO(data))


def test_commands_caps_and_options():
    body = (pkt(f"{ZERO} {A} refs/heads/new\0report-status side-band-64k atomic push-options agent=git/2.39\n")
            + pkt(f"{B} {ZERO} refs/heads/old\n") + b"0000" + pkt("ci.skip\n") + pkt("x=y") + b"0000" + b"PACK")
    r = reader(body)
    req = push.read_commands(r)
    assert req.commands == (Command(ZERO, A, "refs/heads/new"), Command(B, ZERO, "refs/heads/old"))
    assert req.commands[0].is_create and req.commands[1].is_delete and not req.delete_only
    assert req.value("agent") == "git/2.39"
    neg = push.negotiate(req, advertise_atomic=True, advertise_push_options=True)
    assert (neg.report_status, neg.sideband, neg.atomic, neg.push_options, neg.quiet) == (True, True, True, True, False)
    assert push.read_push_options(r) == ("ci.skip", "x=y")
    assert r.stream.read() == b"PACK"


def test_caps_not_advertised_are_not_used():
    req = push.read_commands(reader(pkt(f"{ZERO} {A} refs/heads/x\0atomic push-options report-status-v2\n") + b"0000"))
    neg = push.negotiate(req, advertise_atomic=False, advertise_push_options=False)
    assert not neg.atomic and not neg.push_options and neg.report_status_v2 and not neg.report_status


def test_empty_request_and_shallow_lines():
    assert push.read_commands(reader(b"0000")).commands == ()
    with pytest.raises(pktline.ProtocolError, match="hung up"):
        push.read_commands(reader(b""))
    req = push.read_commands(reader(pkt(f"shallow {A}") + pkt(f"{ZERO} {B} refs/heads/x\0report-status") + b"0000"))
    assert req.shallow == (A,) and req.commands == (Command(ZERO, B, "refs/heads/x"),)


@pytest.mark.parametrize("line", [f"{ZERO} {A}", f"{ZERO}{A} refs/heads/x", f"{'g' * 40} {A} refs/heads/x",
                                  f"{ZERO} {A.upper()} refs/heads/x", "push-cert\0report-status"])
def test_bad_command_lines(line):
    with pytest.raises(pktline.ProtocolError):
        push.read_commands(reader(pkt(line) + b"0000"))


def test_truncated_command_list_and_options():
    with pytest.raises(pktline.ProtocolError):
        push.read_commands(reader(pkt(f"{ZERO} {A} refs/heads/x\0report-status")))
    with pytest.raises(pktline.ProtocolError):
        push.read_push_options(reader(pkt("opt")))


def test_object_format():
    req = push.read_commands(reader(pkt(f"{ZERO} {A} refs/heads/x\0object-format=sha256") + b"0000"))
    with pytest.raises(pktline.ProtocolError, match="unsupported object format 'sha256'"):
        push.negotiate(req, True, False)


def test_pack_header():
    assert push.parse_pack_header(b"PACK\0\0\0\2\0\0\1\0") == push.PackHeader(2, 256)
    assert push.parse_pack_header(b"PACK\0\0") == "eof before pack header was fully read"
    assert push.parse_pack_header(b"PACX\0\0\0\2\0\0\0\1") == "protocol error (pack signature mismatch detected)"
    assert push.parse_pack_header(b"PACK\0\0\0\4\0\0\0\1") == "protocol error (pack version unsupported)"


def test_report_plain_and_sideband():
    rep = push.report(None, [RefResult("refs/heads/a"), RefResult("refs/heads/b", "non-fast-forward")])
    assert rep == pkt("unpack ok\n") + pkt("ok refs/heads/a\n") + pkt("ng refs/heads/b non-fast-forward\n") + b"0000"
    assert push.report("index-pack abnormal exit", []) == pkt("unpack index-pack abnormal exit\n") + b"0000"
    framed = push.band(1, rep)
    assert framed == pkt(b"\x01" + rep)
    big = b"x" * 70000
    parts = list(pktline.parse(push.band(2, big)))
    assert [len(p) for p, _ in parts] == [65516, 70000 - 65515 + 1]
    assert all(p[:1] == b"\x02" for p, _ in parts)


def test_messages_go_to_band_2_or_log():
    log: list = []
    m = push.Messages(True, log)
    assert m.error("x") == pkt(b"\x02error: x\n") and log == []
    m = push.Messages(False, log)
    assert m.warning("y") == b"" and log == ["warning: y\n"]


NAMES = ["heads/ok", "x", "heads/a..b", "heads/.h", "heads/h.lock", "heads/@", "@", "heads/a@{1}", "heads/a b",
         "heads/a\tb", "heads/a:b", "heads/a?", "heads/a[", "heads/a\\b", "heads/a^", "heads/a~", "heads/a*",
         "heads//a", "/heads/a", "heads/a/", "heads/a.", "heads/\u00e4", "a/b/c", "heads/a.b", "heads/a/.b",
         "heads/x.lock/y", "heads/-x", "heads/a\x7f", "heads/a@b", "tags/v1.0"]


def test_refname_rules_match_git_check_ref_format():
    for name in NAMES:
        for onelevel in (False, True):
            args = ["git", "check-ref-format"] + (["--allow-onelevel"] if onelevel else []) + [name]
            want = subprocess.run(args).returncode == 0
            assert check_refname_format(name, onelevel) == want, (name, onelevel)


def _policy(text: str) -> PushPolicy:
    raw = b"".join(line.replace("=", "\n", 1).encode() + b"\0" for line in text.split())
    return PushPolicy.from_config(RepoConfig.parse(raw))


def test_policy_defaults_and_values():
    p = _policy("")
    assert (p.deny_current_branch, p.deny_delete_current, p.fsck, p.unpack_limit, p.auto_gc) == \
        (UNCONFIGURED, UNCONFIGURED, False, 100, True)
    p = _policy("receive.denyCurrentBranch=updateInstead receive.denyDeleteCurrent=warn transfer.fsckObjects=true "
                "receive.denyDeletes=yes receive.maxInputSize=1k transfer.unpackLimit=7 receive.fsck.badEmail=ignore")
    assert (p.deny_current_branch, p.deny_delete_current, p.fsck, p.deny_deletes, p.max_input_size, p.unpack_limit) == \
        (UPDATE_INSTEAD, WARN, True, True, 1024, 7)
    assert p.fsck_msg_types == "bademail=ignore"
    p = _policy("transfer.fsckObjects=true receive.fsckObjects=false receive.denyCurrentBranch=false "
                "receive.denyDeleteCurrent=true receive.unpackLimit=3 transfer.unpackLimit=7")
    assert (p.fsck, p.deny_current_branch, p.deny_delete_current, p.unpack_limit) == (False, IGNORE, REFUSE, 3)
