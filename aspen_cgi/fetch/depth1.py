"""Depth-1 clones: git's answer now, the wide one for the clients after.

A client's `git clone --depth 1` that misses the response cache is answered
by git's own upload-pack (no packObjectsHook: stock's speed and bytes),
single-flight through the cache as any answer; its entry is marked interim
(`depth1=stock`). Once a second request asks for it (a hit on the interim
entry, or a request that followed its computation: cache/responses.py),
`kick()` starts the wide answer's computation (upload-pack through packhook: a wider delta search and
libdeflate) beside it: a thread at niceness 10 in a long-lived server
(packs.background.IN_PROCESS), a detached `python -m aspen_cgi.fetch.depth1`
at niceness 10 under CGI; git and the hook inherit the niceness and run
in the idle scheduling class (gitexec.run_as_background). `build()`
writes that answer to a locked temporary file and renames it over the
entry when it is smaller (`depth1=wide`); otherwise git's entry is kept for
good (`depth1=stock-kept`). Requests that had the old file open read it to
its end. No client ever waits for it.

One build per entry at a time (a flock on `.NAME.wide.lock.tmp` in the
cache directory, whose modification time also says when the last one was
started: a hit on an interim entry starts another only when none runs and
none started in the last RETRY_AFTER_S seconds), holding one of the
machine's build slots (ASPEN_BUILDS_PER_SERVER, shared with version and
segment pack builds: admission.acquire_build): it only makes later answers
smaller.
None starts for an entry already wide or kept.

Pre-warm (fetch/prewarm.py, no client waiting: NO_CLIENT_ENV) computes the
wide answer at once with `build()` too, beside any entry rather than as the
entry being written, so that a client arriving meanwhile is answered by git
at git's speed instead of following the wide computation.

A background build (the thread, or the detached program) never outlives
its repository: it holds a RepoGuard (repoguard.py) taken at its
start (the repository already gone: it ends quietly), looked at before it
makes its lock and temporary files, while git computes (git and its
children are killed as soon as the repository is deleted, moved or
replaced) and before the rename; then it removes its temporary file and
what the guard's undo() removes, and ends quietly."""

from __future__ import annotations

import fcntl
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Generator, Iterable, Mapping, Optional

from .. import settings as aspen_settings
from ..cache import entries, evict, stats
from ..cache.entries import DEPTH1_STOCK, DEPTH1_WIDE, SUFFIX, Replacement

if TYPE_CHECKING:
    from ..cache import responses

NO_CLIENT_ENV = "ASPEN_NO_CLIENT"      # set by pre-warm: nobody waits for this answer (settings.INTERNAL)
NICE = 10
RETRY_AFTER_S = 60.0
# what hands a job to the detached builder (settings.INTERNAL)
HANDOFF = ("ASPEN_DEPTH1_GITDIR", "ASPEN_DEPTH1_NAME", "ASPEN_DEPTH1_VERSION", "ASPEN_DEPTH1_REQUEST")


def no_client(env: Mapping[str, str]) -> bool:
    return env.get(NO_CLIENT_ENV) == "1"


@dataclass(frozen=True)
class Job:
    """One entry's wide answer to build: where the entry is (SETTINGS, NAME,
    ref-store VERSION) and what computes it (the request DATA, run by git in
    GITDIR with ENV)."""
    settings: responses.Settings
    name: str
    version: int
    gitdir: str
    env: Mapping[str, str]
    data: bytes

    @property
    def entry(self) -> str:
        return os.path.join(self.settings.directory, self.name + SUFFIX)

    @property
    def lock(self) -> str:
        return os.path.join(self.settings.directory, f".{self.name}.wide.lock.tmp")


def wide_answer(job: Job) -> Iterable[bytes]:
    """git's upload-pack with the depth-1 pack hook (packhook), as the request came."""
    from ..git import gitexec  # startup
    from ..git.repoconfig import RepoConfig  # startup
    from . import packobjectshook as packhook  # startup
    hooked = packhook.upload_pack_config(object_format=RepoConfig.load(job.gitdir, job.env).object_format)
    return gitexec.git_stream([*hooked, "upload-pack", "--stateless-rpc", "."],
                              cwd=job.gitdir, env=gitexec.child_env(job.env), input=job.data)


# -- locks ------------------------------------------------------------------------------------------

