"""Signed pushes on the server, as git 2.39's receive-pack handles them:
the nonce each request issues when `receive.certNonceSeed` is set (the
advertisement offers it as `push-cert=<nonce>`), and a push's certificate:
the first time a pre-receive or post-receive hook runs, the certificate is
written as a blob, its signature checked and its nonce judged, and those
hooks get GIT_PUSH_CERT, GIT_PUSH_CERT_SIGNER, GIT_PUSH_CERT_KEY,
GIT_PUSH_CERT_STATUS and, when a nonce was issued, GIT_PUSH_CERT_NONCE,
GIT_PUSH_CERT_NONCE_STATUS and GIT_PUSH_CERT_NONCE_SLOP
(prepare_push_cert_sha1()). The push's version records the same facts."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Mapping, Optional

from ..git import gitexec
from ..model.versions import PushCert
from ..protocol import pushcert
from ..protocol.pktline import ProtocolError
from .signature import Programs, SignatureCheck, check


def object_algo(config) -> str:
    """The repository's hash, which also makes the nonce's HMAC (the_hash_algo)."""
    return "sha256" if (config.get("extensions.objectformat") or "").lower() == "sha256" else "sha1"


@dataclass(frozen=True)
class NoncePolicy:
    """receive.certNonceSeed and receive.certNonceSlop."""
    seed: Optional[bytes] = None
    slop_limit: int = 0
    algo: str = "sha1"

    @classmethod
    def from_config(cls, config) -> "NoncePolicy":
        seed = config.get("receive.certnonceseed") if config.has("receive.certnonceseed") else None
        return cls(None if seed is None else seed.encode("utf-8", "surrogateescape"),
                   max(config.int("receive.certnonceslop", 0), 0), object_algo(config))

    def issue(self, now: Optional[float] = None) -> Optional[str]:
        """The nonce a request made at NOW issues; None without a seed."""
        if self.seed is None:
            return None
        return pushcert.make_nonce(self.seed, int(time.time() if now is None else now), algo=self.algo)


def _text(value: Optional[str]) -> str:
    """gpg's bytes as the store keeps text: bytes that are not UTF-8 replaced."""
    return (value or "").encode("utf-8", "surrogateescape").decode("utf-8", "replace")


@dataclass(frozen=True)
class _Facts:
    signature: SignatureCheck
    nonce: pushcert.NonceCheck


class Certificate:
    """One push's certificate (TEXT), judged once, when first needed."""

    def __init__(self, text: bytes, policy: NoncePolicy, issued: Optional[str], config, gitdir: str,
                 env: Mapping[str, str], log: list):
        self.text = text
        self.policy = policy
        self.issued = issued
        self.programs = Programs.from_config(config)
        self.gitdir = gitdir
        self.env = env
        self.log = log
        self.blob: Optional[str] = None      # written to the object store (GIT_PUSH_CERT)
        self._written = False
        self._facts: Optional[_Facts] = None

    def options_agree(self, options: tuple[str, ...]) -> bool:
        return pushcert.options_agree(self.text, options)

    def hook_env(self) -> dict[str, str]:
        """The GIT_PUSH_CERT* variables of a pre-receive or post-receive hook;
        the first call writes the certificate's blob and checks it (a
        signature of no known format raises ProtocolError, where git dies)."""
        if not self._written:
            self._written = True
            self.blob = self._hash(write=True)
        facts = self._judge(strict=True)
        if self.blob is None:
            return {}
        sig, nonce = facts.signature, facts.nonce
        env = {"GIT_PUSH_CERT": self.blob,
               "GIT_PUSH_CERT_SIGNER": sig.signer or "",
               "GIT_PUSH_CERT_KEY": sig.key or "",
               "GIT_PUSH_CERT_STATUS": sig.result}
        if nonce.nonce is not None:
            env["GIT_PUSH_CERT_NONCE"] = nonce.nonce
            env["GIT_PUSH_CERT_NONCE_STATUS"] = nonce.status
            if nonce.status == pushcert.NONCE_SLOP:
                env["GIT_PUSH_CERT_NONCE_SLOP"] = str(nonce.slop)
        return env

    def record(self) -> Optional[PushCert]:
        """What the push's version records (None when git cannot hash the certificate)."""
        blob = self.blob if self._written else self._hash(write=False)
        if blob is None:
            return None
        facts = self._judge(strict=False)
        sig, nonce = facts.signature, facts.nonce
        return PushCert(blob, _text(sig.signer), _text(sig.key), sig.result, nonce.status, nonce.nonce,
                        nonce.slop, self.text)

    def _hash(self, write: bool) -> Optional[str]:
        """The certificate's blob id; with WRITE also stored (a loose object,
        as receive-pack's write_object_file(): outside the quarantine)."""
        args = ["hash-object", "--stdin"] + (["-w"] if write else [])
        res = gitexec.git(args, cwd=self.gitdir, env=gitexec.child_env(self.env), input=self.text)
        if not res.ok:
            self.log.append(res.stderr.decode("utf-8", "replace"))
            return None
        return res.stdout.decode().strip()

    def _judge(self, strict: bool) -> _Facts:
        """The signature's check and the nonce's status, made once. Not STRICT
        (the version's record, when no hook ran): a signature of no known
        format is recorded as unchecked (N) instead of refused."""
        if self._facts is None:
            start = pushcert.signature_start(self.text)
            payload, sig = self.text[:start], self.text[start:]
            try:
                checked = check(payload, sig, self.programs, cwd=self.gitdir, env=self.env, log=self.log)
            except ProtocolError:
                if strict:
                    raise
                return _Facts(SignatureCheck(), self._nonce(payload))
            self._facts = _Facts(checked, self._nonce(payload))
        return self._facts

    def _nonce(self, payload: bytes) -> pushcert.NonceCheck:
        return pushcert.check_nonce(payload, self.issued, self.policy.seed, self.policy.slop_limit,
                                    algo=self.policy.algo)
