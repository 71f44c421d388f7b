"""Aspen's ref store, read from the bench process: the history questions the
planner will ask (`is_ancestor`, `tips`), answered on the aspen target's
repository on disk, with the visits counted and the query timed.

Only local targets running Aspen have a store: `<root>/<repo>/aspen/aspen.sqlite3`
(or under ASPEN_STATE_DIR, which the servers inherit from the bench's
environment). Other targets get no store figures.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Optional

from aspen_cgi import settings
from aspen_cgi.runtime.repository import Repository

from .. import stats
from ..model import TargetInfo
from .base import WorkloadContext

QUERY_RUNS = 9     # timed runs per query; the median is reported


def visits_bound(n: int) -> float:
    """The issue's bound on an ancestry query over N versions: 2*log2(N) + 4."""
    return 2 * math.log2(max(1, n)) + 4


def repo_dir(ctx: WorkloadContext, t: TargetInfo) -> Optional[Path]:
    root = ctx.roots.get(t.name) or t.root
    return Path(root) / ctx.repo if root else None


class Probe:
    """An open ref store of one target's repository (`with Probe(path) as p:`);
    `p.store` is None when the repository has no store (not served by Aspen).
    SYNC=False reads the store as the server left it (no write from the bench)."""

    def __init__(self, gitdir: Path, sync: bool = True):
        self.gitdir = str(gitdir)
        self.sync = sync
        self.store = None

    def __enter__(self) -> "Probe":
        from aspen_cgi.refstore.registry import store_file_name
        from aspen_cgi.refstore.store import RefStore, state_dir
        env = dict(os.environ)
        if os.path.exists(os.path.join(state_dir(self.gitdir, settings.of(env)),
                                       store_file_name(settings.of(env)))):
            self.store = RefStore.open(Repository.of(self.gitdir, env), create=False)
            if self.store is not None and self.sync:
                self.store.sync()
        return self

    def __exit__(self, *exc) -> None:
        if self.store is None:
            return
        from aspen_cgi.refstore import registry  # drop the cached per-thread connection
        conns = getattr(registry._local, "conns", None) or {}
        conn = conns.pop(self.store.path, None)
        if isinstance(conn, tuple):       # (connection, file id) in newer stores
            conn = conn[0]
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass
        self.store = None


def _timed(fn, runs: int = QUERY_RUNS):
    """(last result, median µs over RUNS calls)."""
    times, out = [], None
    for _ in range(max(1, runs)):
        t0 = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return out, stats.median(times)


def stale_branch_figures(store, n: int, branch_ref: str, branch_sha: str, base_sha: str,
                         trunk: str) -> tuple[dict, str]:
    """For a branch BRANCH_REF (one commit BRANCH_SHA on top of trunk's BASE_SHA) cut N
    trunk pushes ago: j = the version that created the branch, k = the latest; is
    the value of trunk (the branch HEAD names: refs/heads/master in git.git) at j
    an ancestor of its value at k? and tips(BASE_SHA).
    Returns (metrics, problem); PROBLEM is empty when every answer is right."""
    problems = []
    made = [v for v, r in store.tips(branch_sha).tips if r == branch_ref]
    if not made:
        return {}, f"store: no tip records {branch_ref} = {branch_sha[:12]}"
    j, k = made[0], store.latest()
    ans, query_us = _timed(lambda: store.is_ancestor(trunk, j, k))
    tips, tips_us = _timed(lambda: store.tips(base_sha))
    bound = visits_bound(n)
    m = {"j": j, "k": k, "versions_span": k - j, "ancestor": ans.ancestor,
         "versions_visited": ans.visits.versions, "segments_visited": ans.visits.segments,
         "visits_total": ans.visits.total, "visits_bound": round(bound, 2), "query_us": round(query_us, 1),
         "tips_found": len(tips.tips), "tips_visits": tips.visits.total, "tips_us": round(tips_us, 1)}
    if not ans.ancestor:
        problems.append(f"store: is_ancestor({trunk}, {j}, {k}) answered false")
    if ans.value_j != base_sha:
        problems.append(f"store: trunk at version {j} is {ans.value_j}, the branch's base is {base_sha}")
    if ans.visits.total > bound:
        problems.append(f"store: {ans.visits.total} visits for N={n} exceed the bound {bound:.1f}")
    if not any(r == trunk and v <= j for v, r in tips.tips):
        problems.append(f"store: tips({base_sha[:12]}) has no {trunk} version <= {j}: {tips.tips}")
    return m, "; ".join(problems)


# ---------------------------------------------------------------- version packs built?

def packs_dir(gitdir: Path) -> Path:
    """Where Aspen keeps GITDIR's version (and segment) packs."""
    from aspen_cgi.runtime.statedir import state_dir
    return Path(state_dir(str(gitdir), settings.of(dict(os.environ)))) / "packs"