def _try_lock(path: str) -> Optional[int]:
    """PATH flocked (made if missing), or None when another holds it. The fd
    is the file still at PATH (one unlinked meanwhile is not a lock)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.fstat(fd).st_ino == os.stat(path).st_ino:
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _due(path: str) -> bool:
    """May a build of this entry be started now: none runs, none started lately."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        if entries._lock_held(fd):
            return False
        return time.time() - os.fstat(fd).st_mtime >= RETRY_AFTER_S
    except OSError:
        return False
    finally:
        os.close(fd)


def _room(settings) -> bool:
    try:
        st = os.statvfs(settings.directory)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize >= settings.reserve_bytes


# -- the build --------------------------------------------------------------------------------------

def build(job: Job, wait: bool = False, compute: Callable[[Job], Iterable[bytes]] = wide_answer,
          log: Optional[Callable[[str], object]] = None, guard=None) -> Generator[bytes, None, None]:
    """Compute JOB's wide answer and put it in place of git's (or as the
    entry, when there is none yet), yielding its bytes as they come. Returns
    at once (nothing yielded) when another build of the entry runs (WAIT:
    waits for it, yielding b"" while it waits) or the entry is already wide
    or kept. Never raises for what it finds in the cache; a failing git
    leaves git's entry kept for good. GUARD (a repoguard.RepoGuard):
    raises RepositoryGone, its temporary file removed and git killed, once
    the repository is gone."""
    s = job.settings
    check = guard.check if guard is not None else (lambda: None)
    fd = -1
    slot = None
    while True:
        check()
        got = _try_lock(job.lock)
        if got is not None:
            fd = got
            break
        if not wait:
            return
        yield b""
        time.sleep(0.05)
    body = replacement = watcher = None
    try:
        os.utime(fd)
        if done(job):
            return
        from ..runtime import admission  # startup
        slot = admission.acquire_build(admission.capacity(aspen_settings.of(job.env)), check)
        if done(job):
            return
        if not _room(s):
            return
        check()
        replacement = Replacement(s.directory, job.name, job.version)
        check()
        body = compute(job)
        if guard is not None:
            watcher = _Watcher(guard, body)
        for chunk in body:
            check()
            try:
                replacement.write(chunk)
            except OSError as e:      # a full disk: git's entry stays; a hit a minute on tries again
                if log is not None:
                    log(f"aspen: the wide depth-1 answer could not be written ({e}); git's is kept\n")
                return
            yield chunk
        rc = getattr(body, "returncode", 0)
        check()                                           # git killed or not: its answer is not used
        current = entries.peek(job.entry)
        if current is not None and current.depth1 != DEPTH1_STOCK:
            return                                        # made wide (or kept) meanwhile
        if rc not in (0, None):
            if current is not None and entries.mark_stock_kept(job.entry):
                stats.record(s.directory, "depth1_kept", current.length)
            if log is not None:
                log(f"aspen: the wide depth-1 answer failed (git exit {rc}); git's is kept\n")
            return
        if current is not None and current.length <= replacement.length:
            if entries.mark_stock_kept(job.entry):
                stats.record(s.directory, "depth1_kept", current.length)
            return
        size = entries.HEADER_SIZE + replacement.length
        if size > s.max_bytes:
            return
        if current is None:
            removed, freed = evict.evict(s.directory, s.max_bytes, need=size)
            if removed:
                stats.record(s.directory, "evicted", freed)
        check()
        replacement.publish(DEPTH1_WIDE)
        replacement = None
        stats.record(s.directory, "depth1_wide", size - entries.HEADER_SIZE)
    finally:
        if watcher is not None:
            watcher.stop()
        if replacement is not None:
            replacement.abandon()
        close = getattr(body, "close", None)
        if close is not None:
            close()
        if slot is not None:
            slot.release()
        os.close(fd)


