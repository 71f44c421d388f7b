"""Differential comparison of stock `git http-backend` and Aspen.

One request (CGI environment + body) goes to the stock binary (as a CGI),
to `aspen-cgi` (as a CGI) and to the WSGI application in process. The
answers are compared after normalising only what may legitimately differ:
dates (checked for form, then replaced), the agent string in
advertisements (and the pkt-line length of that line), and pack bytes
(packs are indexed and compared as object sets).
"""

from __future__ import annotations

import os
import re
import shutil
import time
import subprocess
import tempfile
from dataclasses import dataclass, field
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
    """Replace every agent=<x> by agent=X and re-frame the affected pkt-lines."""
    res = []
    for t in tokens(body):
        if t[0] == "pkt":
            res.append(pkt(re.sub(rb"agent=[^ \n\0]*", b"agent=X", t[1])))
        elif t[0] == "flush":
            res.append(FLUSH)
        elif t[0] == "delim":
            res.append(DELIM)
        elif t[0] == "end":
            res.append(b"0002")
        else:
            raise AssertionError(f"unexpected token in advertisement: {t!r}")
    out = b"".join(res)
    assert len(tokens(out)) == len(tokens(body))
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
        r.objects = pack_objects(r.pack, repo)
    return r


def demux(body: bytes) -> dict[int, bytes]:
    bands = {1: b"", 2: b"", 3: b""}
    for t in tokens(body):
        if t[0] == "band":
            bands[t[1]] += t[2]
    return bands


# --- the three-way comparison ----------------------------------------------------

@dataclass
class Trio:
    stock: h.CgiResult
    cgi: h.CgiResult
    wsgi: Optional[h.CgiResult]

    @property
    def aspens(self) -> list[h.CgiResult]:
        return [r for r in (self.cgi, self.wsgi) if r is not None]


def _compare_bodies(mode: str, s: bytes, a: bytes, repo: Optional[str], who: str) -> None:
    if mode == "exact":
        assert a == s, f"{who} body differs from stock:\n stock={s[:400]!r}\n aspen={a[:400]!r}"
    elif mode == "advert":
        assert norm_advertisement(a) == norm_advertisement(s), \
            f"{who} advertisement differs:\n stock={s[:600]!r}\n aspen={a[:600]!r}"
    elif mode == "pack":
        ps, pa = parse_upload_response(s, repo), parse_upload_response(a, repo)
        assert pa.control == ps.control, f"{who} control lines differ: {ps.control!r} vs {pa.control!r}"
        assert pa.objects == ps.objects, f"{who} object sets differ: {len(ps.objects)} vs {len(pa.objects)}"
        assert bool(pa.error) == bool(ps.error), f"{who} band 3 differs: {ps.error!r} vs {pa.error!r}"
    elif mode == "sideband":
        bs, ba = demux(s), demux(a)
        assert ba[1] == bs[1] and ba[3] == bs[3], f"{who} sideband differs: {bs!r} vs {ba!r}"
    elif mode == "none":
        pass
    else:
        raise ValueError(mode)


def check_trio(s: h.CgiResult, a: h.CgiResult, w: Optional[h.CgiResult], *, mode: str = "exact",
               stderr: Optional[str] = None, status: Optional[int] = None, repo: Optional[str] = None) -> Trio:
    if status is not None:
        assert s.status == status, f"stock answered {s.status}, the test expects {status}: {s.stderr!r}"
    assert a.status == s.status, f"aspen-cgi {a.status} vs stock {s.status}; aspen stderr {a.stderr!r}"
    assert norm_headers(a.headers) == norm_headers(s.headers), \
        f"aspen-cgi headers differ:\n stock={s.headers}\n aspen={a.headers}"
    _compare_bodies(mode, s.body, a.body, repo, "aspen-cgi")
    if w is not None:
        assert w.status == s.status, f"wsgi {w.status} vs stock {s.status}; wsgi errors {w.stderr!r}"
        assert sorted(norm_headers(w.headers, False)) == sorted(norm_headers(s.headers, False)), \
            f"wsgi headers differ:\n stock={s.headers}\n wsgi={w.headers}"
        _compare_bodies(mode, s.body, w.body, repo, "wsgi")
    if stderr is not None:
        assert stderr.encode() in s.stderr, f"stock stderr {s.stderr!r} lacks {stderr!r}"
        for r, who in ((a, "aspen-cgi"), (w, "wsgi")):
            if r is not None:
                assert stderr.encode() in r.stderr, f"{who} stderr {r.stderr!r} lacks {stderr!r}"
    for r in (a, w):
        if r is not None:
            assert b"Traceback" not in r.stderr, r.stderr.decode(errors="replace")
    return Trio(s, a, w)


def compare(env: dict, body: bytes = b"", *, mode: str = "exact", stderr: Optional[str] = None,
            status: Optional[int] = None, with_wsgi: bool = True, repo: Optional[str] = None,
            timeout: float = 60) -> Trio:
    """Send the same request to stock, aspen-cgi and the WSGI app; assert they agree."""
    s = h.stock(env, body, timeout=timeout)
    a = h.aspen(env, body, timeout=timeout)
    w = h.wsgi(env, body) if with_wsgi else None
    return check_trio(s, a, w, mode=mode, stderr=stderr, status=status, repo=repo)


def _remove_after_background_work(path: Path, timeout: float = 60.0) -> None:
    """rm -rf PATH; while a pack builder the last push started there is still
    writing, rm -rf can race it: a directory not empty yet, or a file the
    builder removed itself first (FileNotFoundError half-way, with most of
    PATH still there): try again until PATH is gone. (The race is Aspen's
    known limit: tests/test_background_builds.py.)"""
    deadline = time.monotonic() + timeout
    while True:
        try:
            shutil.rmtree(path)
            return
        except OSError:
            if not os.path.lexists(path):
                return
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


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
    return check_trio(s, a, w, **kw), (rs, ra, rw)


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
