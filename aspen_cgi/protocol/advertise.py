"""Ref and capability advertisements, byte for byte as stock writes them:
upload-pack v0/v1, protocol v2's capability list, and receive-pack."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Optional, Sequence

from ..model.objectid import null_of
from ..model.refs import RefSnapshot
from .pktline import FLUSH, encode

UPLOAD_CAPS = ("multi_ack thin-pack side-band side-band-64k ofs-delta shallow deepen-since "
               "deepen-not deepen-relative no-progress include-tag multi_ack_detailed")
RECEIVE_CAPS = "report-status report-status-v2 delete-refs side-band-64k quiet"


@dataclass(frozen=True)
class UploadCaps:
    allow_tip: bool = False
    allow_reachable: bool = False
    allow_filter: bool = False
    allow_ref_in_want: bool = False
    allow_sideband_all: bool = False
    packfile_uris: bool = False
    bundle_uri: bool = False
    session_id: Optional[str] = None
    unborn: str = "advertise"          # lsrefs.unborn: advertise | allow | ignore
    agent: str = "aspen"
    object_format: str = "sha1"


@dataclass(frozen=True)
class ReceiveCaps:
    atomic: bool = True
    ofs_delta: bool = True
    push_options: bool = False
    push_cert_nonce: Optional[str] = None
    session_id: Optional[str] = None
    agent: str = "aspen"
    object_format: str = "sha1"


def upload_v0(snap: RefSnapshot, caps: UploadCaps, hidden: Callable[[str, str], bool],
              shallow: Sequence[str] = (), version: int = 0) -> Iterator[bytes]:
    """upload-pack's advertisement for protocol v0 (or v1: a `version 1` line first)."""
    if version == 1:
        yield encode("version 1\n")
    cap_text = UPLOAD_CAPS
    if caps.allow_tip:
        cap_text += " allow-tip-sha1-in-want"
    if caps.allow_reachable:
        cap_text += " allow-reachable-sha1-in-want"
    cap_text += " no-done"
    head = snap.head
    if head is not None and head.symref_target is not None:   # stock: even when HEAD itself is hidden
        cap_text += f" symref=HEAD:{head.symref_target}"
    if caps.allow_filter:
        cap_text += " filter"
    if caps.session_id:
        cap_text += f" session-id={caps.session_id}"
    cap_text += f" object-format={caps.object_format} agent={caps.agent}"
    first = True
    listed = ([head] if head is not None else []) + list(snap.refs)
    for ref in listed:
        if hidden(ref.name, snap.namespace_prefix + ref.name):
            continue
        name = ref.name.encode("utf-8", "surrogateescape")
        if first:
            yield encode(ref.oid.encode() + b" " + name + b"\0" + cap_text.encode() + b"\n")
            first = False
        else:
            yield encode(ref.oid.encode() + b" " + name + b"\n")
        if ref.peeled:
            yield encode(ref.peeled.encode() + b" " + name + b"^{}\n")
    for oid in shallow:
        yield encode(f"shallow {oid}\n")
    yield FLUSH


def v2_capabilities(caps: UploadCaps) -> Iterator[bytes]:
    """protocol_v2_advertise_capabilities() of git 2.39 (and 2.40's bundle-uri)."""
    yield encode("version 2\n")
    yield encode(f"agent={caps.agent}\n")
    yield encode("ls-refs=unborn\n" if caps.unborn == "advertise" else "ls-refs\n")
    fetch = "fetch=shallow wait-for-done"
    if caps.allow_filter:
        fetch += " filter"
    if caps.allow_ref_in_want:
        fetch += " ref-in-want"
    if caps.allow_sideband_all:
        fetch += " sideband-all"
    if caps.packfile_uris:
        fetch += " packfile-uris"
    yield encode(fetch + "\n")
    yield encode("server-option\n")
    yield encode(f"object-format={caps.object_format}\n")
    if caps.session_id:
        yield encode(f"session-id={caps.session_id}\n")
    yield encode("object-info\n")
    if caps.bundle_uri:
        yield encode("bundle-uri\n")      # git 2.40's serve.c: after object-info
    yield FLUSH


def receive_v0(lines: Iterable[tuple[str, str]], caps: ReceiveCaps, shallow: Sequence[str] = (),
               version: int = 0) -> Iterator[bytes]:
    """receive-pack's advertisement from (oid, name) lines in order: refs
    (hidden ones already removed) and `.have` lines for objects outside the
    namespace or in alternates."""
    if version == 1:
        yield encode("version 1\n")
    cap_text = RECEIVE_CAPS
    if caps.atomic:
        cap_text += " atomic"
    if caps.ofs_delta:
        cap_text += " ofs-delta"
    if caps.push_cert_nonce:
        cap_text += f" push-cert={caps.push_cert_nonce}"
    if caps.push_options:
        cap_text += " push-options"
    if caps.session_id:
        cap_text += f" session-id={caps.session_id}"
    cap_text += f" object-format={caps.object_format} agent={caps.agent}"
    sent = False
    for oid, name in lines:
        data = f"{oid} ".encode() + name.encode("utf-8", "surrogateescape")
        if not sent:
            yield encode(data + b"\0" + cap_text.encode() + b"\n")
            sent = True
        else:
            yield encode(data + b"\n")
    if not sent:
        yield encode(f"{null_of(caps.object_format)} capabilities^{{}}".encode() + b"\0" + cap_text.encode() + b"\n")
    for oid in shallow:
        yield encode(f"shallow {oid}\n")
    yield FLUSH
