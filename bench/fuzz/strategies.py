"""Hypothesis strategies for client bytes: structured (pkt-line streams,
v0 and v2 upload-pack requests, receive-pack command lists with push options
and a pack, gzip bodies) and byte-level mutation of the captured corpus.
Every strategy draws from the same seeds, so a run is reproducible from its
hypothesis seed."""

from __future__ import annotations

import functools
import gzip
import hashlib
import zlib
from typing import Sequence

from hypothesis import strategies as st

from aspen_cgi.protocol.pktline import DELIM, FLUSH, RESPONSE_END

ZERO = "0" * 40

# pkt-line length fields worth trying: specials, the edges of the limit, non-hex, short
LENGTHS = [b"0000", b"0001", b"0002", b"0003", b"0004", b"0005", b"fff0", b"fff1", b"ffff", b"FFF0",
           b"000g", b"-001", b"    ", b"0x10", b"00\x0000", b"\xff\xff\xff\xff", b"000", b"00"]
TEXT_BITS = [b"\n", b"\0", b" ", b"=", b"\xff", b"\xc3\x28", b"\r\n", b"%00", b"\x00" * 3, b"-1",
             b"99999999999999999999",
             b"0x7fffffff", b"2147483648", b"4294967296", b"\xed\xa0\x80", b"~", b"/../", b"//",
             b"9" * 4400, b"0" * 70 + b"1"]


def pkt(data: bytes) -> bytes:
    return b"%04x" % (len(data) + 4) + data


# ---------------------------------------------------------------- byte mutation

@st.composite
def mutated(draw, seeds: Sequence[bytes], max_ops: int = 6) -> bytes:
    """A seed with up to MAX_OPS edits: flip, insert, delete, duplicate, truncate,
    overwrite a pkt-line length, splice another seed."""
    data = bytearray(draw(st.sampled_from(list(seeds))))
    for _ in range(draw(st.integers(0, max_ops))):
        op = draw(st.integers(0, 7))
        pos = draw(st.integers(0, max(len(data), 1))) % (len(data) + 1)
        if op == 0 and data and pos < len(data):
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == 1:
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8) | st.sampled_from(TEXT_BITS))
        elif op == 2:
            data[pos:pos + draw(st.integers(1, 64))] = b""
        elif op == 3:
            n = draw(st.integers(1, 64))
            data[pos:pos] = data[pos:pos + n] * draw(st.integers(1, 4))
        elif op == 4:
            del data[pos:]
        elif op == 5:
            data[pos:pos + 4] = draw(st.sampled_from(LENGTHS))
        elif op == 6:
            other = draw(st.sampled_from(list(seeds)))
            start = draw(st.integers(0, len(other)))
            data[pos:] = other[start:]
        else:
            data[pos:pos + 1] = draw(st.sampled_from(TEXT_BITS))
    return bytes(data)


# ---------------------------------------------------------------- pkt-line streams

def _framed(lines: st.SearchStrategy) -> st.SearchStrategy:
    """Packets from LINES (bytes, or one of the special packets), mostly framed
    right; sometimes one packet's length is wrong or the stream is cut."""
    special = st.sampled_from([FLUSH, DELIM, RESPONSE_END])
    packet = st.one_of(lines.map(pkt), special)

    @st.composite
    def stream(draw) -> bytes:
        parts = draw(st.lists(packet, max_size=24))
        if parts and draw(st.integers(0, 3)) == 0:
            i = draw(st.integers(0, len(parts) - 1))
            parts[i] = draw(st.sampled_from(LENGTHS)) + parts[i][4:]
        data = b"".join(parts)
        if data and draw(st.integers(0, 5)) == 0:
            data = data[:draw(st.integers(0, len(data) - 1))]
        return data
    return stream()


def text_line(words: Sequence[str]) -> st.SearchStrategy:
    """A protocol-looking line: a keyword, maybe a value, maybe a newline."""
    value = st.one_of(st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")),
                      st.sampled_from(TEXT_BITS), st.binary(max_size=20))
    return st.builds(lambda w, sep, v, nl: w.encode() + sep + v + nl,
                     st.sampled_from(list(words)), st.sampled_from([b"", b" ", b"="]), value,
                     st.sampled_from([b"\n", b""]))


