"""Fuzz targets over the parsers alone, in process: each takes client bytes,
may answer with its documented error type only, and is checked for the
promises it makes (a stream parser and a buffer parser agree, what was
accepted is well formed)."""

from __future__ import annotations

import contextlib
import io
import re
from dataclasses import dataclass
from typing import Iterator, Optional

from hypothesis import strategies as st

from aspen_cgi.http import body as body_mod
from aspen_cgi.http import paths, query, routes
from aspen_cgi.http.body import BodyError
from aspen_cgi.protocol import pktline, push, requests
from aspen_cgi.protocol.pktline import ProtocolError
from aspen_cgi.push import intake
from aspen_cgi.service import protocol_version

from . import strategies as S
from .model import Crash, Run, Session, Target, label

_OID = re.compile(r"\A[0-9a-f]{40}\Z")


@contextlib.contextmanager
def _plain(fn) -> Iterator[Run]:
    yield fn


# ---------------------------------------------------------------- pkt-line

def run_pktline(data: bytes) -> str:
    """parse() over the buffer and Reader over a stream must agree packet for
    packet, and on where an error is; each accepted packet re-encodes to the
    bytes it came from."""
    buffered: list = []
    buf_error: Optional[ProtocolError] = None
    try:
        for packet, end in pktline.parse(data):
            buffered.append((packet, end))
    except ProtocolError as e:
        buf_error = e
    streamed: list = []
    reader = pktline.Reader(io.BytesIO(data))
    stream_error: Optional[ProtocolError] = None
    try:
        while True:
            packet = reader.read()
            if packet is None:
                break
            streamed.append(packet)
    except ProtocolError as e:
        stream_error = e
    if [p for p, _ in buffered] != streamed:
        raise Crash("disagree", f"parse() read {len(buffered)} packets, Reader {len(streamed)}")
    if (buf_error is None) != (stream_error is None):
        raise Crash("disagree", f"parse() error {buf_error!r}, Reader error {stream_error!r}")
    pos = 0
    for packet, end in buffered:
        framed = packet if isinstance(packet, bytes) else None
        raw = pktline.encode(framed) if framed is not None else data[pos:pos + 4]
        if data[pos:end].lower() != raw.lower():
            raise Crash("re-encode", f"packet at {pos} re-encodes to {raw[:20]!r}, came as {data[pos:end][:20]!r}")
        pos = end
    return label(buf_error) if buf_error else f"ok {min(len(buffered), 10)}+ packets" if len(buffered) >= 10 \
        else f"ok {len(buffered)} packets"


# ---------------------------------------------------------------- upload-pack requests

def _check_fetch(req: requests.FetchRequest) -> None:
    for oid in req.wants + req.haves + req.shallow:
        if not _OID.match(oid):
            raise Crash("accepted-bad-oid", repr(oid))
    if req.deepen is not None and not (0 < req.deepen < 1 << 31):
        raise Crash("accepted-bad-depth", repr(req.deepen))
    req.needs_fallback_reason
    for cap in ("multi_ack_detailed", "side-band-64k", "no-done", "no-progress"):
        req.has_capability(cap)


def run_v0(data: bytes) -> str:
    try:
        req = requests.parse_v0(data)
    except ProtocolError as e:
        return label(e)
    _check_fetch(req)
    return f"ok wants={min(len(req.wants), 2)} rounds={req.rounds} done={req.done}"


def run_v2(data: bytes) -> str:
    try:
        req = requests.parse_v2(data)
    except ProtocolError as e:
        return label(e)
    if isinstance(req, requests.FetchRequest):
        _check_fetch(req)
    return f"ok {type(req).__name__}"


# ---------------------------------------------------------------- capabilities and CGI variables

