"""Unit tests of the pure push protocol pieces: commands, capabilities, push
options, push certificates and nonces, gpg's and ssh-keygen's answers as git
reads them, pack header, report-status framing, ref name rules and receive.*
settings."""

from __future__ import annotations

import io
import subprocess

import pytest

from aspen_cgi.git.repoconfig import RepoConfig
from aspen_cgi.model.refname import check_refname_format
from aspen_cgi.protocol import pktline, push
from aspen_cgi.protocol.push import ZERO, Command, RefResult
from aspen_cgi.push.policy import IGNORE, REFUSE, UNCONFIGURED, UPDATE_INSTEAD, WARN, PushPolicy

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
                                  f"{ZERO} {A.upper()} refs/heads/x"])
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


# --- push certificates (protocol/pushcert.py) ---------------------------------------------

CERT = (b"certificate version 0.1\npusher P 1 +0000\nnonce 5-abc\npush-option ci.skip\npush-option x y\n\n"
        + f"{ZERO} {A} refs/heads/new\n{B} {ZERO} refs/heads/old\n".encode()
        + b"-----BEGIN PGP SIGNATURE-----\n\nsig\n-----END PGP SIGNATURE-----\n")


def _cert_body(cert: bytes, end: bytes = b"push-cert-end\n", before: bytes = b"") -> bytes:
    return (before + pkt(b"push-cert\0report-status side-band-64k")
            + b"".join(pkt(line) for line in cert.splitlines(keepends=True)) + (pkt(end) if end else b"")
            + b"0000")


def test_certificate_block_and_its_commands():
    req = push.read_commands(reader(_cert_body(CERT)))
    assert req.cert == CERT
    assert req.commands == (Command(ZERO, A, "refs/heads/new"), Command(B, ZERO, "refs/heads/old"))
    assert req.has("report-status") and req.has("side-band-64k")
    # unsigned command lines come first; a flush in place of push-cert-end ends both lists
    unsigned = pkt(f"{A} {B} refs/heads/x\0report-status\n")
    req = push.read_commands(reader(_cert_body(CERT, end=b"", before=unsigned)))
    assert [c.ref for c in req.commands] == ["refs/heads/x", "refs/heads/new", "refs/heads/old"]
    assert push.read_commands(reader(pkt(f"{A} {B} refs/heads/x\n") + b"0000")).cert is None
    empty = push.read_commands(reader(pkt(b"push-cert\0report-status") + b"0000"))    # as git: nothing to do
    assert (empty.commands, empty.cert) == ((), None)


def test_certificate_errors():
    with pytest.raises(pktline.ProtocolError, match="malformed push certificate certificate version"):
        push.read_commands(reader(_cert_body(b"certificate version 0.1\nno blank line\n")))
    with pytest.raises(pktline.ProtocolError, match="expected old/new/ref, got 'nope\n'"):
        push.read_commands(reader(_cert_body(b"certificate version 0.1\n\nnope\n")))
    with pytest.raises(pktline.ProtocolError, match="got an unexpected packet"):
        push.read_commands(reader(pkt(b"push-cert\0x") + pkt("certificate version 0.1\n") + b"0001"))
    with pytest.raises(pktline.ProtocolError, match="hung up"):
        push.read_commands(reader(pkt(b"push-cert\0x") + pkt("certificate version 0.1\n")))


def test_certificate_parts():
    from aspen_cgi.protocol import pushcert
    start = pushcert.signature_start(CERT)
    assert CERT[start:].startswith(b"-----BEGIN PGP SIGNATURE-----")
    assert pushcert.signature_start(b"no signature\n") == len(b"no signature\n")
    assert pushcert.signature_format(b"-----BEGIN SSH SIGNATURE-----\n") == "ssh"
    assert pushcert.signature_format(b"-----BEGIN SIGNED MESSAGE-----\n") == "x509"
    assert pushcert.signature_format(b"") is None
    assert pushcert.header(CERT, "nonce") == b"5-abc"
    assert pushcert.headers(CERT, "push-option") == [b"ci.skip", b"x y"]
    assert pushcert.header(CERT, "push") is None                      # a key is a whole word
    assert pushcert.options_agree(CERT, ("ci.skip", "x y"))
    assert not pushcert.options_agree(CERT, ("ci.skip",))
    assert not pushcert.options_agree(CERT, ("x y", "ci.skip"))


