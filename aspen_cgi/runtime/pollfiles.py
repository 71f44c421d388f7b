"""Poll files: each repository's current upload-pack advertisements (v0 and
v2) kept as files that nginx serves to pollers without reaching Aspen
(nginx/aspen.conf, docs/polls.md).

Layout, under ASPEN_POLL_DIR (default `<ASPEN_RUN_DIR>/polls`):

    repos/<id>/                 one directory per repository (id: a digest of its git directory's real path)
        upload-pack.v0.<second> the advertisement, valid during that second (Unix time)
        upload-pack.v2.<second>
        .lock                   flock(): writers and invalidations of this repository, one at a time
        .gen                    changed by every invalidation
    urls/<URL path>             a symlink to repos/<id>/, one per URL path pollers used
                                (`/team/repo.git/info/refs`); nginx's `root` is urls/

nginx counts the polls it answers from these files in a log of its own
(ASPEN_POLL_LOG: two bytes a poll), which the metrics turn into
`aspen_polls_from_files_total`.

The rule that keeps a file from being stale: a file is only ever named for
the seconds from when Aspen last checked every input of the answer
(ASPEN_POLL_WINDOW seconds, default 1), and nginx serves the file named for
the current second (`$msec`), so an answer nobody checks again stops being
served by itself. Within its seconds a file is removed, before the push is
acknowledged, by every ref change Aspen makes (`invalidate`, from
push/refwrite.py), and a writer that began before an invalidation never
writes after it (the `.gen` it read first must still be there, checked
under the lock the invalidation takes). A change Aspen does not make (a
`git update-ref` on the server's disk, an edited config) is seen at the
latest when the files named for the seconds it checked run out: at most
ASPEN_POLL_WINDOW seconds."""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
import time
from typing import Optional, Sequence

from .. import settings
from ..model.racy import too_recent

REPOS = "repos"
URLS = "urls"
KINDS = ("upload-pack.v0", "upload-pack.v2")
_names = threading.local()


def poll_dir(s: settings.Settings) -> Optional[str]:
    """Where this server keeps poll files, or None when it keeps none."""
    if s.poll_window <= 0 or s.refstore_url:     # a shared ref log: another node may move the refs
        return None
    return s.poll_dir or os.path.join(s.run_dir, "polls")


def repo_id(gitdir: str) -> str:
    return hashlib.sha1(os.path.realpath(gitdir).encode("utf-8", "surrogateescape")).hexdigest()[:24]


def repo_dir(base: str, gitdir: str) -> str:
    return os.path.join(base, REPOS, repo_id(gitdir))


class _Locked:
    """The repository's lock (made with its directory when missing)."""

    def __init__(self, rdir: str):
        os.makedirs(rdir, exist_ok=True)
        self.fd = os.open(os.path.join(rdir, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)

    def __enter__(self) -> "_Locked":
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(self.fd)
            raise
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)


def generation(rdir: str) -> bytes:
    """What `.gen` holds now (b'' when there is none): read before an answer is computed."""
    try:
        with open(os.path.join(rdir, ".gen"), "rb") as f:
            return f.read(64)
    except OSError:
        return b""


def invalidate(gitdir: str, s: settings.Settings) -> bool:
    """Remove every poll file of GITDIR's repository and change its `.gen`:
    called once refs changed, before the change is acknowledged. False when
    it could not be done (the directory cannot be written)."""
    base = poll_dir(s)
    if base is None:
        return True
    rdir = repo_dir(base, gitdir)
    try:
        with _Locked(rdir):
            gen = f"{time.time_ns()}.{os.getpid()}.{threading.get_ident()}".encode()
            fd = os.open(os.path.join(rdir, ".gen"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
            try:
                os.write(fd, gen)
            finally:
                os.close(fd)
            for name in os.listdir(rdir):
                if not name.startswith("."):
                    os.unlink(os.path.join(rdir, name))
    except OSError:
        return False
    return True


def racy(paths: Sequence[str], started_ns: int) -> Optional[str]:
    """The first of PATHS modified within the racy window before STARTED_NS or
    after it (an answer computed since may predate it), or None."""
    for p in paths:
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if too_recent(st.st_mtime_ns, started_ns):
            return p
    return None


def url_ok(url: str) -> bool:
    """A URL path nginx's `$uri` spells the same way: absolute, ending in
    /info/refs once, no empty, `.` or `..` component, no NUL."""
    if not url.startswith("/") or not url.endswith("/info/refs") or "\0" in url:
        return False
    parts = url[1:].split("/")
    return all(p not in ("", ".", "..") for p in parts) and url.count("/info/refs") == 1


def current(base: str, gitdir: str, kind: str, now: Optional[float] = None) -> bool:
    """Whether KIND's file for this second is there (another request wrote it)."""
    second = int(time.time() if now is None else now)
    return os.path.exists(os.path.join(repo_dir(base, gitdir), f"{kind}.{second}"))


def publish(base: str, gitdir: str, url: str, kind: str, body: bytes, inputs: Sequence[str], started_ns: int,
            gen: bytes, window: int) -> str:
    """Write BODY as KIND's file of GITDIR for the WINDOW seconds from now,
    reachable at URL; what happened: `written`, or why not (`moved`: an
    invalidation since GEN was read; `racy`: an input changed too recently;
    `error`: the directory could not be written)."""
    rdir = repo_dir(base, gitdir)
    tmp = os.path.join(rdir, f".tmp.{os.getpid()}.{threading.get_ident()}")
    try:
        with _Locked(rdir):
            if generation(rdir) != gen:
                return "moved"
            if racy(inputs, started_ns) is not None:
                return "racy"
            second = int(time.time())
            with open(tmp, "wb") as f:
                f.write(body)
            for k in range(window):
                link = f"{tmp}.l"
                os.link(tmp, link)
                os.replace(link, os.path.join(rdir, f"{kind}.{second + k}"))
            os.unlink(tmp)
            for name in os.listdir(rdir):
                head, _, sec = name.rpartition(".")
                if head in KINDS and sec.isdigit() and int(sec) < second:
                    os.unlink(os.path.join(rdir, name))
        _link_url(base, url, rdir)
    except OSError:
        for p in (tmp, f"{tmp}.l"):
            try:
                os.unlink(p)
            except OSError:
                pass
        return "error"
    return "written"


def _link_url(base: str, url: str, rdir: str) -> None:
    """urls/<URL> -> RDIR (made, or pointed again when it names another repository)."""
    path = os.path.join(base, URLS, url.lstrip("/"))
    try:
        if os.readlink(path) == rdir:
            return
    except OSError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}"
    os.symlink(rdir, tmp)
    try:
        os.replace(tmp, path)
    except OSError:
        os.unlink(tmp)
        raise


def served(s: settings.Settings) -> Optional[int]:
    """Polls nginx answered from these files, as counted in its log
    ASPEN_POLL_LOG (two bytes a poll: nginx/aspen.conf's `aspen_poll`
    format), or None without that log."""
    if not s.poll_log:
        return None
    try:
        return os.stat(s.poll_log).st_size // 2
    except OSError:
        return None
