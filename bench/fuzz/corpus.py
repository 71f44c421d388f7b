"""The seed corpus: real requests captured from real git clients.

A small deterministic repository (fixed dates, so the same object IDs on
every machine) is served by Aspen's WSGI application in this process behind
a recording wrapper; git clones, fetches (v0 and v2, depth, filter, with
haves, gzipped) and pushes (new branch, push options, atomic, delete) go
through it, and every request's method, path, query, headers and raw body
are kept. The fuzzers start from these bytes."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional
from wsgiref.simple_server import WSGIRequestHandler, make_server

REPO = "fuzz.git"
_OID = re.compile(rb"[0-9a-f]{40}")
USER = "fuzzer"


@dataclass(frozen=True)
class Captured:
    """One request as a git client sent it."""
    label: str                 # what the client was doing (clone-v0, push-options, ...)
    method: str
    path: str                  # PATH_INFO, e.g. /fuzz.git/git-upload-pack
    query: str
    content_type: str
    content_encoding: str
    git_protocol: str
    body: bytes                # as sent (gzipped when content_encoding says so)

    @property
    def service(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def plain_body(self) -> bytes:
        return gzip.decompress(self.body) if self.content_encoding in ("gzip", "x-gzip") else self.body


@dataclass
class Corpus:
    requests: list[Captured] = field(default_factory=list)

    def posts(self, service: str, version: Optional[int] = None) -> list[Captured]:
        out = [r for r in self.requests if r.method == "POST" and r.service == f"git-{service}"]
        if version is not None:
            out = [r for r in out if ("version=2" in r.git_protocol) == (version == 2)]
        return out

    def bodies(self, service: str, version: Optional[int] = None) -> list[bytes]:
        return [r.plain_body for r in self.posts(service, version)]

    def seeds(self, service: str, version: Optional[int] = None) -> list[bytes]:
        """The non-empty request bodies of SERVICE (never an empty list)."""
        return [b for b in self.bodies(service, version) if b] or [b"0000"]

    def oids(self) -> list[str]:
        """Every object ID the clients named (wants, haves, old and new values)."""
        found = sorted({m.group(0).decode() for r in self.requests for m in _OID.finditer(r.plain_body)})
        return found or ["0" * 40]

    def packs(self) -> list[bytes]:
        """The packs the pushes carried."""
        return [b[b.find(b"PACK"):] for b in self.bodies("receive-pack") if b"PACK" in b]

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        index = []
        for i, r in enumerate(self.requests):
            name = f"{i:02d}-{r.label}-{r.method.lower()}"
            if r.body:
                (folder / f"{name}.body").write_bytes(r.body)
            index.append({**{k: v for k, v in asdict(r).items() if k != "body"}, "file": f"{name}.body",
                          "bytes": len(r.body)})
        (folder / "index.json").write_text(json.dumps(index, indent=1) + "\n")


# ---------------------------------------------------------------- the repository

def _git(*args: str, cwd: Path, env: Optional[dict] = None, check: bool = True) -> subprocess.CompletedProcess:
    full = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", **(env or {})}
    res = subprocess.run(["git", *args], cwd=str(cwd), env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         timeout=120)
    if check and res.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {res.stderr.decode(errors='replace')}")
    return res


def _dated(n: int) -> dict:
    date = f"2024-01-{n + 1:02d}T12:00:00+00:00"
    return {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date, "GIT_AUTHOR_NAME": "Fuzz",
            "GIT_AUTHOR_EMAIL": "fuzz@example.com", "GIT_COMMITTER_NAME": "Fuzz",
            "GIT_COMMITTER_EMAIL": "fuzz@example.com"}


def make_repo(root: Path, name: str = REPO) -> Path:
    """A small bare repository under ROOT with fixed object IDs: 6 commits on
    main with nested files, a branch `topic` merged, an annotated and a light tag.
    Pushes are open to the fuzzer, with push options and filters advertised."""
    work = root / (name + ".work")
    bare = root / name
    _git("init", "-q", "-b", "main", str(work), cwd=root)
    for i in range(6):
        d = work / "src" / f"d{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"file{i}.txt").write_text("".join(f"line {j} of commit {i}\n" for j in range(20 + i)))
        (work / "README").write_text(f"readme version {i}\n" * (i + 1))
        _git("add", "-A", cwd=work)
        _git("commit", "-q", "-m", f"commit {i}", cwd=work, env=_dated(i))
    _git("checkout", "-q", "-b", "topic", cwd=work)
    (work / "topic.txt").write_text("on topic\n")
    _git("add", "-A", cwd=work)
    _git("commit", "-q", "-m", "work on topic", cwd=work, env=_dated(7))
    _git("checkout", "-q", "main", cwd=work)
    _git("merge", "-q", "--no-ff", "-m", "merge topic", "topic", cwd=work, env=_dated(8))
    _git("tag", "-a", "v1.0", "-m", "release 1.0", "HEAD~1", cwd=work, env=_dated(8))
    _git("tag", "light", "HEAD", cwd=work)
    _git("clone", "-q", "--bare", str(work), str(bare), cwd=root)
    _git("remote", "remove", "origin", cwd=bare, check=False)
    for key, value in (("http.receivepack", "true"), ("receive.advertisepushoptions", "true"),
                       ("uploadpack.allowfilter", "true")):
        _git("config", key, value, cwd=bare)
    shutil.rmtree(work)
    return bare


def objects(gitdir: Path) -> dict[str, list[str]]:
    """The repository's object IDs by type (commit, tree, blob, tag)."""
    res = _git("cat-file", "--batch-all-objects", "--batch-check=%(objecttype) %(objectname)", cwd=gitdir)
    out: dict[str, list[str]] = {}
    for line in res.stdout.decode().splitlines():
        kind, _, oid = line.partition(" ")
        out.setdefault(kind, []).append(oid)
    return out


