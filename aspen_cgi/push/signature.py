"""Signature checks as git 2.39's gpg-interface.c makes them
(check_signature()): the format from the signature's first line, then
`gpg --keyid-format=long --status-fd=1 --verify <file> -` (openpgp),
`gpgsm --status-fd=1 --verify <file> -` (x509) or `ssh-keygen -Y
find-principals/verify/check-novalidate` (ssh), programs named by
`gpg.program`, `gpg.<format>.program`, and git's parsing of what they
print. git exposes no command that checks a detached signature over a
buffer, so the programs are run here, through gitexec, as git runs them."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional

from ..git import gitexec
from ..protocol.pktline import ProtocolError
from ..protocol.pushcert import signature_format

TRUST_LEVELS = ("UNDEFINED", "NEVER", "MARGINAL", "FULLY", "ULTIMATE")

# parse_gpg_output()'s table: status word, result letter, and what follows it
_KEYID, _UID, _FPR, _TRUST, _EXCL = 1, 2, 4, 8, 16
_GPG_STATUS = (
    ("GOODSIG ", "G", _EXCL | _KEYID | _UID),
    ("BADSIG ", "B", _EXCL | _KEYID | _UID),
    ("ERRSIG ", "E", _EXCL | _KEYID),
    ("EXPSIG ", "X", _EXCL | _KEYID | _UID),
    ("EXPKEYSIG ", "Y", _EXCL | _KEYID | _UID),
    ("REVKEYSIG ", "R", _EXCL | _KEYID | _UID),
    ("VALIDSIG ", None, _FPR),
    ("TRUST_", None, _TRUST),
)


@dataclass(frozen=True)
class SignatureCheck:
    """What git's struct signature_check holds after a check."""
    result: str = "N"                    # G, B, E, X, Y, R, or N (no answer)
    signer: Optional[str] = None
    key: Optional[str] = None
    fingerprint: Optional[str] = None
    primary_key_fingerprint: Optional[str] = None
    trust_level: Optional[str] = None
    output: str = ""                     # the program's messages (stderr)


@dataclass(frozen=True)
class Programs:
    """git_gpg_config(): the verifying program of each format, and ssh's files."""
    openpgp: str = "gpg"
    x509: str = "gpgsm"
    ssh: str = "ssh-keygen"
    ssh_allowed_signers: Optional[str] = None
    ssh_revocation_file: Optional[str] = None

    @classmethod
    def from_config(cls, config) -> "Programs":
        def last(*names: str) -> Optional[str]:
            vals = [v for v in config.ordered(*names) if v is not None]
            return vals[-1] if vals else None

        def path(name: str) -> Optional[str]:
            v = last(name)
            return os.path.expanduser(v) if v else None
        return cls(openpgp=last("gpg.program", "gpg.openpgp.program") or "gpg",
                   x509=last("gpg.x509.program") or "gpgsm",
                   ssh=last("gpg.ssh.program") or "ssh-keygen",
                   ssh_allowed_signers=path("gpg.ssh.allowedsignersfile"),
                   ssh_revocation_file=path("gpg.ssh.revocationfile"))


def check(payload: bytes, signature: bytes, programs: Programs, *, cwd: str,
          env: Mapping[str, str], log: list) -> SignatureCheck:
    """check_signature(): SIGNATURE over PAYLOAD. A signature of no known
    format is refused as git refuses it (git dies there)."""
    fmt = signature_format(signature)
    if fmt is None:
        raise ProtocolError("bad/incompatible signature '" + signature.decode("utf-8", "replace") + "'")
    if fmt == "ssh":
        return _check_ssh(payload, signature, programs, cwd, env, log)
    argv = [programs.openpgp, "--keyid-format=long"] if fmt == "openpgp" else [programs.x509]
    with _SigFile(signature, env) as name:
        res = _run(argv + ["--status-fd=1", "--verify", name, "-"], payload, cwd, env, log)
    check = parse_gpg_output(res.stdout.decode("utf-8", "surrogateescape"))
    return _with_output(check, res.stderr.decode("utf-8", "replace"))


def parse_gpg_output(status: str) -> SignatureCheck:
    """parse_gpg_output(): the result, key and signer from gpg's status lines."""
    result, signer, key, fpr, primary, trust = "N", None, None, None, None, None
    seen_exclusive = False
    for line in status.split("\n"):
        if not line.startswith("[GNUPG:] "):
            continue
        line = line[len("[GNUPG:] "):]
        for word, letter, flags in _GPG_STATUS:
            if not line.startswith(word):
                continue
            rest = line[len(word):]
            if flags & _EXCL:
                if seen_exclusive:
                    return SignatureCheck("E")
                seen_exclusive = True
            if letter:
                result = letter
            if flags & _KEYID:
                key, sep, after = rest.partition(" ")
                if sep and flags & _UID:
                    signer = after
            if flags & _TRUST:
                level = rest.split(" ", 1)[0]
                if level not in TRUST_LEVELS:
                    return SignatureCheck("E")
                trust = level
            if flags & _FPR:
                fields = rest.split(" ")
                fpr = fields[0]
                primary = " ".join(fields[9:]) if len(fields) > 9 else None
            break
    return SignatureCheck(result, signer, key, fpr, primary, trust)