class _Watcher:
    """Kills BODY's git (a gitexec.Stream) and its children as soon as GUARD
    finds the repository gone, however long git computes before it writes."""

    INTERVAL = 0.05

    def __init__(self, guard, body):
        self.guard = guard
        self.proc = getattr(body, "proc", None)
        self.stopped = threading.Event()
        if self.proc is not None:
            threading.Thread(target=self._run, name="aspen-depth1-guard", daemon=True).start()

    def stop(self) -> None:
        self.stopped.set()

    def _run(self) -> None:
        while not self.stopped.wait(self.INTERVAL):
            if self.proc.poll() is not None:
                return
            if not self.guard.alive():
                _kill_tree(self.proc.pid)
                return


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                kids = [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            kids = []
        out.extend(kids)
        todo.extend(kids)
    return out


def _kill_tree(pid: int) -> None:
    """SIGKILL our child PID, then the descendants it had (found first, so
    that none is reparented away meanwhile)."""
    import signal  # startup
    for p in [pid, *_descendants(pid)]:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


def done(job: Job) -> bool:
    """Is there nothing left to build: the entry is wide, kept, or not a depth-1 interim one."""
    depth1 = entries.depth1_of(job.entry)
    return depth1 is not None and depth1 != DEPTH1_STOCK


# -- starting it ------------------------------------------------------------------------------------

def kick(job: Job, in_process: bool) -> bool:
    """Start JOB's build in the background unless one runs or started lately
    (or the entry is done); True when started. Never raises."""
    try:
        if not _due(job.lock) or done(job):
            return False
        with open(job.lock, "ab"):
            pass
        os.utime(job.lock)
        if in_process:
            threading.Thread(target=_in_thread, args=(job,), name="aspen-depth1-wide", daemon=True).start()
            return True
        return _detached(job)
    except Exception as e:   # noqa: BLE001  (a background nicety: say why, fail nothing)
        sys.stderr.write(f"aspen: could not start the wide depth-1 answer of {job.gitdir}: {e}\n")
        return False


def _in_thread(job: Job) -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)   # this thread and its children
    except (OSError, AttributeError):
        pass
    from ..git import gitexec  # startup
    gitexec.run_as_background()          # its children in the idle scheduling class
    guard = _guard(job.gitdir, job.env)
    if guard is None:
        return
    try:
        for _ in build(job, log=sys.stderr.write, guard=guard):
            pass
    except Exception as e:   # noqa: BLE001
        if guard.alive():
            sys.stderr.write(f"aspen: the wide depth-1 answer of {job.gitdir} failed: {e}\n")
        else:
            guard.undo()     # deleted, moved or replaced: nothing left behind, nothing to say


def _guard(gitdir: str, env: Mapping[str, str]):
    """The repository's RepoGuard for a background build (its cache
    directory watched too when it is the repository's own), or None when it
    is already gone (then what a deletion under way left of Aspen's state
    is cleared, as undo() does)."""
    from ..cache import responses  # startup
    from ..runtime.repoguard import RepoGuard, RepositoryGone  # startup
    from ..runtime.statedir import state_dir  # startup
    sdir = state_dir(gitdir, aspen_settings.of(env))
    guard = RepoGuard.take(gitdir, sdir)
    if guard is None:
        return None
    settings = responses.settings(sdir, aspen_settings.of(env))
    if settings is not None and settings.repo is not None:
        try:
            guard.watch(settings.directory)
        except RepositoryGone:
            RepoGuard.clear_leftovers(gitdir, sdir)
            return None
    return guard


def _detached(job: Job) -> bool:
    import tempfile  # startup

    from ..git import gitexec  # startup
    fd, request = tempfile.mkstemp(prefix=f".{job.name}.request.", suffix=".tmp", dir=job.settings.directory)
    try:
        os.write(fd, job.data)
    finally:
        os.close(fd)
    child = gitexec.child_env(job.env).without(*HANDOFF)
    child.update(zip(HANDOFF, (job.gitdir, job.name, str(job.version), request)))
    try:
        gitexec.detached([sys.executable, "-m", "aspen_cgi.fetch.depth1"], env=child)
    except OSError:
        os.unlink(request)
        raise
    return True


def main(argv: Optional[list[str]] = None) -> int:
    """Detached, at niceness NICE: the wide build of the job in the environment (CGI, kick())."""
    from ..cache import responses  # startup
    from ..runtime.statedir import state_dir  # startup
    argv = sys.argv[1:] if argv is None else argv
    try:
        os.nice(NICE)
    except OSError:
        pass
    gitdir, name, version, request = (os.environ.get(k, "") for k in HANDOFF)
    from ..git import gitexec  # startup
    gitexec.run_as_background()
    env = gitexec.child_env().without(*HANDOFF)
    guard = _guard(gitdir, env)
    if guard is None:
        try:
            os.unlink(request)
        except OSError:
            pass
        return 0
    try:
        with open(request, "rb") as f:
            data = f.read()
        os.unlink(request)
    except OSError:
        if not guard.alive():
            guard.undo()
            return 0
        return 1
    config = aspen_settings.of(env)
    settings = responses.settings(state_dir(gitdir, config), config)
    if settings is None or not name:
        return 0
    try:
        for _ in build(Job(settings, name, int(version or 0), gitdir, env, data), log=sys.stderr.write,
                       guard=guard):
            pass
    except Exception:
        if guard.alive():
            raise
        guard.undo()         # deleted, moved or replaced: nothing left behind, ends quietly
    return 0


if __name__ == "__main__":
    sys.exit(main())
