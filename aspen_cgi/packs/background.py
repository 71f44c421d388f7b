"""Version and segment packs built after pushes, off the response path: a
push that landed starts one detached `aspen import -q REPO` when none is
running for the repository (a lock file names the builder; a dead builder's
lock is taken over). Long-lived servers (gunicorn, mod_wsgi) build in a
thread of the worker instead.

`build()` is the builder: every version pack first (planned fetches wait for
them), then the segment packs the schedule asks for, one run at a time,
under a second lock, so that a long compaction never holds back the next
push's version pack: a builder started meanwhile builds that and leaves the
segments to the one compacting, which looks again before it stops.

Opt-in for now (ASPEN_VERSION_PACKS=auto) until its cost under push load is
measured; `aspen import REPO` builds the same packs by hand."""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

from .. import gitexec
from ..refstore.owners import owner_alive, owner_id

ENV = "ASPEN_VERSION_PACKS"
WAIT_ENV = "ASPEN_BUILD_WAIT_MS"     # how long a fetch waits for a running builder (default 2000)
LOCK = ".build.lock"              # the version-pack builder's
SEGMENT_LOCK = ".segments.lock"   # the segment-pack builder's


def enabled(env: Mapping[str, str]) -> bool:
    return (env.get(ENV) or os.environ.get(ENV, "")).lower() == "auto"


def _holder(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


def running(packs_dir: str) -> bool:
    return owner_alive(_holder(os.path.join(packs_dir, LOCK)))


class BuildLock:
    """Held by the one builder of a repository's packs; False from acquire()
    when a live builder has it."""

    def __init__(self, packs_dir: str, name: str = LOCK):
        self.path = os.path.join(packs_dir, name)
        self.held = False

    def acquire(self) -> bool:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        for _ in range(2):
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
            with os.fdopen(fd, "w") as f:
                f.write(owner_id() + "\n")
            self.held = True
            return True
        return False

    def release(self) -> None:
        if self.held:
            try:
                os.unlink(self.path)
            except OSError:
                pass
            self.held = False


# Set by long-lived servers (the WSGI application): build in a thread of this
# process, ready milliseconds after the push, instead of starting a program.
IN_PROCESS = False


def kick(gitdir: str, packs_dir: str, env: Mapping[str, str]) -> bool:
    """Start a builder unless one is running; True when started."""
    if not enabled(env) or running(packs_dir):
        return False
    child = {k: v for k, v in env.items() if k not in ("GIT_NAMESPACE",)}
    if IN_PROCESS:
        threading.Thread(target=_build, args=(gitdir, child), daemon=True, name="aspen-packs").start()
        return True
    child.pop("GIT_DIR", None)
    gitexec.detached([sys.executable, "-m", "aspen_cgi.cli", "import", "-q", "--wait-lock", gitdir], env=child)
    return True


def await_built(gitdir: str, store, env: Mapping[str, str]) -> bool:
    """True when every version has its pack. A fetch that arrives while they
    are being built (right after a push, say) starts a builder if none is
    running and waits for it up to ASPEN_BUILD_WAIT_MS, so that it is served
    from the pack of the push it came for rather than by git."""
    if store.all_packs_built():
        return True
    if not enabled(env):
        return False
    try:
        wait = max(0.0, float(env.get(WAIT_ENV) or os.environ.get(WAIT_ENV) or 2000) / 1000)
    except ValueError:
        wait = 2.0
    kick(gitdir, store.packs_dir, env)
    start = time.monotonic()
    pause = 0.002
    while time.monotonic() - start < wait:
        time.sleep(pause)
        pause = min(pause * 2, 0.02)
        if store.all_packs_built():
            return True
        if time.monotonic() - start > 1.0 and not running(store.packs_dir):
            return False          # the builder (given a second to start) stopped short: git answers
    return False


@dataclass
class BuildReport:
    versions: list = field(default_factory=list)     # (version, BuiltPack or None)
    segments: list = field(default_factory=list)     # ((lo, hi), BuiltPack or None)
    pruned: list = field(default_factory=list)       # (lo, hi) of segment packs removed
    busy: Optional[str] = None                       # the lock another builder held, when we left it to them


Progress = Callable[[int, int, str], None]


def build(store, search=None, on_version: Optional[Progress] = None,
          on_segment: Optional[Progress] = None) -> BuildReport:
    """Build every missing version pack, then every missing segment pack, of
    STORE's repository, holding an admission slot: builds are cold
    computations too, and wait (without a queue bound) for their turn."""
    from .. import admission
    slot = admission.acquire(admission.limits(store.env), store.gitdir, queue=False)
    try:
        return _build_all(store, search, on_version, on_segment)
    finally:
        slot.release()


def _build_all(store, search, on_version: Optional[Progress], on_segment: Optional[Progress]) -> BuildReport:
    from .versionpack import DeltaSearch
    search = search or DeltaSearch()
    rep = BuildReport()
    done_segments = 0
    while True:
        vlock = BuildLock(store.packs_dir)
        if not vlock.acquire():
            rep.busy = vlock.path
            return rep
        try:
            while True:      # pushes may land while packs are built
                store.sync()
                batch = store.build_packs(search, progress=lambda done, total, v: on_version and on_version(
                    done, total, f"version {v}"))
                rep.versions += batch
                if not batch:
                    break
        finally:
            vlock.release()
        slock = BuildLock(store.packs_dir, SEGMENT_LOCK)
        if not slock.acquire():
            rep.busy = slock.path
            return rep
        try:
            todo = store.segments_to_build()
            if todo:
                lo, hi = todo[0]
                if on_segment:
                    on_segment(done_segments, done_segments + len(todo), f"versions {lo}-{hi}")
                rep.segments.append(((lo, hi), store.build_segment(lo, hi, search)))
                done_segments += 1
            rep.pruned += store.prune_segments()
            if not todo:
                store.sweep_packs()
        finally:
            slock.release()
        if not todo and store.all_packs_built() and not store.segments_to_build():
            if on_segment:
                on_segment(done_segments, done_segments, "")
            return rep


def _build(gitdir: str, env: Mapping[str, str]) -> None:
    from ..refstore.store import RefStore
    store = RefStore.open(gitdir, env)
    if store is None:
        return
    try:
        build(store)
    except Exception as e:  # noqa: BLE001  (a failed build leaves the version to git; say why)
        sys.stderr.write(f"aspen: building packs for {gitdir} failed: {e}\n")
