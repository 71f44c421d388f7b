"""receive-pack's request and report, as bytes and typed objects: the command
list (`old new ref`, capabilities after a NUL on the first), push options,
the pack header, and report-status / report-status-v2 framing. Pure: no
storage, no processes."""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from typing import Iterable, Optional

from ..model.objectid import HEX_LENGTHS, OID_PATTERN, ZERO, is_null, is_oid
from . import pktline
from .pktline import FLUSH, ProtocolError, encode
from .procreceive import RefReport

__all__ = ["ZERO", "Command"]


@dataclass(frozen=True)
class Command:
    old: str
    new: str
    ref: str   # as the client sent it (outside any namespace)

    @property
    def is_delete(self) -> bool:
        return is_null(self.new)

    @property
    def is_create(self) -> bool:
        return is_null(self.old)

    @property
    def utf8_ref(self) -> bool:
        """Was the ref name valid UTF-8? (Undecodable bytes are kept as surrogates;
        the ref store keeps names as text, so Aspen refuses them as funny.)"""
        try:
            self.ref.encode("utf-8")
            return True
        except UnicodeEncodeError:
            return False


@dataclass(frozen=True)
class PushRequest:
    commands: tuple[Command, ...]
    capabilities: tuple[str, ...] = ()
    shallow: tuple[str, ...] = ()
    push_options: tuple[str, ...] = ()
    cert: Optional[bytes] = None       # the push certificate's text, when the push was signed

    def has(self, cap: str) -> bool:
        return cap in self.capabilities

    def value(self, cap: str) -> Optional[str]:
        for c in self.capabilities:
            if c.startswith(cap + "="):
                return c[len(cap) + 1:]
        return None

    @property
    def delete_only(self) -> bool:
        return all(c.is_delete for c in self.commands)


@dataclass(frozen=True)
class Negotiated:
    """What the server uses of the client's capabilities (read_head_info)."""
    report_status: bool = False
    report_status_v2: bool = False
    sideband: bool = False
    quiet: bool = False
    atomic: bool = False
    push_options: bool = False


def negotiate(req: PushRequest, advertise_atomic: bool, advertise_push_options: bool,
              object_format: str = "sha1") -> Negotiated:
    """The capabilities used; the client's object format must be the repository's
    (OBJECT_FORMAT), and so must the length of every id its commands carry."""
    fmt = req.value("object-format") or "sha1"
    if fmt != object_format:
        raise ProtocolError(f"error: unsupported object format '{fmt}'")
    size = HEX_LENGTHS[object_format]
    for c in req.commands:
        if len(c.old) != size:
            raise ProtocolError(f"protocol error: expected old/new/ref, got '{c.old} {c.new} {c.ref}'")
    return Negotiated(
        report_status=req.has("report-status"),
        report_status_v2=req.has("report-status-v2"),
        sideband=req.has("side-band-64k"),
        quiet=req.has("quiet"),
        atomic=advertise_atomic and req.has("atomic"),
        push_options=advertise_push_options and req.has("push-options"),
    )


_COMMAND = re.compile(f"({OID_PATTERN}) ({OID_PATTERN}) ", re.S)


def parse_command(line: bytes, shown: Optional[bytes] = None) -> Command:
    """One `old new ref` line; SHOWN is what the error names instead of LINE."""
    text = line.decode("utf-8", "surrogateescape")
    m = _COMMAND.match(text)
    if m is None or len(m.group(1)) != len(m.group(2)):
        named = text if shown is None else shown.decode("utf-8", "surrogateescape")
        raise ProtocolError(f"protocol error: expected old/new/ref, got '{named}'")
    return Command(m.group(1), m.group(2), text[m.end():])


def read_commands(reader: pktline.Reader) -> PushRequest:
    """read_head_info(): command lines up to the flush, and a push
    certificate's block (whose commands follow the unsigned ones)."""
    commands: list[Command] = []
    caps: tuple[str, ...] = ()
    shallow: list[str] = []
    cert = bytearray()
    while True:
        pkt = reader.read()
        if pkt is None:   # EOF before the flush, even with no command at all
            raise ProtocolError("the remote end hung up unexpectedly")
        if not isinstance(pkt, bytes):
            break
        line = pktline.strip_lf(pkt)
        if line.startswith(b"shallow ") and len(line) > 8:
            oid = line[8:].decode("latin-1")
            if not is_oid(oid):
                raise ProtocolError(f"protocol error: expected shallow sha, got '{line[8:].decode('latin-1')}'")
            shallow.append(oid)
            continue
        if b"\0" in line:
            line, _, feat = line.partition(b"\0")
            caps = tuple(feat.decode("utf-8", "replace").split())
        if line == b"push-cert":
            if _read_cert(reader, cert):
                break
            continue
        commands.append(parse_command(line))
    if cert:
        from .pushcert import command_lines  # startup: hashlib and hmac: only for signed pushes
        commands += [parse_command(line, rest) for line, rest in command_lines(bytes(cert))]
    return PushRequest(tuple(commands), caps, tuple(shallow), cert=bytes(cert) or None)


