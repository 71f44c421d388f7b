"""`aspen import`: record a repository (or every one under a directory) and
build its version and segment packs, in the foreground with progress bars
or as the detached background builder a push starts (`--background`)."""

from __future__ import annotations

import argparse
import os
import sys
import time

from .history import open_repo


def cmd_import(args: argparse.Namespace) -> int:
    if args.background:
        return _import_background(args)
    if args.all:
        return _import_all(args)
    from ..runtime.progress import Bar  # startup
    store = open_repo(args.repo)
    bars: dict[str, Bar] = {}

    def bar(label: str):
        def update(done: int, total: int, what: str) -> None:
            if label not in bars:
                for other in bars.values():
                    other.finish()
                bars[label] = Bar(label, enabled=not args.quiet)
            bars[label].update(done, total, what)
        return update

    def say(line: str) -> None:
        if any(b.enabled for b in bars.values()):
            sys.stderr.write("\r\033[K")
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    t0 = time.monotonic()
    rep = _import_repo(store, args.repo, _search(args), bar("building version packs"),
                       bar("building segment packs"), say, wait=not args.no_wait)
    for b in bars.values():
        b.finish()
    if rep.gone:
        sys.stderr.write(f"aspen: {args.repo} was deleted, moved or replaced during the import; stopped\n")
        _exit_leaving_store_open(1)
    print(f"imported: {store.latest()} versions; {_built_now(rep)}; in {store.packs_dir}: "
          f"{len(rep.pruned)} segment packs removed, {len(store.segment_packs())} kept; "
          f"{time.monotonic() - t0:.1f} s")
    if rep.busy:
        print(f"left to the builder running ({rep.busy})")
    return 0


def _search(args: argparse.Namespace, nice: int = 0, threads: int = 0):
    from ..packs.versionpack import DeltaSearch  # startup
    return DeltaSearch(args.window, args.depth, args.compression, reuse_deltas=args.reuse_deltas,
                       threads=args.threads or threads, nice=nice)


def _built_now(rep) -> str:
    objects = sum(p.objects for _, p in rep.versions if p)
    size = sum(p.size for _, p in rep.versions if p)
    seg_objects = sum(p.objects for _, p in rep.segments if p)
    seg_size = sum(p.size for _, p in rep.segments if p)
    return (f"{len(rep.versions)} version packs built now ({objects} objects, {size} bytes); "
            f"{len(rep.segments)} segment packs built now ({seg_objects} objects, {seg_size} bytes)"
            + ("; the import's pack built again with the wide search" if rep.widened else ""))


def _import_repo(store, name: str, search, on_version, on_segment, say, wait: bool = True):
    """Build what STORE's repository lacks; with WAIT, a builder found running
    is waited for (SAY tells its pid) and whatever it left is built after it.
    The merged BuildReport: `busy` only without WAIT, `gone` when the
    repository went."""
    from ..packs import background  # startup
    from ..runtime.admission import BUILDS_ENV  # startup
    total = background.BuildReport()
    told: set = set()

    def slot_wait(n: int) -> None:
        say(f"aspen: waiting for a build slot ({n} builds already run on this machine; {BUILDS_ENV})")
    while True:
        rep = background.build(store, search, on_version, on_segment, on_wait_slot=slot_wait, quick_first=False)
        total.versions += rep.versions
        total.segments += rep.segments
        total.pruned += rep.pruned
        total.widened = total.widened or rep.widened
        if rep.gone or not rep.busy:
            total.gone = rep.gone
            return total
        if not wait:
            total.busy, total.busy_owner = rep.busy, rep.busy_owner
            return total
        if rep.busy_owner not in told:
            told.add(rep.busy_owner)
            say(f"aspen: waiting for the builder running for {name} "
                f"(pid {background.holder_pid(rep.busy_owner)}, {os.path.basename(rep.busy)})")
        _wait_free(rep.busy, rep.busy_owner)


def _wait_free(lock: str, owner) -> None:
    """Until LOCK is no longer OWNER's, or OWNER died."""
    from ..packs.background import _holder  # startup
    from ..runtime.owners import owner_alive  # startup
    pause = 0.05
    while _holder(lock) == owner and owner_alive(owner):
        time.sleep(pause)
        pause = min(pause * 1.5, 0.5)