# ---------------------------------------------------------------- capture

class _Quiet(WSGIRequestHandler):
    def log_message(self, *args) -> None:
        pass


class _Recorder:
    """A WSGI wrapper around Aspen that keeps each request's bytes."""

    def __init__(self, root: Path):
        from aspen_cgi.wsgi import application
        self.app = application
        self.root = root
        self.label = ""
        self.seen: list[Captured] = []

    def __call__(self, environ, start_response):
        import io
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        self.seen.append(Captured(self.label, environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""),
                                  environ.get("QUERY_STRING", ""), environ.get("CONTENT_TYPE", ""),
                                  environ.get("HTTP_CONTENT_ENCODING", ""), environ.get("HTTP_GIT_PROTOCOL", ""),
                                  body))
        environ["wsgi.input"] = io.BytesIO(body)
        environ.update({"GIT_PROJECT_ROOT": str(self.root), "GIT_HTTP_EXPORT_ALL": "1", "REMOTE_USER": USER,
                        "ASPEN_ACCESS_LOG": "0", "ASPEN_CACHE": "off", "ASPEN_VERSION_PACKS": "off"})
        return self.app(environ, start_response)


def capture(root: Path, scratch: Path) -> Corpus:
    """Serve ROOT/fuzz.git (made by make_repo) to real git clients and record
    what they send. ROOT's repository is changed by the pushes."""
    recorder = _Recorder(root)
    server = make_server("127.0.0.1", 0, recorder, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_port}/{REPO}"
    scratch.mkdir(parents=True, exist_ok=True)
    env = {"GIT_TERMINAL_PROMPT": "0", "HOME": str(scratch)}

    def run(label: str, *args: str, cwd: Path = scratch, n: int = 20) -> None:
        recorder.label = label
        _git(*args, cwd=cwd, env={**env, **_dated(n)})

    try:
        run("clone-v0", "-c", "protocol.version=0", "clone", "-q", url, "c0")
        run("clone-v2", "-c", "protocol.version=2", "clone", "-q", url, "c2")
        run("clone-v1", "-c", "protocol.version=1", "clone", "-q", "--bare", url, "c1")
        run("depth-v2", "-c", "protocol.version=2", "clone", "-q", "--depth", "1", url, "d2")
        run("depth-v0", "-c", "protocol.version=0", "clone", "-q", "--depth", "1", "--no-single-branch", url, "d0")
        run("filter-v2", "-c", "protocol.version=2", "clone", "-q", "--filter=blob:none", url, "f2")
        run("ls-remote-v2", "-c", "protocol.version=2", "ls-remote", url)
        c2, c0 = scratch / "c2", scratch / "c0"
        (c2 / "new.txt").write_text("new work\n" * 50)
        _git("add", "-A", cwd=c2)
        _git("commit", "-q", "-m", "new work", cwd=c2, env=_dated(21))
        run("push-options", "-c", "protocol.version=0", "push", "-q", "-o", "ci.skip", "-o", "reviewer=alice",
            "origin", "HEAD:refs/heads/feature", cwd=c2)
        run("push-atomic", "push", "-q", "--atomic", "origin", "HEAD:refs/heads/main", "v1.0:refs/tags/v1.0-copy",
            cwd=c2)
        run("push-delete", "push", "-q", "origin", ":refs/heads/topic", cwd=c2)
        # the client has commits the server lacks: many haves, a request over 1 KiB, sent gzipped
        for i in range(40):
            (c0 / "local.txt").write_text(f"local {i}\n")
            _git("add", "-A", cwd=c0)
            _git("commit", "-q", "-m", f"local {i}", cwd=c0, env=_dated(22))
        run("fetch-haves-v0", "-c", "protocol.version=0", "fetch", "-q", "origin", cwd=c0)
        run("fetch-haves-v2", "-c", "protocol.version=2", "fetch", "-q", "origin", "+refs/heads/*:refs/remotes/x/*",
            cwd=c0)
        run("fetch-deepen-v2", "-c", "protocol.version=2", "fetch", "-q", "--deepen=1", "origin", cwd=scratch / "d2")
        run("fetch-shallow-since-v0", "-c", "protocol.version=0", "fetch", "-q", "--shallow-since=2024-01-03",
            "origin", cwd=scratch / "d0")
    finally:
        server.shutdown()
        server.server_close()
    return Corpus(list(recorder.seen))


def build(workdir: Path) -> tuple[Path, Corpus]:
    """A fresh repository root and the corpus captured against a twin of it.
    Returns (root holding fuzz.git, corpus); the twin is thrown away."""
    twin = workdir / "capture-root"
    twin.mkdir(parents=True, exist_ok=True)
    make_repo(twin)
    corpus = capture(twin, workdir / "capture-clients")
    shutil.rmtree(twin, ignore_errors=True)
    shutil.rmtree(workdir / "capture-clients", ignore_errors=True)
    root = workdir / "root"
    root.mkdir(parents=True, exist_ok=True)
    make_repo(root)
    return root, corpus
