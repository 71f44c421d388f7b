"""The bad-input table (issue 8, part 2): hostile requests, each with the
status Aspen must give and the status stock gives.

Every row is sent over real HTTP (a raw socket, so framing attacks go out as
written) to Aspen under gunicorn in GIT_PROJECT_ROOT mode, or to aspen-cgi
under a CGI host in PATH_TRANSLATED mode; stock `git http-backend` gets the
same bytes under the same kind of host over a copy of the repositories
(unless it cannot answer: the row says why). After every row the server
still serves (`git ls-remote` equals the repository's refs) and no ref of
any repository moved; at the end a real clone passes `fsck --strict` and no
server logged a traceback.

    python -m tests.test_hostile --table     # the table and its counts by status
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import socket
import struct
import sys
import threading
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional, Union

import pytest

from aspen_cgi.protocol.pktline import DELIM, FLUSH, encode

from . import harness as h
from .cgiserver import CgiServer, _Handler

pytestmark = pytest.mark.timeout(120)

UP = "application/x-git-upload-pack-request"
RP = "application/x-git-receive-pack-request"
ZERO = "0" * 40
UNKNOWN = "0123456789abcdef0123456789abcdef01234567"
FAKE_PACK = "pack-" + "a" * 40
FAKE_LOOSE = "ab/" + "c" * 38
IN_ROOT_LOOSE = "cd/" + "e" * 38
LIMITS_ENV = {"ASPEN_IDLE_TIMEOUT": "2", "ASPEN_REQUEST_TIMEOUT": "4", "ASPEN_MAX_PUSH_BYTES": "1000000"}


# ---------------------------------------------------------------- the repositories a row may name

@dataclass
class World:
    """Object ids of the served repository, for rows whose body names them."""
    main: str = ""
    topic: str = ""
    secret: str = ""      # the commit only refs/hidden/secret reaches
    x: str = ""           # a commit whose parent no repository has (UNCONNECTED)

    def oid(self, name: str) -> str:
        return getattr(self, name)


Body = Union[bytes, Callable[[World], bytes]]


def pkts(*lines: str) -> bytes:
    return b"".join(encode(l if l.endswith("\n") else l + "\n") for l in lines)


def v0(*lines: str, done: bool = True) -> Callable[[World], bytes]:
    return lambda w: pkts(*(l.format(**vars(w)) for l in lines)) + FLUSH + (encode("done\n") if done else b"")


def v2(command: str, *args: str, caps: tuple[str, ...] = ("object-format=sha1",)) -> Callable[[World], bytes]:
    return lambda w: (pkts(f"command={command}", *caps) + DELIM
                      + pkts(*(a.format(**vars(w)) for a in args)) + FLUSH)


def raw_object(kind: int, data: bytes, zdata: Optional[bytes] = None) -> bytes:
    n = len(data)
    byte = (kind << 4) | (n & 15)
    n >>= 4
    head = b""
    while n:
        head += bytes([byte | 0x80])
        byte, n = n & 0x7f, n >> 7
    head += bytes([byte])
    return head + (zdata if zdata is not None else zlib.compress(data))


def pack(*objects: bytes) -> bytes:
    body = b"PACK" + struct.pack(">II", 2, len(objects)) + b"".join(objects)
    return body + hashlib.sha1(body).digest()


EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


def push(*commands: str, caps: str = "report-status", data: Optional[Callable[[World], bytes]] = None):
    """A receive-pack request: commands (formatted with the World's oids), then a pack."""
    def body(w: World) -> bytes:
        lines = [c.format(**vars(w)) for c in commands]
        out = b"".join(encode((l + ("\0" + caps if i == 0 else "") + "\n").encode("utf-8", "surrogateescape"))
                       for i, l in enumerate(lines))
        return out + FLUSH + (data(w) if data else pack())
    return body


def _commit_text(parent: str, author: str = "A U Thor <a@example.com> 1700000000 +0000") -> bytes:
    return (f"tree {EMPTY_TREE}\n" + (f"parent {parent}\n" if parent else "")
            + f"author {author}\ncommitter {author}\n\nhostile\n").encode()


UNCONNECTED = _commit_text(UNKNOWN)


def commit_object(parent: str, author: str = "A U Thor <a@example.com> 1700000000 +0000") -> bytes:
    return raw_object(1, _commit_text(parent, author))


def gz(data: bytes) -> bytes:
    return gzip.compress(data, 1)


def million_haves(w: World) -> bytes:
    have = encode(f"have {w.topic}\n")
    return encode(f"want {w.main} multi_ack_detailed side-band-64k\n") + FLUSH + have * 1_000_000 + encode("done\n")


def million_haves_v2(w: World) -> bytes:
    have = encode(f"have {w.topic}\n")
    return pkts("command=fetch", "object-format=sha1") + DELIM + encode(f"want {w.main}\n") + \
        have * 1_000_000 + encode("done\n") + FLUSH


def zeros_bomb(size: int) -> bytes:
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b"\0" * (1 << 20)
    return b"".join(z.compress(chunk) for _ in range(size >> 20)) + z.flush()


BOMB = zeros_bomb(1 << 28)


def endless_blobs(w: World) -> Iterator[bytes]:
    """A push whose pack claims 2^32-1 objects and never ends: the same small blob forever."""
    yield push(f"{ZERO} {{main}} refs/heads/endless")(w)[:-32]      # commands, no pack
    yield b"PACK" + struct.pack(">II", 2, 0xffffffff)
    blob = raw_object(3, b"x" * 100)
    while True:
        yield blob * 2000


def endless_commands(w: World) -> Iterator[bytes]:
    yield encode(f"{ZERO} {w.main} refs/heads/c0\0report-status\n")
    i = 1
    while True:
        yield b"".join(encode(f"{ZERO} {w.main} refs/heads/c{i + k}\n") for k in range(2000))
        i += 2000


def endless_haves(w: World) -> Iterator[bytes]:
    yield encode(f"want {w.main} multi_ack_detailed\n") + FLUSH
    have = encode(f"have {w.topic}\n") * 20000
    while True:
        yield have


# ---------------------------------------------------------------- the table

@dataclass(frozen=True)
class Row:
    name: str
    attacks: str
    method: str
    path: str                       # the request target as sent (%-escapes stay escaped)
    status: int                     # Aspen's status
    stock: Optional[int]            # stock's status; None: stock not asked (`why` says why)
    body: Body = b""
    headers: tuple[tuple[str, str], ...] = ()
    send: str = "length"            # length | chunked | endless | slow | stall | raw
    contains: bytes = b""           # Aspen's body holds this (an ERR pkt-line, a report line)
    absent: bytes = b""             # ... and never this (a served secret)
    why: str = ""                   # where Aspen differs from stock, and why
    mode: str = "root"              # root: gunicorn, GIT_PROJECT_ROOT; translated: aspen-cgi, PATH_TRANSLATED
    server: str = "main"            # main | limits (ASPEN_IDLE_TIMEOUT, ASPEN_REQUEST_TIMEOUT, ASPEN_MAX_PUSH_BYTES)
    kind: str = ""                  # which kind of the issue's list it belongs to


def up(name, attacks, body, status, stock, *, v2p=False, kind, **kw) -> Row:
    extra = tuple(kw.pop("headers", ()))
    ct = () if any(k == "Content-Type" for k, _ in extra) else (("Content-Type", UP),)
    hdrs = ct + ((("Git-Protocol", "version=2"),) if v2p else ()) + extra
    return Row(name, attacks, "POST", kw.pop("path", "/repo.git/git-upload-pack"), status, stock, body,
               hdrs, kind=kind, **kw)


def rp(name, attacks, body, status, stock, *, kind, repo="repo.git", **kw) -> Row:
    hdrs = (("Content-Type", RP),) + tuple(kw.pop("headers", ()))
    return Row(name, attacks, "POST", f"/{repo}/git-receive-pack", status, stock, body, hdrs, kind=kind, **kw)


def get(name, attacks, path, status, stock, *, kind, **kw) -> Row:
    return Row(name, attacks, "GET", path, status, stock, kind=kind, **kw)


SYMLINK_WHY = ("stock follows a symbolic link anywhere and serves its target; Aspen serves only regular "
               "files whose real path is inside the repository (dumb.local_file)")
HANG_WHY = "stock waits for the body as long as the web server lets it (no idle or wall-clock bound)"
NUL_WHY = "a CGI environment cannot hold a NUL byte: no CGI host can start stock with this PATH_INFO"
DIES_WHY = "stock answers 200 with an empty body (it dies after the headers went out); Aspen refuses with a status"
V2_WANT_WHY = ("git's v2 upload-pack sends any object it holds (stock sends the hidden commit's pack); Aspen "
               "holds v2 to v0's rule when refs are hidden (upload.refused_want)")
TRANSLATED_WHY = ("PATH_TRANSLATED is the web server's mapping, trusted as stock trusts it (Apache and nginx "
                  "remove dot segments before mapping); the repository reached is still a repository")

ROWS: list[Row] = []

# --- path traversal, encoded forms, NUL, in both path modes
for mode in ("root", "translated"):
    t = "" if mode == "root" else "-translated"
    aliased = 500 if mode == "root" else 404
    ROWS += [
        get(f"dotdot-config{t}", "`..` out of objects/info to the config", "/repo.git/objects/info/../../config",
            aliased, aliased, kind="traversal", mode=mode),
        get(f"encoded-dotdot{t}", "%2e%2e segments", "/repo.git/objects/info/%2e%2e/%2e%2e/config",
            aliased, aliased, kind="traversal", mode=mode),
        get(f"encoded-slash{t}", "%2f hiding the separators", "/repo.git/objects/info/..%2f..%2fconfig",
            aliased, aliased, kind="traversal", mode=mode),
        get(f"dotdot-route{t}", "`..` before a route, to a file named like HEAD",
            "/repo.git/objects/../HEAD", 500 if mode == "root" else 200, 500 if mode == "root" else 200,
            kind="traversal", mode=mode, why="" if mode == "root" else TRANSLATED_WHY),
        get(f"overlong-dot{t}", "overlong UTF-8 dots (%c0%ae)", "/repo.git/objects/info/%c0%ae%c0%ae/%c0%ae%c0%ae/HEAD",
            404, 404, kind="traversal", mode=mode),
        get(f"state-sqlite{t}", "the ref store", "/repo.git/aspen/aspen.sqlite3", 404, 404, kind="state", mode=mode),
        get(f"state-wal{t}", "the ref store's WAL", "/repo.git/aspen/aspen.sqlite3-wal", 404, 404,
            kind="state", mode=mode),
        get(f"state-as-repo{t}", "a route under the state dir, as if it were a repository",
            "/repo.git/aspen/objects/info/packs", 404, 404, kind="state", mode=mode),
        get(f"config{t}", "the repository's config", "/repo.git/config", 404, 404, kind="state", mode=mode),
        get(f"hook{t}", "a hook", "/repo.git/hooks/pre-receive", 404, 404, kind="state", mode=mode),
        get(f"symlink-pack{t}", "pack-<h>.pack linked to /etc/passwd", f"/links.git/objects/pack/{FAKE_PACK}.pack",
            404, 200, kind="symlink", absent=b"root:", why=SYMLINK_WHY, mode=mode),
        get(f"symlink-loose{t}", "a loose object linked to /etc/passwd", f"/links.git/objects/{FAKE_LOOSE}",
            404, 200, kind="symlink", absent=b"root:", why=SYMLINK_WHY, mode=mode),
        get(f"symlink-alternates{t}", "objects/info/alternates linked to /etc/passwd",
            "/links.git/objects/info/alternates", 404, 200, kind="symlink", absent=b"root:", why=SYMLINK_WHY,
            mode=mode),
        up(f"want-hidden-sideband{t}", "want of a hidden ref's commit (v0)", v0("want {secret} side-band-64k"), 200, 200,
           kind="hidden", contains=b"ERR upload-pack: not our ref", mode=mode),
        up(f"pkt-ffff{t}", "pkt-line length 0xffff (over 65520)", b"ffff" + b"a" * 70000, 400, 200,
           kind="pktlen", why="stock's upload-pack dies after the headers went out; Aspen parses first", mode=mode),
    ]
ROWS += [
    get("dotdot-translated-outside", "`..` out of the document root to a repository beside it",
        "/repo.git/../../outside.git/HEAD", 200, 200, kind="traversal", mode="translated", why=TRANSLATED_WHY),
    get("double-slash", "`//` inside the path", "/repo.git//HEAD", 500, 500, kind="traversal"),
    get("nul-in-repo", "NUL byte in the repository name", "/repo.git%00/HEAD", 404, None, kind="nul", why=NUL_WHY),
    get("nul-after-route", "NUL byte after a route", "/repo.git/HEAD%00", 404, None, kind="nul", why=NUL_WHY),
    get("nul-in-object-name", "NUL byte inside a loose object's name", f"/repo.git/objects/{FAKE_LOOSE[:10]}%00"
        + FAKE_LOOSE[11:], 404, None, kind="nul", why=NUL_WHY),
    get("dotdot-root", "`..` above the project root", "/../outside.git/HEAD", 500, 500, kind="traversal"),
    get("backslashes", "Windows separators", "/repo.git\\..\\..\\outside.git/HEAD", 404, 404, kind="traversal"),
    get("nul-in-query", "NUL after the service name", "/repo.git/info/refs?service=git-upload-pack%00x", 403, 403,
        kind="nul"),
    get("service-traversal", "a service name with a path", "/repo.git/info/refs?service=../../bin/sh", 403, 403,
        kind="traversal"),
    get("symlink-idx", "pack-<h>.idx linked to /etc/hostname", f"/links.git/objects/pack/{FAKE_PACK}.idx", 404, 200,
        kind="symlink", why=SYMLINK_WHY),
    get("symlink-into-other-repo", "a loose object linked into another repository of the root",
        f"/links.git/objects/{IN_ROOT_LOOSE}", 404, 200, kind="symlink", why=SYMLINK_WHY),
    get("fifo-http-alternates", "objects/info/http-alternates is a FIFO", "/links.git/objects/info/http-alternates",
        404, None, kind="symlink", why="stock blocks forever opening the FIFO; Aspen serves regular files only"),
    get("symlink-inside", "a pack linked to a pack of the same repository (allowed)",
        "/links.git/objects/pack/{inside}.pack", 200, 200, kind="symlink"),
    get("symlinked-info-refs", "info/refs file linked to /etc/passwd (the dumb answer is generated)",
        "/links.git/info/refs", 200, 200, kind="symlink", absent=b"root:"),
    get("linked-repository", "a repository the operator linked into the root from outside it",
        "/outside-link.git/HEAD", 200, 200, kind="symlink"),
    get("state-cache", "a response cache entry's directory", "/repo.git/aspen/cache/info/refs", 404, 404,
        kind="state"),
    get("state-shm", "the ref store's shared memory", "/repo.git/aspen/aspen.sqlite3-shm", 404, 404, kind="state"),
    get("packed-refs", "packed-refs (hidden refs in it)", "/repo.git/packed-refs", 404, 404, kind="state"),
]

# --- pkt-line framing
for v2p in (False, True):
    s = "-v2" if v2p else "-v0"
    ROWS += [
        up(f"pkt-fff1{s}", "pkt-line length 65521", b"fff1" + b"a" * 65600, 400, 200, v2p=v2p, kind="pktlen",
           why="stock answers 200 and its upload-pack dies after the headers; Aspen parses the request first"),
        up(f"pkt-len-beyond-body{s}", "a length past the end of the body", b"0100want ", 400, 200, v2p=v2p,
           kind="pktlen", why="as above: stock's 200 carries no answer"),
        up(f"pkt-nonhex{s}", "a length that is not hex", b"zzzzwant", 400, 200, v2p=v2p, kind="pktlen",
           why="as above"),
        up(f"pkt-len-3{s}", "length 0003", b"0003", 400, 200, v2p=v2p, kind="pktlen", why="as above"),
    ]
ROWS += [
    rp("pkt-ffff-push", "pkt-line length 0xffff in the push commands", b"ffff" + b"a" * 70000, 400, 200,
       kind="pktlen", why="stock answers 200 with an empty body, receive-pack dies after the headers"),
]

# --- bodies: endless, slow, gzip bombs, a million haves
ROWS += [
    up("endless-chunked-upload", "a chunked upload-pack body that never ends", endless_haves, 413, 200,
       kind="endless", send="endless", why=DIES_WHY),
    up("million-haves-v0", "a million haves (v0), 50 MB", million_haves, 413, 200, kind="haves", why=DIES_WHY),
    up("million-haves-v2", "a million haves (v2), 50 MB", million_haves_v2, 413, 200, v2p=True, kind="haves",
       why=DIES_WHY),
    up("million-haves-gzip", "a million haves, gzipped to 200 KB", lambda w: gz(million_haves(w)), 413, 200,
       headers=(("Content-Encoding", "gzip"),), kind="haves", why=DIES_WHY),
    up("gzip-bomb-upload", "256 MB of zeros gzipped to 250 KB", BOMB, 413, 200,
       headers=(("Content-Encoding", "gzip"),), kind="gzip", why=DIES_WHY),
    up("gzip-corrupt", "a gzip body that is not gzip", b"\x1f\x8b\x08\x00garbage-garbage", 400, 200,
       headers=(("Content-Encoding", "gzip"),), kind="gzip",
       why="stock answers 200 with an empty body after its inflate fails"),
    rp("gzip-bomb-push", "a push of zeros gzipped (256 MB inflated)", BOMB, 400, 200,
       headers=(("Content-Encoding", "gzip"),), kind="gzip",
       why="stock answers 200 with an empty body; Aspen reads the commands first: zeros are a flush and no pack"),
    rp("endless-push", "a push whose pack never ends (2^32-1 objects)", endless_blobs, 413, None,
       kind="endless", send="endless", server="limits", why=HANG_WHY + " (ASPEN_MAX_PUSH_BYTES)"),
    rp("endless-commands", "a push whose command list never ends", endless_commands, 413, None, kind="endless",
       send="endless", server="limits", why=HANG_WHY + " and holds every command in memory (ASPEN_MAX_PUSH_BYTES)"),
    rp("push-over-max-input", "a push past receive.maxInputSize (1 KB)",
       push(f"{ZERO} {{main}} refs/heads/big", data=lambda w: pack(raw_object(3, os.urandom(4096)))), 200, 200, repo="capped.git", kind="endless",
       contains=b"unpack"),
    up("stalled-upload", "an upload-pack body that stops half way", v0("want {main}"), 408, None, kind="slow",
       send="stall", server="limits", why=HANG_WHY + " (ASPEN_IDLE_TIMEOUT)"),
    rp("stalled-push", "a push body that stops half way", push(f"{ZERO} {{main}} refs/heads/slow"), 408, None,
       kind="slow", send="stall", server="limits", why=HANG_WHY + " (ASPEN_IDLE_TIMEOUT)"),
    up("dribbled-upload", "an upload-pack body sent a byte at a time, forever", endless_haves, 0, None,
       kind="slow", send="slow", server="limits",
       why=HANG_WHY + "; Aspen closes the connection at ASPEN_REQUEST_TIMEOUT (status 0: no answer)"),
    rp("dribbled-push", "a push body sent a byte at a time, forever", endless_commands, 0, None,
       kind="slow", send="slow", server="limits",
       why=HANG_WHY + "; Aspen closes the connection at ASPEN_REQUEST_TIMEOUT (status 0: no answer)"),
    up("slow-but-complete", "a small request sent in 5 pieces (it is answered)", v0("want {main} no-progress"),
       200, 200, kind="slow", send="pieces"),
]

# --- deepen, unknown capabilities, wants
for v2p in (False, True):
    s = "-v2" if v2p else "-v0"
    fetch = (lambda *a: v2("fetch", *a)) if v2p else (lambda *a: v0(*a))
    first = "want {main}" if v2p else "want {main} shallow"
    ROWS += [
        up(f"deepen-2^31{s}", "deepen 2147483648", fetch(first, "deepen 2147483648", *(["done"] if v2p else [])),
           400, 200, v2p=v2p, kind="deepen", why="stock's 200 ends in its upload-pack's death; Aspen refuses first"),
        up(f"deepen-negative{s}", "deepen -1", fetch(first, "deepen -1", *(["done"] if v2p else [])),
           400, 200, v2p=v2p, kind="deepen", why="as above"),
        up(f"want-unknown{s}", "want of an object the repository lacks",
           fetch("want " + UNKNOWN + ("" if v2p else " side-band-64k"), *(["done"] if v2p else [])),
           200, 200, v2p=v2p, kind="hidden", contains=b"not our ref"),
        up(f"want-hidden{s}", "want of a hidden ref's commit",
           fetch("want {secret}" + ("" if v2p else " side-band-64k"), *(["done"] if v2p else [])),
           200, 200, v2p=v2p, kind="hidden", contains=b"ERR upload-pack: not our ref",
           why=V2_WANT_WHY if v2p else ""),
        up(f"want-not-hex{s}", "want HEAD (a name, not an id)", fetch("want HEAD", *(["done"] if v2p else [])),
           400, 200, v2p=v2p, kind="hidden", why="stock's 200 ends in its upload-pack's death"),
    ]
ROWS += [
    up("unknown-cap-v0", "an unknown capability on the first want (ignored, as git does)",
       v0("want {main} no-progress frobnicate=1 x-evil"), 200, 200, kind="caps"),
    up("unknown-cap-v2", "an unknown capability line in a v2 request", v2("fetch", "want {main}", "done",
       caps=("object-format=sha1", "frobnicate=1")), 400, 200, v2p=True, kind="caps",
       why="stock's upload-pack dies (`unknown capability`) after the headers: an empty 200; Aspen says so"),
    up("unknown-command-v2", "an unknown v2 command", v2("frobnicate"), 400, 200, v2p=True, kind="caps",
       why="as above"),
    up("unknown-fetch-arg-v2", "an unknown fetch argument", v2("fetch", "want {main}", "frobnicate", "done"),
       400, 200, v2p=True, kind="caps", why="as above"),
    up("want-ref-not-allowed", "want-ref without uploadpack.allowRefInWant",
       v2("fetch", "want-ref refs/hidden/secret", "done"), 400, 200, v2p=True, kind="hidden", why="as above"),
    up("ls-refs-hidden-prefix", "ls-refs asking for the hidden prefix (answered without it)",
       v2("ls-refs", "ref-prefix refs/hidden/"), 200, 200, v2p=True, kind="hidden", absent=b"refs/hidden"),
    up("ls-refs-nul-prefix", "NUL inside a ref-prefix", v2("ls-refs", "ref-prefix refs/\0hidden"), 200, 200,
       v2p=True, kind="nul", absent=b"refs/hidden"),
    up("want-nul", "NUL inside a want line", v0("want {main}\0side-band-64k"), 400, 200, kind="nul",
       why="stock's 200 carries no answer"),
    up("filter-not-allowed", "filter without uploadpack.allowFilter", v2("fetch", "want {main}", "filter blob:none",
       "done"), 400, 200, v2p=True, kind="caps", why="stock's 200 carries no answer"),
]

# --- pushes: hidden refs, corrupt objects, unconnected packs, refused names, enablement
ROWS += [
    rp("push-hidden-create", "creating a hidden ref", push(f"{ZERO} {{main}} refs/hidden/new"), 200, 200,
       kind="push-hidden", contains=b"ng refs/hidden/new deny updating a hidden ref"),
    rp("push-hidden-update", "moving a hidden ref", push("{secret} {main} refs/hidden/secret"), 200, 200,
       kind="push-hidden", contains=b"ng refs/hidden/secret deny updating a hidden ref"),
    rp("push-hidden-delete", "deleting a hidden ref", push(f"{{secret}} {ZERO} refs/hidden/secret",
       caps="report-status delete-refs"), 200, 200, kind="push-hidden",
       contains=b"ng refs/hidden/secret deny deleting a hidden ref"),
    rp("push-corrupt-zlib", "a pack whose object is not zlib", push(f"{ZERO} {{main}} refs/heads/corrupt",
       data=lambda w: pack(raw_object(3, b"0123456789", b"not zlib at all"))), 200, 200, kind="corrupt",
       contains=b"unpacker error"),
    rp("push-fsck-failure", "a commit with a broken author line (receive.fsckObjects)",
       push(f"{ZERO} {{main}} refs/heads/badauthor", data=lambda w: pack(commit_object(w.main, "broken"))),
       200, 200, kind="corrupt", contains=b"unpacker error"),
    rp("push-truncated-pack", "a pack cut short", push(f"{ZERO} {{main}} refs/heads/short",
       data=lambda w: pack(raw_object(3, b"x" * 1000))[:40]), 200, 200, kind="corrupt",
       contains=b"unpacker error"),
    rp("push-unconnected", "a commit whose parent the repository lacks", push(f"{ZERO} {{x}} refs/heads/unconnected",
       data=lambda w: pack(raw_object(1, UNCONNECTED), raw_object(2, b""))), 200, 200, kind="unconnected", contains=b"ng refs/heads/unconnected unpacker error"),
    rp("push-missing-object", "a ref set to an object sent nowhere", push(f"{ZERO} {UNKNOWN} refs/heads/nothing"),
       200, 200, kind="unconnected", contains=b"ng refs/heads/nothing missing necessary objects"),
    rp("push-name-dotdot", "ref name with `..`", push(f"{ZERO} {{main}} refs/heads/a..b"), 200, 200,
       kind="refname", contains=b"ng refs/heads/a..b funny refname"),
    rp("push-name-lock", "ref name ending .lock", push(f"{ZERO} {{main}} refs/heads/x.lock"), 200, 200,
       kind="refname", contains=b"ng refs/heads/x.lock funny refname"),
    rp("push-name-at-brace", "ref name with @{", push(ZERO + " {main} refs/heads/a@{{1}}"), 200, 200,
       kind="refname", contains=b"funny refname"),
    rp("push-name-control", "ref name with a control character", push(f"{ZERO} {{main}} refs/heads/a\x01b"),
       200, 200, kind="refname", contains=b"funny refname"),
    rp("push-name-outside-refs", "ref name outside refs/ (HEAD)", push(f"{ZERO} {{main}} HEAD"), 200, 200,
       kind="refname", contains=b"funny refname"),
    rp("push-name-trailing-slash", "ref name ending in /", push(f"{ZERO} {{main}} refs/heads/"), 200, 200,
       kind="refname", contains=b"funny refname"),
    rp("push-name-dotdot-path", "ref name climbing out of refs/", push(f"{ZERO} {{main}} refs/../../config"),
       200, 200, kind="refname", contains=b"funny refname"),
    rp("push-not-enabled", "receive-pack without a user, http.receivepack unset", push(f"{ZERO} {{main}} refs/heads/x"),
       403, 403, repo="locked.git", kind="enable"),
    rp("push-forged-user", "a Remote-User request header does not make a user",
       push(f"{ZERO} {{main}} refs/heads/x"), 403, 403, repo="locked.git", kind="enable",
       headers=(("Remote-User", "admin"), ("X-Remote-User", "admin"))),
    rp("push-disabled", "receive-pack with http.receivepack=false", push(f"{ZERO} {{main}} refs/heads/x"), 403, 403,
       repo="off.git", kind="enable"),
    get("adv-not-enabled", "receive-pack advertisement without a user", "/locked.git/info/refs?service=git-receive-pack",
        403, 403, kind="enable"),
]

# --- methods, content types, lengths, raw framing
ROWS += [
    Row("put-info-refs", "PUT on a GET route", "PUT", "/repo.git/info/refs", 405, 405, kind="method"),
    Row("get-upload-pack", "GET on the POST route", "GET", "/repo.git/git-upload-pack", 405, 405, kind="method"),
    up("wrong-content-type", "upload-pack with a receive-pack content type", v0("want {main}"), 415, 415,
       kind="method", headers=(("Content-Type", RP),)),
    Row("bad-content-length", "Content-Length: abc", "POST", "/repo.git/git-upload-pack", 400, None,
        send="raw", kind="method", body=(b"POST /repo.git/git-upload-pack HTTP/1.1\r\nHost: x\r\nContent-Type: " +
                                          UP.encode() + b"\r\nContent-Length: abc\r\nConnection: close\r\n\r\n0000"),
        why="gunicorn refuses it before any application; stock's own parse is in test_fetch_badinput"),
    Row("nul-in-header", "NUL inside the Git-Protocol header", "GET", "/repo.git/info/refs", 400, None, send="raw",
        kind="nul", body=b"GET /repo.git/info/refs?service=git-upload-pack HTTP/1.1\r\nHost: x\r\n"
                         b"Git-Protocol: version=2\0version=0\r\nConnection: close\r\n\r\n",
        why="gunicorn refuses a NUL in a header before any application"),
    Row("git-protocol-garbage", "a Git-Protocol header of 4 KB of garbage (v0 answer)", "GET",
        "/repo.git/info/refs?service=git-upload-pack", 200, 200, headers=(("Git-Protocol", "version=9:" + "x" * 4000),),
        kind="caps"),
]


def rows_by_mode(mode: str) -> list[Row]:
    return [r for r in ROWS if r.mode == mode]


# ---------------------------------------------------------------- sending a row

CLOSED = 0      # the server closed the connection without an answer (a request past its wall-clock bound)


@dataclass
class Answer:
    status: Optional[int]     # None: no answer before the hang guard; CLOSED: closed without one
    body: bytes
    raw: bytes = b""


def _request_head(row: Row, path: str, length: Optional[int]) -> bytes:
    lines = [f"{row.method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in row.headers]
    if row.send in ("chunked", "endless", "slow"):
        lines.append("Transfer-Encoding: chunked")
    elif length is not None and row.method != "GET":
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _read_answer(sock: socket.socket, guard: float) -> Answer:
    sock.settimeout(guard)
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except socket.timeout:
        if not data:
            return Answer(None, b"")
    except ConnectionResetError:
        pass
    if not data:
        return Answer(CLOSED, b"")
    head, _, body = data.partition(b"\r\n\r\n")
    try:
        status = int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return Answer(None, b"", data)
    if b"transfer-encoding: chunked" in head.lower():
        body = _dechunk(body)
    return Answer(status, body, data)


def _dechunk(data: bytes) -> bytes:
    out, pos = b"", 0
    while pos < len(data):
        end = data.find(b"\r\n", pos)
        if end < 0:
            break
        size = int(data[pos:end].split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += data[end + 2:end + 2 + size]
        pos = end + 4 + size
    return out


def _chunk(b: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(b), b) if b else b""


def exchange(port: int, row: Row, world: World, path: Optional[str] = None, guard: float = 40) -> Answer:
    """Send ROW to 127.0.0.1:PORT as it says, and read the whole answer (the server closes)."""
    path = path or row.path
    sock = socket.create_connection(("127.0.0.1", port), timeout=guard)
    try:
        if row.send == "raw":
            sock.sendall(row.body if isinstance(row.body, bytes) else row.body(world))
            return _read_answer(sock, guard)
        if row.send in ("endless", "slow"):
            gen = row.body(world)
            sock.sendall(_request_head(row, path, None))
            stop = threading.Event()

            def feed() -> None:
                try:
                    sent = 0
                    for piece in gen:
                        if stop.is_set() or sent > (1 << 31):
                            return
                        if row.send == "slow":
                            for i in range(len(piece)):
                                if stop.is_set():
                                    return
                                sock.sendall(_chunk(piece[i:i + 1]))
                                time.sleep(0.2)
                        else:
                            sock.sendall(_chunk(piece))
                        sent += len(piece)
                except OSError:
                    pass
            feeder = threading.Thread(target=feed, daemon=True)
            feeder.start()
            try:
                return _read_answer(sock, guard)
            finally:
                stop.set()
        body = row.body if isinstance(row.body, bytes) else row.body(world)
        if row.send == "stall":
            sock.sendall(_request_head(row, path, len(body)) + body[:len(body) // 2])
            return _read_answer(sock, guard)
        sock.sendall(_request_head(row, path, len(body) if row.method != "GET" else None))
        try:
            if row.send == "pieces":
                step = max(1, len(body) // 5)
                for i in range(0, len(body), step):
                    sock.sendall(body[i:i + step])
                    time.sleep(0.1)
            else:
                sock.sendall(body)
        except (BrokenPipeError, ConnectionResetError):
            pass    # answered before reading it all (413): the answer is still there
        return _read_answer(sock, guard)
    finally:
        sock.close()


# ---------------------------------------------------------------- servers

class _TranslatedHandler(_Handler):
    """The CGI host, mapping URLs the way a naive web server does: PATH_TRANSLATED = document root + PATH_INFO."""

    def _env(self) -> dict[str, str]:
        env = super()._env()
        env.pop("GIT_PROJECT_ROOT", None)
        env["PATH_TRANSLATED"] = self.server.settings["ASPEN_TEST_DOCROOT"] + env["PATH_INFO"]
        return env


def translated_server(root: Path, program: str) -> CgiServer:
    s = CgiServer(root, {"ASPEN_TEST_DOCROOT": str(root), "GIT_PROJECT_ROOT": ""}, program).start()
    s.httpd.RequestHandlerClass = _TranslatedHandler
    return s


def build_root(base: Path) -> Path:
    """The repositories every row may name."""
    root = base / "root"
    root.mkdir(parents=True)
    repo = h.make_history(root / "repo.git")
    secret = h.git("commit-tree", "-m", "secret", "main^{tree}", cwd=str(repo)).stdout.decode().strip()
    h.git("update-ref", "refs/hidden/secret", secret, cwd=str(repo))
    for k, v in (("uploadpack.hideRefs", "refs/hidden"), ("receive.hideRefs", "refs/hidden"),
                 ("http.receivepack", "true"), ("receive.fsckObjects", "true")):
        h.git("config", k, v, cwd=str(repo))
    h.git("repack", "-adq", cwd=str(repo))
    for name, cfg in (("locked.git", {}), ("off.git", {"http.receivepack": "false"}),
                      ("capped.git", {"http.receivepack": "true", "receive.maxInputSize": "1k"})):
        h.git("clone", "-q", "--bare", str(repo), str(root / name))
        for k, v in cfg.items():
            h.git("config", k, v, cwd=str(root / name))
    links = root / "links.git"
    h.git("clone", "-q", "--bare", "--no-local", str(repo), str(links))
    packdir = links / "objects" / "pack"
    real = sorted(p.name for p in packdir.iterdir() if p.suffix == ".pack")[0]
    (packdir / f"{FAKE_PACK}.pack").symlink_to("/etc/passwd")
    (packdir / f"{FAKE_PACK}.idx").symlink_to("/etc/hostname")
    inside = "pack-" + "b" * 40
    (packdir / f"{inside}.pack").symlink_to(real)
    (links / "inside.txt").write_text(inside)
    for loose, target in ((FAKE_LOOSE, "/etc/passwd"), (IN_ROOT_LOOSE, str(repo / "config"))):
        (links / "objects" / loose).parent.mkdir(exist_ok=True)
        (links / "objects" / loose).symlink_to(target)
    (links / "objects" / "info").mkdir(exist_ok=True)
    (links / "objects" / "info" / "alternates").symlink_to("/etc/passwd")
    (links / "info").mkdir(exist_ok=True)
    (links / "info" / "refs").symlink_to("/etc/passwd")
    outside = base / "outside.git"
    h.git("clone", "-q", "--bare", str(repo), str(outside))
    (root / "outside-link.git").symlink_to(outside)
    return root


@dataclass
class Servers:
    root: Path
    stock_root: Path
    world: World
    aspen: dict = field(default_factory=dict)     # (mode, server) -> server
    stock: dict = field(default_factory=dict)     # mode -> CgiServer
    outcomes: dict = field(default_factory=dict)  # row name -> (aspen status, stock status)

    def port(self, row: Row) -> int:
        s = self.aspen[(row.mode, row.server)]
        return s.port if hasattr(s, "port") else s.httpd.server_address[1]

    def url(self, mode: str, server: str = "main") -> str:
        return self.aspen[(mode, server)].url


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile")
    root = build_root(base)
    stock_base = base / "stock"
    stock_base.mkdir()
    shutil.copytree(root, stock_base / "root", symlinks=True)
    shutil.copytree(base / "outside.git", stock_base / "outside.git", symlinks=True)
    for r in (root, stock_base / "root"):
        os.mkfifo(r / "links.git" / "objects" / "info" / "http-alternates")
    os.unlink(stock_base / "root" / "outside-link.git")
    (stock_base / "root" / "outside-link.git").symlink_to(stock_base / "outside.git")
    repo = root / "repo.git"
    world = World(main=h.out("rev-parse", "main", cwd=str(repo)), topic=h.out("rev-parse", "topic", cwd=str(repo)),
                  secret=h.out("rev-parse", "refs/hidden/secret", cwd=str(repo)))
    world.x = hashlib.sha1(b"commit %d\0" % len(UNCONNECTED) + UNCONNECTED).hexdigest()
    srv = Servers(root, stock_base / "root", world)
    started = []
    try:
        srv.aspen[("root", "main")] = h.Server(root, {"ASPEN_ACCESS_LOG": "0"}).start()
        srv.aspen[("root", "limits")] = h.Server(root, dict(LIMITS_ENV, ASPEN_ACCESS_LOG="0")).start()
        srv.aspen[("translated", "main")] = translated_server(root, "aspen")
        srv.stock["root"] = CgiServer(srv.stock_root, {}, "stock").start()
        srv.stock["translated"] = translated_server(srv.stock_root, "stock")
        started = list(srv.aspen.values()) + list(srv.stock.values())
        yield srv
    finally:
        for s in started:
            s.stop()


def _path_for(row: Row, root: Path) -> str:
    if "{inside}" in row.path:
        return row.path.replace("{inside}", (root / "links.git" / "inside.txt").read_text())
    return row.path


def all_refs(root: Path) -> dict[str, dict[str, str]]:
    return {p.name: h.refs_of(str(p)) for p in sorted(root.iterdir())
            if p.suffix == ".git" and not p.is_symlink()}


def serves(url: str, repo: Path) -> None:
    """`git ls-remote` over HTTP lists exactly the repository's visible refs."""
    text = h.out("ls-remote", f"{url}/repo.git")
    listed = {name: oid for oid, name in (line.split("\t") for line in text.splitlines()) if name != "HEAD"}
    refs = {k: v for k, v in h.refs_of(str(repo)).items() if not k.startswith("refs/hidden/")}
    peeled = {k: v for k, v in listed.items() if k.endswith("^{}")}
    assert {k: v for k, v in listed.items() if k not in peeled} == refs


# ---------------------------------------------------------------- the tests

@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_row(servers, row):
    """Aspen gives the row's status (and its ERR or report line); stock gives the
    status the row records; the server serves normally right after; no ref moved."""
    before = all_refs(servers.root)
    path = _path_for(row, servers.root)
    guard = 30 if row.server == "limits" else 60
    got = exchange(servers.port(row), row, servers.world, path, guard)
    stock_status, stock_body = None, b""
    if row.stock is not None:
        sport = servers.stock[row.mode].httpd.server_address[1]
        theirs = exchange(sport, row, servers.world, _path_for(row, servers.stock_root), 60)
        stock_status, stock_body = theirs.status, theirs.body
    servers.outcomes[row.name] = (got.status, stock_status)
    assert got.status == row.status, f"{row.name}: Aspen answered {got.status}, the row says {row.status}: {got.raw[:300]!r}"
    assert stock_status == row.stock, f"{row.name}: stock answered {stock_status}, the row says {row.stock}"
    assert b"Traceback" not in got.body and b'File "' not in got.body
    if row.contains:
        assert row.contains in got.body, f"{row.name}: {got.body[:400]!r}"
        if row.stock is not None and not row.why:
            assert row.contains in stock_body, f"{row.name}: stock said {stock_body[:400]!r}"
    if row.absent:
        assert row.absent not in got.body, f"{row.name}: served {got.body[:200]!r}"
    assert all_refs(servers.root) == before
    serves(servers.url(row.mode, row.server), servers.root / "repo.git")


def test_after_the_table_a_clone_is_whole_and_no_server_logged_a_traceback(servers, tmp_path):
    for (mode, name), s in servers.aspen.items():
        dest = tmp_path / f"{mode}-{name}"
        h.git("clone", "-q", "--mirror", f"{s.url}/repo.git", str(dest))
        h.fsck_strict(str(dest))
        visible = {k: v for k, v in h.refs_of(str(servers.root / "repo.git")).items()
                   if not k.startswith("refs/hidden/")}
        assert h.refs_of(str(dest)) == visible
        assert "Traceback" not in s.log_text(), s.log_text()[-3000:]


def test_the_table_covers_every_kind_the_issue_lists(servers):
    kinds = Counter(r.kind for r in ROWS)
    for kind in ("traversal", "symlink", "nul", "pktlen", "endless", "slow", "gzip", "haves", "deepen", "caps",
                 "hidden", "push-hidden", "corrupt", "unconnected", "refname", "state", "enable"):
        assert kinds[kind] >= 1, kind
    assert len(ROWS) >= 60
    assert len({r.name for r in ROWS}) == len(ROWS)
    differs = [r for r in ROWS if r.stock != r.status]
    assert all(r.why for r in differs), [r.name for r in differs if not r.why]
    print("\n" + summary(servers.outcomes))


def summary(outcomes: Optional[dict] = None) -> str:
    counts = Counter(r.status for r in ROWS)
    text = f"{len(ROWS)} rows: " + ", ".join(f"{n}x{s}" for s, n in sorted(counts.items()))
    text += f"; {sum(r.stock != r.status for r in ROWS)} differ from stock"
    if outcomes:
        seen = Counter(a for a, _ in outcomes.values())
        text += f"\nobserved ({len(outcomes)} rows run): " + ", ".join(f"{n}x{s}" for s, n in sorted(seen.items(), key=str))
    return text


def table() -> str:
    lines = [f"{'row':32} {'mode':10} {'aspen':>5} {'stock':>5}  attacks / why (status 0: closed without an answer)"]
    for r in ROWS:
        lines.append(f"{r.name:32} {r.mode:10} {r.status:>5} {str(r.stock or '-'):>5}  {r.attacks}"
                     + (f"  [{r.why}]" if r.why else ""))
    return "\n".join(lines) + "\n" + summary()


if __name__ == "__main__":
    if "--table" in sys.argv:
        print(table())