def pktline_streams() -> st.SearchStrategy:
    return _framed(st.binary(max_size=80) | st.sampled_from(TEXT_BITS))


# ---------------------------------------------------------------- upload-pack requests

UPLOAD_CAPS = ["multi_ack", "multi_ack_detailed", "thin-pack", "side-band", "side-band-64k", "ofs-delta", "shallow",
               "deepen-since", "deepen-not", "deepen-relative", "no-progress", "include-tag", "no-done",
               "allow-tip-sha1-in-want", "filter", "agent=git/2.39.5", "object-format=sha1", "object-format=sha256",
               "session-id=x", "agent="]


def _oid(oids: Sequence[str]) -> st.SearchStrategy:
    """Mostly an object ID the clients named; sometimes zero, sometimes not an ID at all."""
    return st.integers(0, 9).flatmap(lambda i: st.sampled_from(list(oids)) if i < 8 else st.just(ZERO) if i < 9
                                     else st.text("0123456789abcdefABCDEF", min_size=0, max_size=66))


def _rarely(draw, n: int = 8) -> bool:
    """True one time in N (hypothesis's simplest draw, which it favours, is False)."""
    return draw(st.sampled_from([False] * (n - 1) + [True]))


def _number() -> st.SearchStrategy:
    return st.one_of(st.integers(-2 ** 40, 2 ** 40).map(str), st.sampled_from(["0", "-0", "+1", "0x10", "1e3", " 1",
                                                                               "2147483648", "", "١"]),
                     st.integers(1, 6000).map(lambda n: "9" * n))   # Python's int() refuses past 4300 digits


def _shallow_lines(oids: Sequence[str]) -> list[st.SearchStrategy]:
    return [
        _oid(oids).map(lambda o: f"shallow {o}"),
        _number().map(lambda n: f"deepen {n}"),
        _number().map(lambda n: f"deepen-since {n}"),
        st.sampled_from(["refs/heads/main", "main", "", "refs/tags/v1.0^{}"]).map(lambda r: f"deepen-not {r}"),
        st.just("deepen-relative"),
        st.sampled_from(["blob:none", "blob:limit=1k", "tree:0", "sparse:oid=main:x", "combine:blob:none+tree:1",
                         "", "bogus"]).map(lambda f: f"filter {f}"),
    ]


def _encode_line(text: str, newline: bool) -> bytes:
    return text.encode("utf-8", "surrogateescape") + (b"\n" if newline else b"")


@st.composite
def v0_requests(draw, oids: Sequence[str]) -> bytes:
    """want lines (capabilities on the first, sometimes on later ones),
    shallow/deepen/filter, flush, have rounds, done; mostly well framed."""
    out = []
    for i in range(draw(st.integers(0, 4))):
        line = f"want {draw(_oid(oids))}"
        if i == 0 or draw(st.integers(0, 6)) == 0:
            line += " " + " ".join(draw(st.lists(st.sampled_from(UPLOAD_CAPS) | st.text(max_size=12), max_size=8)))
        out.append(pkt(_encode_line(line, draw(st.booleans()))))
    for line in draw(st.lists(st.one_of(*_shallow_lines(oids)), max_size=3)):
        out.append(pkt(_encode_line(line, True)))
    if draw(st.integers(0, 8)):
        out.append(FLUSH)
    for _ in range(draw(st.integers(0, 3))):
        for oid in draw(st.lists(_oid(oids), max_size=5)):
            out.append(pkt(_encode_line(f"have {oid}", True)))
        out.append(draw(st.sampled_from([FLUSH, FLUSH, pkt(b"done\n"), pkt(b"done"), DELIM, b""])))
    if draw(st.booleans()):
        out.append(pkt(b"done\n"))
    if draw(st.integers(0, 4)) == 0:
        out.append(draw(st.binary(max_size=16) | st.sampled_from(LENGTHS)))
    return b"".join(out)


