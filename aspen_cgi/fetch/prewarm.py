"""Pre-warm on push: once a version lands, its depth-1 clones are computed
into the response cache in the background, so the first CI job of a storm
already hits. The requests are the ones git (protocol v2) sends for
`git clone --depth 1 URL` (HEAD's branch, wanted twice: as HEAD and as the
branch) and `git clone --depth 1 --branch B URL`, without progress (no
terminal), computed by fetch/upload.py as a client's are (into the same cache entries).

ASPEN_PREWARM: `default` (a version that updated HEAD's branch), `all`
(every branch the version updated), `off`. One pre-warmer per repository at
a time (a flock); it looks again at the newest version before it stops.
It warms a version once the repository has gone ASPEN_COMPACT_QUIET_MS
(default 1000) without a newer one, as compaction waits: during a burst of
pushes each version's answers would be superseded before a client asked
them (under the busy-repo bench on the medium preset, before this wait,
Aspen's server CPU was 8x stock's, in the idle class).

Only where clients clone that way: a push starts a pre-warmer when a
client asked the repository for a depth-1 clone in the last
ASPEN_PREWARM_DEMAND_S seconds (default a day; `note_demand()` touches
DEMAND_FILE in its state directory, at most once a minute). A wide depth-1
answer of git.git costs about 20 s of CPU (the import's pre-warm of its two
requests took 40 s), and with the cache on, as by default, every push to
HEAD's branch started a pre-warmer, whether anyone cloned that way or not.
`aspen import` pre-warms once, demand or not.
Runs in a thread of a long-lived server, or as `python -m
aspen_cgi.fetch.prewarm` started detached by a CGI push, at niceness 10,
its git children in the idle scheduling class (gitexec.run_as_background).

A pre-warmer never outlives its repository: it holds a RepoGuard
(repoguard.py) and looks at it before each step, before making its
cache directory (one level: never a deleted repository's parents) and
while an answer is computed; when the repository was deleted, moved or
replaced it stops the computation (its git child goes with it), removes the
directories it made and ends quietly."""

from __future__ import annotations

import fcntl
import os
import sys
import time
from typing import Mapping, Optional

from .. import settings as aspen_settings
from ..git import gitexec
from ..model.objectid import ZERO, is_null
from ..protocol import pktline
from .afterpush import detach, held, start
from .demand import demanded

MUTEX = "prewarm.mutex"     # in the cache directory: held by the running pre-warmer of its repository


def policy(s: aspen_settings.Settings) -> str:
    """ASPEN_PREWARM (settings.py): `default`, `all` or `off`."""
    return s.prewarm


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


