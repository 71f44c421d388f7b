"""`aspen`: the operator's command line. `dev` serves repositories; `log`,
`verify`, `compact`, `import` and `query` read and maintain a repository's
ref store and version packs; `stats` reports the response cache, and with
`--server` the server's metrics (metrics.py). Each command reads the
server's settings (settings.py) from its environment, and exits 2 when one
cannot be parsed."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Optional

from . import __version__
from . import settings as aspen_settings


def _cmd_dev(args: argparse.Namespace) -> int:
    from .devserver import serve  # startup
    return serve(args.dir, args.host, args.port, args.workers, allow_push=not args.no_push)


def _open(repo: str):
    """The store of REPO (a bare repository or a work tree's .git), synced with the disk."""
    from .refstore.store import RefStore  # startup
    gitdir = repo
    if not os.path.isfile(os.path.join(gitdir, "HEAD")) and os.path.isdir(os.path.join(repo, ".git")):
        gitdir = os.path.join(repo, ".git")
    if not os.path.isfile(os.path.join(gitdir, "HEAD")):
        raise SystemExit(f"aspen: not a git repository: {repo}")
    gitdir = os.path.abspath(gitdir)
    from .runtime.repository import Repository  # startup
    store = RefStore.open(Repository.of(gitdir, dict(os.environ, GIT_DIR=gitdir)))
    if store is None:
        raise SystemExit(f"aspen: cannot keep a ref store for {repo} (read-only? set ASPEN_STATE_DIR)")
    from .refstore import db  # startup
    try:
        store.sync()
    except db.Unstorable as e:
        raise SystemExit(f"aspen: the ref store cannot hold the refs of {repo}: {e}; they are served from disk")
    if store.imported:
        _RECORDED.append(gitdir)
    return store


_RECORDED: list[str] = []       # the repositories this command recorded as version 1 (pre-warmed after an import)


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def _cert_json(cert) -> Optional[dict]:
    """A version's push certificate for `aspen log --json` (its text as UTF-8, undecodable bytes replaced)."""
    if cert is None:
        return None
    return {"blob": cert.blob, "signer": cert.signer, "key": cert.key, "status": cert.status,
            "nonce": cert.nonce, "nonce_status": cert.nonce_status, "nonce_slop": cert.nonce_slop,
            "text": cert.text.decode("utf-8", "replace")}


# git's words for each %G? letter (git log's pretty formats)
SIGNATURE_WORDS = {"G": "good signature", "B": "bad signature", "E": "signature cannot be checked",
                   "X": "good signature, expired", "Y": "good signature, expired key",
                   "R": "good signature, revoked key", "N": "no signature checked"}


def _cert_line(cert) -> str:
    """`    signed: good signature by <signer>, key <key>, nonce OK, certificate <blob>`."""
    what = SIGNATURE_WORDS.get(cert.status, cert.status)
    by = f" by {cert.signer}" if cert.signer else ""
    slop = f" ({cert.nonce_slop:+d}s)" if cert.nonce_slop is not None else ""
    return (f"    signed: {cert.status} {what}{by}, key {cert.key or '-'}, nonce {cert.nonce_status}{slop}, "
            f"certificate {cert.blob[:12]}\n")


def _cmd_log(args: argparse.Namespace) -> int:
    store = _open(args.repo)
    if args.export:
        return _export_chain(store, args.export)
    out = sys.stdout
    cluster = store.replica_root is not None      # the node that took each version is worth a look
    try:
        for v in store.log(args.limit):
            if args.json:
                link = store.chain([v.id]).get(v.id)
                out.write(json.dumps({"id": v.id, "kind": v.kind, "who": v.who, "at": v.at, "push_id": v.push_id,
                                      "state": v.state, "node": v.node,
                                      "updates": [{"ref": u.ref, "old": u.old, "new": u.new, "fast_forward": u.ff}
                                                  for u in v.updates],
                                      "cert": _cert_json(v.cert),
                                      "chain": None if link is None else
                                      {"hash": link[1], "prev": link[0], "start": bool(link[2])}}) + "\n")
                continue
            who = v.who or "-"
            state = "" if v.state == "done" else f" [{v.state}]"
            what = f"  ({v.push_id})" if v.kind in ("undo", "restore") and v.push_id else ""
            via = f"  via {v.node}" if cluster and v.node else ""
            out.write(f"version {v.id}  {v.kind}  {who}  {_when(v.at)}{state}{what}{via}\n")
            if v.cert is not None:
                out.write(_cert_line(v.cert))
            shown = v.updates if args.all_updates or len(v.updates) <= 20 else v.updates[:20]
            for u in shown:
                mark = " ff" if u.ff else ""
                out.write(f"    {u.old[:12]}..{u.new[:12]}  {u.ref}{mark}\n")
            if len(shown) < len(v.updates):
                out.write(f"    ... {len(v.updates) - len(shown)} more (--all-updates)\n")
    except BrokenPipeError:
        pass
    return 0


def _export_chain(store, path: str) -> int:
    """Every chained version as one JSON line (version, prev, hash, start, text): what
    docs/ref-store.md's auditor procedure checks without Aspen."""
    out = sys.stdout if path == "-" else open(path, "w", encoding="utf-8")
    n = 0
    try:
        for link in store.chain_links():
            out.write(json.dumps({"version": link.version, "prev": link.prev, "hash": link.hash,
                                  "start": link.start, "text": link.text}) + "\n")
            n += 1
    finally:
        if out is not sys.stdout:
            out.close()
    if path != "-":
        print(f"{path}: {n} chained versions", file=sys.stderr)
    return 0


def _cmd_verify_chain(args: argparse.Namespace, store) -> int:
    rep = store.verify_chain()
    if args.json:
        print(json.dumps({"ok": rep.ok, **rep.__dict__}))
    elif rep.ok:
        span = f"versions {rep.first}..{rep.last} ({rep.links})" if rep.links else "no versions yet"
        print(f"chain intact: {span}; it starts at version {rep.starts_at}")
    else:
        print(f"chain broken at version {rep.broken_at}: {rep.why}")
    return 0 if rep.ok else 1


def _cmd_verify(args: argparse.Namespace) -> int:
    store = _open(args.repo)
    if args.chain:
        return _cmd_verify_chain(args, store)
    from .runtime.progress import Spinner  # startup
    with Spinner("verifying", enabled=not args.quiet) as spin:
        rep = store.verify(progress=spin.step)
    if args.json:
        print(json.dumps({"ok": rep.ok, "versions": rep.versions, "refs": rep.refs, "problems": rep.problems}))
    else:
        for p in rep.problems:
            print(f"problem: {p}")
        print(f"{'consistent' if rep.ok else 'NOT consistent'}: {rep.versions} versions, {rep.refs} refs, "
              f"{len(rep.problems)} problems")
    return 0 if rep.ok else 1


def _cmd_compact(args: argparse.Namespace) -> int:
    store = _open(args.repo)
    rep = store.compact()
    if args.json:
        print(json.dumps(rep.__dict__))
    else:
        print(f"compacted: {rep.versions} versions, {rep.nodes_built} segments built now, "
              f"{rep.segments} segments ({rep.segment_rows} ref summaries) over {rep.levels} levels")
    return 0


def _cmd_db(args: argparse.Namespace) -> int:
    from .refstore import store as refstore  # startup
    url = args.url or aspen_settings.of(os.environ).refstore_url
    if not url:
        print("aspen db: no database: give its URL or set ASPEN_REFSTORE_URL", file=sys.stderr)
        return 2
    if args.action == "drop":
        if not args.repo:
            print("aspen db drop: name the store's repository with --repo (as `aspen db list` shows it)",
                  file=sys.stderr)
            return 2
        try:
            gone = refstore.drop_database_store(url, args.repo)
        except (refstore.db.Error, refstore.db.Busy) as e:      # type: ignore[misc]
            print(f"aspen db drop: {e}", file=sys.stderr)
            return 1
        print(f"aspen db drop: {'dropped' if gone else 'no store of'} {args.repo}")
        return 0 if gone else 1
    if args.action == "migrate":
        return _db_migrate(refstore, url, args)
    try:
        stores = refstore.database_stores(url, init=args.action == "init")
    except refstore.db.Error as e:      # type: ignore[misc]
        print(f"aspen db {args.action}: {e}", file=sys.stderr)
        return 1
    except refstore.db.Busy as e:
        print(f"aspen db {args.action}: the database did not answer: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([{"repo": r, "schema": sc, "schema_version": v} for r, sc, v in stores]))
    elif args.action == "init":
        print(f"aspen db init: ready, {len(stores)} store(s)")
    else:
        for r, sc, v in stores:
            print(f"{sc}  schema {v}  {r}")
    return 0


def _db_migrate(refstore, url: str, args: argparse.Namespace) -> int:
    """`aspen db migrate`: every store behind moved to this Aspen's schema now."""
    from .runtime.progress import Bar  # startup
    bar = Bar("aspen db migrate", enabled=not args.json)
    try:
        moved = refstore.migrate_database_stores(url, bar.update)
    except (refstore.db.Error, refstore.db.Busy) as e:      # type: ignore[misc]
        bar.finish()
        print(f"aspen db migrate: {e}", file=sys.stderr)
        return 1
    bar.finish()
    newer = [(r, b) for r, b, a in moved if a > refstore.db.SCHEMA_VERSION]
    if args.json:
        print(json.dumps([{"repo": r, "before": b, "after": a} for r, b, a in moved]))
    else:
        changed = sum(1 for _, b, a in moved if a != b)
        print(f"aspen db migrate: {changed} of {len(moved)} store(s) moved to schema {refstore.db.SCHEMA_VERSION}")
        for r, b in newer:
            print(f"aspen db migrate: {r} is at schema {b}, newer than this Aspen's", file=sys.stderr)
    return 1 if any(a < refstore.db.SCHEMA_VERSION for _, _, a in moved) else 0


def _cmd_replica(args: argparse.Namespace) -> int:
    """`aspen replica sync`: bring this node's copies to the log."""
    from .refstore import store as refstore  # startup
    from .runtime.progress import Bar  # startup
    from .runtime.repository import Repository  # startup
    env = dict(os.environ)
    s = aspen_settings.of(env)
    if not refstore.replica_mode(s):
        print("aspen replica: this node is no replica: set ASPEN_REFSTORE_URL and ASPEN_PACK_STORE",
              file=sys.stderr)
        return 2
    paths = list(args.repo)
    if args.all:
        root = env.get("GIT_PROJECT_ROOT")
        if not root or not s.cluster:
            print("aspen replica sync --all: set GIT_PROJECT_ROOT and ASPEN_CLUSTER", file=sys.stderr)
            return 2
        try:
            known = refstore.database_stores(s.refstore_url)
        except (refstore.db.Error, refstore.db.Busy) as e:      # type: ignore[misc]
            print(f"aspen replica sync: {e}", file=sys.stderr)
            return 1
        paths += [os.path.join(root, r[len(s.cluster) + 1:]) for r, _, _ in known if r.startswith(s.cluster + ":")]
    if not paths:
        print("aspen replica sync: name a repository, or --all", file=sys.stderr)
        return 2
    failed = 0
    for path in paths:
        path = os.path.abspath(path)
        served = Repository.of(path, dict(env, GIT_DIR=path))
        made = not os.path.exists(os.path.join(path, "HEAD")) and refstore.materialize(path, served)
        if not os.path.isfile(os.path.join(path, "HEAD")):
            print(f"aspen replica sync: {path}: not a repository here, and the log knows none there",
                  file=sys.stderr)
            failed += 1
            continue
        store = refstore.RefStore.open(served)
        if store is None:
            print(f"aspen replica sync: {path}: its store cannot be opened", file=sys.stderr)
            failed += 1
            continue
        bar = Bar(f"sync {os.path.basename(path)}", enabled=not args.quiet)
        try:
            before, after = store.catch_up(lambda done, total: bar.update(done, total, "versions' packs"))
        except (OSError, refstore.db.Error, refstore.db.Busy) as e:     # type: ignore[misc]
            bar.finish()
            print(f"aspen replica sync: {path}: {e}", file=sys.stderr)
            failed += 1
            continue
        bar.finish()
        print(f"{path}: {'made, ' if made else ''}version {before} -> {after}")
    return 1 if failed else 0


def _cmd_import(args: argparse.Namespace) -> int:
    if args.background:
        return _import_background(args)
    if args.all:
        return _import_all(args)
    from .runtime.progress import Bar  # startup
    store = _open(args.repo)
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
    from .packs.versionpack import DeltaSearch  # startup
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
    from .packs import background  # startup
    from .runtime.admission import BUILDS_ENV  # startup
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
    from .packs.background import _holder  # startup
    from .runtime.owners import owner_alive  # startup
    pause = 0.05
    while _holder(lock) == owner and owner_alive(owner):
        time.sleep(pause)
        pause = min(pause * 1.5, 0.5)


def _import_background(args: argparse.Namespace) -> int:
    """What a push starts under CGI (packs/background.py): niced, one
    pack-objects thread, gone at once when another builder runs, and quietly
    when the repository goes (leaving nothing behind)."""
    from .packs import background  # startup
    from .refstore.guarded import open_store  # startup
    from .runtime.repoguard import RepoGuard, RepositoryGone  # startup
    from .runtime.statedir import state_dir  # startup
    try:
        os.nice(background.NICE)
    except OSError:
        pass
    from .git import gitexec  # startup
    gitexec.run_as_background()
    gitdir = os.path.abspath(args.repo)
    from .runtime.repository import Repository  # startup
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

    from .runtime.progress import Bar  # startup
    root = os.path.abspath(args.repo)
    if not os.path.isdir(root):
        raise SystemExit(f"aspen: not a directory: {args.repo}")
    from .git.discovery import repositories  # startup
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
            store = _open(gitdir)
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


def _cmd_query(args: argparse.Namespace) -> int:
    store = _open(args.repo)
    if args.what == "ancestor":
        if len(args.args) != 3:
            raise SystemExit("aspen query ancestor REPO REF J K")
        try:
            ref, j, k = args.args[0], int(args.args[1]), int(args.args[2])
        except ValueError:
            raise SystemExit("aspen query ancestor REPO REF J K (J and K are version numbers)")
        t0 = time.perf_counter()
        a = store.is_ancestor(ref, j, k)
        us = (time.perf_counter() - t0) * 1e6
        print(json.dumps({"ref": a.ref, "j": a.j, "k": a.k, "ancestor": a.ancestor, "value_j": a.value_j,
                          "value_k": a.value_k, "versions_visited": a.visits.versions,
                          "segments_visited": a.visits.segments, "us": round(us, 1)}))
        return 0 if a.ancestor else 1
    if len(args.args) != 1:
        raise SystemExit("aspen query tip REPO COMMIT")
    t = store.tips(args.args[0])
    print(json.dumps({"commit": t.commit, "tips": [{"version": v, "ref": r} for v, r in t.tips],
                      "versions_visited": t.visits.versions, "segments_visited": t.visits.segments}))
    return 0 if t.tips else 1


def _depth1_entries(items) -> dict[str, int]:
    """Depth-1 clones' entries by what they hold: git's answer (stock, the wide
    one being built), the wide one, or git's kept for good."""
    from .cache.entries import DEPTH1_LABELS, depth1_of  # startup
    counts = {label: 0 for label in DEPTH1_LABELS.values()}
    for e in items:
        label = DEPTH1_LABELS.get(depth1_of(e.path) or 0)
        if label:
            counts[label] += 1
    return counts


def _cmd_install_cgi(args: argparse.Namespace) -> int:
    from . import cgilauncher  # startup
    path = args.path or cgilauncher.installed()
    python = args.python or os.path.join(os.path.dirname(path), "python3")
    why = cgilauncher.rewrite(path, python)
    if why is not None:
        print(f"aspen install-cgi: {why}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"{path}: starts {python} -IS directly")
    return 0


def _cmd_resident(args: argparse.Namespace) -> int:
    from . import resident  # startup
    run_dir = aspen_settings.of(os.environ).run_dir
    found = resident.running(run_dir)
    if not args.all:
        found = [r for r in found if r.ours]
    if args.json and not args.stop:
        print(json.dumps([r.as_dict() for r in found]))
        return 0
    if not found:
        print(f"no resident {'of this user' if args.all else 'of this install'} in {run_dir}")
        return 0
    rc = 0
    for r in found:
        if args.stop:
            went = resident.stop(r)
            print(f"{r.socket}: pid {r.pid} {'stopped' if went else 'did not stop within 10 s'}")
            rc |= 0 if went else 1
        else:
            state = f"pid {r.pid}, {len(r.workers)} worker(s)" if r.pid else "not running (a stale socket)"
            print(f"{r.socket}: {state}{'' if r.ours else ' (another install)'}")
    return rc


def _cmd_stats(args: argparse.Namespace) -> int:
    from .cache import evict, responses, stats  # startup
    from .runtime import admission  # startup
    from .runtime.statedir import state_dir  # startup
    if not args.repo and not args.server:
        raise SystemExit("aspen stats: name a repository, or --server for the server's metrics")
    rows = []
    for repo in args.repo:
        gitdir = os.path.abspath(repo)
        if not os.path.isfile(os.path.join(gitdir, "HEAD")):
            raise SystemExit(f"aspen: not a git repository: {repo}")
        config = aspen_settings.of(os.environ)
        settings = responses.settings(state_dir(gitdir, config), config)
        if settings is None:
            rows.append({"repo": repo, "cache": "off"})
            continue
        c = stats.totals(settings.directory) if os.path.isdir(settings.directory) else stats.Counters()
        items = evict.entries(settings.directory)
        rows.append({"repo": repo, "cache_dir": settings.directory, "requests": c.requests,
                     "hit_rate": round(c.hit_rate, 4), "hits": c.counts["hit"], "shared": c.counts["shared"],
                     "cold": c.counts["cold"], "uncached": c.counts["uncached"], "prewarmed": c.counts["prewarm"],
                     "bytes_from_cache": c.bytes["hit"] + c.bytes["shared"],
                     "bytes_computed": c.bytes["cold"] + c.bytes["uncached"], "evictions": c.counts["evicted"],
                     "evicted_bytes": c.bytes["evicted"], "abandoned": c.counts["abandoned"],
                     "superseded": c.counts["superseded"], "entries": len(items), "entry_bytes": sum(e.size for e in items),
                     "max_bytes": settings.max_bytes, "depth1_wide": c.counts["depth1_wide"],
                     "depth1_kept": c.counts["depth1_kept"], "depth1_entries": _depth1_entries(items)})
    g = admission.gauges(admission.capacity(aspen_settings.of(os.environ)))
    server = {"cold_running": g.running, "queue_depth": g.queued, "builds_running": g.builds}
    values = None
    if args.server:
        from .http import metricspage  # startup
        from .runtime import metrics  # startup
        values = metricspage.snapshot(os.environ)
        server.update({"metrics_dir": metrics.directory(aspen_settings.of(os.environ)), "metrics": metrics.families(values)})
    if args.json:
        print(json.dumps({"repositories": rows, "server": server}, indent=2))
        return 0
    for r in rows:
        if r.get("cache") == "off":
            print(f"{r['repo']}: cache off (ASPEN_CACHE=off)")
            continue
        print(f"{r['repo']}:")
        print(f"  requests {r['requests']}  hit rate {r['hit_rate']:.1%}  (hit {r['hits']}, shared {r['shared']}, "
              f"cold {r['cold']}, uncached {r['uncached']}, pre-warmed {r['prewarmed']})")
        print(f"  bytes served from cache {r['bytes_from_cache']:,}  computed {r['bytes_computed']:,}")
        print(f"  entries {r['entries']} ({r['entry_bytes']:,} of {r['max_bytes']:,} bytes)  "
              f"evictions {r['evictions']} ({r['evicted_bytes']:,} bytes)  abandoned {r['abandoned']}  "
              f"superseded {r['superseded']}")
        d1 = r["depth1_entries"]
        print(f"  depth-1 clones: entries stock {d1['stock']}, wide {d1['wide']}, stock-kept {d1['stock-kept']}; "
              f"made wide in the background {r['depth1_wide']}, kept git's {r['depth1_kept']}")
    if values is not None:
        _print_metrics(server["metrics_dir"], values)
    else:
        print(f"server: cold computations running {server['cold_running']}, queue depth {server['queue_depth']}, "
              f"pack builds running {server['builds_running']}")
    return 0


def _print_metrics(where: str, values: dict) -> None:
    """The server's metrics, family by family: the numbers GET /_aspen/metrics serves."""
    from .runtime import metrics  # startup
    counted = [k for k in values if metrics.family(k) in metrics.COUNTERS and values[k]]
    print(f"server metrics ({where}):")
    if not counted:
        print("  nothing counted yet: the server counts with ASPEN_METRICS=1 in its environment, here "
              "under ASPEN_STATE_DIR or ASPEN_RUN_DIR as set for it")
    for name, kind, title, _ in metrics.FAMILIES:
        rows = [(metrics.labels_of(k), v) for k, v in sorted(values.items()) if metrics.family(k) == name]
        if not rows:
            continue
        if len(rows) == 1 and not rows[0][0]:
            print(f"  {title}: {metrics.number_text(rows[0][1])}")
            continue
        print(f"  {title}:")
        cells = [list(labels.values()) for labels, _ in rows]
        ncol = max(len(c) for c in cells)
        widths = [max((len(c[i]) for c in cells if i < len(c)), default=0) for i in range(ncol)]
        for c, (_, v) in zip(cells, rows):
            text = "  ".join((c[i] if i < len(c) else "-").ljust(widths[i]) for i in range(ncol))
            print(f"    {text}  {metrics.number_text(v)}")


def _who() -> str:
    import pwd  # startup
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def _rewind(args: argparse.Namespace, store, kind: str, make, through: int, push_id: str) -> int:
    """Make an undo or restore version (push/undo.py) and say what it did."""
    from .model.versions import VersionMeta  # startup
    from .push import undo as rewind  # startup
    from .runtime.repository import Repository  # startup
    from .service import child_env  # startup
    t0 = time.monotonic()
    try:
        changes = make()
        done = rewind.apply(store, Repository.of(store.gitdir, child_env(dict(os.environ), store.gitdir)), changes,
                            VersionMeta(kind=kind, who=_who(), push_id=push_id), through)
    except rewind.Refused as e:
        if args.json:
            print(json.dumps({"ok": False, "refused": str(e)}))
        else:
            print(f"aspen {kind}: refused: {e}", file=sys.stderr)
        return 1
    ms = (time.monotonic() - t0) * 1000
    if done.hook_output:
        sys.stderr.write(done.hook_output.decode("utf-8", "replace"))
    if args.json:
        print(json.dumps({"ok": True, "version": done.version, "kind": kind, "ms": round(ms, 1),
                          "reinjected": list(done.reinjected), "post_receive_status": done.hook_status,
                          "updates": [{"ref": c.ref, "old": c.old, "new": c.new} for c in done.changes]}))
        return 0
    print(f"version {done.version}: {kind} ({push_id}), {len(done.changes)} ref(s), {ms:.0f} ms")
    for c in done.changes:
        print(f"    {c.old[:12]}..{c.new[:12]}  {c.ref}")
    if done.reinjected:
        print(f"    objects put back from the packs of versions {', '.join(map(str, done.reinjected))}")
    return 0


def _cmd_undo(args: argparse.Namespace) -> int:
    from .push import undo as rewind  # startup
    store = _open(args.repo)
    return _rewind(args, store, "undo", lambda: rewind.undo_changes(store, args.version, args.force),
                   args.version - 1, f"undo-{args.version}")


def _cmd_restore(args: argparse.Namespace) -> int:
    from .model.pin import PinError, parse  # startup
    from .push import undo as rewind  # startup
    store = _open(args.repo)
    try:
        version = store.resolve_pin(parse(args.at))
    except PinError as e:
        print(f"aspen restore: refused: {e}", file=sys.stderr)
        return 1
    return _rewind(args, store, "restore", lambda: rewind.restore_changes(store, args.ref, version),
                   version, f"restore-{version}")


def _cmd_doctor(args: argparse.Namespace) -> int:
    from . import doctor  # startup
    c = doctor.checkup(args.repo, args.user, args.apache_dir, args.unit, args.url, os.environ)
    return doctor.report(doctor.examine(c), args.json)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aspen", description="Aspen: a drop-in replacement for git http-backend.",
        epilog="A repository's past, for any git client: git clone http://HOST/REPO.git@V (a version from "
               "`aspen log`) or REPO.git@2026-11-30T12:00Z; over protocol v2 also --server-option=aspen-version=V "
               "or aspen-at=T. Read-only. A bundle of it: GET http://HOST/REPO.git/aspen/bundle[@V] "
               "(git clone --bundle-uri=...). See docs/time-travel.md.")
    parser.add_argument("--version", action="version", version=f"aspen {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    dev = sub.add_parser("dev", help="serve every repository under DIR on localhost (embedded defaults)",
                         description="Serve every bare repository under DIR over smart and dumb HTTP on localhost. "
                                     "An empty or missing DIR gets a small demo repository. Pushes are allowed "
                                     "anonymously (http.receivepack=true is implied) unless --no-push is given.")
    dev.add_argument("dir", nargs="?", default="./repos", help="directory of repositories (default: ./repos)")
    dev.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    dev.add_argument("--port", type=int, default=8080, help="port (default: 8080; 0 picks a free one)")
    dev.add_argument("--workers", type=int, default=2, help="gunicorn worker processes (default: 2)")
    dev.add_argument("--no-push", action="store_true", help="refuse pushes, as stock does without REMOTE_USER")
    dev.set_defaults(func=_cmd_dev)

    log = sub.add_parser("log", help="versions of a repository's refs, newest first",
                         description="List the ref store's versions newest first: id, kind (import, push, "
                                     "external), who, when, and each ref update (old..new, ff when a fast-forward); "
                                     "with --json also each version's place in the hash chain.")
    log.add_argument("repo", help="path of the repository")
    log.add_argument("-n", "--limit", type=int, default=None, help="show at most N versions")
    log.add_argument("--json", action="store_true", help="one JSON object per version per line")
    log.add_argument("--all-updates", action="store_true", help="do not abbreviate versions with many updates")
    log.add_argument("--export", metavar="FILE", help="write every chained version (hash, previous hash, canonical "
                                                      "text) as JSON lines to FILE (- for stdout), for an auditor "
                                                      "(docs/ref-store.md)")
    log.set_defaults(func=_cmd_log)

    verify = sub.add_parser("verify", help="check the ref store against the refs on disk and the objects",
                            description="Check the ref store's own consistency (SQLite integrity, versions replay "
                                        "to the current refs, nothing pending), that it equals the refs on disk, "
                                        "and that every ref's objects are present and connected, and the hash "
                                        "chain over the versions. Exit 0 only when everything is consistent.")
    verify.add_argument("repo", help="path of the repository")
    verify.add_argument("--chain", action="store_true", help="check only the hash chain over the versions, end to "
                                                             "end, and name the first broken link")
    verify.add_argument("--json", action="store_true", help="print the result as JSON")
    verify.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    verify.set_defaults(func=_cmd_verify)

    undo = sub.add_parser("undo", help="one new version putting back every ref a version changed",
                          description="Make one new version that sets every ref version V changed back to its value "
                                      "before V (a ref V created is deleted). Refused, with the refs named, when one "
                                      "of them moved since V, unless --force. Objects git gc pruned are put back from "
                                      "the version packs first; post-receive and post-update run as for a push.")
    undo.add_argument("repo", help="path of the repository")
    undo.add_argument("version", type=int, help="the version to undo (`aspen log` lists them)")
    undo.add_argument("--force", action="store_true", help="put the refs back even where they moved since")
    undo.add_argument("--json", action="store_true", help="print the result as JSON")
    undo.set_defaults(func=_cmd_undo)

    restore = sub.add_parser("restore", help="one new version bringing one ref back to its value at a version or time",
                             description="Make one new version that sets REF to its value at version V, or at the "
                                         "latest version committed by time T (ISO 8601, e.g. 2026-11-30T12:00Z): a "
                                         "deleted branch comes back. Objects git gc pruned are put back from the "
                                         "version packs first; post-receive and post-update run as for a push.")
    restore.add_argument("repo", help="path of the repository")
    restore.add_argument("ref", help="the full ref name, e.g. refs/heads/topic")
    restore.add_argument("--at", required=True, metavar="V|T", help="a version number or a time")
    restore.add_argument("--json", action="store_true", help="print the result as JSON")
    restore.set_defaults(func=_cmd_restore)

    compact = sub.add_parser("compact", help="build missing history segments and checkpoint the store",
                             description="Build every segment the geometric schedule calls for (pushes do this as "
                                         "they land; this catches up after external changes or crashes), then "
                                         "checkpoint the SQLite write-ahead log.")
    compact.add_argument("repo", help="path of the repository")
    compact.add_argument("--json", action="store_true", help="print the result as JSON")
    compact.set_defaults(func=_cmd_compact)

    imp = sub.add_parser("import", help="record a repository (or every one under a directory) and build its packs",
                         description="Bring the ref store up to the refs on disk (recording the repository as "
                                     "version 1 on first use), then build every version pack not built yet: the "
                                     "import version's pack holds the whole repository, each later version's is "
                                     "the thin pack of what it introduced. Then compact: build the segment packs "
                                     "(runs of versions 2..N on a binary schedule) a full clone is spliced from, "
                                     "and remove those a larger one replaced. Packs are built once with a wide "
                                     "delta search, so this can take minutes on a large repository. When a "
                                     "builder is already running for the repository (one a push started), this "
                                     "waits for it (saying its pid), then builds whatever is still missing; exit "
                                     "0 once everything is built. Every build holds one of the machine's "
                                     "ASPEN_BUILDS_PER_SERVER build slots (default half the cores). With --all, "
                                     "REPO is a directory: every repository under it (bare, or a work tree's "
                                     ".git, found as GIT_PROJECT_ROOT serves them; other directories are "
                                     "skipped) is imported in turn, with a progress bar over the repositories. "
                                     "Interrupted (even by kill -9), run it again: what is built is skipped and "
                                     "the rest is built.")
    imp.add_argument("repo", metavar="REPO", help="path of the repository (with --all: a directory of repositories)")
    imp.add_argument("--all", action="store_true",
                     help="import every repository under the directory REPO, skipping what is built")
    imp.add_argument("--window", type=int, default=250, help="delta search window (default 250)")
    imp.add_argument("--depth", type=int, default=50, help="maximum delta chain depth (default 50)")
    imp.add_argument("--compression", type=int, default=9, help="zlib level 0-9 (default 9)")
    imp.add_argument("--threads", type=int, default=0,
                     help="pack-objects threads (default: git's, one per core, as background builds)")
    imp.add_argument("--reuse-deltas", action="store_true",
                     help="reuse the deltas of the repository's packs instead of searching every object afresh")
    imp.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    imp.add_argument("--no-wait", dest="no_wait", action="store_true",
                     help="exit at once (0) when another builder is running, leaving the packs to it")
    imp.add_argument("--wait-lock", dest="no_wait", action="store_true", help=argparse.SUPPRESS)   # the old name
    imp.add_argument("--background", action="store_true",
                     help="what a push starts under CGI: niceness 10, the idle scheduling class, exit at once "
                          "when another builder runs, and stop quietly, leaving nothing, if the repository "
                          "is deleted or replaced")
    imp.set_defaults(func=_cmd_import)

    query = sub.add_parser("query", help="ask the ref store a history question (JSON answer with visit counts)",
                           description="`ancestor REPO REF J K`: is REF's value at version J an ancestor of its "
                                       "value at version K (exit 0 yes, 1 not proved)? `tip REPO COMMIT`: which "
                                       "versions made COMMIT a ref's value? Both print the versions and segments "
                                       "visited.")
    query.add_argument("what", choices=("ancestor", "tip"))
    query.add_argument("repo", help="path of the repository")
    query.add_argument("args", nargs="*", help="REF J K for ancestor, COMMIT for tip")
    query.set_defaults(func=_cmd_query)

    icgi = sub.add_parser("install-cgi", help="make the installed aspen-cgi start Python directly, without /bin/sh",
                          description="Rewrite the first line of the installed aspen-cgi (pip installs it as a /bin/sh "
                                      "line that execs Python with -I -S) to start the venv's Python directly with the "
                                      "same flags: 0.8 ms less of every CGI request. ./run setup runs it; after a "
                                      "plain `pip install`, run it once as the venv's owner.")
    icgi.add_argument("path", nargs="?", help="the aspen-cgi to rewrite (default: the one beside this Python)")
    icgi.add_argument("--python", help="the interpreter it starts (default: python3 beside it)")
    icgi.add_argument("-q", "--quiet", action="store_true", help="print nothing when it succeeds")
    icgi.set_defaults(func=_cmd_install_cgi)

    res = sub.add_parser("resident", help="show or stop the resident process aspen-cgi hands requests to",
                         description="Under CGI, aspen-cgi hands each request no recorded answer serves to a "
                                     "resident Aspen process of the same user, started on first need, which keeps "
                                     "the pipeline imported and forks workers (ASPEN_CGI_RESIDENT, "
                                     "ASPEN_CGI_RESIDENT_IDLE, ASPEN_CGI_RESIDENT_WORKERS). This shows it: its "
                                     "socket in ASPEN_RUN_DIR (run this with the server's setting), pid and "
                                     "workers; --stop ends it (workers finish their requests; the next request "
                                     "is answered in-process and starts another).")
    res.add_argument("--stop", action="store_true", help="stop it (SIGTERM) and wait for it to go")
    res.add_argument("--all", action="store_true", help="every resident of this user in the run directory, "
                                                        "other installs' too")
    res.add_argument("--json", action="store_true", help="print them as JSON")
    res.set_defaults(func=_cmd_resident)

    dbp = sub.add_parser("db", help="the PostgreSQL database of ref stores (ASPEN_REFSTORE_URL): "
                                    "init, list, migrate, drop",
                         description="init: make the database's list of stores (each repository's store, a "
                                     "schema of its own, is made on its first request); list: every store in "
                                     "it, with the repository it is known by; migrate: move every store to "
                                     "this Aspen's schema now (a cluster with a shared pack store, once every "
                                     "node runs this Aspen; docs/cluster.md, Upgrading); drop: remove the store "
                                     "of the repository --repo names, e.g. before a cluster's repository is "
                                     "replaced by a new one at the same path (docs/cluster.md).")
    dbp.add_argument("action", choices=("init", "list", "migrate", "drop"),
                     help="init: make the list of stores; list: show them; migrate: move them to this "
                          "Aspen's schema; drop: remove one (--repo)")
    dbp.add_argument("--repo", help="drop: the repository the store is known by (as `list` shows it)")
    dbp.add_argument("url", nargs="?", help="the database's postgresql:// URL (default: ASPEN_REFSTORE_URL)")
    dbp.add_argument("--json", action="store_true", help="print the stores as JSON")
    dbp.set_defaults(func=_cmd_db)

    rep = sub.add_parser("replica", help="bring this node's repositories to the cluster's log (docs/cluster.md)",
                         description="sync: make each repository the log knows and this node lacks (an empty "
                                     "node, a lost directory), then apply the pack store's packs of every version "
                                     "its copy lacks and set its refs as the log has them, with a progress bar. "
                                     "Needs the server's ASPEN_REFSTORE_URL, ASPEN_PACK_STORE, ASPEN_CLUSTER and "
                                     "GIT_PROJECT_ROOT. A server does the same before each answer; this does it "
                                     "ahead of the first request.")
    rep.add_argument("action", choices=("sync",), help="sync: bring the copies to the log")
    rep.add_argument("repo", nargs="*", help="path of a repository on this node (it need not exist yet)")
    rep.add_argument("--all", action="store_true", help="every repository of ASPEN_CLUSTER in the log")
    rep.add_argument("--quiet", action="store_true", help="no progress bar")
    rep.set_defaults(func=_cmd_replica)

    doc = sub.add_parser("doctor", help="check what breaks deployments, and say how to fix each",
                         description="Check, on the server, what breaks Aspen deployments, one line each with how to "
                                     "fix it: the settings and where each came from (the environment, Apache's "
                                     "SetEnv lines); Apache's CGI or WSGI module; PrivateTmp and the run directory; "
                                     "then, as the web server's user (root switches to it): the run directory's "
                                     "admission and build slots and the resident; PostgreSQL and the pack store "
                                     "in a cluster; and for each repository (those named, else every one under "
                                     "GIT_PROJECT_ROOT) that it can be read and pushed to, git's ownership check "
                                     "(safe.directory), that its aspen/ state is writable, the ref store against "
                                     "the refs on disk and the pack backlog. With --url, a smart-HTTP request to "
                                     "the server. Exit 1 when something is wrong (a FAIL line).")
    doc.add_argument("repo", nargs="*", help="repositories to check (default: every one under GIT_PROJECT_ROOT)")
    doc.add_argument("--user", help="the server's user (default: the unit's User=, else APACHE_RUN_USER from "
                                    "Apache's envvars when Apache runs Aspen, else this user)")
    doc.add_argument("--apache-dir", default=os.environ.get("APACHE_CONFDIR") or "/etc/apache2",
                     help="Apache's configuration (default: $APACHE_CONFDIR, else /etc/apache2)")
    doc.add_argument("--unit", action="append",
                     help="the server's systemd unit file, read for its Environment=, User= and PrivateTmp "
                          "(default: apache2.service's when Apache runs Aspen, and "
                          "/etc/systemd/system/aspen-gunicorn.service where it exists; repeatable)")
    doc.add_argument("--url", help="a repository's URL on the server: its info/refs must answer as smart HTTP")
    doc.add_argument("--json", action="store_true", help="print the findings as JSON")
    doc.set_defaults(func=_cmd_doctor)

    st = sub.add_parser("stats", help="response cache, admission and server metrics figures",
                        description="For each repository: requests answered through the response cache, the hit "
                                    "rate (hits and shared over all), bytes served from the cache and computed, "
                                    "cold computations, pre-warmed requests, entries and evictions; and for this "
                                    "machine the cold computations running and the admission queue depth "
                                    "(ASPEN_RUN_DIR). Counts are those of every process that served the "
                                    "repository since its cache was made. With --server: the server's metrics, "
                                    "the numbers GET /_aspen/metrics serves when the server runs with "
                                    "ASPEN_METRICS=1, read from the same files (metrics/ under ASPEN_STATE_DIR "
                                    "when set, else under ASPEN_RUN_DIR: run it with the server's setting): "
                                    "requests by service, method and status; fetches by plan (planned or "
                                    "fallback, and why) and by response-cache result (hit, shared, cold, ...); "
                                    "upload-pack bytes from stored packs, computed by git and from the cache; "
                                    "admission's 503s, queued fetches and queue depth; ref-store versions "
                                    "pushed; and the version-pack backlog.")
    st.add_argument("repo", nargs="*", help="path of a repository")
    st.add_argument("--server", action="store_true",
                    help="the server's metrics (what GET /_aspen/metrics serves with ASPEN_METRICS=1): requests, "
                         "plans and fallbacks, cache results, admission, pushes, pack backlog, bytes by source")
    st.add_argument("--json", action="store_true", help="print the figures as JSON")
    st.set_defaults(func=_cmd_stats)
    return parser


# commands that read or write a repository's files: run as root, they act as its owner
AS_OWNER = ("log", "verify", "undo", "restore", "compact", "import", "query", "stats", "replica")


def _repo_paths(args: argparse.Namespace) -> list[str]:
    """The command's repository paths, made absolute (acting as the owner may change directory)."""
    if isinstance(args.repo, list):
        args.repo = [os.path.abspath(r) for r in args.repo]
        paths = list(args.repo)
    else:
        args.repo = os.path.abspath(args.repo)
        paths = [args.repo]
    if getattr(args, "export", None) and args.export != "-":
        args.export = os.path.abspath(args.export)
    if args.command == "replica" and args.all and os.environ.get("GIT_PROJECT_ROOT"):
        paths.append(os.environ["GIT_PROJECT_ROOT"])
    return paths


def _act_as_owner(args: argparse.Namespace) -> int:
    """Run as root, become the owner of the repositories named (0), or say why not (1)."""
    if args.command not in AS_OWNER or os.geteuid() != 0:
        return 0
    from .runtime import runas  # startup
    paths = _repo_paths(args)
    owners = runas.owners_of(paths)
    if all(o.uid == 0 for o in owners):
        return 0
    if len(owners) > 1:
        named = ", ".join(f"{p} ({runas.owner_of(p).name})" for p in paths)
        print(f"aspen {args.command}: the repositories belong to different users: {named}; "
              f"run it once per owner, as that owner", file=sys.stderr)
        return 1
    owner = owners[0]
    existing = [p for p in paths if os.path.exists(p)]
    try:
        runas.become(owner)
    except runas.CannotActAs as e:
        print(f"aspen {args.command}: {paths[0]} belongs to {owner.name} and root cannot act as that user "
              f"here ({e}); run it as the owner: sudo -u {owner.name} aspen {args.command} ...", file=sys.stderr)
        return 1
    print(f"aspen {args.command}: acting as {owner.name}, the owner of {paths[0]}", file=sys.stderr)
    for p in existing:
        if not os.access(p, os.R_OK | os.X_OK):
            print(f"aspen {args.command}: {owner.name} cannot reach {p}: a directory above it is closed to that "
                  f"user (and to a server running as it)", file=sys.stderr)
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from . import settings  # startup
    try:
        if args.command != "doctor":        # which says what is wrong with them
            aspen_settings.of(os.environ)   # every command reads them: a bad one stops it before it starts
    except settings.SettingsError as e:
        print(e, file=sys.stderr)
        return 2
    if _act_as_owner(args):
        return 1
    rc = args.func(args)
    if args.command == "import" and _RECORDED:
        from .fetch.prewarm import after_import  # startup
        after_import(_RECORDED, dict(os.environ))     # their first depth-1 clones, before anyone asks
    return rc


if __name__ == "__main__":
    sys.exit(main())
