"""Helpers for signed-push tests: gpg keyrings made in the test (a client's
with secret keys, a server's with only the public keys it trusts), ssh
signing keys, detached signatures as git makes them, hand-made push
certificates, and the nonce a server with a given seed issues."""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from . import differential as d

KNOWN = "Signer One <one@example.com>"          # the server has its public key
STRANGER = "Stranger <stranger@example.com>"    # the server has never seen it


def gpg(home: Path, *args: str, input: Optional[bytes] = None) -> bytes:
    env = dict(os.environ, GNUPGHOME=str(home))
    proc = subprocess.run(["gpg", "--batch", "--no-tty", *args], env=env, input=input,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    if proc.returncode != 0:
        raise AssertionError(f"gpg {' '.join(args)} failed: {proc.stderr.decode(errors='replace')}")
    return proc.stdout


@dataclass(frozen=True)
class Keys:
    client: Path            # GNUPGHOME with both secret keys
    server: Path            # GNUPGHOME with KNOWN's public key only
    known: str              # fingerprints
    stranger: str

    @staticmethod
    def long_id(fpr: str) -> str:
        """gpg --keyid-format=long: the fingerprint's last 16 hex digits."""
        return fpr[-16:]

    def stop(self) -> None:
        """End the gpg-agent the client's keyring started (gpg starts one for secret keys)."""
        for home in (self.client, self.server):
            subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=dict(os.environ, GNUPGHOME=str(home)),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)


def make_keys(base: Path) -> Keys:
    client, server = base / "gnupg-client", base / "gnupg-server"
    for home in (client, server):
        home.mkdir(mode=0o700)
    fprs = []
    for uid in (KNOWN, STRANGER):
        gpg(client, "--passphrase", "", "--quick-gen-key", uid, "ed25519", "sign", "never")
        listing = gpg(client, "--with-colons", "--list-keys", uid).decode()
        fprs.append(next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:")))
    gpg(server, "--import", input=gpg(client, "--export", fprs[0]))
    return Keys(client, server, fprs[0], fprs[1])


def detach_sign(keys: Keys, fpr: str, payload: bytes) -> bytes:
    """What git's sign_buffer() appends: `gpg -bsau KEY` over PAYLOAD."""
    return gpg(keys.client, "-bsau", fpr, input=payload)


def nonce(seed: str, stamp: int) -> str:
    """The nonce git's receive-pack, run by http-backend (path "."), issues at
    STAMP: git's hmac_hash() keys the HMAC with ".:<stamp>" over the seed."""
    return f"{stamp}-" + hmac.new(f".:{stamp}".encode(), seed.encode(), hashlib.sha1).hexdigest()


def valid_nonce(seed: str, value: str) -> bool:
    m = re.fullmatch(r"([1-9][0-9]*)-[0-9a-f]{40}", value)
    return m is not None and nonce(seed, int(m.group(1))) == value


def certificate(commands: Sequence[tuple[str, str, str]], nonce_value: Optional[str] = None,
                options: Sequence[str] = (), pushee: str = "http://example.invalid/repo.git/") -> bytes:
    """A certificate's payload as git's generate_push_cert() writes it."""
    out = "certificate version 0.1\npusher Signer One <one@example.com> 1700000000 +0000\n"
    out += f"pushee {pushee}\n"
    if nonce_value is not None:
        out += f"nonce {nonce_value}\n"
    out += "".join(f"push-option {o}\n" for o in options)
    out += "\n" + "".join(f"{old} {new} {ref}\n" for old, new, ref in commands)
    return out.encode()


def cert_request(cert: bytes, pack: bytes, caps: str = "report-status side-band-64k quiet",
                 options: Sequence[str] = (), ended: bool = True) -> bytes:
    """A signed push's request as send-pack writes it: `push-cert\\0caps`, one
    pkt-line per certificate line, `push-cert-end`, a flush, push options, the pack.
    Not ENDED: a flush where `push-cert-end` goes."""
    body = d.pkt(b"push-cert\0" + caps.encode())
    body += b"".join(d.pkt(line) for line in cert.splitlines(keepends=True))
    body += (d.pkt("push-cert-end\n") if ended else b"") + d.FLUSH
    if options:
        body += b"".join(d.pkt(o + "\n") for o in options) + d.FLUSH
    return body + pack


def ssh_key(base: Path, comment: str = "one@example.com") -> tuple[Path, str]:
    """An ed25519 ssh key (no passphrase): its private key file and its public key line."""
    path = base / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, timeout=60, stdout=subprocess.DEVNULL)
    return path, (base / "id_ed25519.pub").read_text().strip()