def _compute(gitdir: str, env: Mapping[str, str], body: bytes, guard, store) -> bool:
    """Answer one depth-1 request as fetch/upload.py answers a client's
    (filling the cache), with nobody waiting; whether it was answered.
    Stopped (RepositoryGone) as soon as GUARD finds the repository gone.
    It reads refs from STORE, the pre-warmer's own (opened without making
    one): a request's opening would make a store dropped meanwhile anew."""
    from ..git.repoconfig import RepoConfig  # startup
    from ..runtime.repoguard import RepositoryGone  # startup
    from ..service import Repo, RequestInfo, ServiceContext, ServiceRefused, child_env, service_enabled  # startup
    from . import upload  # startup
    guard.check()
    cenv = child_env({**gitexec.GitEnv(env).without("GIT_DIR", "GIT_NAMESPACE"),
                      "GIT_PROTOCOL": "version=2", "ASPEN_NO_CLIENT": "1"}, gitdir)    # fetch/depth1.py
    config = RepoConfig.load(gitdir, cenv)
    if not service_enabled("upload-pack", config, None):
        return False                # stock's backend would refuse every client's fetch
    ctx = ServiceContext(Repo(gitdir, gitdir, True), config, cenv, RequestInfo.of(cenv, 2), [], aspen_settings.of(cenv),
                         _store=store, _store_opened=True)
    try:
        stream = upload.serve(ctx, body)
        try:
            for _ in stream:
                guard.check()
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
    except (RepositoryGone, KeyboardInterrupt):
        raise
    except ServiceRefused:
        return False                # admission's 503: the cache stays cold, a client computes it
    except Exception as e:          # noqa: BLE001  (as a 500 would: this request only)
        if guard.alive():
            sys.stderr.write(f"aspen: pre-warm of {gitdir} failed: {e}\n")
        return False
    return True


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
    from ..cache import responses, stats  # startup
    from ..refstore.guarded import open_store  # startup
    from ..runtime.repoguard import RepoGuard, RepositoryGone, abandon  # startup
    from ..runtime.statedir import state_dir  # startup
    config = aspen_settings.of(env)
    mode = policy(config)
    quiet = config.compact_quiet
    sdir = state_dir(gitdir, config)
    settings = responses.settings(sdir, config)
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
        mutex = os.path.join(settings.directory, MUTEX)
        done, seen = 0, -1
        while True:
            lock = os.open(mutex, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                guard.watch(mutex)
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    return done
                while True:
                    if store is None:
                        from ..runtime.repository import Repository  # startup
                        store = open_store(Repository.of(gitdir, env), guard)
                        if store is None:
                            return done
                    guard.check()
                    version = store.sync()
                    if version == seen:
                        break
                    wait = quiet - (time.time() - store.latest_at())
                    if wait > 0:             # pushes are landing: warm only the version they stop at
                        time.sleep(min(wait, 0.25))
                        continue
                    seen = version
                    snap = store.snapshot(None)
                    refs = snap.by_name()
                    updated = {r: refs[r].oid if r in refs else ZERO for r in store.version_refs(version)}
                    for body in requests_for(snap.head_target, updated, mode):
                        if _compute(gitdir, env, body, guard, store):
                            done += 1
                            guard.check()
                            stats.record(settings.directory, "prewarm", 0)
            finally:
                os.close(lock)
            # a push that landed before the mutex was let go found it held and started no
            # pre-warmer (kick): this one looks once more
            if store.sync() == seen:
                return done
    except Exception:
        if guard.alive():
            raise
        guard.undo()
        if store is not None:
            abandon(store)
        raise RepositoryGone(gitdir) from None


def running(directory: str) -> bool:
    """Whether a pre-warmer holds the mutex in the cache DIRECTORY: it warms
    every version that lands before it lets go (run)."""
    return held(os.path.join(directory, MUTEX))


def kick(gitdir: str, env: Mapping[str, str], in_process: bool) -> bool:
    """Pre-warm after a push, where depth-1 clones are asked for: a
    low-priority thread here, or a detached program, unless a pre-warmer of
    the repository runs (a burst of pushes under CGI started a program per
    push, each to find the mutex held: an interpreter's start of CPU each).
    Whether one started."""
    from ..cache import responses  # startup
    from ..runtime.statedir import state_dir  # startup
    config = aspen_settings.of(env)
    sdir = state_dir(gitdir, config)
    if policy(config) == "off" or not demanded(sdir, config):
        return False
    cache = responses.settings(sdir, config)
    if cache is not None and running(cache.directory):
        return False
    child = gitexec.child_env(env).without("GIT_NAMESPACE")
    if in_process:
        start(lambda: run(gitdir, child), "pre-warm", "aspen-prewarm", gitdir)
        return True
    child["ASPEN_PREWARM_GITDIR"] = gitdir
    detach("aspen_cgi.fetch.prewarm", child)
    return True


def after_import(gitdirs: list[str], env: Mapping[str, str]) -> None:
    """Pre-warm the depth-1 clones of HEAD's branch of the repositories
    `aspen import` recorded as version 1, as after a push ,
    once the import is done: one detached pre-warmer at niceness NICE for
    them all, one after the other, with this command's environment. Its entries are the server's when the server's configuration
    environment is the same (user, HOME, GIT_CONFIG_*, ASPEN_CACHE_DIR or
    ASPEN_STATE_DIR)."""
    if policy(aspen_settings.of(env)) == "off" or not gitdirs:
        return
    from .depth1 import HANDOFF  # startup
    child = gitexec.child_env(env).without("GIT_DIR", "GIT_NAMESPACE", "ASPEN_PREWARM_GITDIR", *HANDOFF)
    try:
        gitexec.detached([sys.executable, "-m", "aspen_cgi.fetch.prewarm", *gitdirs], env=child)
    except OSError as e:
        sys.stderr.write(f"aspen: could not start the pre-warm: {e}\n")


def _prewarm_imported(gitdirs: list[str]) -> int:
    for gitdir in gitdirs:
        real = os.path.realpath(gitdir)
        env = dict(os.environ)
        try:
            run(real, env)
        except Exception as e:   # noqa: BLE001  (deleted meanwhile, or broken: the next one)
            sys.stderr.write(f"aspen: pre-warm of {gitdir} failed: {e}\n")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    """Detached, at niceness 10: `GITDIR...` (after_import), or the
    repository of ASPEN_PREWARM_GITDIR (kick())."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        os.nice(10)
    except OSError:
        pass
    gitexec.run_as_background()
    if argv:
        return _prewarm_imported(argv)
    from ..runtime.repoguard import RepositoryGone  # startup
    try:
        run(os.environ["ASPEN_PREWARM_GITDIR"], dict(os.environ))
    except RepositoryGone:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)          # without closing the store: SQLite would delete its log by name
    return 0


if __name__ == "__main__":
    sys.exit(main())
