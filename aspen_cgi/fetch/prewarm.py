"""Pre-warm on push: once a version lands, its depth-1 clones are computed
into the response cache in the background, so the first CI job of a storm
already hits. The requests are the ones git (protocol v2) sends for
`git clone --depth 1 URL` (HEAD's branch, wanted twice: as HEAD and as the
branch) and `git clone --depth 1 --branch B URL`, without progress (no
terminal), computed through the same request pipeline as a client's.

ASPEN_PREWARM: `default` (a version that updated HEAD's branch), `all`
(every branch the version updated), `off`. One pre-warmer per repository at
a time (a flock); it looks again at the newest version before it stops.

Only where clients clone that way: a push starts a pre-warmer when a
client asked the repository for a depth-1 clone in the last
ASPEN_PREWARM_DEMAND_S seconds (default a day; `note_demand()` touches
DEMAND_FILE in its state directory, at most once a minute). A wide depth-1
answer of git.git costs about 20 s of CPU (the import's pre-warm of its two
requests took 40 s), and with the cache on, as by default, every push to
HEAD's branch started a pre-warmer, whether anyone cloned that way or not.
`aspen import` pre-warms once, demand or not.
Runs in a thread of a long-lived server, or as `python -m
aspen_cgi.fetch.prewarm` started detached by a CGI push, at niceness 10.

A pre-warmer never outlives its repository: it holds a RepoGuard
(repoguard.py) and looks at it before each step, before making its
cache directory (one level: never a deleted repository's parents) and
while an answer is computed; when the repository was deleted, moved or
replaced it stops the computation (its git child goes with it), removes the
directories it made and ends quietly."""

from __future__ import annotations

import fcntl
import io
import os
import sys
import threading
import time
from typing import Mapping, Optional

from .. import settings
from ..model.objectid import ZERO, is_null
from ..protocol import pktline

DEMAND_FILE = "depth1.asked"
NOTE_EVERY_S = 60.0


def policy(env: Mapping[str, str]) -> str:
    """ASPEN_PREWARM (settings.py): `default`, `all` or `off`."""
    return settings.of(env).prewarm


def demand_effect(sdir: str) -> tuple[str, str, str]:
    """note_demand as a replayed request does it (http/replay.py): the file's mtime now."""
    return ("touch", os.path.join(sdir, DEMAND_FILE), "")


def note_demand(sdir: str) -> None:
    """A client asked for a depth-1 clone of the repository whose state lives in SDIR."""
    path = os.path.join(sdir, DEMAND_FILE)
    try:
        if time.time() - os.stat(path).st_mtime < NOTE_EVERY_S:
            return
        os.utime(path)
    except FileNotFoundError:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
        except OSError:
            pass             # no state directory (yet): the next request notes it
    except OSError:
        pass


def demanded(sdir: str, env: Mapping[str, str]) -> bool:
    """Whether a client asked for a depth-1 clone within the demand window."""
    window = settings.of(env).prewarm_demand
    try:
        return time.time() - os.stat(os.path.join(sdir, DEMAND_FILE)).st_mtime <= window
    except OSError:
        return False


def clone_request(wants: list[str], include_tag: bool = True) -> bytes:
    """The v2 fetch git 2.x sends for `clone --depth 1` (no terminal), in the wants' hash."""
    lines = ["command=fetch\n", f"object-format={'sha256' if len(wants[0]) == 64 else 'sha1'}\n"]
    args = ["thin-pack\n", "no-progress\n"] + (["include-tag\n"] if include_tag else []) + ["ofs-delta\n",
                                                                                           "deepen 1\n"]
    args += [f"want {w}\n" for w in wants] + ["done\n"]
    return (b"".join(pktline.encode(x) for x in lines) + pktline.DELIM
            + b"".join(pktline.encode(x) for x in args) + pktline.FLUSH)


def requests_for(head_target: Optional[str], updated: dict[str, str], mode: str) -> list[bytes]:
    """The requests to compute for a version that set UPDATED (ref -> new value)."""
    out = []
    for ref, oid in sorted(updated.items()):
        if not ref.startswith("refs/heads/") or is_null(oid):
            continue
        if ref == head_target:
            out.append(clone_request([oid, oid]))
        elif mode != "all":
            continue
        out.append(clone_request([oid]))
    return out


def _upload_env(env: Mapping[str, str], body: bytes) -> dict[str, str]:
    out = {k: v for k, v in env.items() if k not in ("HTTP_CONTENT_ENCODING", "CONTENT_LENGTH", "GIT_DIR")}
    for key in ("PATH_INFO", "PATH_TRANSLATED"):
        if key in out and out[key].endswith("/git-receive-pack"):
            out[key] = out[key][:-len("git-receive-pack")] + "git-upload-pack"
    out.update({"REQUEST_METHOD": "POST", "CONTENT_TYPE": "application/x-git-upload-pack-request",
                "CONTENT_LENGTH": str(len(body)), "HTTP_GIT_PROTOCOL": "version=2", "GIT_PROTOCOL": "version=2",
                "QUERY_STRING": "", "ASPEN_ACCESS_LOG": "0", "ASPEN_NO_CLIENT": "1"})   # cache/depth1.py
    return out


