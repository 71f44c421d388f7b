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

from .. import stats
from ..model import TargetInfo
from .base import WorkloadContext

QUERY_RUNS = 9     # timed runs per query; the median is reported
TRUNK = "refs/heads/main"


def visits_bound(n: int) -> float:
    """The issue's bound on an ancestry query over N versions: 2*log2(N) + 4."""
    return 2 * math.log2(max(1, n)) + 4


def repo_dir(ctx: WorkloadContext, t: TargetInfo) -> Optional[Path]:
    root = ctx.roots.get(t.name) or t.root
    return Path(root) / ctx.repo if root else None


class Probe:
    """An open ref store of one target's repository (`with Probe(path) as p:`);
    `p.store` is None when the repository has no store (not served by Aspen)."""

    def __init__(self, gitdir: Path):
        self.gitdir = str(gitdir)
        self.store = None

    def __enter__(self) -> "Probe":
        from aspen_cgi.refstore.store import RefStore, state_dir
        env = dict(os.environ)
        if os.path.exists(os.path.join(state_dir(self.gitdir, env), "aspen.sqlite3")):
            self.store = RefStore.open(self.gitdir, env, create=False)
            if self.store is not None:
                self.store.sync()
        return self

    def __exit__(self, *exc) -> None:
        if self.store is None:
            return
        from aspen_cgi.refstore import store as store_mod   # drop the cached per-thread connection
        conns = getattr(store_mod._local, "conns", None) or {}
        conn = conns.pop(self.store.path, None)
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


def stale_branch_figures(store, n: int, branch_ref: str, branch_sha: str, base_sha: str) -> tuple[dict, str]:
    """For a branch BRANCH_REF (one commit BRANCH_SHA on top of trunk's BASE_SHA) cut N
    trunk pushes ago: j = the version that created the branch, k = the latest; is
    trunk's value at j an ancestor of trunk's value at k? and tips(BASE_SHA).
    Returns (metrics, problem); PROBLEM is empty when every answer is right."""
    problems = []
    made = [v for v, r in store.tips(branch_sha).tips if r == branch_ref]
    if not made:
        return {}, f"store: no tip records {branch_ref} = {branch_sha[:12]}"
    j, k = made[0], store.latest()
    ans, query_us = _timed(lambda: store.is_ancestor(TRUNK, j, k))
    tips, tips_us = _timed(lambda: store.tips(base_sha))
    bound = visits_bound(n)
    m = {"j": j, "k": k, "versions_span": k - j, "ancestor": ans.ancestor,
         "versions_visited": ans.visits.versions, "segments_visited": ans.visits.segments,
         "visits_total": ans.visits.total, "visits_bound": round(bound, 2), "query_us": round(query_us, 1),
         "tips_found": len(tips.tips), "tips_visits": tips.visits.total, "tips_us": round(tips_us, 1)}
    if not ans.ancestor:
        problems.append(f"store: is_ancestor({TRUNK}, {j}, {k}) answered false")
    if ans.value_j != base_sha:
        problems.append(f"store: trunk at version {j} is {ans.value_j}, the branch's base is {base_sha}")
    if ans.visits.total > bound:
        problems.append(f"store: {ans.visits.total} visits for N={n} exceed the bound {bound:.1f}")
    if not any(r == TRUNK and v <= j for v, r in tips.tips):
        problems.append(f"store: tips({base_sha[:12]}) has no {TRUNK} version <= {j}: {tips.tips}")
    return m, "; ".join(problems)
