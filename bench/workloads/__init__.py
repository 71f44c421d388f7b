"""The workloads, by name. A workload is `run(ctx: WorkloadContext) -> list[Measurement]`;
each measures every target of the context in the same run.

    from bench.workloads import WORKLOADS, WorkloadContext
    rows = WORKLOADS["warm-fetch"](WorkloadContext(targets=..., repo="bench.git", ...))

Knobs (`ctx.params`, quick default in brackets): reps (per workload), jobs 200 [20]
and pool (= jobs) for storms, max_n 10000 [100], pushes 10000 [200] and window
100 [50] for push-history, writers 16 [4], readers 4 [2], seconds 30 [5],
clients 16 [4], fetches 200 [20], refs 5000 [500] for ref-advertisement, seed 1,
protocol 2 (or 0).

Metric keys (wire bytes only when the target has a proxy): `bytes` (server to
client), `request_bytes`, `exchange_bytes` (both ways), `pack_bytes`,
`requests`; `wall_ms` (median over reps), `failures`; percentiles as
`p50_ms`/`p90_ms`/`p99_ms` (also `min_ms`, `mean_ms`, `max_ms`); storms add
`server_cpu_s`, `server_peak_rss_bytes`, `total_wall_ms`; Aspen rows may add
`plan`, `why`, `versions_visited`, `planning_us` from its access log.
"""

from .base import WORKLOADS, Workload, WorkloadContext, register
from . import adverts, clones, fetches, pushes, randomfetch, storms  # each registers its workloads

_FAMILIES = (adverts, clones, fetches, pushes, randomfetch, storms)

ORDER = ["full-clone", "depth1-clone", "warm-fetch", "stale-branch", "ref-advertisement", "push-history",
         "storm-depth1", "storm-warm", "writers", "clone-concurrency", "random-fetch"]
_ordered = {n: WORKLOADS[n] for n in ORDER if n in WORKLOADS}
_ordered.update(WORKLOADS)   # any later-registered names keep their place after these
WORKLOADS.clear()
WORKLOADS.update(_ordered)

__all__ = ["WORKLOADS", "Workload", "WorkloadContext", "register", "ORDER"]