V2_FETCH_ARGS = ["thin-pack", "no-progress", "include-tag", "ofs-delta", "done", "wait-for-done", "sideband-all"]


@st.composite
def v2_requests(draw, oids: Sequence[str]) -> bytes:
    """command=X, capability lines, delim, arguments, flush."""
    out = []
    command = draw(st.sampled_from(["ls-refs", "fetch", "fetch", "object-info", "bundle-uri", "bogus", ""]))
    if draw(st.integers(0, 10)):
        out.append(pkt(f"command={command}\n".encode()))
    caps = st.sampled_from(["agent=git/2.39.5", "object-format=sha1", "object-format=sha256", "server-option=x",
                            "server-option=", "session-id=1", "command=fetch", "unknown-cap"])
    out += [pkt(c.encode() + b"\n") for c in draw(st.lists(caps, max_size=4))]
    if draw(st.integers(0, 8)):
        out.append(DELIM)
    args = [st.sampled_from(V2_FETCH_ARGS + ["peel", "symrefs", "unborn", "size"]),
            st.sampled_from(["refs/heads/", "refs/tags/", "HEAD", "", "refs/heads/main"]).map(
                lambda p: f"ref-prefix {p}"),
            _oid(oids).map(lambda o: f"want {o}"), _oid(oids).map(lambda o: f"have {o}"),
            _oid(oids).map(lambda o: f"oid {o}"),
            st.sampled_from(["HEAD", "refs/heads/main", "refs/heads/nope", "", "refs/heads/../x"]).map(
                lambda r: f"want-ref {r}"),
            st.sampled_from(["https", "https,file", "http", ""]).map(lambda p: f"packfile-uris {p}"),
            *_shallow_lines(oids)]
    for line in draw(st.lists(st.one_of(*args), max_size=10)):
        out.append(pkt(_encode_line(line, draw(st.booleans()))))
    if draw(st.integers(0, 8)):
        out.append(FLUSH)
    if draw(st.integers(0, 5)) == 0:
        out.append(draw(st.binary(max_size=16) | st.sampled_from(LENGTHS)))
    return b"".join(out)


# ---------------------------------------------------------------- receive-pack requests

RECEIVE_CAPS = ["report-status", "report-status-v2", "side-band-64k", "quiet", "atomic", "ofs-delta", "push-options",
                "delete-refs", "agent=git/2.39.5", "object-format=sha1", "push-cert=1", "session-id=x"]
BAD_RECEIVE_CAPS = ["object-format=sha256", "object-format=", "object-format=sha1 object-format=x"]
REFNAMES = [b"refs/heads/main", b"refs/heads/fuzz", b"refs/heads/topic", b"refs/tags/v1.0", b"refs/heads/a/b",
            b"refs/heads/..", b"refs/heads/x.lock", b"refs/heads/@{x}", b"HEAD", b"refs/heads/", b"main", b"",
            "refs/heads/\xe9".encode(), b"refs/heads/\xff\xfe", b"refs/tags/\xed\xa0\x80", b"refs/heads/sp ace",
            b"refs/heads/" + b"n" * 300, b"refs/heads/" + b"n" * 65000, b"refs/heads/" + b"n/" * 1200 + b"x"]


EMPTY_PACK = b"PACK\0\0\0\2\0\0\0\0" + hashlib.sha1(b"PACK\0\0\0\2\0\0\0\0").digest()   # all objects there


def pack_header(version: int, entries: int) -> bytes:
    return b"PACK" + version.to_bytes(4, "big") + entries.to_bytes(4, "big")