def parse_ssh_output(output: str) -> SignatureCheck:
    """parse_ssh_output(): ssh-keygen's first line, `Good "git" signature ...`."""
    first = output.split("\n", 1)[0]
    signer = None
    good_for, good_with = 'Good "git" signature for ', 'Good "git" signature with '
    if first.startswith(good_for):
        rest = first[len(good_for):]
        cut = rest.rfind(" with ")
        if cut < 0:
            return SignatureCheck("B", trust_level="NEVER")
        signer, line, trust = rest[:cut], rest[cut + 1:], "FULLY"
    elif first.startswith(good_with):
        line, trust = first[len(good_with):], "UNDEFINED"
    else:
        return SignatureCheck("B", trust_level="NEVER")
    at = line.find("key ")
    if at < 0:
        return SignatureCheck("B", signer, trust_level=trust)
    fpr = line[at + 4:]
    return SignatureCheck("G", signer, fpr, fpr, trust_level=trust)


def _check_ssh(payload: bytes, signature: bytes, programs: Programs, cwd: str,
               env: Mapping[str, str], log: list) -> SignatureCheck:
    """verify_ssh_signed_buffer(), for a payload without a timestamp (a push
    certificate's): git then passes an empty argument where the time goes."""
    allowed = programs.ssh_allowed_signers
    if not allowed:
        log.append("error: gpg.ssh.allowedSignersFile needs to be configured and exist "
                   "for ssh signature verification\n")
        return SignatureCheck()
    prog = programs.ssh
    with _SigFile(signature, env) as name:
        found = _run([prog, "-Y", "find-principals", "-f", allowed, "-s", name, ""], None, cwd, env, log)
        if found.returncode and b"usage:" in found.stderr:
            log.append("error: ssh-keygen -Y find-principals/verify is needed for ssh signature verification "
                       "(available in openssh version 8.2p1+)\n")
            return SignatureCheck()
        out, err = b"", b""
        principals = found.stdout.decode("utf-8", "surrogateescape")
        if found.returncode or not principals:
            res = _run([prog, "-Y", "check-novalidate", "-n", "git", "-s", name, ""], payload, cwd, env, log)
            out, err = res.stdout, res.stderr
        else:
            for line in principals.split("\n"):
                principal = line[:-1] if line.endswith("\r") else line
                if not principal:
                    continue
                argv = [prog, "-Y", "verify", "-n", "git", "-f", allowed, "-I", principal, "-s", name, ""]
                revoked = programs.ssh_revocation_file
                if revoked:
                    if os.path.exists(revoked):
                        argv += ["-r", revoked]
                    else:
                        log.append(f"warning: ssh signing revocation file configured but not found: {revoked}\n")
                res = _run(argv, payload, cwd, env, log)
                out, err = res.stdout, res.stderr
                if res.returncode == 0 and out.startswith(b"Good"):
                    break
    text = (_stripspace(out.decode("utf-8", "surrogateescape")) + found.stderr.decode("utf-8", "surrogateescape")
            + _stripspace(err.decode("utf-8", "surrogateescape")))
    return _with_output(parse_ssh_output(text), text)


def _with_output(check: SignatureCheck, output: str) -> SignatureCheck:
    return SignatureCheck(check.result, check.signer, check.key, check.fingerprint,
                          check.primary_key_fingerprint, check.trust_level, output)


def _stripspace(text: str) -> str:
    """strbuf_stripspace(): trailing blanks off each line, runs of empty lines
    made one, none at the start or end, a final newline."""
    lines: list[str] = []
    for line in text.split("\n"):
        line = line.rstrip(" \t\r\v\f")
        if line or (lines and lines[-1]):
            lines.append(line)
    while lines and not lines[-1]:
        lines.pop()
    return "".join(line + "\n" for line in lines)


def _run(argv: list[str], stdin: Optional[bytes], cwd: str, env: Mapping[str, str],
         log: list) -> gitexec.Result:
    """pipe_command(): a program that cannot start answers nothing, as in git."""
    try:
        return gitexec.program(argv, cwd=cwd, env=gitexec.child_env(env), input=stdin)
    except OSError as e:
        log.append(f"error: cannot run {argv[0]}: {e.strerror}\n")
        return gitexec.Result(-1, b"", b"")


class _SigFile:
    """mks_tempfile_t(".git_vtag_tmpXXXXXX"): the signature in a file under
    $TMPDIR (or /tmp), removed afterwards."""

    def __init__(self, data: bytes, env: Mapping[str, str]):
        self.data = data
        self.dir = env.get("TMPDIR") or "/tmp"
        self.name = ""

    def __enter__(self) -> str:
        import tempfile  # startup
        fd, self.name = tempfile.mkstemp(prefix=".git_vtag_tmp", dir=self.dir)
        with os.fdopen(fd, "wb") as f:
            f.write(self.data)
        return self.name

    def __exit__(self, *exc) -> None:
        try:
            os.unlink(self.name)
        except OSError:
            pass
