"""Version and segment packs built after pushes, off the response path.

- Who builds: a push that landed (and a fetch that finds versions without
  packs, `await_built`) starts one builder per repository when none is
  running: a thread of the worker in long-lived servers (gunicorn, mod_wsgi:
  IN_PROCESS), a detached `aspen import -q --background REPO` under CGI. A
  lock file in the packs directory names the builder; a dead builder's lock
  is taken over.
- What: `build()` builds every version pack first (planned fetches wait for
  them), then the segment packs the schedule asks for, one run at a time,
  under a second lock, so that a long compaction never holds back the next
  push's version pack: a builder started meanwhile builds that and leaves the
  segments to the one compacting, which looks again before it stops.
- When: segment packs only once the repository has been
  ASPEN_COMPACT_QUIET_MS milliseconds (default 1000) without a new version.
  During a burst of pushes the builder keeps building each push's version
  pack (fetches wait for those) and leaves compaction until the burst ends:
  then the schedule's runs over the whole burst are built once, instead of
  every intermediate run a push completed (each re-deltifies all its
  versions' objects, and most are pruned by the next larger run). Measured
  on the medium preset, 513 pushes: the runs built push by push cost 11.4 ms
  of CPU per push, the version packs 16.4 ms.
- How hard: every build (background or `aspen import`) holds one of the
  machine's ASPEN_BUILDS_PER_SERVER build slots (default half the cores, at
  least one; admission.py), apart from live requests' cold slots, so clones
  never queue behind builds. A builder waits for its slot holding its
  repository's lock, so pushes meanwhile start no second one. Background
  builds run git at niceness 10 (os.nice in the detached builder, a `nice`
  prefix for a thread's git children) with git's pack-objects threads (one
  per core), in the kernel's idle scheduling and I/O classes
  (gitexec.run_as_background: a core only when no request wants it;
  measured with builds niced alone, pushes on 2 cores cost 1.6x stock's).
- Never outliving the repository: a `RepoGuard` taken at the start (the
  (st_dev, st_ino) of the repository, its objects/ and refs/, its state
  directory and the store's files; HEAD and config present) is checked
  before every step, before every file or directory is made, while waiting
  for a slot and every 20 ms while git runs. When the repository was
  deleted, moved or replaced, the builder kills its git child, removes its
  scratch directory, lock files and whatever else it made (the same inodes
  only), and stops quietly (`BuildReport.gone`); when the repository is
  being deleted where it stands (its directory the same, HEAD, objects and
  refs gone) it also removes what Aspen keeps in it, so that nothing of it
  is left. Directories are made one level at a time (never `makedirs`) and
  the store is opened without making its directory (`open_store`, which
  removes at once the files opening it made when the repository turns out
  gone), so a deleted repository's directories are never re-created. Its store's connection is
  left open rather than closed (SQLite's close would delete the write-ahead
  log by name: a new repository's, if one replaced it). The pre-warmer
  (fetch/prewarm.py) uses the same guard. A narrow race remains: a file made
  between a check and a `rm -rf` that has already listed its directory
  makes that `rm` fail (ENOTEMPTY); the file is removed when the builder
  notices, so nothing stays.

On by default; ASPEN_VERSION_PACKS=off turns it off (git answers every fetch
that needs a version landed since; packs built before are still used).
`aspen import REPO` builds the same packs by hand, after waiting for a
running builder."""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

from .. import settings
from ..git import gitexec
from ..refstore.guarded import open_store
from ..refstore.registry import release_thread, store_file_name
from ..runtime.owners import owner_alive, owner_id
from ..runtime.repoguard import RepoGuard, RepositoryGone, abandon
from ..runtime.repoguard import identity as _ident
from ..runtime.repository import Repository
from ..runtime.statedir import state_dir

if TYPE_CHECKING:
    from ..runtime.admission import Slot

LOCK = ".build.lock"              # the version-pack builder's
SEGMENT_LOCK = ".segments.lock"   # the segment-pack builder's
NICE = 10                         # background builds' niceness


def enabled(s: settings.Settings) -> bool:
    """ASPEN_VERSION_PACKS (settings.py) is not `off`."""
    return s.version_packs != "off"