def test_nonce_statuses():
    """check_nonce() over HTTP (stateless): the nonce git's HMAC makes, judged."""
    import hashlib
    import hmac

    from aspen_cgi.protocol import pushcert as pc

    seed = b"seed"

    def made(stamp: int) -> str:       # git keys the HMAC with ".:<stamp>" over the seed
        return f"{stamp}-" + hmac.new(f".:{stamp}".encode(), seed, hashlib.sha1).hexdigest()
    assert pc.make_nonce(seed, 1700000000) == made(1700000000)
    now = made(1700000100)

    def judge(nonce, issued=now, limit=0):
        payload = b"certificate version 0.1\n" + (b"nonce " + nonce.encode() + b"\n" if nonce else b"") + b"\n"
        return pc.check_nonce(payload, issued, seed if issued else None, limit)
    assert judge(now) == pc.NonceCheck("OK", now)
    assert judge(None) == pc.NonceCheck("MISSING", now)
    assert judge(now, issued=None) == pc.NonceCheck("UNSOLICITED", None)
    assert judge(made(1700000090)) == pc.NonceCheck("SLOP", now, 10)
    assert judge(made(1700000110)) == pc.NonceCheck("SLOP", now, -10)          # issued by a clock ahead
    assert judge(made(1700000090), limit=10) == pc.NonceCheck("OK", made(1700000090))
    assert judge(made(1700000090), limit=9) == pc.NonceCheck("SLOP", now, 10)
    old = made(1700000090)
    flipped = old[:-1] + ("1" if old[-1] == "0" else "0")
    for bad in ("0" + old, flipped, old + "0", "x-1", "1700000090", "-5-abc", " 17-x", made(1700000090)[:-1]):
        assert judge(bad).status == "BAD", bad


def test_gpg_status_parsing():
    from aspen_cgi.push.signature import parse_gpg_output, parse_ssh_output
    good = ("[GNUPG:] NEWSIG\n[GNUPG:] KEY_CONSIDERED F00 0\n[GNUPG:] GOODSIG 0123456789ABCDEF A U Thor <a@x>\n"
            "[GNUPG:] VALIDSIG F1 2024-01-01 1 0 4 0 22 10 01 PRIMARY\n[GNUPG:] TRUST_UNDEFINED 0 pgp\n")
    c = parse_gpg_output(good)
    assert (c.result, c.key, c.signer, c.fingerprint, c.primary_key_fingerprint, c.trust_level) == \
        ("G", "0123456789ABCDEF", "A U Thor <a@x>", "F1", "PRIMARY", "UNDEFINED")
    e = parse_gpg_output("[GNUPG:] ERRSIG 00AA 22 10 00 1 9\n[GNUPG:] NO_PUBKEY 00AA\n")
    assert (e.result, e.key, e.signer) == ("E", "00AA", None)
    assert parse_gpg_output("[GNUPG:] BADSIG 00AA Someone\n").result == "B"
    twice = "[GNUPG:] GOODSIG 00AA A\n[GNUPG:] GOODSIG 00BB B\n"
    assert (parse_gpg_output(twice).result, parse_gpg_output(twice).key) == ("E", None)    # two signatures
    assert parse_gpg_output(good.replace("TRUST_UNDEFINED", "TRUST_WHATEVER")).result == "E"
    assert parse_gpg_output("gpg: no status lines\n").result == "N"
    s = parse_ssh_output('Good "git" signature for one@x with ED25519 key SHA256:abc\n')
    assert (s.result, s.signer, s.key) == ("G", "one@x", "SHA256:abc")
    s = parse_ssh_output('Good "git" signature with ED25519 key SHA256:abc\n')
    assert (s.result, s.signer, s.key) == ("G", None, "SHA256:abc")
    assert parse_ssh_output("Could not verify signature.\n").result == "B"