def _read_cert(reader: pktline.Reader, cert: bytearray) -> bool:
    """A certificate's lines (kept whole, newline included) up to
    `push-cert-end`, appended to CERT; True when a flush ended it instead
    (which also ends the command list)."""
    while True:
        pkt = reader.read()
        if pkt is None:
            raise ProtocolError("the remote end hung up unexpectedly")
        if pkt == pktline.FLUSH_PKT:
            return True
        if not isinstance(pkt, bytes):
            raise ProtocolError("protocol error: got an unexpected packet")
        if pkt == b"push-cert-end\n":
            return False
        cert += pkt.partition(b"\0")[0]     # strbuf_addstr(): a line ends at a NUL


def read_push_options(reader: pktline.Reader) -> tuple[str, ...]:
    opts: list[str] = []
    while True:
        pkt = reader.read()
        if pkt is None:
            raise ProtocolError("the remote end hung up unexpectedly")
        if not isinstance(pkt, bytes):
            return tuple(opts)
        opts.append(pktline.strip_lf(pkt).decode("utf-8", "surrogateescape"))


@dataclass(frozen=True)
class PackHeader:
    version: int
    entries: int


def parse_pack_header(head: bytes) -> PackHeader | str:
    """parse_pack_header(): a PackHeader, or stock's error string."""
    if len(head) < 12:
        return "eof before pack header was fully read"
    if head[:4] != b"PACK":
        return "protocol error (pack signature mismatch detected)"
    version, entries = struct.unpack(">II", head[4:12])
    if version not in (2, 3):
        return "protocol error (pack version unsupported)"
    return PackHeader(version, entries)


@dataclass(frozen=True)
class RefResult:
    ref: str
    error: Optional[str] = None   # None: ok
    reports: tuple[RefReport, ...] = ()   # what the proc-receive hook said the ref became


def report(unpack_error: Optional[str], results: Iterable[RefResult], v2: bool = False) -> bytes:
    """report(), or with V2 report_v2(): after an `ok`, each of the
    proc-receive hook's reports as `option` lines, an `ok` again before
    every report but the first."""
    def line(text: str) -> bytes:
        return encode(text.encode("utf-8", "surrogateescape"))
    out = [line(f"unpack {unpack_error or 'ok'}\n")]
    for r in results:
        if r.error is not None:
            out.append(line(f"ng {r.ref} {r.error}\n"))
            continue
        out.append(line(f"ok {r.ref}\n"))
        for i, rep in enumerate(r.reports if v2 else ()):
            if i:
                out.append(line(f"ok {r.ref}\n"))
            if rep.ref_name is not None:
                out.append(line(f"option refname {rep.ref_name}\n"))
            if rep.old_oid is not None:
                out.append(line(f"option old-oid {rep.old_oid}\n"))
            if rep.new_oid is not None:
                out.append(line(f"option new-oid {rep.new_oid}\n"))
            if rep.forced_update:
                out.append(line("option forced-update\n"))
    out.append(FLUSH)
    return b"".join(out)


SIDEBAND_MAX = pktline.MAX_PKT - 5   # send_sideband(): payload per packet after length and band


def band(n: int, data: bytes) -> bytes:
    return b"".join(pktline.sideband(n, data, SIDEBAND_MAX)) if data else b""


@dataclass
class Messages:
    """Where rp_error/rp_warning and child stderr go: band 2, or the server log."""
    sideband: bool
    log: list[str] = field(default_factory=list)

    def frame(self, data: bytes) -> bytes:
        if not data:
            return b""
        if self.sideband:
            return band(2, data)
        self.log.append(data.decode("utf-8", "replace"))
        return b""

    def error(self, msg: str) -> bytes:
        return self.frame(f"error: {msg}\n".encode("utf-8", "surrogateescape"))

    def warning(self, msg: str) -> bytes:
        return self.frame(f"warning: {msg}\n".encode("utf-8", "surrogateescape"))
