"""The whole request pipeline in process: `handle()` over a real repository,
with fuzzed bodies and fuzzed CGI variables (method, PATH_INFO, QUERY_STRING,
CONTENT_TYPE, Content-Encoding, Git-Protocol, CONTENT_LENGTH). Runs git, so
slower. A crash is a traceback anywhere (response, log, late messages, the
stderr git and threads write to), a 5xx that is not deliberate, a body that
breaks while it is read, or a hang."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tempfile
import threading
import traceback
from dataclasses import dataclass
from typing import Iterator, Optional

from hypothesis import strategies as st

from aspen_cgi.http.backend import handle
from aspen_cgi.http.body import BodyError
from aspen_cgi.http.message import Request

from . import corpus as corpus_mod
from . import strategies as S
from .corpus import REPO, USER
from .model import Crash, Run, Session, Target

DEADLINE = 60.0          # seconds one request may take before it counts as a hang
MAX_RESPONSE = 64 << 20


@dataclass(frozen=True)
class HttpInput:
    method: Optional[str]
    path_info: str
    query: str
    content_type: Optional[str]
    content_encoding: Optional[str]
    git_protocol: Optional[str]
    content_length: Optional[str]     # "exact", None (read to EOF), or the CONTENT_LENGTH text
    body: bytes
    remote_user: bool = True
    cache: bool = True                # Aspen's response cache on (its default) or off

    def env(self, base: dict) -> dict:
        env = dict(base)
        env["ASPEN_CACHE"] = "on" if self.cache else "off"
        if self.method is not None:
            env["REQUEST_METHOD"] = self.method
        env["PATH_INFO"] = self.path_info
        env["QUERY_STRING"] = self.query
        env["SERVER_PROTOCOL"] = "HTTP/1.1"
        for key, value in (("CONTENT_TYPE", self.content_type), ("HTTP_CONTENT_ENCODING", self.content_encoding),
                           ("HTTP_GIT_PROTOCOL", self.git_protocol)):
            if value is not None:
                env[key] = value
        if self.content_length == "exact":
            env["CONTENT_LENGTH"] = str(len(self.body))
        elif self.content_length is not None:
            env["CONTENT_LENGTH"] = self.content_length
        if self.remote_user:
            env["REMOTE_USER"] = USER
        return env

    def request(self, base: dict) -> Request:
        length = len(self.body) if self.content_length == "exact" else None
        return Request(self.env(base), io.BytesIO(self.body), length)


# ---------------------------------------------------------------- inputs

_PATHS = [f"/{REPO}/info/refs", f"/{REPO}/HEAD", f"/{REPO}/objects/info/packs", f"/{REPO}/objects/info/alternates",
          f"/{REPO}/objects/pack/pack-{'a' * 40}.pack", f"/{REPO}/git-upload-pack", f"/{REPO}/git-receive-pack",
          "/", "", "/../etc/passwd", f"/{REPO}/../{REPO}/info/refs", f"//{REPO}/info/refs", f"/{REPO}/./HEAD",
          f"/{REPO}.git/info/refs", f"/{REPO}/.git/git-upload-pack", "~root/x/info/refs", "/nope.git/git-upload-pack",
          f"/{REPO}/git-upload-pack\udcff", f"/{REPO}\x00/HEAD", f"/{REPO}/objects/ab/{'c' * 38}"]
_TYPES = ["application/x-git-upload-pack-request", "application/x-git-receive-pack-request", "", "text/plain",
          "application/x-git-upload-pack-request; charset=utf-8", "APPLICATION/X-GIT-UPLOAD-PACK-REQUEST"]
_ENCODINGS = ["gzip", "x-gzip", "deflate", "identity", "", "gzip, gzip", "GZIP"]
_PROTOCOLS = ["version=2", "version=1", "version=0", "version=2:object-format=sha1", "version=3", "version=",
              "version=1:version=2", "foo", ":", "version=2\0"]
_LENGTHS = ["0", "-1", "1k", "0x10", "010", " 5", "5 ", "abc", "99999999999999999999", "1g", "+3", "", "9" * 5000]


def _text(seeds: list[str]) -> st.SearchStrategy:
    return st.one_of(st.sampled_from(seeds), S.mutated([x.encode("utf-8", "surrogateescape") for x in seeds],
                                                       max_ops=2).map(lambda b: b.decode("latin-1")))


def _header(value: Optional[str]) -> Optional[str]:
    """A header as a server passes it on: no NUL, CR or LF (gunicorn refuses them; a CGI
    environment cannot hold NUL). PATH_INFO keeps them: %00 in a URL decodes to NUL."""
    return None if value is None else value.replace("\0", "").replace("\r", "").replace("\n", "")


@st.composite
def _inputs(draw, s: Session) -> HttpInput:
    seeds = [r for r in s.corpus.requests]
    seed = draw(st.sampled_from(seeds))
    oids, packs = s.corpus.oids(), s.corpus.packs()
    service = seed.service if seed.method == "POST" else draw(st.sampled_from(["git-upload-pack", "git-receive-pack"]))
    version2 = "version=2" in seed.git_protocol
    if service == "git-receive-pack":
        structured = S.receive_requests(oids, packs)
    else:
        structured = S.v2_requests(oids) if version2 else S.v0_requests(oids)
    plain = draw(st.one_of(st.just(seed.plain_body), S.mutated([seed.plain_body or b"0000"]), structured,
                           structured, st.binary(max_size=64)))
    body, gz = plain, False
    encoding = seed.content_encoding or None
    if draw(st.integers(0, 3)) == 0:
        gz = True
        body = S.gzipped(plain, draw(st.integers(0, 3)))
        encoding = "gzip"
    if draw(st.integers(0, 4)) == 0:
        encoding = draw(st.none() | st.sampled_from(_ENCODINGS) | st.text(max_size=8))
    elif seed.content_encoding and not gz:
        body = seed.body if plain == seed.plain_body else S.gzipped(plain, 0)
    path = f"/{REPO}/{service}"
    method = "POST"
    if draw(st.integers(0, 5)) == 0:
        path = draw(_text(_PATHS + [seed.path]))
        method = draw(st.sampled_from(["GET", "POST", "HEAD", "PUT", ""]) | st.none())
    ctype = f"application/x-{service}-request"
    if draw(st.integers(0, 6)) == 0:
        ctype = draw(st.none() | _text(_TYPES))
    protocol = seed.git_protocol or None
    if draw(st.integers(0, 4)) == 0:
        protocol = draw(st.none() | _text(_PROTOCOLS))
    query = ""
    if draw(st.integers(0, 6)) == 0:
        query = draw(_text(["service=git-upload-pack", "service=git-receive-pack", "service=", "service",
                            "a&service=git-upload-pack", "%73ervice=git-upload-pack"]))
        if draw(st.booleans()):
            method, path = "GET", f"/{REPO}/info/refs"
    length: Optional[str] = "exact"
    if draw(st.integers(0, 5)) == 0:
        length = draw(st.none() | _text(_LENGTHS) | st.integers(0, len(body) + 64).map(str))
    return HttpInput(method, path, _header(query), _header(ctype), _header(encoding), _header(protocol),
                     _header(length), body,
                     remote_user=draw(st.integers(0, 9)) > 0, cache=draw(st.booleans()))


def _push_values(s: Session) -> list[str]:
    """New values a push names: the repository's commits (eight times over, as most pushes
    name commits), its tags and trees, and what the clients named (some of it not on the server)."""
    found = corpus_mod.objects(s.root / REPO)
    return sorted(found.get("commit", [])) * 8 + found.get("tag", []) + found.get("tree", [])[:5] + s.corpus.oids()


@st.composite
def _push_inputs(draw, s: Session, values: list[str]) -> HttpInput:
    """Well-framed pushes only: the ref checks, the ref store and the ref writes
    see far more commands than the mixed pipeline gives them."""
    body = draw(S.receive_requests(values, s.corpus.packs()))
    return HttpInput("POST", f"/{REPO}/git-receive-pack", "", "application/x-git-receive-pack-request", None, None,
                     "exact", body, remote_user=True, cache=True)


# ---------------------------------------------------------------- running one request

@dataclass
class Answer:
    status: int = 0
    reason: str = ""
    body: bytes = b""
    log: str = ""
    trace: Optional[dict] = None
    error: Optional[BaseException] = None
    error_tb: str = ""


def answer(req: Request) -> Answer:
    """handle(REQ) with its body read to the end (in this thread, no deadline)."""
    out = Answer()
    _serve(req, out)
    return out


def _serve(req: Request, out: Answer) -> None:
    try:
        resp = handle(req)
    except BaseException as e:   # handle() promises to never raise
        out.error, out.error_tb = e, traceback.format_exc()
        return
    out.status, out.reason, out.trace = resp.status, resp.reason, resp.trace
    messages = list(resp.log)
    chunks, size = [], 0
    try:
        for chunk in resp.body:
            size += len(chunk)
            if size <= MAX_RESPONSE:
                chunks.append(chunk)
    except BodyError as e:
        messages.append(f"(body ended: {e})")
    except BaseException as e:
        out.error, out.error_tb = e, traceback.format_exc()
    finally:
        try:
            resp.close()
        except BaseException as e:
            out.error, out.error_tb = e, traceback.format_exc()
    if resp.late is not None:
        messages += resp.late()
    out.body = b"".join(chunks)
    out.log = "".join(m if m.endswith("\n") else m + "\n" for m in messages)


def _thread_stack(thread: threading.Thread) -> str:
    frame = sys._current_frames().get(thread.ident)
    return "".join(traceback.format_stack(frame)) if frame is not None else ""


def _outcome(inp: HttpInput, ans: Answer) -> str:
    words = ans.log.strip().splitlines()[0][:40] if ans.log.strip() else ""
    words = "".join("_" if c.isdigit() else c for c in words.split("'")[0])
    trace = ans.trace or {}
    kind = "pack" if ans.status == 200 and b"PACK" in ans.body else "ERR" if b"ERR " in ans.body[:64] else ""
    what = trace.get("push") or (f"{trace['plan']}:{trace.get('why', '')}" if trace.get("plan") else "")
    return " ".join(x for x in (trace.get("service", "-"), str(ans.status), kind, what, words) if x)


def deliberate_5xx(status: int, log: str) -> bool:
    """503 (overloaded) and the 500s stock also gives (aliased path, dubious
    ownership, bad gitfile, bad buffer setting), each with a `fatal:` message."""
    return status == 503 or (status == 500 and log.startswith("fatal:") and "internal error" not in log)


def base_env(s: Session) -> dict:
    """The server's environment every fuzzed request starts from: fuzz.git
    under GIT_PROJECT_ROOT, exported, version packs on."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(s.workdir), "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_PROJECT_ROOT": str(s.root), "GIT_HTTP_EXPORT_ALL": "1", "ASPEN_ACCESS_LOG": "0",
            "REMOTE_ADDR": "127.0.0.1", "ASPEN_VERSION_PACKS": "auto"}