@st.composite
def pack_bytes(draw, packs: Sequence[bytes]) -> bytes:
    """A real pack or an empty one (half the time), a pack with a doctored
    header, a mutated pack, or a header and junk."""
    kind = draw(st.integers(0, 7))
    if kind >= 6:
        return EMPTY_PACK
    if kind in (0, 5) and packs:
        return draw(st.sampled_from(list(packs)))
    if kind == 1 and packs:
        real = draw(st.sampled_from(list(packs)))
        return pack_header(draw(st.sampled_from([2, 3, 1, 0, 4, 2 ** 32 - 1])),
                           draw(st.sampled_from([0, 1, 2, 3, 2 ** 31, 2 ** 32 - 1]))) + real[12:]
    if kind == 2:
        return draw(st.sampled_from([b"", b"PACK", b"PACK\0\0\0\2", b"KCAP\0\0\0\2\0\0\0\0", b"\0" * 12]))
    if kind == 3 and packs:
        return draw(mutated(packs, max_ops=3))
    return pack_header(draw(st.integers(0, 4)), draw(st.integers(0, 2 ** 32 - 1))) + draw(st.binary(max_size=64))


@st.composite
def receive_requests(draw, oids: Sequence[str], packs: Sequence[bytes]) -> bytes:
    """Command lines (capabilities after a NUL on the first), shallow lines,
    flush, push options, flush, then a pack."""
    out = []
    if _rarely(draw):
        out += [pkt(f"shallow {o}".encode()) for o in draw(st.lists(_oid(oids), min_size=1, max_size=2))]
    value = st.sampled_from([ZERO] + list(oids))
    commands = draw(st.lists(st.tuples(st.just(ZERO) | value, value, st.sampled_from(REFNAMES)), min_size=1,
                             max_size=4))
    caps = draw(st.lists(st.sampled_from(RECEIVE_CAPS), max_size=6))
    if _rarely(draw, 12):
        caps.append(draw(st.sampled_from(BAD_RECEIVE_CAPS)))
    for i, (old, new, ref) in enumerate(commands):
        if ref.startswith(b"refs/heads/") and old == ZERO and draw(st.booleans()):
            ref += b"-%d" % draw(st.integers(0, 10 ** 6))      # a name not taken yet: the create can land
        line = f"{old} {new} ".encode() + ref
        if i == 0:
            line += b"\0" + " ".join(caps).encode()
        if _rarely(draw, 10):
            line = draw(mutated([line], max_ops=2))
        out.append(pkt(line + (b"\n" if draw(st.booleans()) else b"")))
    if _rarely(draw, 12):
        out.append(pkt(b"push-cert\0report-status\n"))
    if not _rarely(draw, 12):
        out.append(FLUSH)
    if "push-options" in caps or _rarely(draw):
        opts = draw(st.lists(st.one_of(st.text(max_size=30).map(lambda t: t.encode("utf-8", "surrogatepass")),
                                       st.sampled_from([b"ci.skip", b"a=b\n", b"\0", b""])), max_size=4))
        out += [pkt(o) for o in opts]
        out.append(draw(st.sampled_from([FLUSH] * 6 + [DELIM, b""])))
    out.append(draw(pack_bytes(packs)))
    return b"".join(out)


# ---------------------------------------------------------------- request bodies

def gzipped(data: bytes, mode: int) -> bytes:
    """DATA gzipped (mode 0), deflated without the gzip wrapper (1), or gzip
    cut short (2), or two gzip members (3)."""
    if mode == 0:
        return gzip.compress(data, mtime=0)
    if mode == 1:
        return zlib.compress(data)
    whole = gzip.compress(data, mtime=0)
    if mode == 2:
        return whole[:max(1, len(whole) // 2)]
    return whole + gzip.compress(data, mtime=0)


def bodies(seeds: Sequence[bytes]) -> st.SearchStrategy:
    """A (gzipped or not) body: a seed or a mutated seed, then maybe gzip with a twist, then maybe mutated again."""
    @st.composite
    def body(draw) -> tuple[bytes, bool]:
        data = draw(st.sampled_from(list(seeds)) | mutated(seeds, max_ops=3))
        gz = draw(st.booleans())
        if gz:
            data = gzipped(data, draw(st.integers(0, 3)))
            if draw(st.integers(0, 3)) == 0:
                data = draw(mutated([data], max_ops=2))
        return data, gz
    return body()


@functools.lru_cache(maxsize=8)
def gzip_bomb(size: int) -> bytes:
    return gzip.compress(b"0" * size, compresslevel=9, mtime=0)