def run_capabilities(data: bytes) -> str:
    """DATA as the capability list of a v0 want, of a push command, and as a
    Git-Protocol header."""
    text = data.decode("utf-8", "surrogateescape")
    protocol_version(text)
    want = S.pkt(b"want " + b"a" * 40 + b" " + data + b"\n") + pktline.FLUSH + S.pkt(b"done\n")
    outcome = []
    try:
        req = requests.parse_v0(want)
        _check_fetch(req)
        outcome.append(f"v0 caps={min(len(req.capabilities), 3)}")
    except (ProtocolError, ValueError) as e:
        if not isinstance(e, ProtocolError) and "too long" not in str(e):
            raise
        outcome.append(label(e))
    line = f"{S.ZERO} {'b' * 40} refs/heads/x".encode() + b"\0" + data
    try:
        cmd = push.read_commands(pktline.Reader(io.BytesIO(S.pkt(line) + pktline.FLUSH)))
        neg = push.negotiate(cmd, True, True)
        outcome.append(f"push atomic={neg.atomic} sb={neg.sideband}")
    except (ProtocolError, ValueError) as e:
        if not isinstance(e, ProtocolError) and "too long" not in str(e):
            raise
        outcome.append(label(e))
    return " | ".join(outcome)


def run_cgi_vars(data: bytes) -> str:
    """DATA as QUERY_STRING, PATH_INFO and CONTENT_LENGTH."""
    text = data.decode("utf-8", "surrogateescape")
    params = query.parameters(text)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in params.items()):
        raise Crash("bad-parameters", repr(params)[:200])
    m = routes.match(text)
    ok = paths.avoid_alias(text)
    try:
        n = body_mod.parse_content_length(text)
        if n is not None and n < 0:
            raise Crash("negative-length", repr(n))
        length = "length" if n is not None else "eof"
    except BodyError:
        length = "bad-length"
    return f"route={m.route.handler if m else None} alias-ok={ok} {length}"


# ---------------------------------------------------------------- receive-pack

def run_receive(data: bytes) -> str:
    """The command list, push options when negotiated, then the pack header,
    read from one stream as pushflow reads them."""
    reader = pktline.Reader(io.BytesIO(data))
    try:
        req = push.read_commands(reader)
        if not req.commands:
            return "no commands"
        for c in req.commands:
            if not (_OID.match(c.old) and _OID.match(c.new)):
                raise Crash("accepted-bad-oid", repr(c))
        neg = push.negotiate(req, True, True)
        if neg.push_options:
            push.read_push_options(reader)
    except ProtocolError as e:
        return label(e)
    return _pack_header(reader.stream.read(12))


def _pack_header(head: bytes) -> str:
    header = push.parse_pack_header(head)
    if isinstance(header, str):
        return f"unpack error: {header}"
    if header.version not in (2, 3) or not 0 <= header.entries < 1 << 32:
        raise Crash("bad-header", repr(header))
    args = intake.intake_args(header, intake.IntakeOptions())
    if not any(a.startswith(f"--pack_header={header.version},{header.entries}") for a in args):
        raise Crash("header-args", repr(args))
    return f"pack v{header.version} {args[0]}"


def run_pack_header(data: bytes) -> str:
    return _pack_header(data[:12])


# ---------------------------------------------------------------- request bodies

@dataclass(frozen=True)
class BodyInput:
    data: bytes
    gzip: bool
    length: Optional[int]       # Content-Length as declared (None: read to EOF)
    limit: int                  # GIT_HTTP_MAX_REQUEST_BUFFER


def run_body(inp: BodyInput) -> str:
    """read_upload_request() and Body.read(): BodyError or the body; never more
    than the limit after inflation, never more than Content-Length read."""
    out = []
    try:
        data = body_mod.read_upload_request(io.BytesIO(inp.data), inp.length, inp.gzip, inp.limit)
        bound = max(inp.limit, 8192)    # stock's first read buffer is 8 KiB whatever the limit
        if len(data) > bound:
            raise Crash("over-limit", f"{len(data)} > {bound}")
        out.append("upload ok")
    except BodyError as e:
        out.append(label(e))
    stream = io.BytesIO(inp.data)
    b = body_mod.Body(stream, inp.length, inp.gzip)
    try:
        total = 0
        while True:
            chunk = b.read(4096)
            if not chunk:
                break
            total += len(chunk)
            if total > 64 * 1024 * 1024:
                raise Crash("unbounded", "more than 64 MiB inflated")
        out.append("stream ok")
    except BodyError as e:
        if b.error is not e:
            raise Crash("error-not-recorded", repr(e))
        out.append(label(e))
    if inp.length is not None and stream.tell() > inp.length:
        raise Crash("read-past-length", f"{stream.tell()} > {inp.length}")
    return " | ".join(out)