class _Pipeline:
    def __init__(self, s: Session):
        self.session = s
        self.base = base_env(s)
        self.stderr = tempfile.TemporaryFile(mode="w+", buffering=1, dir=str(s.workdir))
        self.hung = 0

    def __call__(self, inp: HttpInput) -> str:
        self.stderr.flush()
        fd = self.stderr.fileno()
        start = os.fstat(fd).st_size
        ans = Answer()
        t = threading.Thread(target=_serve, args=(inp.request(self.base), ans), daemon=True, name="fuzz-request")
        t.start()
        t.join(DEADLINE)
        if t.is_alive():
            self.hung += 1
            raise Crash("hang", f"no answer within {DEADLINE:.0f}s\n{_thread_stack(t)}")
        self.stderr.flush()
        stderr = os.pread(fd, os.fstat(fd).st_size - start, start).decode("utf-8", "replace")
        if ans.error is not None:
            raise Crash(f"raised {type(ans.error).__name__}", ans.error_tb)
        for where, text in (("body", ans.body.decode("utf-8", "replace")), ("log", ans.log), ("stderr", stderr)):
            if "Traceback" in text or "internal error" in text:
                raise Crash(f"traceback in {where}", text[-4000:])
        if ans.status >= 500 and not deliberate_5xx(ans.status, ans.log):
            raise Crash(f"status {ans.status}", ans.log[-4000:])
        if not 200 <= ans.status < 600:
            raise Crash("bad status", repr(ans.status))
        return _outcome(inp, ans)

    def end_check(self) -> None:
        """The repository after every push the fuzzer made: refs point at
        objects that exist, and the ref store agrees with the disk."""
        gitdir = self.session.root / REPO
        fsck = subprocess.run(["git", "fsck", "--connectivity-only", "--no-progress", "--no-dangling"],
                              cwd=str(gitdir), capture_output=True, timeout=300)
        if fsck.returncode != 0:
            raise Crash("repository broken", fsck.stderr.decode(errors="replace")[-4000:])
        verify = subprocess.run([sys.executable, "-m", "aspen_cgi.cli", "verify", "-q", str(gitdir)],
                                capture_output=True, timeout=300)
        if verify.returncode != 0:
            raise Crash("ref store inconsistent", (verify.stdout + verify.stderr).decode(errors="replace")[-4000:])


@contextlib.contextmanager
def _open(s: Session) -> Iterator[Run]:
    # version packs built, so that fetches are planned and spliced by Aspen, not only handed to git
    subprocess.run([sys.executable, "-m", "aspen_cgi.cli", "import", "-q", str(s.root / REPO)], check=True,
                   capture_output=True, timeout=600)
    p = _Pipeline(s)
    with contextlib.redirect_stderr(p.stderr):    # git children and stray thread tracebacks write here
        try:
            yield p
        finally:
            p.stderr.flush()
    if not p.hung:
        p.end_check()
    p.stderr.close()


TARGETS = [
    Target("pipeline", "handle() in process over fuzz.git: upload-pack v0/v2, receive-pack, fuzzed CGI variables",
           lambda s: _inputs(s), _open, slow=True),
    Target("push", "handle() over fuzz.git with well-framed receive-pack requests: commands, options, packs",
           lambda s: _push_inputs(s, _push_values(s)), _open, slow=True),
]