def _import_background(args: argparse.Namespace) -> int:
    """What a push starts under CGI (packs/background.py): niced, one
    pack-objects thread, gone at once when another builder runs, and quietly
    when the repository goes (leaving nothing behind)."""
    from ..packs import background  # startup
    from ..refstore.guarded import open_store  # startup
    from ..runtime.repoguard import RepoGuard, RepositoryGone  # startup
    from ..runtime.statedir import state_dir  # startup
    try:
        os.nice(background.NICE)
    except OSError:
        pass
    from ..git import gitexec  # startup
    gitexec.run_as_background()
    gitdir = os.path.abspath(args.repo)
    from ..runtime.repository import Repository  # startup
    repo = Repository.of(gitdir, dict(os.environ, GIT_DIR=gitdir))
    guard = RepoGuard.take(gitdir, state_dir(gitdir, repo.settings))
    try:
        store = open_store(repo, guard) if guard is not None else None   # never makes a deleted one's dir
    except RepositoryGone:
        guard = None
    if guard is None:
        _exit_leaving_store_open(0)
    if store is None:
        return 0
    try:
        rep = background.build(store, _search(args, nice=background.NICE), guard=guard)
    except Exception as e:  # noqa: BLE001  (nobody reads this but a log; say why)
        sys.stderr.write(f"aspen: building packs for {gitdir} failed: {e}\n")
        return 1
    if rep.gone:
        _exit_leaving_store_open(0)
    return 0


def _exit_leaving_store_open(code: int) -> None:
    """Exit without closing a store whose repository went: SQLite's close
    would delete the write-ahead log by name, a new repository's if one
    replaced it (repoguard.py)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _import_all(args: argparse.Namespace) -> int:
    import threading  # startup

    from ..runtime.progress import Bar  # startup
    root = os.path.abspath(args.repo)
    if not os.path.isdir(root):
        raise SystemExit(f"aspen: not a directory: {args.repo}")
    from ..git.discovery import repositories  # startup
    repos = repositories(root)
    bar = Bar("importing repositories", enabled=not args.quiet)
    search = _search(args)
    counts = {"built": 0, "already": 0, "failed": 0}
    t0 = time.monotonic()

    def say(line: str, out=sys.stderr) -> None:
        if bar.enabled:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
        out.write(line + "\n")
        out.flush()

    def one(n: int, gitdir: str, name: str) -> None:
        def step(kind: str):
            return lambda done, total, what: bar.update(n, len(repos), f"{name}: {kind} {done}/{total}")
        try:
            store = open_repo(gitdir)
            rep = _import_repo(store, name, search, step("version packs"), step("segment packs"), say,
                               wait=not args.no_wait)
        except (SystemExit, Exception) as e:    # noqa: BLE001  (one repository's failure stops not the rest)
            counts["failed"] += 1
            say(f"{name}: failed: {e}")
            return
        if rep.gone:
            counts["failed"] += 1
            say(f"{name}: deleted, moved or replaced during the import", sys.stdout)
        elif rep.versions or rep.segments:
            counts["built"] += 1
            say(f"{name}: {store.latest()} versions; {_built_now(rep)}", sys.stdout)
        elif rep.busy:
            counts["already"] += 1
            say(f"{name}: left to the builder running ({rep.busy})", sys.stdout)
        else:
            counts["already"] += 1
            say(f"{name}: {store.latest()} versions, already built", sys.stdout)

    for n, gitdir in enumerate(repos):
        name = os.path.relpath(gitdir, root)
        bar.update(n, len(repos), name)
        # a thread per repository: the store's connections are per thread and go with it
        worker = threading.Thread(target=one, args=(n, gitdir, name), daemon=True, name="aspen-import")
        worker.start()
        while worker.is_alive():
            worker.join(0.2)
    bar.update(len(repos), len(repos), "")
    bar.finish()
    print(f"imported {len(repos)} repositories under {root}: {counts['built']} built now, "
          f"{counts['already']} already built, {counts['failed']} failed; {time.monotonic() - t0:.1f} s")
    return 1 if counts["failed"] else 0