def _body_strategy(s: Session):
    seeds = s.corpus.seeds("upload-pack") + s.corpus.seeds("receive-pack")[:2]

    @st.composite
    def inputs(draw) -> BodyInput:
        bombs = st.sampled_from([1 << 10, 1 << 20, 11 << 20, 40 << 20]).map(lambda n: (S.gzip_bomb(n), True))
        data, gz = draw(st.one_of(S.bodies(seeds), S.bodies(seeds), S.bodies(seeds), bombs))
        mode = draw(st.integers(0, 4))
        length = (len(data) if mode < 2 else None if mode == 2 else
                  max(0, len(data) + draw(st.integers(-50, 50))))
        if mode == 4:
            length = draw(st.integers(0, 1 << 40))
        limit = draw(st.sampled_from([1 << 20, 10 << 20, 1000, 8192, 0, 1]))
        return BodyInput(data, gz, length, limit)
    return inputs()


# ---------------------------------------------------------------- the registry

def _mixed(structured, seeds):
    return st.one_of(structured, S.mutated(seeds), st.binary(max_size=200))


TARGETS = [
    Target("pktline", "pkt-line decoding: parse() and Reader agree; packets re-encode",
           lambda s: st.one_of(S.pktline_streams(),
                               S.mutated(s.corpus.seeds("upload-pack") + s.corpus.seeds("receive-pack")),
                               st.binary(max_size=64)),
           lambda s: _plain(run_pktline)),
    Target("upload-v0", "v0/v1 upload-pack requests (wants, capabilities, shallow, have rounds)",
           lambda s: _mixed(S.v0_requests(s.corpus.oids()), s.corpus.seeds("upload-pack", 0)),
           lambda s: _plain(run_v0)),
    Target("upload-v2", "v2 commands (ls-refs, fetch, object-info) and their arguments",
           lambda s: _mixed(S.v2_requests(s.corpus.oids()), s.corpus.seeds("upload-pack", 2)),
           lambda s: _plain(run_v2)),
    Target("capabilities", "capability lists of a v0 want and a push command; Git-Protocol",
           lambda s: st.one_of(
               st.lists(st.sampled_from(S.UPLOAD_CAPS + S.RECEIVE_CAPS + S.BAD_RECEIVE_CAPS), max_size=12).map(
                   lambda c: " ".join(c).encode()),
               S.mutated([" ".join(S.UPLOAD_CAPS).encode(), " ".join(S.RECEIVE_CAPS).encode(), b"version=2",
                          b"version=1:version=2"]),
               st.binary(max_size=80)),
           lambda s: _plain(run_capabilities)),
    Target("cgi-vars", "QUERY_STRING, PATH_INFO (routes, aliases), CONTENT_LENGTH",
           lambda s: st.one_of(
               S.mutated([b"service=git-upload-pack", b"/fuzz.git/info/refs", b"/fuzz.git/git-receive-pack",
                          b"/fuzz.git/objects/pack/pack-" + b"a" * 40 + b".pack", b"123", b"0x1fk", b"-1",
                          b"a=%41&b=+%00&service"]),
               st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")), st.binary(max_size=40)),
           lambda s: _plain(run_cgi_vars)),
    Target("receive-commands", "receive-pack command list, push options and pack header",
           lambda s: _mixed(S.receive_requests(s.corpus.oids(), s.corpus.packs()), s.corpus.seeds("receive-pack")),
           lambda s: _plain(run_receive)),
    Target("pack-header", "pack header parsing and the intake arguments it makes",
           lambda s: st.one_of(S.pack_bytes(s.corpus.packs()), st.binary(min_size=0, max_size=16)),
           lambda s: _plain(run_pack_header)),
    Target("body", "request bodies: Content-Length, EOF, gzip (bombs, truncation), the buffer limit",
           _body_strategy, lambda s: _plain(run_body)),
]