def background_search():
    """How background builds search: the wide delta search at niceness NICE,
    in the idle scheduling class, with git's pack-objects threads (one per
    core): idle cores only. Measured on the medium preset, the import packed
    wide took 7.0 s with two threads against 12.0 s with one (from the first
    request), and pushes meanwhile were as fast as stock's either way
    (p50 39.8 against 43.9 ms with two, 43.4 against 41.3 with one)."""
    from .versionpack import DeltaSearch  # startup
    return DeltaSearch(threads=0, nice=NICE)


# -- locks and starting builders -------------------------------------------------------------------

def _holder(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


def holder_pid(owner: Optional[str]) -> Optional[int]:
    """The pid in a lock's owner ("host:pid:start")."""
    try:
        return int(owner.rsplit(":", 2)[1]) if owner else None
    except (ValueError, IndexError):
        return None


def running(packs_dir: str) -> bool:
    """A builder runs: it builds version packs (LOCK), or waits to compact and
    builds the versions that land meanwhile (SEGMENT_LOCK)."""
    return any(owner_alive(_holder(os.path.join(packs_dir, name))) for name in (LOCK, SEGMENT_LOCK))


class BuildLock:
    """Held by the one builder of a repository's packs; False from acquire()
    when a live builder has it. The packs directory is made here if missing
    (one level: its parent, the store's directory, exists), through GUARD."""

    def __init__(self, packs_dir: str, name: str = LOCK, guard: Optional[RepoGuard] = None):
        self.path = os.path.join(packs_dir, name)
        self.guard = guard
        self.held = False
        self.ident: Optional[tuple[int, int]] = None

    def holder(self) -> Optional[str]:
        return _holder(self.path)

    def acquire(self) -> bool:
        packs_dir = os.path.dirname(self.path)
        if not os.path.isdir(packs_dir):
            if self.guard is not None:
                self.guard.mkdir(packs_dir)
            else:
                try:
                    os.mkdir(packs_dir)
                except FileExistsError:
                    pass
        for _ in range(2):
            if self.guard is not None:
                self.guard.check()
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                if owner_alive(_holder(self.path)):
                    return False
                try:
                    os.unlink(self.path)     # a dead builder's
                except OSError:
                    pass
                continue
            st = os.fstat(fd)
            self.ident = (st.st_dev, st.st_ino)
            with os.fdopen(fd, "w") as f:
                f.write(owner_id() + "\n")
            self.held = True
            return True
        return False

    def release(self) -> None:
        """Remove the lock file, if it is still the one this lock made."""
        if self.held:
            if _ident(self.path) == self.ident:
                try:
                    os.unlink(self.path)
                except OSError:
                    pass
            self.held = False


# Set by long-lived servers (the WSGI application): build in a thread of this
# process, ready milliseconds after the push, instead of starting a program.
IN_PROCESS = False


def kick(repo: Repository, packs_dir: str) -> bool:
    """Start a builder unless one is running; True when started."""
    config = repo.settings
    if config.version_packs == "off":
        return False
    if config.metrics:                  # its backlog is counted at scrape time from now on
        from ..runtime import metrics  # startup
        metrics.note_backlog(metrics.directory(config),
                             os.path.join(os.path.dirname(packs_dir), store_file_name(config)))
    if running(packs_dir):
        return False
    whole = repo.without("GIT_NAMESPACE")
    if IN_PROCESS:
        threading.Thread(target=_build, args=(whole,), daemon=True, name="aspen-packs").start()
        return True
    gitexec.detached([sys.executable, "-m", "aspen_cgi.cli", "import", "-q", "--background", repo.gitdir],
                     env=whole.git_env.without("GIT_DIR"))
    return True


ADOPTABLE_WAIT = 4        # versions at most a fetch waits for, each one a client's pack to adopt


def quick(store, version: int) -> bool:
    """Whether VERSION's pack is made in milliseconds: the pack its push's client
    sent is kept (adopted, no git runs), or it has no new values (a deletion,
    an empty repository's import: no pack)."""
    return store.sent_pack(version) is not None or not store.version_values(version)


def quick_backlog(store) -> Optional[bool]:
    """None when every version has its pack; else whether the versions
    without one are at most ADOPTABLE_WAIT, each `quick`."""
    unbuilt = store.unbuilt(ADOPTABLE_WAIT + 1)
    if not unbuilt:
        return None
    return len(unbuilt) <= ADOPTABLE_WAIT and all(quick(store, v) for v in unbuilt)


@dataclass(frozen=True)
class BuildWait:
    """What a fetch found of its versions' packs: all built, and how long it waited (seconds)."""
    built: bool
    waited: float = 0.0


def await_built(store, later: Optional[list[Callable[[], object]]] = None) -> BuildWait:
    """Whether every version has its pack. A fetch never waits for work that
    only makes later answers smaller: when versions lack their packs, it
    waits (up to ASPEN_BUILD_WAIT_MS, default 50 ms) only when each of them
    is `quick` (a push whose client's pack is kept, a version with no new
    values), at most ADOPTABLE_WAIT of them,
    and a builder runs or is started now: adopting such a pack runs no git
    (versionpack.adopt), a few milliseconds. Otherwise (a pack to build
    with pack-objects, the import's, a backlog) git answers at once and a
    builder is started: given LATER, by a function added to it that the
    caller runs once its answer is sent, so that the build takes no CPU
    from the answer. Measured on git.git before this rule: a fetch of a
    branch cut 100 pushes ago waited the old default 2 s three times for a
    backlog the builder had not reached, then got git's answer anyway
    (10.7x stock's wall time)."""
    backlog = quick_backlog(store)
    if backlog is None:
        return BuildWait(True)
    config, repo = store.repo.settings, store.repo
    if not enabled(config):
        return BuildWait(False)
    if not (backlog and config.build_wait > 0):
        packs = store.packs_dir
        if later is None:
            kick(repo, packs)
        else:
            later.append(lambda: kick(repo, packs))
        return BuildWait(False)
    kick(repo, store.packs_dir)
    start = time.monotonic()
    pause = 0.002
    while True:
        waited = time.monotonic() - start
        if waited >= config.build_wait:
            return BuildWait(False, waited)
        time.sleep(min(pause, config.build_wait - waited))
        pause = min(pause * 2, 0.01)
        if store.all_packs_built():
            return BuildWait(True, time.monotonic() - start)


def adopt_now(store) -> bool:
    """At the end of a push, before it is acknowledged: when every version
    without its pack is `quick` (at most ADOPTABLE_WAIT), make their packs
    here (the client's pack adopted: no git runs, milliseconds), so that a
    fetch right after the push is planned without any build; the wide
    delta search is compaction's, later. Nothing when a builder holds the
    repository's lock, or a version needs git: the background builder's
    then. Whether every version has its pack now."""
    from . import builder  # startup
    backlog = quick_backlog(store)
    if backlog is None:
        builder.drop_sent_of_built(store)      # built by a build that looked before the push kept its pack
        return True
    if not backlog:
        return False
    lock = BuildLock(store.packs_dir)
    if not lock.acquire():
        return False
    try:
        builder.build_packs(store, limit=ADOPTABLE_WAIT, adopt_only=True)
        return store.all_packs_built()
    except Exception as e:  # noqa: BLE001  (the background builder builds it: say why)
        sys.stderr.write(f"aspen: adopting the pushed pack of {store.gitdir} failed: {e}\n")
        return False
    finally:
        lock.release()


# -- the builder ---------------------------------------------------------------------------------------

@dataclass
class BuildReport:
    versions: list = field(default_factory=list)     # (version, BuiltPack or None)
    segments: list = field(default_factory=list)     # ((lo, hi), BuiltPack or None)
    pruned: list = field(default_factory=list)       # (lo, hi) of segment packs removed
    busy: Optional[str] = None                       # the lock another builder held, when we left it to them
    busy_owner: Optional[str] = None                 # that builder ("host:pid:start")
    gone: bool = False                               # the repository went: stopped, nothing left behind
    widened: bool = False                            # the import's pack was built again with the wide search
    widen_tried: bool = False                        # ... tried once (git failed: say, gc pruned what it reached)


Progress = Callable[[int, int, str], None]


class _BuildSlot:
    """The machine-wide build slot, taken when there is something to build."""

    def __init__(self, s: settings.Settings, guard: RepoGuard, on_wait: Optional[Callable[[int], None]]):
        self.settings = s
        self.guard = guard
        self.on_wait = on_wait
        self.slot: Optional[Slot] = None

    def take(self) -> None:
        if self.slot is None:
            from ..runtime import admission  # startup
            self.slot = admission.acquire_build(admission.capacity(self.settings), self.guard.check, self.on_wait)
            self.guard.check()

    def release(self) -> None:
        if self.slot is not None:
            self.slot.release()
            self.slot = None


def build(store, search=None, on_version: Optional[Progress] = None,
          on_segment: Optional[Progress] = None, guard: Optional[RepoGuard] = None,
          on_wait_slot: Optional[Callable[[int], None]] = None, quick_first: bool = True) -> BuildReport:
    """Build every missing version pack, then every missing segment pack, of
    STORE's repository, holding one of the machine's build slots while there
    is something to build (ON_WAIT_SLOT(n) when all n are taken). Stops with
    `gone` set when the repository goes (GUARD, taken now if not given).
    QUICK_FIRST (background builds): version packs that are not their
    client's, the import's included, with quick_search, so that fetches are
    planned soon; the import's is then built again with SEARCH once the
    repository is quiet. Without it (`aspen import` by hand), with SEARCH."""
    rep = BuildReport()
    try:
        guard = guard or RepoGuard(store.gitdir, os.path.dirname(store.path))
    except RepositoryGone:
        rep.gone = True
        abandon(store)
        RepoGuard.clear_leftovers(store.gitdir, os.path.dirname(store.path))
        return rep
    slot = _BuildSlot(store.repo.settings, guard, on_wait_slot)
    try:
        _build_all(store, search, on_version, on_segment, guard, slot, rep, quick_first)
    except RepositoryGone:
        rep.gone = True
    except Exception:
        if guard.alive():
            raise
        rep.gone = True             # failed because the repository went (git, a file, the store)
    finally:
        slot.release()
    if rep.gone:
        guard.undo()
        abandon(store)
    return rep


def _build_all(store, search, on_version: Optional[Progress], on_segment: Optional[Progress],
               guard: RepoGuard, slot: _BuildSlot, rep: BuildReport, quick_first: bool = True) -> None:
    """Version packs first (holding LOCK only while building them, so that each
    push adopts its client's pack itself: adopt_now), then the segment packs,
    holding SEGMENT_LOCK while the repository is not yet quiet and while each
    run is built; versions that land meanwhile are built first."""
    from . import builder  # startup
    from . import versionpack as vp  # startup
    search = search or vp.DeltaSearch()
    quiet = compact_quiet(store.repo.settings)
    done_segments = 0
    slock: Optional[BuildLock] = None
    try:
        while True:
            vlock = BuildLock(store.packs_dir, guard=guard)
            if not _acquire(vlock, ADOPTER_HOLD if slock is not None else 0.0):    # back from a quiet wait
                rep.busy, rep.busy_owner = vlock.path, vlock.holder()
                return
            guard.watch(store.packs_dir)
            try:
                while True:      # pushes may land while packs are built
                    guard.check()
                    store.sync()
                    guard.watch_store(store)
                    if store.all_packs_built():
                        break
                    slot.take()
                    batch = builder.build_packs(store, search, progress=lambda done, total, v: on_version and on_version(
                        done, total, f"version {v}"), guard=guard, later=quick_search(search) if quick_first else search)
                    rep.versions += batch
                    if not batch:
                        break
            finally:
                vlock.release()
            guard.check()
            todo = builder.segments_to_build(store) or _widen_todo(store, search, rep)
            if todo:
                if slock is None:
                    slock = BuildLock(store.packs_dir, SEGMENT_LOCK, guard)
                    if not slock.acquire():
                        slock = None
                        rep.busy, rep.busy_owner = os.path.join(store.packs_dir, SEGMENT_LOCK), _holder(
                            os.path.join(store.packs_dir, SEGMENT_LOCK))
                        return
                wait = _unquiet(store, quiet)
                if wait > 0:
                    # pushes are landing: compaction once they stop, their versions' packs before
                    slot.release()
                    time.sleep(min(wait, 0.25))
                    continue
                todo = builder.segments_to_build(store)       # again, holding the lock
                if todo:
                    lo, hi = todo[0]
                    if on_segment:
                        on_segment(done_segments, done_segments + len(todo), f"versions {lo}-{hi}")
                    slot.take()
                    rep.segments.append(((lo, hi), builder.build_segment(store, lo, hi, search, guard)))
                    done_segments += 1
                elif _widen_todo(store, search, rep):
                    slot.take()
                    rep.widen_tried = True
                    try:
                        rep.widened = builder.widen_import(store, search, guard) is not None
                    except vp.BuildError as e:   # the quick pack stays; the next builder tries again
                        guard.check()
                        sys.stderr.write(f"aspen: building packs for {store.gitdir} failed:"
                                         f" the import's wide pack: {e}\n")
                rep.pruned += builder.prune_segments(store)
                continue
            if slock is not None:
                slock.release()
                slock = None
            # nothing to compact: tidy up without the segment lock (both are safe against a
            # running builder), so that a finished build makes no file in the repository
            guard.check()
            rep.pruned += builder.prune_segments(store)
            builder.sweep_packs(store)
            if store.all_packs_built() and not builder.segments_to_build(store) and not _widen_todo(store, search, rep):
                if on_segment:
                    on_segment(done_segments, done_segments, "")
                return
    finally:
        if slock is not None:
            slock.release()


def import_final(store) -> bool:
    """The import's pack is as background builds leave it for good: built
    with the wide search (or none, or not built yet). A planned cache entry
    made before is computed again once it is (fetch/upload._judge)."""
    from .versionpack import DeltaSearch  # startup
    window = store.import_window()
    return window is None or window >= DeltaSearch().window


def _widen_todo(store, search, rep: BuildReport) -> list:
    """["import"] when the import's pack was built with a narrower search than
    SEARCH's (quick_search: clones are planned at once, at about stock's
    bytes) and this build has not tried to widen it yet."""
    from . import builder  # startup
    return ["import"] if not rep.widen_tried and builder.import_to_widen(store, search) else []


ADOPTER_HOLD = 2.0       # seconds a builder tries for LOCK, which a push's adopt_now holds for milliseconds


def _acquire(lock: BuildLock, patience: float) -> bool:
    """LOCK, trying for PATIENCE seconds: a push's adopt_now holds it for milliseconds."""
    deadline = time.monotonic() + patience
    while not lock.acquire():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


def quick_search(search):
    """The delta search of a version pack that is not its client's: git's own
    (window 10, deltas reused), with SEARCH's threads and niceness; the wide
    one is left to the segment packs. Measured on git.git: a version pack's
    wide search (window 250, no reuse) took seconds, and a burst of pushes
    made a backlog that fetches waited for."""
    from .versionpack import DeltaSearch  # startup
    return DeltaSearch(window=10, depth=50, compression=-1, reuse_deltas=True, threads=search.threads,
                       nice=search.nice)


def compact_quiet(s: settings.Settings) -> float:
    """Seconds without a new version before segment packs are built (ASPEN_COMPACT_QUIET_MS)."""
    return s.compact_quiet


def _unquiet(store, quiet: float) -> float:
    """How much longer to wait for the repository to be QUIET seconds without a new version."""
    if quiet <= 0:
        return 0.0
    return quiet - (time.time() - store.latest_at())


def _build(repo: Repository) -> None:
    """A server thread's builder (IN_PROCESS): the thread itself runs at
    niceness NICE (Linux keeps one per thread), and so do its git children."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), max(NICE, gitexec.niceness()))
    except OSError:
        pass                         # then each git child gets a `nice` prefix
    gitexec.run_as_background()
    gitdir = repo.gitdir
    guard = RepoGuard.take(gitdir, state_dir(gitdir, repo.settings))
    if guard is None:
        return
    try:
        store = open_store(repo, guard)
    except RepositoryGone:
        return
    if store is None:
        return
    try:
        build(store, background_search(), guard=guard)
    except Exception as e:  # noqa: BLE001  (a failed build leaves the version to git; say why)
        sys.stderr.write(f"aspen: building packs for {gitdir} failed: {e}\n")
    finally:
        release_thread()
