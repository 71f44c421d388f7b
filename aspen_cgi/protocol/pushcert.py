"""Push certificates (`git push --signed`) as bytes, as git 2.39's
receive-pack reads them: where the signature starts, the header fields,
the commands a certificate carries, whether its push-options agree with
the request's, and the nonce (an HMAC of the seed, keyed with the
repository path and a time)
with the judgement of a returned nonce. Pure: no storage, no processes.

A certificate is sent as `push-cert\\0<caps>`, its lines one pkt-line each,
then `push-cert-end\\n`; `protocol/push.py` collects the lines."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Optional

from .pktline import ProtocolError

# gpg-interface.c: the line a signature of each format starts with
SIGNATURE_STARTS: dict[str, tuple[bytes, ...]] = {
    "openpgp": (b"-----BEGIN PGP SIGNATURE-----", b"-----BEGIN PGP MESSAGE-----"),
    "x509": (b"-----BEGIN SIGNED MESSAGE-----",),
    "ssh": (b"-----BEGIN SSH SIGNATURE-----",),
}

NONCE_OK, NONCE_SLOP, NONCE_BAD = "OK", "SLOP", "BAD"
NONCE_MISSING, NONCE_UNSOLICITED = "MISSING", "UNSOLICITED"

SERVICE_DIR = "."          # http-backend runs `receive-pack --stateless-rpc .`: the path the nonce signs
_UINTMAX = 2 ** 64 - 1


def signature_format(sig: bytes) -> Optional[str]:
    """get_format_by_sig(): the format whose start line SIG begins with."""
    for name, starts in SIGNATURE_STARTS.items():
        if sig.startswith(starts):
            return name
    return None


def signature_start(buf: bytes) -> int:
    """parse_signed_buffer(): the offset of the last line that starts a
    signature, or len(BUF) when there is none."""
    match = len(buf)
    pos = 0
    while pos < len(buf):
        if signature_format(buf[pos:]) is not None:
            match = pos
        eol = buf.find(b"\n", pos)
        pos = len(buf) if eol < 0 else eol + 1
    return match


def headers(buf: bytes, key: str) -> list[bytes]:
    """Every value of header KEY, in order, as repeated find_header() calls
    see them: lines `KEY value` before the first empty line."""
    k = key.encode()
    out = []
    for line in buf.split(b"\n"):
        if not line:
            break
        if len(line) > len(k) and line.startswith(k) and line[len(k):len(k) + 1] == b" ":
            out.append(line[len(k) + 1:])
    return out


def header(buf: bytes, key: str) -> Optional[bytes]:
    """find_header(): the first value of header KEY."""
    found = headers(buf, key)
    return found[0] if found else None


def command_lines(cert: bytes) -> list[tuple[bytes, bytes]]:
    """queue_commands_from_cert(): the lines between the blank line that ends
    the headers and the signature, each an `old new ref` command, with the
    certificate's text from that line on (what git names when it is not one)."""
    blank = cert.find(b"\n\n")
    if blank < 0:
        raise ProtocolError("malformed push certificate " + cert[:100].decode("utf-8", "replace"))
    start, end = blank + 2, signature_start(cert)
    lines = []
    while start < end:
        eol = cert.find(b"\n", start, end)
        lines.append((cert[start:eol if eol >= 0 else end], cert[start:]))
        start = eol + 1 if eol >= 0 else end
    return lines


def options_agree(cert: bytes, options: tuple[str, ...]) -> bool:
    """check_cert_push_options(): the certificate's push-option headers are
    exactly the request's push options, in order."""
    sent = [o.encode("utf-8", "surrogateescape") for o in options]
    return headers(cert, "push-option") == sent


def make_nonce(seed: bytes, stamp: int, path: str = SERVICE_DIR, algo: str = "sha1") -> str:
    """prepare_push_cert_nonce(): `<stamp>-<hex HMAC>`. git's hmac_hash() is
    called with "path:stamp" as the key and the seed as the message."""
    mac = hmac.new(f"{path}:{stamp}".encode(), seed, getattr(hashlib, algo)).hexdigest()
    return f"{stamp}-{mac}"


@dataclass(frozen=True)
class NonceCheck:
    status: str                   # OK, SLOP, BAD, MISSING or UNSOLICITED
    nonce: Optional[str]          # what hooks see as GIT_PUSH_CERT_NONCE (None: the server issued none)
    slop: Optional[int] = None    # seconds between the certificate's nonce and ours, for SLOP


def _leading_number(text: str) -> tuple[int, int]:
    """strtoumax() base 10 at the start of TEXT: (value, digits used); saturates."""
    n = 0
    while n < len(text) and text[n].isascii() and text[n].isdigit():
        n += 1
    return (min(int(text[:n]), _UINTMAX) if n else 0), n


def _as_long(v: int) -> int:
    v &= _UINTMAX
    return v - 2 ** 64 if v >= 2 ** 63 else v


def check_nonce(payload: bytes, issued: Optional[str], seed: Optional[bytes], slop_limit: int,
                path: str = SERVICE_DIR, algo: str = "sha1") -> NonceCheck:
    """check_nonce() of a stateless receive-pack: the certificate's nonce
    against the one this request issued (ISSUED, made with SEED). A nonce
    another request issued passes its HMAC check and is judged by its age:
    within SLOP_LIMIT seconds (when set) it counts as ours."""
    raw = header(payload, "nonce")
    if raw is None:
        return NonceCheck(NONCE_MISSING, issued)
    if issued is None or seed is None:
        return NonceCheck(NONCE_UNSOLICITED, issued)
    nonce = raw.decode("utf-8", "surrogateescape")
    if nonce == issued:
        return NonceCheck(NONCE_OK, issued)
    if not nonce or not ("1" <= nonce[0] <= "9"):
        return NonceCheck(NONCE_BAD, issued)
    stamp, used = _leading_number(nonce)
    if nonce[used:used + 1] != "-":
        return NonceCheck(NONCE_BAD, issued)
    expect = make_nonce(seed, stamp, path, algo)
    if len(expect) != len(nonce) or not hmac.compare_digest(expect.encode(), raw):
        return NonceCheck(NONCE_BAD, issued)
    slop = _as_long(_leading_number(issued)[0] - stamp)
    if slop_limit and abs(slop) <= slop_limit:
        return NonceCheck(NONCE_OK, nonce)
    return NonceCheck(NONCE_SLOP, issued, slop)
