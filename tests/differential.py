"""Differential comparison of stock `git http-backend` and Aspen.

One request (CGI environment + body) goes to the stock binary (as a CGI),
to `aspen-cgi` (as a CGI) and to the WSGI application in process. The
answers are compared after normalising only what may legitimately differ:
dates (checked for form, then replaced), the agent string in
advertisements (and the pkt-line length of that line), pack bytes (packs
are indexed and compared as object sets), and progress (side-band 2:
compared as the sequence of its kinds of message, counts and timings
masked; see progress_kinds()).
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

from . import harness as h

DATE_RE = re.compile(r"^(Mon|Tue|Wed|Thu|Fri|Sat|Sun), ([1-9]|[12][0-9]|3[01]) "
                     r"(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{4} \d\d:\d\d:\d\d \+0000$")
NOCACHE = [("Expires", "Fri, 01 Jan 1980 00:00:00 GMT"), ("Pragma", "no-cache"),
           ("Cache-Control", "no-cache, max-age=0, must-revalidate")]
NOW_DATED = ("Date", "Expires")


def env_for(root, path: str, method: str = "GET", query: Optional[str] = None, **extra) -> dict:
    """A CGI environment for GIT_PROJECT_ROOT mode with export-all."""
    env = {"GIT_PROJECT_ROOT": str(root), "GIT_HTTP_EXPORT_ALL": "1", "REQUEST_METHOD": method,
           "PATH_INFO": path, "SERVER_PROTOCOL": "HTTP/1.1"}
    if query is not None:
        env["QUERY_STRING"] = query
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def post_env(root, repo: str, svc: str, body: bytes, **extra) -> dict:
    e = env_for(root, f"/{repo}/git-{svc}", "POST", CONTENT_TYPE=f"application/x-git-{svc}-request",
                CONTENT_LENGTH=str(len(body)))
    e.update(extra)
    return {k: v for k, v in e.items() if v is not None}


def norm_headers(headers, keep_status: bool = True) -> list[tuple[str, str]]:
    """Dates replaced by <date> after checking their form; Expires in 1980 kept as is."""
    out = []
    for k, v in headers:
        if not keep_status and k == "Status":
            continue
        if k in ("Date", "Expires") and v != NOCACHE[0][1]:
            assert DATE_RE.match(v), f"bad date form in {k}: {v!r}"
            v = "<date>"
        elif k == "Last-Modified":
            assert DATE_RE.match(v), f"bad date form in {k}: {v!r}"
        out.append((k, v))
    return out


# --- pkt-lines -----------------------------------------------------------------

def pkt(data) -> bytes:
    if isinstance(data, str):
        data = data.encode()
    return b"%04x" % (len(data) + 4) + data


FLUSH = b"0000"
DELIM = b"0001"


def tokens(body: bytes) -> list[tuple]:
    """("pkt", payload) / ("flush",) / ("delim",) / ("end",) / ("band", n, data) / ("raw", bytes)."""
    out: list[tuple] = []
    i = 0
    while i < len(body):
        if body[i:i + 4] == b"PACK":
            out.append(("raw", body[i:]))
            break
        head = body[i:i + 4]
        try:
            n = int(head, 16)
        except ValueError:
            out.append(("raw", body[i:]))
            break
        if n == 0:
            out.append(("flush",))
            i += 4
            continue
        if n == 1:
            out.append(("delim",))
            i += 4
            continue
        if n == 2:
            out.append(("end",))
            i += 4
            continue
        payload = body[i + 4:i + n]
        assert len(payload) == n - 4, f"truncated pkt-line at {i}: {body[i:i + 40]!r}"
        i += n
        if payload[:1] in (b"\x01", b"\x02", b"\x03"):
            out.append(("band", payload[0], payload[1:]))
        else:
            out.append(("pkt", payload))
    return out


def norm_advertisement(body: bytes) -> bytes:
    """Replace every agent=<x> by agent=X and re-frame the affected pkt-lines.
    What Aspen adds to protocol v2's capabilities by default (docs/differences.md)
    is left out: `packfile-uris` in `fetch=`, the `bundle-uri` line."""
    res = []
    dropped = 0
    for t in tokens(body):
        if t[0] == "pkt" and t[1] == b"bundle-uri\n":
            dropped += 1
            continue
        if t[0] == "pkt":
            line = re.sub(rb"agent=[^ \n\0]*", b"agent=X", t[1])
            if line.startswith(b"fetch="):
                line = line.replace(b" packfile-uris", b"")
            res.append(pkt(line))
        elif t[0] == "flush":
            res.append(FLUSH)
        elif t[0] == "delim":
            res.append(DELIM)
        elif t[0] == "end":
            res.append(b"0002")
        else:
            raise AssertionError(f"unexpected token in advertisement: {t!r}")
    out = b"".join(res)
    assert len(tokens(out)) == len(tokens(body)) - dropped
    return out


def pack_objects(pack: bytes, repo: Optional[str] = None) -> set[str]:
    """Index PACK (fixing a thin pack against REPO's objects) and return its object ids."""
    assert pack.startswith(b"PACK"), f"not a pack: {pack[:16]!r}"
    with tempfile.TemporaryDirectory() as tmp:
        objdir = Path(tmp) / "objects"
        (objdir / "pack").mkdir(parents=True)
        env = dict(os.environ)
        env["GIT_OBJECT_DIRECTORY"] = str(objdir)
        cwd = tmp
        if repo:
            env["GIT_ALTERNATE_OBJECT_DIRECTORIES"] = str(Path(repo) / "objects")
            env["GIT_DIR"] = str(repo)
        else:
            h.git("init", "-q", "--bare", str(Path(tmp) / "r.git"))
            env["GIT_DIR"] = str(Path(tmp) / "r.git")
        proc = subprocess.run(["git", "index-pack", "--stdin", "--fix-thin"], input=pack, cwd=cwd, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        assert proc.returncode == 0, f"index-pack failed: {proc.stderr.decode(errors='replace')}"
        name = proc.stdout.decode().split()[-1]
        idx = objdir / "pack" / f"pack-{name}.idx"
        show = subprocess.run(["git", "show-index"], stdin=open(idx, "rb"), stdout=subprocess.PIPE, check=True)
        return {line.split()[1] for line in show.stdout.decode().splitlines()}


@dataclass
class UploadResponse:
    control: list = field(default_factory=list)     # every non-sideband token, in order
    pack: bytes = b""
    progress: bytes = b""
    error: bytes = b""
    objects: set = field(default_factory=set)


def parse_upload_response(body: bytes, repo: Optional[str] = None) -> UploadResponse:
    r = UploadResponse()
    pack = bytearray()
    for t in tokens(body):
        if t[0] == "band":
            if t[1] == 1:
                pack += t[2]
            elif t[1] == 2:
                r.progress += t[2]
            else:
                r.error += t[2]
        elif t[0] == "raw":
            pack += t[1]
        else:
            r.control.append(t)
    r.pack = bytes(pack)
    if r.pack:
        check_pack_ends(r.pack, "response")      # before index-pack, which passes bytes after a pack through
        r.objects = pack_objects(r.pack, repo)
    return r


# --- side-band 2: progress ------------------------------------------------------------

# git's progress meters (progress.c display()): "Title: N", "Title:  P% (n/total)", each
# maybe followed by throughput (", 1.00 MiB | 2.00 MiB/s") and ", done."
PROGRESS_LINE = re.compile(rb"(?P<title>[A-Z][A-Za-z ]*[a-z]): +(?:\d+|\d+% \(\d+/\d+\))(?:, [^\r\n]*)?")
# pack-objects' last line
TOTAL_LINE = re.compile(rb"Total (?P<objects>\d+) \(delta \d+\)(?:, reused \d+ \(delta \d+\))?"
                        rb"(?:, pack-reused \d+)?")
# the one line Aspen writes instead when it answers from stored packs (fetch/planned.py)
ASPEN_LINE = re.compile(rb"Aspen: \d+ stored packs, (?P<objects>\d+) objects, \d+\.\d MiB")
# Meters git starts with start_delayed_progress(): shown only once the work has
# taken 2 s, so whether they appear at all is timing (rev-list --progress, the
# connectivity check of receive-pack).
DELAYED = {"Checking connectivity"}


def progress_kinds(data: bytes) -> list[tuple]:
    """Side-band 2 as the sequence of what it says: ("progress", title) for
    each meter (its updates, counts, throughput and "done" masked: they
    depend on timing and on how the pack was built; delayed meters left
    out), ("total",) for pack-objects' summary, ("aspen",) for Aspen's line
    for a stored-pack answer, and ("text", line) verbatim for anything else
    (hook output, warnings, errors)."""
    out: list[tuple] = []
    for seg in re.split(rb"[\r\n]", data):
        if not seg:
            continue
        m = PROGRESS_LINE.fullmatch(seg)
        if m:
            kind: tuple = ("progress", m["title"].decode())
            if kind[1] in DELAYED or out[-1:] == [kind]:
                continue
        elif TOTAL_LINE.fullmatch(seg):
            kind = ("total",)
        elif ASPEN_LINE.fullmatch(seg):
            kind = ("aspen",)
        else:
            kind = ("text", seg)
        out.append(kind)
    return out


def request_caps(request: bytes) -> set[str]:
    """The capabilities and fetch arguments of an upload-pack or receive-pack
    request (v0: on its first line; v2: the argument lines), gunzipped first."""
    if request[:2] == b"\x1f\x8b":
        try:
            request = gzip.decompress(request)
        except (OSError, EOFError):
            return set()
    caps: set[str] = set()
    first = True
    try:
        toks = tokens(request)             # a receive-pack request's pack is one ("raw", ...) at the end
    except AssertionError:                 # a malformed request: its well-formed start
        toks = []
    for t in toks:
        if t[0] != "pkt":
            continue
        line = t[1].rstrip(b"\n")
        if first and b"\0" in line:          # receive-pack: "old new ref\0caps"
            caps.update(line.split(b"\0", 1)[1].decode(errors="replace").split())
        elif first and line.startswith(b"want "):
            caps.update(line.decode(errors="replace").split()[2:])
        elif b" " not in line:
            caps.add(line.decode(errors="replace"))
        first = False
    return caps


def pack_count(pack: bytes) -> int:
    """The object count in a pack's header."""
    assert pack[:4] == b"PACK" and len(pack) >= 32, f"not a pack: {pack[:16]!r}"
    return int.from_bytes(pack[8:12], "big")


def check_pack_ends(pack: bytes, who: str) -> None:
    """PACK is one whole pack and nothing after it: its last 20 bytes are
    the SHA-1 of the rest (bytes after a pack would be outside any framing)."""
    assert len(pack) >= 32 and hashlib.sha1(pack[:-20]).digest() == pack[-20:], \
        f"{who}: the pack's trailer is not its checksum (bytes after the pack, or a broken pack): ...{pack[-40:]!r}"


def compare_progress(s: bytes, a: bytes, request: Optional[bytes], who: str,
                     packs: Optional[tuple[bytes, bytes]] = None) -> None:
    """Side-band 2 of stock (S) and Aspen (A) for the same request. The
    kinds of message must be the same, in the same order, except that an
    answer Aspen wrote from stored packs has its one line where git's
    meters were: then stock must have sent progress too. With `no-progress`
    (upload-pack) or `quiet` (receive-pack) in the request, Aspen sends no
    progress. PACKS (stock's, Aspen's): each side's object count must be
    the one its own summary line states."""
    ks, ka = progress_kinds(s), progress_kinds(a)
    caps = request_caps(request) if request is not None else set()
    asked = sorted(caps & {"no-progress", "quiet"})
    if asked:
        meters = [seg for seg in re.split(rb"[\r\n]", a)
                  if PROGRESS_LINE.fullmatch(seg) or TOTAL_LINE.fullmatch(seg) or ASPEN_LINE.fullmatch(seg)]
        assert meters == [], f"{who} sent progress though the request said {asked}: {a!r}"
        assert a == b"" or s != b"", f"{who} sent band 2 where stock sent none, the request saying {asked}: {a!r}"
    if ("aspen",) in ka:
        assert ka == [("aspen",)], f"{who}: Aspen's stored-pack line with more progress: {a!r}"
        git_meters = [k for k in ks if k[0] in ("progress", "total")]
        assert git_meters and len(git_meters) == len(ks), \
            f"{who} sent its stored-pack progress line where stock sent {'no progress' if not ks else 'more'}: stock={s!r}"
    else:
        assert ka == ks, f"{who} progress (band 2) differs:\n stock={ks!r}\n aspen={ka!r}\n raw stock={s!r}\n raw aspen={a!r}"
    if packs is not None:
        for data, pack, side in ((s, packs[0], "stock"), (a, packs[1], who)):
            for seg in re.split(rb"[\r\n]", data):
                m = TOTAL_LINE.fullmatch(seg) or ASPEN_LINE.fullmatch(seg)
                if m:
                    assert pack and int(m["objects"]) == pack_count(pack), \
                        f"{side}'s progress says {seg!r} but its pack holds {pack_count(pack) if pack else 0} objects"


def demux(body: bytes) -> dict[int, bytes]:
    bands = {1: b"", 2: b"", 3: b""}
    for t in tokens(body):
        if t[0] == "band":
            bands[t[1]] += t[2]
    return bands


# --- a planned answer's bytes ---------------------------------------------------------

PLANNED_BOUND = 1.02        # the product's promise: a planned answer's pack at most 2 % over stock's, per fetch
PLANNED = re.compile(rb"^aspen: .* plan=planned\b", re.M)


def planned(r: h.CgiResult) -> bool:
    """Whether Aspen answered R from stored packs: its access line (ASPEN_ACCESS_LOG=1) says plan=planned."""
    return PLANNED.search(r.stderr) is not None


def check_planned_bytes(stock_pack: bytes, aspen_pack: bytes, who: str) -> None:
    """The product's promise for a fetch answered from stored packs: its pack
    has at most PLANNED_BOUND times the bytes of stock's pack for the same request."""
    assert len(aspen_pack) <= PLANNED_BOUND * len(stock_pack), \
        f"{who}'s planned pack has {len(aspen_pack)} bytes, over {PLANNED_BOUND}x stock's {len(stock_pack)}"


# --- the three-way comparison ----------------------------------------------------

@dataclass
class Trio:
    stock: h.CgiResult
    cgi: h.CgiResult
    wsgi: Optional[h.CgiResult]

    @property
    def aspens(self) -> list[h.CgiResult]:
        return [r for r in (self.cgi, self.wsgi) if r is not None]


def shape(body: bytes) -> list[tuple]:
    """The framing of a response: every token outside the side-band as it
    is, each run of side-band packets as one ("bands",) (their channels'
    contents are compared on their own; how they interleave is timing), raw
    bytes as ("raw",) when they are a pack, else as they are."""
    out: list[tuple] = []
    for t in tokens(body):
        if t[0] == "band":
            if out[-1:] != [("bands",)]:
                out.append(("bands",))
        elif t[0] == "raw":
            out.append(("raw",) if t[1][:4] == b"PACK" else t)
        else:
            out.append(t)
    return out


def _band_sizes_ok(body: bytes, request: Optional[bytes], who: str) -> None:
    """Side-band packets within what the client negotiated: 1000 bytes for
    `side-band`, 65520 for `side-band-64k` (gitprotocol-pack)."""
    caps = request_caps(request) if request is not None else set()
    limit = 1000 if "side-band" in caps and "side-band-64k" not in caps else 65520
    big = max((len(t[2]) + 5 for t in tokens(body) if t[0] == "band"), default=0)
    assert big <= limit, f"{who}: a side-band packet of {big} bytes, over the {limit} the request allows"


def _compare_bodies(mode: str, s: bytes, a: bytes, repo: Optional[str], who: str,
                    request: Optional[bytes] = None, planned_answer: bool = False) -> None:
    """PLANNED_ANSWER: A was answered from stored packs, its pack bounded by stock's (mode `pack`)."""
    if mode == "exact":
        assert a == s, f"{who} body differs from stock:\n stock={s[:400]!r}\n aspen={a[:400]!r}"
    elif mode == "advert":
        assert norm_advertisement(a) == norm_advertisement(s), \
            f"{who} advertisement differs:\n stock={s[:600]!r}\n aspen={a[:600]!r}"
    elif mode == "pack":
        # the framing, every line outside the side-band and every byte outside pkt-lines exact
        assert shape(a) == shape(s), f"{who} framing differs:\n stock={shape(s)!r}\n aspen={shape(a)!r}"
        ps, pa = parse_upload_response(s, repo), parse_upload_response(a, repo)
        assert pa.control == ps.control, f"{who} control lines differ: {ps.control!r} vs {pa.control!r}"
        assert pa.objects == ps.objects, f"{who} object sets differ: {len(ps.objects)} vs {len(pa.objects)}"
        if planned_answer:
            check_planned_bytes(ps.pack, pa.pack, who)
        assert pa.error == ps.error, f"{who} band 3 differs: {ps.error!r} vs {pa.error!r}"
        compare_progress(ps.progress, pa.progress, request, who, (ps.pack, pa.pack))
        _band_sizes_ok(a, request, who)
    elif mode == "sideband":
        assert shape(a) == shape(s), f"{who} framing differs:\n stock={shape(s)!r}\n aspen={shape(a)!r}"
        bs, ba = demux(s), demux(a)
        assert ba[1] == bs[1], f"{who} band 1 differs:\n stock={bs[1]!r}\n aspen={ba[1]!r}"
        assert ba[3] == bs[3], f"{who} band 3 differs:\n stock={bs[3]!r}\n aspen={ba[3]!r}"
        compare_progress(bs[2], ba[2], request, who)
        _band_sizes_ok(a, request, who)
    else:
        raise ValueError(mode)


def check_trio(s: h.CgiResult, a: h.CgiResult, w: Optional[h.CgiResult], *, mode: str = "exact",
               stderr: Optional[str] = None, status: Optional[int] = None, repo: Optional[str] = None,
               request: Optional[bytes] = None) -> Trio:
    """REQUEST: the body all three were sent (what it asked for decides some
    of the checks: `no-progress`, `quiet`, the side-band's packet size)."""
    if status is not None:
        assert s.status == status, f"stock answered {s.status}, the test expects {status}: {s.stderr!r}"
    assert a.status == s.status, f"aspen-cgi {a.status} vs stock {s.status}; aspen stderr {a.stderr!r}"
    assert norm_headers(a.headers) == norm_headers(s.headers), \
        f"aspen-cgi headers differ:\n stock={s.headers}\n aspen={a.headers}"
    _compare_bodies(mode, s.body, a.body, repo, "aspen-cgi", request, planned(a))
    if w is not None:
        assert w.status == s.status, f"wsgi {w.status} vs stock {s.status}; wsgi errors {w.stderr!r}"
        assert sorted(norm_headers(w.headers, False)) == sorted(norm_headers(s.headers, False)), \
            f"wsgi headers differ:\n stock={s.headers}\n wsgi={w.headers}"
        _compare_bodies(mode, s.body, w.body, repo, "wsgi", request, planned(w))
    if stderr is not None:
        assert stderr.encode() in s.stderr, f"stock stderr {s.stderr!r} lacks {stderr!r}"
        for r, who in ((a, "aspen-cgi"), (w, "wsgi")):
            if r is not None:
                assert stderr.encode() in r.stderr, f"{who} stderr {r.stderr!r} lacks {stderr!r}"
    for r in (a, w):
        if r is not None:
            assert b"Traceback" not in r.stderr, r.stderr.decode(errors="replace")
    return Trio(s, a, w)


def _nonce_masked(r: h.CgiResult) -> h.CgiResult:
    """R with a receive-pack advertisement's push-cert nonce (a time stamp and
    its HMAC: it changes every second) masked, its pkt-line framed again."""
    if b"push-cert=" not in r.body:
        return r
    lines = [pkt(re.sub(rb"push-cert=[^ \n\0]*", b"push-cert=N", t[1])) if t[0] == "pkt" else FLUSH
             for t in tokens(r.body)]
    return replace(r, body=b"".join(lines))


def check_like_stock(env: dict, body: bytes, r: h.CgiResult) -> Trio:
    """R, Aspen's answer to the request ENV and BODY (a replayed one, the
    resident's), is stock's answer to it: status, headers and body as
    check_trio compares an aspen-cgi answer (a 200 to info/refs?service= as
    an advertisement, its agent masked; a push-cert nonce masked)."""
    s = h.stock(env, body)
    advert = s.status == 200 and "service=" in env.get("QUERY_STRING", "")
    return check_trio(_nonce_masked(s), _nonce_masked(r), None, mode="advert" if advert else "exact")


def compare(env: dict, body: bytes = b"", *, mode: str = "exact", stderr: Optional[str] = None,
            status: Optional[int] = None, with_wsgi: bool = True, repo: Optional[str] = None,
            timeout: float = 60) -> Trio:
    """Send the same request to stock, aspen-cgi and the WSGI app; assert they
    agree. Mode `pack`: Aspen's access line on, so that a planned answer is
    known and bounded (PLANNED_BOUND)."""
    s = h.stock(env, body, timeout=timeout)
    ours = dict(env, ASPEN_ACCESS_LOG="1") if mode == "pack" else env
    a = h.aspen(ours, body, timeout=timeout)
    w = h.wsgi(ours, body) if with_wsgi else None
    return check_trio(s, a, w, mode=mode, stderr=stderr, status=status, repo=repo, request=body)




def _background_work(path: Path) -> list:
    """Aspen's background work that may still write under PATH: detached
    builders and pre-warmers there (aspen-cgi's), and this process's
    background threads (the WSGI application's, which name no repository)."""
    return h.working_on(path) + [t.name for t in threading.enumerate() if t.name in h.BACKGROUND_THREADS]


def _remove_after_background_work(path: Path, timeout: float = 60.0) -> None:
    """rm -rf PATH once, as stock's tests delete a root they served. A pack
    builder or pre-warmer the last requests started may still run there: rm
    can meet a file one made between its listing of a directory and its
    rmdir (ENOTEMPTY, tests/test_background_builds.py). Then, once that work
    has noticed and ended, nothing of PATH's repositories may be left, as
    nothing of them is after stock; the directories rm could not remove
    above them are left empty, and are removed."""
    repos = h.git_dirs(path)
    errors = h.rm_rf(path)
    assert all(getattr(e, "errno", None) == errno.ENOTEMPTY for e in errors), errors
    if not errors:
        return
    deadline = time.monotonic() + timeout
    while _background_work(path):
        assert time.monotonic() < deadline, f"background work under {path} still runs: {_background_work(path)}"
        time.sleep(0.05)
    left = [str(g) for g in repos if os.path.lexists(g)]
    assert left == [], f"left after rm -rf {path} (which met {errors}) once the builders ended: {left}"
    files = sorted(str(p) for p in path.rglob("*") if not p.is_dir())
    assert files == [], f"left after rm -rf {path} (which met {errors}) once the builders ended: {files}"
    for dirpath, _, _ in sorted(os.walk(path), key=lambda w: -len(w[0])):
        os.rmdir(dirpath)


def triplicate(root: Path) -> tuple[Path, Path, Path]:
    """Three identical copies of a project root, for requests that change the repository."""
    out = []
    for name in ("stock-root", "cgi-root", "wsgi-root"):
        dest = root.parent / name
        if dest.exists():
            _remove_after_background_work(dest)
        try:
            shutil.copytree(root, dest, symlinks=True)
        except FileExistsError:
            left = sorted(str(p.relative_to(dest)) for p in dest.rglob("*"))
            raise AssertionError(f"{dest} was made again after rm -rf: {left}") from None
        out.append(dest)
    return tuple(out)


def compare_mutating(root: Path, make_env, body: bytes = b"", **kw) -> tuple[Trio, tuple[Path, Path, Path]]:
    """Like compare(), but each implementation gets its own copy of ROOT
    (make_env(root) builds the environment for a copy)."""
    rs, ra, rw = triplicate(root)
    s = h.stock(make_env(rs), body, timeout=kw.pop("timeout", 60))
    a = h.aspen(make_env(ra), body)
    w = h.wsgi(make_env(rw), body) if kw.pop("with_wsgi", True) else None
    return check_trio(s, a, w, request=body, **kw), (rs, ra, rw)


def aspen_both(env: dict, body: bytes = b"", timeout: float = 30) -> tuple[h.CgiResult, h.CgiResult]:
    """Aspen as CGI and through WSGI; asserts they agree on status and headers."""
    a = h.aspen(env, body, timeout=timeout)
    w = h.wsgi(env, body)
    assert a.status == w.status, f"aspen-cgi {a.status} vs wsgi {w.status}"
    assert sorted(norm_headers(a.headers, False)) == sorted(norm_headers(w.headers, False))
    assert a.body == w.body
    return a, w


def stock_raw(env: dict, body: bytes = b"", timeout: float = 30) -> tuple[bytes, bytes]:
    """Stock's raw stdout and stderr (for quirks the header parser cannot represent)."""
    full = dict(h.BASE_ENV)
    full.update(env)
    p = subprocess.run([h.STOCK], env=full, input=body, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout)
    return p.stdout, p.stderr


def v0_request(wants, haves=(), caps="multi_ack_detailed side-band-64k ofs-delta no-progress", done=True,
               extra=()) -> bytes:
    """A v0 upload-pack request: wants (caps on the first), extra lines, flush, haves, done."""
    lines = []
    for i, w in enumerate(wants):
        lines.append(pkt(f"want {w} {caps}\n" if i == 0 and caps else f"want {w}\n"))
    for e in extra:
        lines.append(pkt(e if e.endswith("\n") else e + "\n"))
    lines.append(FLUSH)
    for hv in haves:
        lines.append(pkt(f"have {hv}\n"))
    if done:
        lines.append(pkt("done\n"))
    else:
        lines.append(FLUSH)
    return b"".join(lines)


def v2_request(command: str, caps=(), args=()) -> bytes:
    out = [pkt(f"command={command}\n")]
    out += [pkt(c + "\n") for c in caps]
    out.append(DELIM)
    out += [pkt(a + "\n") for a in args]
    out.append(FLUSH)
    return b"".join(out)


def parse_cgi_head(head: bytes) -> list[tuple[str, str]]:
    return [tuple(line.decode("latin-1").split(": ", 1)) for line in head.split(b"\r\n") if line]