def _compute(env: Mapping[str, str], body: bytes, guard) -> int:
    """Run one request through the pipeline (filling the cache); its status.
    Stopped (RepositoryGone) as soon as GUARD finds the repository gone."""
    from ..http.backend import handle
    from ..http.message import Request
    guard.check()
    resp = handle(Request(_upload_env(env, body), io.BytesIO(body), len(body)))
    try:
        for _ in resp.body:
            guard.check()
    finally:
        resp.close()
    return resp.status


def _make_dir(directory: str, gitdir: str, sdir: str, guard) -> None:
    """The cache directory: the repository's own is made one level at a time
    through GUARD; a shared one (ASPEN_CACHE_DIR) as a whole."""
    if os.path.isdir(directory):
        return
    inside = [d for d in (sdir, gitdir) if directory.startswith(d.rstrip("/") + "/")]
    if not inside:
        os.makedirs(directory, exist_ok=True)
        return
    missing = []
    d = directory
    while not os.path.isdir(d) and d != inside[0]:
        missing.append(d)
        d = os.path.dirname(d)
    for d in reversed(missing):
        guard.mkdir(d)


def run(gitdir: str, env: Mapping[str, str]) -> int:
    """Pre-warm the newest version's requests (and newer ones that land
    meanwhile); the number of requests computed. Returns 0 at once when
    another pre-warmer of the repository is running. Raises RepositoryGone
    (repoguard.py), having removed what it made, when the repository
    was deleted, moved or replaced meanwhile."""
    from ..runtime.repoguard import RepoGuard, RepositoryGone, abandon, open_store
    from ..runtime.statedir import state_dir
    from ..cache import responses, stats
    mode = policy(env)
    sdir = state_dir(gitdir, env)
    settings = responses.settings(sdir, env)
    if mode == "off" or settings is None:
        return 0
    guard = RepoGuard.take(gitdir, sdir)
    if guard is None:
        raise RepositoryGone(gitdir)
    store = None
    try:
        _make_dir(settings.directory, gitdir, sdir, guard)
        guard.watch(settings.directory)
        guard.check()
        mutex = os.path.join(settings.directory, "prewarm.mutex")
        lock = os.open(mutex, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            guard.watch(mutex)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return 0
            done, seen = 0, -1
            while True:
                if store is None:
                    store = open_store(gitdir, env, guard)
                    if store is None:
                        return done
                guard.check()
                version = store.sync()
                if version == seen:
                    return done
                seen = version
                snap = store.snapshot(None)
                refs = snap.by_name()
                updated = {r: refs[r].oid if r in refs else ZERO for r in store.version_refs(version)}
                for body in requests_for(snap.head_target, updated, mode):
                    if _compute(env, body, guard) == 200:
                        done += 1
                        guard.check()
                        stats.record(settings.directory, "prewarm", 0)
        finally:
            os.close(lock)
    except Exception:
        if guard.alive():
            raise
        guard.undo()
        if store is not None:
            abandon(store)
        raise RepositoryGone(gitdir) from None


def kick(gitdir: str, env: Mapping[str, str], in_process: bool) -> bool:
    """Pre-warm after a push, where depth-1 clones are asked for: a
    low-priority thread here, or a detached program. Whether one started."""
    from ..runtime.statedir import state_dir
    from ..runtime.repoguard import RepositoryGone
    if policy(env) == "off" or not demanded(state_dir(gitdir, env), env):
        return False
    child = {k: v for k, v in env.items() if k != "GIT_NAMESPACE"}
    if in_process:
        def work() -> None:
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)   # this thread and its children
            except (OSError, AttributeError):
                pass
            try:
                run(gitdir, child)
            except RepositoryGone:
                pass                 # deleted or replaced: nothing to warm, nothing left behind
            except Exception as e:   # a background nicety: the server's log says why, nothing fails
                sys.stderr.write(f"aspen: pre-warm of {gitdir} failed: {e}\n")
        threading.Thread(target=work, name="aspen-prewarm", daemon=True).start()
        return True
    from ..git import gitexec
    child["ASPEN_PREWARM_GITDIR"] = gitdir
    gitexec.detached([sys.executable, "-m", "aspen_cgi.fetch.prewarm"], env=child)
    return True


def main() -> int:
    try:
        os.nice(10)
    except OSError:
        pass
    from ..runtime.repoguard import RepositoryGone
    try:
        run(os.environ["ASPEN_PREWARM_GITDIR"], dict(os.environ))
    except RepositoryGone:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)          # without closing the store: SQLite would delete its log by name
    return 0


if __name__ == "__main__":
    sys.exit(main())