def _builder_running(pdir: Path) -> bool:
    """Is a live builder holding any lock in the packs directory (`.build.lock`
    of the version packs, `.segments.lock` of the compaction, any other
    `*.lock`)? A lock whose holder is dead does not count (the next builder
    takes it over); without Aspen's owner check, a lock file counts."""
    try:
        locks = [p for p in pdir.iterdir() if p.name.endswith(".lock")]
    except OSError:
        return False
    try:
        from aspen_cgi.runtime.owners import owner_alive
    except Exception:
        return bool(locks)
    for lock in locks:
        try:
            holder = lock.read_text().strip()
            fresh = time.time() - lock.stat().st_mtime < 5.0
        except OSError:
            continue                # removed meanwhile
        if owner_alive(holder) if holder else fresh:     # an empty lock is being written
            return True
    return False


def _pending_packs(gitdir: Path) -> Optional[int]:
    """Versions still without a pack, plus the segment packs (compaction) the
    store's schedule still asks for when the store has them; None without a store."""
    with Probe(gitdir, sync=False) as p:
        st = p.store
        if st is None:
            return None
        try:
            from aspen_cgi.refstore import db
            pending = len(db.versions_without_pack(st.conn, 1 << 30))
        except Exception:
            pending = 0 if st.all_packs_built() else 1
        try:
            pending += len(_segments_to_build(st))
        except Exception:
            pass
        return pending


def _segments_to_build(st) -> list:
    """The segment packs ST's schedule still asks for ([] from an Aspen without them)."""
    try:
        from aspen_cgi.packs.builder import segments_to_build
    except ImportError:
        todo = getattr(st, "segments_to_build", None)     # an Aspen from before packs/builder.py
        return todo() if callable(todo) else []
    return segments_to_build(st)


def _segment_packs(gitdir: Path) -> Optional[int]:
    with Probe(gitdir, sync=False) as p:
        fn = getattr(p.store, "segment_packs", None) if p.store is not None else None
        try:
            return len(fn()) if callable(fn) else None
        except Exception:
            return None


def _listing(pdir: Path) -> tuple:
    try:
        return tuple(sorted((p.name, p.stat().st_size) for p in pdir.iterdir() if p.is_file()))
    except OSError:
        return ()


def packs_figures(gitdir: Path) -> dict:
    """pack_files (*.pack) and packs_bytes (their size) in GITDIR's packs directory,
    and segment_packs (the store's segment packs) when the store keeps them."""
    packs = [(n, size) for n, size in _listing(packs_dir(gitdir)) if n.endswith(".pack")]
    out = {"pack_files": len(packs), "packs_bytes": sum(size for _, size in packs)}
    segs = _segment_packs(gitdir)
    if segs is not None:
        out["segment_packs"] = segs
    return out


def wait_packs(gitdir: Path, timeout: float = 600.0, poll: float = 0.05, quiet: float = 0.3) -> dict:
    """Wait until GITDIR's packs are all built: no live builder holding a lock
    in the packs directory (version packs or compaction), no version without
    its pack, no segment pack the store's schedule still asks for, and the
    directory unchanged for QUIET seconds (a builder between two locks).
    Returns packs_wait_ms, packs_settled (False on timeout or without a store),
    packs_pending (at the end; -1 when unknown), pack_files, packs_bytes and
    segment_packs."""
    pdir = packs_dir(gitdir)
    t0 = time.monotonic()
    deadline = t0 + timeout
    last, since, pending = None, t0, None
    settled = False
    while True:
        now = time.monotonic()
        listing = _listing(pdir)
        if listing != last:
            last, since = listing, now
        busy = _builder_running(pdir)
        if not busy:
            try:
                pending = _pending_packs(Path(gitdir))
            except Exception:       # the store busy or changing under us: look again
                pending = -2
            if pending is None:     # no store at all: nothing will be built
                break
        if not busy and pending == 0 and now - since >= quiet:
            settled = True
            break
        if now > deadline:
            break
        time.sleep(poll if busy or pending else min(poll, quiet / 3))
    return {"packs_wait_ms": round((time.monotonic() - t0) * 1000, 1), "packs_settled": settled,
            "packs_pending": pending if pending is not None and pending >= 0 else -1, **packs_figures(Path(gitdir))}


def wait_target_packs(ctx: WorkloadContext, t: TargetInfo, timeout: Optional[float] = None,
                      quiet: float = 0.3) -> dict:
    """wait_packs on T's repository when T builds version packs (aspen, aspen-packs: every
    Aspen target but aspen-git); {} otherwise (aspen-git, stock, URL targets).
    The bound is params packs_timeout (default 600 s) unless TIMEOUT is given."""
    if not getattr(t, "version_packs", False):
        return {}
    gitdir = repo_dir(ctx, t)
    if gitdir is None:
        return {}
    return wait_packs(gitdir, float(timeout if timeout is not None else ctx.param("packs_timeout", 600)),
                      quiet=quiet)
