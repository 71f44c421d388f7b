"""Signed pushes (`git push --signed`) beside stock git-http-backend 2.39.5.

Real git clients push over HTTP to stock (as a CGI) and to Aspen (as a CGI,
and under gunicorn); pre-receive and post-receive hooks write down every
GIT_PUSH_CERT* variable and the certificate's blob, and the two servers'
records must agree: a good signature, a key the server does not know, an
unsigned push, a nonce issued seconds before (SLOP, and OK within
receive.certNonceSlop), a nonce of another seed (BAD). Hand-made requests
bring what a client would not send (no nonce, an unasked nonce, an altered
payload, push options that disagree, malformed certificates). Aspen also
records the certificate with the push's version (`aspen log`)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from . import differential as d
from . import harness as h
from . import pushkit as pk
from . import signkit as sk

pytestmark = pytest.mark.timeout(240)

ASPEN = str(Path(sys.executable).parent / "aspen")
SEED = "a seed only the server knows"
# A push spans a second boundary now and then (the client signs between the advertisement
# and the push): with a slop allowed, its nonce is OK on both servers all the same.
SIGNING = {"receive.certNonceSeed": SEED, "receive.certNonceSlop": "30"}
DATES = {"GIT_AUTHOR_DATE": "2001-02-03T04:05:06Z", "GIT_COMMITTER_DATE": "2001-02-03T04:05:06Z"}

# the hooks write down what they were told (@OUT@: a directory of the test's)
RECORD = """out=@OUT@/$(basename "$0")
env | grep '^GIT_PUSH_CERT' | sort > "$out.env"
if test -n "$GIT_PUSH_CERT"; then git cat-file blob "$GIT_PUSH_CERT" > "$out.cert"; fi
"""
REQUIRE_GOOD = 'test "$GIT_PUSH_CERT_STATUS" = G || { echo "not signed by a known key"; exit 1; }\n'
HOOKS = ("pre-receive", "post-receive")


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    k = sk.make_keys(tmp_path_factory.mktemp("keys"))
    yield k
    k.stop()


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    return h.make_history(tmp_path_factory.mktemp("src") / "src.git")


@dataclass
class Side:
    name: str            # "stock" or "aspen"
    root: Path
    repo: Path
    url: str
    out: Path            # where its hooks write


def make_sides(tmp_path: Path, src: Path, keys: sk.Keys, cgi_server_factory, server_factory=None,
               config: Optional[dict] = None, pre_receive: str = "", aspen: str = "cgi",
               **server_env: str) -> list[Side]:
    """The same repository (SRC's history, CONFIG, the recording hooks) served
    by stock and by Aspen (ASPEN: "cgi" or "wsgi"), with the server's keyring."""
    config = SIGNING if config is None else config
    sides = []
    for name in ("stock", "aspen"):
        root = tmp_path / name
        root.mkdir(parents=True)
        repo = pk.enable_push(Path(shutil.copytree(src, root / "repo.git", symlinks=True)))
        for k, v in config.items():
            pk.set_config(repo, k, v)
        out = tmp_path / f"{name}-hooks"
        out.mkdir()
        for hook in HOOKS:
            pk.write_hook(repo, hook, RECORD.replace("@OUT@", str(out)) + (pre_receive if hook == "pre-receive" else ""))
        env = {"GNUPGHOME": str(keys.server), **server_env}
        if name == "stock":
            srv = cgi_server_factory(root, **env)
        elif aspen == "cgi":
            srv = cgi_server_factory(root, program="aspen", **env)
        else:
            srv = server_factory(root, **env)
        sides.append(Side(name, root, repo, f"{srv.url}/repo.git", out))
    return sides


def client(tmp_path: Path, src: Path, sides: list[Side]) -> tuple[Path, str, str]:
    """A work tree with a remote per side and one new commit (the same commit
    for both: fixed dates): (work tree, old main, new main)."""
    work = tmp_path / "work"
    h.git("clone", "-q", str(src), str(work))
    for s in sides:
        h.git("remote", "add", s.name, s.url, cwd=str(work))
    old = pk.rev(work, "main")
    (work / "signed.txt").write_text("pushed with a certificate\n")
    h.git("add", "-A", cwd=str(work))
    h.git("commit", "-q", "-m", "signed", cwd=str(work), env=DATES)
    return work, old, pk.rev(work, "main")


@dataclass
class Seen:
    """One side's push: what the client printed, and what each hook recorded."""
    rc: int
    status: list[str]                    # porcelain lines, without the URL line
    remote: list[str]
    env: dict[str, dict[str, str]]       # hook -> GIT_PUSH_CERT* (a hook that did not run: absent)
    cert: dict[str, bytes]


def push(work: Path, side: Side, keys: sk.Keys, *flags: str, signer: Optional[str] = None,
         config: tuple[str, ...] = (), env: Optional[dict] = None) -> Seen:
    args = ["-c", f"user.signingKey={signer or keys.known}", *config, "push", "--porcelain", *flags, side.name, "main"]
    p = h.git(*args, cwd=str(work), check=False, env={"GNUPGHOME": str(keys.client), **(env or {})})
    status = [line for line in p.stdout.decode().splitlines() if "\t" in line or line == "Done"]
    remote = [line.rstrip() for line in p.stderr.decode().splitlines() if line.startswith("remote:")]
    return Seen(p.returncode, status, remote, *recorded(side))


def recorded(side: Side) -> tuple[dict[str, dict[str, str]], dict[str, bytes]]:
    envs, certs = {}, {}
    for hook in HOOKS:
        f = side.out / f"{hook}.env"
        if f.exists():
            envs[hook] = dict(line.split("=", 1) for line in f.read_text().splitlines())
        c = side.out / f"{hook}.cert"
        if c.exists():
            certs[hook] = c.read_bytes()
    return envs, certs


def blob_of(repo: Path, oid: str) -> bytes:
    return h.git("cat-file", "blob", oid, cwd=str(repo)).stdout


def normal(side: Side, seen: Seen, seed: str = SEED) -> tuple:
    """SEEN with what must differ between two servers replaced, each after a
    check: the blob id (the certificate names the server's URL: it must be the
    recorded certificate's id, in the repository), the nonce (one this seed
    makes), the slop (a small number of seconds); in the certificate, the URL,
    the push's time, the nonce and the signature."""
    envs = {}
    for hook, env in seen.env.items():
        env = dict(env)
        if "GIT_PUSH_CERT" in env:
            assert blob_of(side.repo, env["GIT_PUSH_CERT"]) == seen.cert[hook]
            env["GIT_PUSH_CERT"] = "<blob>"
        if "GIT_PUSH_CERT_NONCE" in env:
            assert sk.valid_nonce(seed, env["GIT_PUSH_CERT_NONCE"]), env
            env["GIT_PUSH_CERT_NONCE"] = "<nonce>"
        if "GIT_PUSH_CERT_NONCE_SLOP" in env:
            assert 1 <= int(env["GIT_PUSH_CERT_NONCE_SLOP"]) <= 30, env
            env["GIT_PUSH_CERT_NONCE_SLOP"] = "<slop>"
        envs[hook] = env
    certs = {hook: normal_cert(side, c) for hook, c in seen.cert.items()}
    return seen.rc, seen.status, seen.remote, envs, certs


def normal_cert(side: Side, cert: bytes) -> str:
    text = cert.decode()
    assert f"\npushee {side.url}/\n" in text, text
    text = text.replace(side.url, "<url>")
    text = re.sub(r"\npusher (.*) \d+ \+0000\n", r"\npusher \1 <time> +0000\n", text)
    text = re.sub(r"\nnonce \S+\n", "\nnonce <nonce>\n", text)
    m = re.search(r"^-----BEGIN (PGP|SSH) SIGNATURE-----\n", text, re.M)
    assert m and text.rstrip().endswith(f"-----END {m.group(1)} SIGNATURE-----"), text
    return text[:m.start()] + f"<{m.group(1)} signature>\n"


def cert_nonce(cert: bytes) -> Optional[str]:
    m = re.search(rb"^nonce (\S+)$", cert, re.M)
    return m.group(1).decode() if m else None


def aspen_log(repo: Path) -> dict:
    res = subprocess.run([ASPEN, "log", "--json", "-n", "1", str(repo)], capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def both(sides: list[Side], fn) -> dict[str, object]:
    return {s.name: fn(s) for s in sides}


# --- the advertisement ---------------------------------------------------------------

def test_push_cert_nonce_advertised_as_stock(tmp_path, src):
    """With receive.certNonceSeed, both advertise push-cert=<nonce>, the same
    nonce in the same second (git keys the HMAC of the seed with ".:<time>");
    without it, neither does."""
    root = tmp_path / "root"
    root.mkdir()
    repo = pk.enable_push(Path(shutil.copytree(src, root / "repo.git", symlinks=True)))
    env = d.env_for(root, "/repo.git/info/refs", query="service=git-receive-pack")
    for seeded in (False, True):
        if seeded:
            pk.set_config(repo, "receive.certNonceSeed", SEED)
        for _ in range(20):
            before = h.stock(env)
            aspen = h.aspen(env)
            after = h.stock(env)
            if before.body == after.body:
                break
        else:
            pytest.fail("the clock kept ticking between requests")
        assert aspen.status == before.status == 200
        assert d.norm_advertisement(aspen.body) == d.norm_advertisement(before.body)
        found = re.findall(rb"push-cert=([^ \n]+)", aspen.body)
        if seeded:
            assert len(found) == 1 and sk.valid_nonce(SEED, found[0].decode())
            assert abs(int(found[0].split(b"-")[0]) - time.time()) < 60
        else:
            assert found == []


# --- real clients ----------------------------------------------------------------------

@pytest.mark.parametrize("aspen", ["cgi", "wsgi"])
def test_good_signature_as_stock_and_recorded_with_the_version(tmp_path, src, keys, cgi_server_factory,
                                                               server_factory, aspen):
    sides = make_sides(tmp_path, src, keys, cgi_server_factory, server_factory, aspen=aspen)
    work, old, new = client(tmp_path, src, sides)
    seen = {s.name: push(work, s, keys, "--signed") for s in sides}
    for s in sides:
        got = seen[s.name]
        assert got.rc == 0 and h.refs_of(str(s.repo))["refs/heads/main"] == new
        pre = got.env["pre-receive"]
        assert pre["GIT_PUSH_CERT_STATUS"] == "G"
        assert pre["GIT_PUSH_CERT_SIGNER"] == sk.KNOWN
        assert pre["GIT_PUSH_CERT_KEY"] == keys.long_id(keys.known)
        assert pre["GIT_PUSH_CERT_NONCE_STATUS"] == "OK"
        assert pre["GIT_PUSH_CERT_NONCE"] == cert_nonce(got.cert["pre-receive"])
        assert "GIT_PUSH_CERT_NONCE_SLOP" not in pre
        assert got.env["post-receive"] == pre
        assert f"{old} {new} refs/heads/main\n".encode() in got.cert["pre-receive"]
    assert normal(sides[1], seen["aspen"]) == normal(sides[0], seen["stock"])

    aspen_side = sides[1]
    pre = seen["aspen"].env["pre-receive"]
    log = aspen_log(aspen_side.repo)
    assert log["updates"] == [{"ref": "refs/heads/main", "old": old, "new": new, "fast_forward": True}]
    assert log["cert"] == {"blob": pre["GIT_PUSH_CERT"], "signer": sk.KNOWN, "key": keys.long_id(keys.known),
                           "status": "G", "nonce": pre["GIT_PUSH_CERT_NONCE"], "nonce_status": "OK",
                           "nonce_slop": None, "text": seen["aspen"].cert["pre-receive"].decode()}
    text = subprocess.run([ASPEN, "log", "-n", "1", str(aspen_side.repo)], capture_output=True, text=True,
                          timeout=60).stdout
    assert (f"    signed: G good signature by {sk.KNOWN}, key {keys.long_id(keys.known)}, nonce OK, "
            f"certificate {pre['GIT_PUSH_CERT'][:12]}\n") in text


def test_unknown_key_is_status_e_and_a_hook_may_refuse_it(tmp_path, src, keys, cgi_server_factory):
    sides = make_sides(tmp_path, src, keys, cgi_server_factory, pre_receive=REQUIRE_GOOD)
    work, old, new = client(tmp_path, src, sides)
    seen = {s.name: push(work, s, keys, "--signed", signer=keys.stranger) for s in sides}
    for s in sides:
        got = seen[s.name]
        assert got.rc != 0
        assert got.status == ["!\trefs/heads/main:refs/heads/main\t[remote rejected] (pre-receive hook declined)",
                              "Done"]
        assert "remote: not signed by a known key" in got.remote
        assert h.refs_of(str(s.repo))["refs/heads/main"] == old
        pre = got.env["pre-receive"]
        assert (pre["GIT_PUSH_CERT_STATUS"], pre["GIT_PUSH_CERT_SIGNER"]) == ("E", "")
        assert pre["GIT_PUSH_CERT_KEY"] == keys.long_id(keys.stranger)
        assert pre["GIT_PUSH_CERT_NONCE_STATUS"] == "OK"
        assert "post-receive" not in got.env
        assert blob_of(s.repo, pre["GIT_PUSH_CERT"]) == got.cert["pre-receive"]   # written all the same
    assert normal(sides[1], seen["aspen"]) == normal(sides[0], seen["stock"])


def test_unsigned_pushes(tmp_path, src, keys, cgi_server_factory):
    """An unsigned push to a server offering a nonce: hooks see no
    certificate, the version records none. `--signed` to a server that
    offers none fails alike; `--signed=if-asked` pushes unsigned."""
    sides = make_sides(tmp_path, src, keys, cgi_server_factory)
    work, _, new = client(tmp_path, src, sides)
    seen = {s.name: push(work, s, keys) for s in sides}
    for s in sides:
        assert seen[s.name].rc == 0 and h.refs_of(str(s.repo))["refs/heads/main"] == new
        assert seen[s.name].env == {"pre-receive": {}, "post-receive": {}}
    assert normal(sides[1], seen["aspen"]) == normal(sides[0], seen["stock"])
    assert aspen_log(sides[1].repo)["cert"] is None

    plain = make_sides(tmp_path / "plain", src, keys, cgi_server_factory, config={})
    work, old, new = client(tmp_path / "plain", src, plain)
    refused = {}
    for s in plain:
        p = h.git("push", "--signed", s.name, "main", cwd=str(work), check=False,
                  env={"GNUPGHOME": str(keys.client)})
        refused[s.name] = (p.returncode, p.stderr.decode().replace(s.url, "<url>"))
        assert h.refs_of(str(s.repo))["refs/heads/main"] == old
    assert refused["aspen"] == refused["stock"]
    assert refused["stock"][0] != 0 and "the receiving end does not support --signed push" in refused["stock"][1]
    asked = {s.name: push(work, s, keys, "--signed=if-asked") for s in plain}
    for s in plain:
        assert asked[s.name].rc == 0 and h.refs_of(str(s.repo))["refs/heads/main"] == new
        assert asked[s.name].env == {"pre-receive": {}, "post-receive": {}}
    assert normal(plain[1], asked["aspen"]) == normal(plain[0], asked["stock"])


def _slow_gpg(tmp_path: Path, action: str) -> Path:
    """A gpg.program for the client that does ACTION before it signs: what
    happens between the advertisement (the nonce) and the push."""
    path = tmp_path / "slow-gpg"
    path.write_text("#!/bin/sh\ncase \" $* \" in *\" -bsau \"*) " + action + " ;; esac\nexec gpg \"$@\"\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("slop_limit", [None, "60"], ids=["slop", "within-slop"])
def test_an_older_nonce(tmp_path, src, keys, cgi_server_factory, slop_limit):
    """A nonce issued two seconds before the push: SLOP and its age without
    receive.certNonceSlop; OK within it, and hooks see that older nonce."""
    config = {"receive.certNonceSeed": SEED}
    if slop_limit:
        config["receive.certNonceSlop"] = slop_limit
    sides = make_sides(tmp_path, src, keys, cgi_server_factory, config=config)
    work, _, new = client(tmp_path, src, sides)
    wrapper = _slow_gpg(tmp_path, "sleep 2.2")
    seen = {s.name: push(work, s, keys, "--signed", config=("-c", f"gpg.program={wrapper}")) for s in sides}
    for s in sides:
        got = seen[s.name]
        assert got.rc == 0 and h.refs_of(str(s.repo))["refs/heads/main"] == new
        pre = got.env["pre-receive"]
        assert pre["GIT_PUSH_CERT_STATUS"] == "G"
        sent = cert_nonce(got.cert["pre-receive"])
        if slop_limit:
            assert pre["GIT_PUSH_CERT_NONCE_STATUS"] == "OK" and pre["GIT_PUSH_CERT_NONCE"] == sent
            assert "GIT_PUSH_CERT_NONCE_SLOP" not in pre
        else:
            assert pre["GIT_PUSH_CERT_NONCE_STATUS"] == "SLOP"
            issued = pre["GIT_PUSH_CERT_NONCE"]
            assert issued != sent and sk.valid_nonce(SEED, issued)
            age = int(issued.split("-")[0]) - int(sent.split("-")[0])
            assert int(pre["GIT_PUSH_CERT_NONCE_SLOP"]) == age >= 2
    assert normal(sides[1], seen["aspen"]) == normal(sides[0], seen["stock"])
    log = aspen_log(sides[1].repo)["cert"]
    pre = seen["aspen"].env["pre-receive"]
    assert (log["nonce_status"], log["nonce"]) == (pre["GIT_PUSH_CERT_NONCE_STATUS"], pre["GIT_PUSH_CERT_NONCE"])
    assert log["nonce_slop"] == (None if slop_limit else int(pre["GIT_PUSH_CERT_NONCE_SLOP"]))


def test_a_nonce_of_another_seed_is_bad(tmp_path, src, keys, cgi_server_factory):
    """The server's seed changes between the advertisement and the push: the
    certificate's nonce fails the HMAC check."""
    sides = make_sides(tmp_path, src, keys, cgi_server_factory)
    work, _, new = client(tmp_path, src, sides)
    wrapper = _slow_gpg(tmp_path, 'git config --file "$RESEED" receive.certNonceSeed "another seed"')
    seen = {s.name: push(work, s, keys, "--signed", config=("-c", f"gpg.program={wrapper}"),
                         env={"RESEED": str(s.repo / "config")}) for s in sides}
    for s in sides:
        pre = seen[s.name].env["pre-receive"]
        assert seen[s.name].rc == 0 and h.refs_of(str(s.repo))["refs/heads/main"] == new
        assert (pre["GIT_PUSH_CERT_STATUS"], pre["GIT_PUSH_CERT_NONCE_STATUS"]) == ("G", "BAD")
        assert sk.valid_nonce("another seed", pre["GIT_PUSH_CERT_NONCE"])
        assert sk.valid_nonce(SEED, cert_nonce(seen[s.name].cert["pre-receive"]))
    assert normal(sides[1], seen["aspen"], "another seed") == normal(sides[0], seen["stock"], "another seed")


def test_ssh_signed_push(tmp_path, src, keys, cgi_server_factory):
    """gpg.format=ssh on the client; the server checks against
    gpg.ssh.allowedSignersFile (and without one, answers N)."""
    key, public = sk.ssh_key(tmp_path)
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f"one@example.com {public}\n")
    fingerprint = subprocess.run(["ssh-keygen", "-lf", str(key)], capture_output=True, text=True,
                                 check=True).stdout.split()[1]
    for with_file in (True, False):
        config = dict(SIGNING)
        if with_file:
            config["gpg.ssh.allowedSignersFile"] = str(allowed)
        base = tmp_path / f"allowed-{with_file}"
        sides = make_sides(base, src, keys, cgi_server_factory, config=config)
        work, _, _ = client(base, src, sides)
        seen = {s.name: push(work, s, keys, "--signed", signer=str(key), config=("-c", "gpg.format=ssh"))
                for s in sides}
        for s in sides:
            pre = seen[s.name].env["pre-receive"]
            assert seen[s.name].rc == 0
            if with_file:
                assert (pre["GIT_PUSH_CERT_STATUS"], pre["GIT_PUSH_CERT_SIGNER"]) == ("G", "one@example.com")
                assert pre["GIT_PUSH_CERT_KEY"] == fingerprint
            else:
                assert (pre["GIT_PUSH_CERT_STATUS"], pre["GIT_PUSH_CERT_SIGNER"], pre["GIT_PUSH_CERT_KEY"]) \
                    == ("N", "", "")
        assert normal(sides[1], seen["aspen"]) == normal(sides[0], seen["stock"])


# --- hand-made certificates ---------------------------------------------------------------

HANDMADE = {
    # name: (server has a seed, the certificate's nonce, options signed, options sent, alter payload, sign)
    "no-nonce": (True, None, (), (), False, True),
    "unsolicited-nonce": (False, "1700000000-" + "0" * 40, (), (), False, True),
    "altered-payload": (True, None, (), (), True, True),
    "options-agree": (True, None, ("ci.skip", '"quoted"'), ("ci.skip", '"quoted"'), False, True),
    "options-disagree": (True, None, ("ci.skip",), ("deploy",), False, True),
    "unsigned-no-hooks": (True, None, (), (), False, False),
}


@pytest.mark.parametrize("case", list(HANDMADE))
def test_handmade_certificates_as_stock(tmp_path, src, keys, case):
    seeded, nonce_value, signed_opts, sent_opts, alter, sign = HANDMADE[case]
    work = tmp_path / "work"
    h.git("clone", "-q", str(src), str(work))
    old = pk.rev(work, "main")
    new = pk.commit(work, "hand made")
    payload = sk.certificate([(old, new, "refs/heads/main")], nonce_value, signed_opts)
    cert = payload + (sk.detach_sign(keys, keys.known, payload) if sign else b"")
    if alter:
        cert = cert.replace(b"pusher Signer One", b"pusher Signer 0ne")
    body = sk.cert_request(cert, pk.pack_for(work, [new, "^" + old]), options=sent_opts,
                           caps="report-status side-band-64k quiet" + (" push-options" if sent_opts else ""))
    seen = {}
    for prog in ("stock", "aspen"):
        root = tmp_path / prog
        root.mkdir()
        repo = pk.enable_push(Path(shutil.copytree(src, root / "repo.git", symlinks=True)))
        pk.set_config(repo, "receive.advertisePushOptions", "true")
        if seeded:
            pk.set_config(repo, "receive.certNonceSeed", SEED)
        out = tmp_path / f"{prog}-hooks"
        out.mkdir()
        if sign:
            for hook in HOOKS:
                pk.write_hook(repo, hook, RECORD.replace("@OUT@", str(out)))
        r = pk.post(root, "repo.git", body, program=prog, GNUPGHOME=str(keys.server))
        side = Side(prog, root, repo, "", out)
        envs, certs = recorded(side)
        for hook, env in envs.items():
            assert blob_of(repo, env["GIT_PUSH_CERT"]) == certs[hook] == cert
            if "GIT_PUSH_CERT_NONCE" in env:
                assert sk.valid_nonce(SEED, env["GIT_PUSH_CERT_NONCE"])
                env["GIT_PUSH_CERT_NONCE"] = "<nonce>"
        seen[prog] = (r.status, pk.report_lines(r.body), pk.messages(r.body), h.refs_of(str(repo)), envs)
    assert seen["aspen"] == seen["stock"]
    status, report, _, refs, envs = seen["stock"]
    expect = {
        "no-nonce": ("G", "MISSING"), "unsolicited-nonce": ("G", None), "altered-payload": ("B", "MISSING"),
        "options-agree": ("G", "MISSING"), "options-disagree": ("G", "MISSING"),
    }
    if case == "options-disagree":
        assert report == ["unpack ok", "ng refs/heads/main inconsistent push options"]
        assert refs["refs/heads/main"] == old and set(envs) == {"pre-receive"}
    else:
        assert report == ["unpack ok", "ok refs/heads/main"] and refs["refs/heads/main"] == new
    if sign:
        pre = envs["pre-receive"]
        assert (pre["GIT_PUSH_CERT_STATUS"], pre.get("GIT_PUSH_CERT_NONCE_STATUS")) == expect[case]
        assert pre["GIT_PUSH_CERT_SIGNER"] == sk.KNOWN
        assert pre["GIT_PUSH_CERT_KEY"] == sk.Keys.long_id(keys.known)
    else:
        assert envs == {}
    if case != "options-disagree":
        log = aspen_log(tmp_path / "aspen" / "repo.git")["cert"]
        assert log["text"] == cert.decode() and log["status"] == (expect[case][0] if sign else "N")


MALFORMED = {
    # name: (certificate, hooks, stock's message, request ended by push-cert-end)
    "no-blank-line": (b"certificate version 0.1\n@CMD@\n", False,
                      "fatal: malformed push certificate @CERT100@\n", True),
    "not-a-command": (b"certificate version 0.1\n\ngarbage line\n", False,
                      "fatal: protocol error: expected old/new/ref, got 'garbage line\n'", True),
    "unsigned-with-a-hook": (b"certificate version 0.1\n\n@CMD@\n", True,
                             "fatal: bad/incompatible signature ''", True),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_certificates(tmp_path, src, case):
    """Where stock's receive-pack dies (200, an empty body, `fatal:` on
    stderr), Aspen answers 400 with the same message; no ref moves either way."""
    text, hooks, message, ended = MALFORMED[case]
    work = tmp_path / "work"
    h.git("clone", "-q", str(src), str(work))
    old = pk.rev(work, "main")
    new = pk.commit(work, "malformed")
    cmd = f"{old} {new} refs/heads/main".encode()
    cert = text.replace(b"@CMD@", cmd)
    body = sk.cert_request(cert, pk.pack_for(work, [new, "^" + old]), ended=ended)
    message = message.replace("@CERT100@", cert[:100].decode())     # git names the first 100 bytes
    for prog in ("stock", "aspen"):
        root = tmp_path / prog
        root.mkdir()
        repo = pk.enable_push(Path(shutil.copytree(src, root / "repo.git", symlinks=True)))
        pk.set_config(repo, "receive.certNonceSeed", SEED)
        if hooks:
            pk.write_hook(repo, "pre-receive", "echo ran\n")
        r = pk.post(root, "repo.git", body, program=prog)
        assert message in r.stderr.decode(), r.stderr
        assert (r.status, r.body) == ((200, b"") if prog == "stock" else (400, b""))
        assert h.refs_of(str(repo))["refs/heads/main"] == old
        assert not [p for p in (repo / "objects").iterdir() if p.name.startswith("incoming-")]


def test_certificate_ended_by_a_flush(tmp_path, src, keys):
    """A flush where `push-cert-end` goes ends the certificate and the commands."""
    work = tmp_path / "work"
    h.git("clone", "-q", str(src), str(work))
    old = pk.rev(work, "main")
    new = pk.commit(work, "flush")
    payload = sk.certificate([(old, new, "refs/heads/main")])
    cert = payload + sk.detach_sign(keys, keys.known, payload)
    body = sk.cert_request(cert, pk.pack_for(work, [new, "^" + old]), ended=False)
    seen = {}
    for prog in ("stock", "aspen"):
        root = tmp_path / prog
        root.mkdir()
        repo = pk.enable_push(Path(shutil.copytree(src, root / "repo.git", symlinks=True)))
        r = pk.post(root, "repo.git", body, program=prog, GNUPGHOME=str(keys.server))
        seen[prog] = (r.status, pk.report_lines(r.body), h.refs_of(str(repo)))
    assert seen["aspen"] == seen["stock"]
    assert seen["stock"][1] == ["unpack ok", "ok refs/heads/main"]
