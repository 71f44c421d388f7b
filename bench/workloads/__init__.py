"""The workloads, by name. A workload is `run(ctx: WorkloadContext) -> list[Measurement]`;
each measures every target of the context in the same run.

    from bench.workloads import WORKLOADS, WorkloadContext
    rows = WORKLOADS["warm-fetch"](WorkloadContext(targets=..., repo="bench.git", ...))

Knobs (`ctx.params`, quick default in brackets): reps (per workload), jobs 200 [20]
and pool (= jobs) for storms, max_n 10000 [100], pushes 10000 [200] and window
100 [50] for push-history, writers 16 [4], readers 4 [2], seconds 30 [5],
clients 16 [4], fetches 200 [20] and protocols "0,2" and wait_packs 1 for
random-fetch (lagging-clients: fetches 120 [12], branches 4 [3], behind
"1,2,5,10,20,50" ["1,3,10"], pushes_between 3, time_limit 3600 [600]), refs
5000 [500] for ref-advertisement, history 1000 [50] for history-clone,
busy-repo's seconds 180 [30], burst 100 [20], burst_every 90 [20], first_burst
15 [5], push_rate 1, event_gap 2 [1], events 200 [40], concurrency 2, mix,
stale_back 100 [10], max_pushes 1000 [300], fsck 1, max_pending 60,
cpu_fetches 4 [2] for warm-fetch, jobs 40 [8], fetches 20 [5] and ramp_s 2 [1] for fairness, packs_timeout (seconds a version-packs
target is given to build its packs: 600 after one push, 1800 after
histories), seed 1, protocol 2 (or 0).

Metric keys (wire bytes only when the target has a proxy): `bytes` (server to
client), `request_bytes`, `exchange_bytes` (both ways), `pack_bytes`,
`requests`; `wall_ms` (median over reps), `failures`; percentiles as
`p50_ms`/`p90_ms`/`p99_ms` (also `min_ms`, `mean_ms`, `max_ms`); storms add
`server_cpu_s`, `server_peak_rss_bytes`, `total_wall_ms` (warm-fetch and
history-clone: `server_cpu_s` per fetch or clone); Aspen rows add the plan
trace (common.PlanStats): `plan_share`, `planned`, `fallback`, `fallbacks`
(why=count), `plan`, `why`, `planning_us`, `versions_visited`,
`segments_visited`, `visits_total`, `extents`, `serve_ms`; targets that build
version packs (aspen, aspen-packs) add `packs_wait_ms` (and `pack_files`,
`packs_bytes`).
"""

from . import (  # each registers its own
    adverts,
    busy,
    clones,
    fairness,
    fetches,
    lagging,
    memory,
    pushes,
    randomfetch,
    storms,
)
from .base import WORKLOADS, Workload, WorkloadContext, register

_FAMILIES = (adverts, busy, clones, fairness, fetches, lagging, memory, pushes, randomfetch, storms)

ORDER = ["full-clone", "history-clone", "depth1-clone", "warm-fetch", "stale-branch", "ref-advertisement", "poll-storm",
         "push-history", "storm-depth1", "storm-warm", "fairness", "writers", "clone-concurrency", "random-fetch",
         "lagging-clients", "busy-repo"]
_ordered = {n: WORKLOADS[n] for n in ORDER if n in WORKLOADS}
_ordered.update(WORKLOADS)   # any later-registered names keep their place after these
WORKLOADS.clear()
WORKLOADS.update(_ordered)

__all__ = ["WORKLOADS", "Workload", "WorkloadContext", "register", "ORDER"]
