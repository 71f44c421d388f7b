"""Bundles kept current: after a push, where clients take bundles (a
`bundle-uri` answer or a bundle download within ASPEN_PREWARM_DEMAND_S:
fetch/demand.py), the bundle the next `bundle-uri` answer names
(offload.bundle_version: the repository at its last compaction) is built
once the repository is quiet and its builder has finished, so that the
first client to download it gets a static file instead of waiting for the
splice. Not after every push: during a burst the advertised version does
not move (compaction waits for ASPEN_COMPACT_QUIET_MS), and a keeper waits
for the burst to end as compaction does.

One keeper per repository at a time (a flock on `bundles/keeper.mutex`);
it waits while a builder runs or one is due (a version without its pack, a
segment run the schedule asks for), and looks at the newest version again
after letting the mutex go (a push meanwhile found it held). A thread of a
long-lived server, or `python -m aspen_cgi.fetch.bundlekeep` started
detached by a CGI push, at niceness 10 with its git children in the idle
scheduling class. It never outlives its repository (a RepoGuard, as the
pre-warmer: runtime/repoguard.py), and gives up after MAX_WAIT_S waiting
for a builder."""

from __future__ import annotations

import fcntl
import os
import sys
import time
from typing import Mapping, Optional

from .. import settings as aspen_settings
from ..git import gitexec
from .afterpush import detach, held, start
from .bundle import DIRECTORY
from .demand import BUNDLE_DEMAND_FILE, demanded

MUTEX = "keeper.mutex"      # in the bundles directory: held by the running keeper of its repository
MAX_WAIT_S = 1800.0         # for the builder to finish compacting
POLL_S = 0.25


def wanted(gitdir: str, s: aspen_settings.Settings) -> bool:
    """Bundles are advertised here and a client took one within the demand window."""
    from ..runtime.statedir import state_dir  # startup
    return bool(s.bundle_uri and s.refstore) and demanded(state_dir(gitdir, s), s, BUNDLE_DEMAND_FILE)


def _build(gitdir: str, env: Mapping[str, str], store, version: int) -> Optional[str]:
    """Build the bundle of VERSION as its first download would (fetch/bundle.py);
    its path, or None where the repository serves no such bundle."""
    from ..git.repoconfig import RepoConfig  # startup
    from ..model.pin import Pin  # startup
    from ..service import Repo, RequestInfo, ServiceContext, ServiceRefused, child_env, service_enabled  # startup
    from . import bundle  # startup
    cenv = child_env({**gitexec.GitEnv(env).without("GIT_DIR", "GIT_NAMESPACE"), "ASPEN_NO_CLIENT": "1"}, gitdir)
    config = RepoConfig.load(gitdir, cenv)
    if not service_enabled("upload-pack", config, None):
        return None
    ctx = ServiceContext(Repo(gitdir, gitdir, True), config, cenv, RequestInfo.of(cenv, 2), [],
                         aspen_settings.of(cenv), _store=store, _store_opened=True)
    try:
        return bundle.bundle_file(ctx, Pin(version=version, text=str(version))).path
    except ServiceRefused:
        return None


def _compaction_due(store, config: aspen_settings.Settings) -> bool:
    """A builder runs, or is still to come for what the last pushes left: a
    version without its pack or a segment run the schedule asks for (a
    builder a CGI push started may not have taken its lock yet)."""
    from ..packs import background, builder  # startup
    if background.running(store.packs_dir):
        return True
    return background.enabled(config) and (not store.all_packs_built() or bool(builder.segments_to_build(store)))


def run(gitdir: str, env: Mapping[str, str]) -> list[str]:
    """Keep the advertised bundle built until no newer one is due; the bundle
    files built. [] at once when another keeper of the repository runs.
    Raises RepositoryGone when the repository went meanwhile."""
    from ..refstore.guarded import open_store  # startup
    from ..runtime.repoguard import RepoGuard, RepositoryGone, abandon  # startup
    from ..runtime.repository import Repository  # startup
    from ..runtime.statedir import state_dir  # startup
    from .offload import bundle_version  # startup
    config = aspen_settings.of(env)
    sdir = state_dir(gitdir, config)
    guard = RepoGuard.take(gitdir, sdir)
    if guard is None:
        raise RepositoryGone(gitdir)
    store = None
    built: list[str] = []
    try:
        store = open_store(Repository.of(gitdir, env), guard)
        if store is None:
            return built
        directory = os.path.join(os.path.dirname(store.path), DIRECTORY)
        if not os.path.isdir(directory):
            guard.mkdir(directory)
        guard.watch(directory)
        deadline = time.monotonic() + MAX_WAIT_S
        done, seen = -1, -1
        while True:
            lock = os.open(os.path.join(directory, MUTEX), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    return built
                while time.monotonic() < deadline:
                    guard.check()
                    seen = store.sync()
                    wait = config.compact_quiet - (time.time() - store.latest_at())
                    if wait > 0 or _compaction_due(store, config):
                        time.sleep(min(max(wait, POLL_S), POLL_S))
                        continue
                    version = bundle_version(store)
                    if version < 1 or version == done:
                        break
                    path = _build(gitdir, env, store, version)
                    done = version
                    if path is not None:
                        built.append(path)
            finally:
                os.close(lock)
            # a push that landed before the mutex was let go found it held and started no
            # keeper (kick): this one looks once more
            if store.sync() == seen or time.monotonic() >= deadline:
                return built
    except Exception:
        if guard.alive():
            raise
        guard.undo()
        if store is not None:
            abandon(store)
        raise RepositoryGone(gitdir) from None


def running(directory: str) -> bool:
    """Whether a keeper holds the mutex in the bundles DIRECTORY."""
    return held(os.path.join(directory, MUTEX))


def kick(gitdir: str, env: Mapping[str, str], in_process: bool) -> bool:
    """After a push, where bundles are taken (`wanted`): a low-priority thread
    here, or a detached program, unless a keeper of the repository runs.
    Whether one started."""
    config = aspen_settings.of(env)
    if not wanted(gitdir, config):
        return False
    from ..runtime.statedir import state_dir  # startup
    if running(os.path.join(state_dir(gitdir, config), DIRECTORY)):
        return False
    child = gitexec.child_env(env).without("GIT_NAMESPACE")
    if in_process:
        start(lambda: run(gitdir, child), "keeping the bundle", "aspen-bundlekeep", gitdir)
        return True
    child["ASPEN_BUNDLE_GITDIR"] = gitdir
    detach("aspen_cgi.fetch.bundlekeep", child)
    return True


def main() -> int:
    """Detached, at niceness 10: the repository of ASPEN_BUNDLE_GITDIR (kick())."""
    try:
        os.nice(10)
    except OSError:
        pass
    gitexec.run_as_background()
    from ..runtime.repoguard import RepositoryGone  # startup
    try:
        run(os.environ["ASPEN_BUNDLE_GITDIR"], dict(os.environ))
    except RepositoryGone:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)          # without closing the store: SQLite would delete its log by name
    except Exception as e:   # noqa: BLE001  (nobody reads this but a log; say why)
        sys.stderr.write(f"aspen: keeping the bundle of {os.environ.get('ASPEN_BUNDLE_GITDIR')} failed: {e}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
