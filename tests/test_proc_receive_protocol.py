"""Unit tests of the pure proc-receive pieces (protocol/procreceive.py) and the
report-status-v2 writer: receive.procReceiveRefs patterns, the version
answer, the report parser's rules and messages, and the option lines."""

from __future__ import annotations

import pytest

from aspen_cgi.git.repoconfig import RepoConfig
from aspen_cgi.protocol import procreceive as pr
from aspen_cgi.protocol.push import RefResult, report
from aspen_cgi.push.policy import PushPolicy

from .differential import pkt

A = "a" * 40
B = "b" * 40
Z = "0" * 40


def test_patterns_and_modifiers():
    """t5411 test-0050: m:refs/heads/main, ad:refs/heads, a!:refs/heads."""
    pats = pr.patterns(["m:refs/heads/main", "ad:refs/heads", "a!:refs/heads", None])
    assert pats[0] == pr.RefPattern("refs/heads/main", add=False, delete=False, modify=True)
    assert pr.matches(pats, A, B, "refs/heads/main")            # modify main
    assert not pr.matches(pats, A, B, "refs/heads/topic")       # modify another branch
    assert pr.matches(pats, A, Z, "refs/heads/main")            # delete under refs/heads
    assert pr.matches(pats, Z, A, "refs/heads/next")            # create under refs/heads
    assert pr.matches(pats, Z, A, "refs/tags/v123")             # create outside: the negative pattern
    assert not pr.matches(pats, A, Z, "refs/tags/v123")         # delete outside
    plain = pr.patterns(["refs/for/"])
    assert pr.matches(plain, Z, A, "refs/for") and pr.matches(plain, A, B, "refs/for/main/topic")
    assert not pr.matches(plain, Z, A, "refs/forx/main") and not pr.matches((), Z, A, "refs/for/x")


def test_policy_reads_the_patterns_in_order():
    cfg = RepoConfig.parse(b"receive.procreceiverefs\nrefs/for\0receive.procreceiverefs\nm:refs/heads\0"
                           b"receive.procreceiverefs\0receive.shallowupdate\ntrue\0")
    pol = PushPolicy.from_config(cfg)
    assert [p.prefix for p in pol.proc_receive_refs] == ["refs/for", "refs/heads"]
    assert pol.shallow_update


def test_requests_written_to_the_hook():
    assert pr.version_request(False, False) == pkt("version=1\n") + b"0000"
    assert pr.version_request(True, True) == pkt("version=1\0atomic push-options\n") + b"0000"
    assert pr.commands_request([(Z, A, "refs/for/x")]) == pkt(f"{Z} {A} refs/for/x") + b"0000"
    assert pr.options_request(["a=1"]) == pkt("a=1") + b"0000"


@pytest.mark.parametrize("lines,want", [
    ([b"version=1\0push-options\n"], pr.VersionAnswer(1, True)),
    ([b"version=1\n"], pr.VersionAnswer(1, False)),
    ([b"version=abc"], pr.VersionAnswer(0, False)),
    ([b"version="], pr.VersionAnswer(0, False)),          # no longer than `version=`: not a version line
    ([b"version=2x"], pr.VersionAnswer(2, False)),
    ([b"version= -3"], pr.VersionAnswer(-3, False)),
    ([b"version=99999999999999999999"], pr.VersionAnswer(-1, False)),   # strtol's LONG_MAX, cut to an int
    ([b"version=1\0push-options", b"version=2"], pr.VersionAnswer(2, True)),
    ([b"hello"], pr.VersionAnswer(0, False)),
])
def test_version_answer(lines, want):
    assert pr.parse_version(lines) == want


REFS = ["refs/heads/main", "refs/for/a", "refs/for/b"]
SENT = [False, True, True]


def outcome(lines, eof_first=False):
    return pr.parse_report([line.encode() for line in lines], eof_first, REFS, SENT)


def test_report_ok_with_options_and_several_rewrites():
    r = outcome(["ok refs/for/a", "option refname refs/pull/1/head", f"option old-oid {B.upper()}",
                 "option forced-update", "ok refs/for/a", f"option new-oid {A}junk", "ok refs/for/b"])
    assert r.ok and r.message == ""
    a = r.commands[1]
    assert (a.handled, a.returned, a.error) == (True, True, None)
    assert a.reports == (pr.RefReport("refs/pull/1/head", B, None, True), pr.RefReport(None, None, A, False))
    assert r.commands[2].reports == () and r.commands[0] == pr.CommandOutcome(False, False, None)


def test_report_errors_are_stocks_messages():
    r = outcome(["xy", "nope refs/x", "option refname x", "option refname y", "ok refs/heads/main",
                 "ok refs/nowhere", "ng refs/for/a", "option refname z"])
    assert not r.ok
    assert r.message == ("proc-receive reported incomplete status line: 'xy'\n"
                         "proc-receive reported bad status 'nope' on ref 'refs/x'\n"
                         "proc-receive reported 'option' without a matching 'ok/ng' directive\n"
                         "proc-receive reported status on unexpected ref: refs/heads/main\n"
                         "proc-receive reported status on unknown ref: refs/nowhere")
    assert r.commands[1].error == "failed"
    assert r.commands[2].error == "proc-receive failed to report status"


def test_report_fall_through_and_after():
    r = outcome(["ok refs/for/a", "option fall-through", "ng refs/for/b message with spaces"])
    assert r.commands[1] == pr.CommandOutcome(False, False, None, (pr.RefReport(),))
    assert r.commands[2].error == "message with spaces" and not r.ok
    again = outcome(["ok refs/for/a", "option fall-through", "ok refs/for/a", "ok refs/for/b"])
    assert again.message == "proc-receive reported status on unexpected ref: refs/for/a"


def test_report_empty_and_cut_lines():
    assert outcome([], eof_first=True) == pr.Report(False, "proc-receive exited abnormally",
                                                     tuple(pr.CommandOutcome(s, False, None) for s in SENT))
    r = outcome(["ok refs/for/a\0ignored", "ng refs/for/b "])
    assert r.commands[1].returned and r.commands[2].error == ""


def test_report_v2_lines():
    results = [RefResult("refs/for/a", None, (pr.RefReport(None, None, None), pr.RefReport("refs/pull/1/head", Z, A, True))),
               RefResult("refs/heads/x", "hook declined"), RefResult("refs/for/b", None, (pr.RefReport(""),))]
    v2 = report(None, results, v2=True)
    assert v2 == (pkt("unpack ok\n") + pkt("ok refs/for/a\n") + pkt("ok refs/for/a\n")
                  + pkt("option refname refs/pull/1/head\n") + pkt(f"option old-oid {Z}\n")
                  + pkt(f"option new-oid {A}\n") + pkt("option forced-update\n")
                  + pkt("ng refs/heads/x hook declined\n") + pkt("ok refs/for/b\n") + pkt("option refname \n")
                  + b"0000")
    assert report(None, results) == (pkt("unpack ok\n") + pkt("ok refs/for/a\n") + pkt("ng refs/heads/x hook declined\n")
                                     + pkt("ok refs/for/b\n") + b"0000")
