"""Storm workloads: K concurrent jobs against one target at a time, each a
`--depth 1` clone (`storm-depth1`) or a warm one-commit fetch (`storm-warm`):
latency samples and p50/p90/p99, failures, total bytes, and the server's CPU
seconds and peak RSS over the storm. Jobs run as `git` subprocesses on a
thread pool (params pool, default K: all submitted at once)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

from .. import gitclient, stats, targets
from ..model import Measurement, TargetInfo
from .base import WorkloadContext, register
from .common import (
    ServerUsage,
    Wire,
    copy_client,
    first_failure,
    ordered,
    quiet_repo,
    repo_url,
    report,
    rmtree,
    run_jobs,
)
from .storeprobe import wait_target_packs


class CacheMarks:
    """How Aspen's access lines mark the storm's fetches (cache=hit, shared,
    cold, uncached, overloaded): counted from the target's log; nothing for
    targets without one (stock)."""

    def __init__(self, t: TargetInfo):
        self.path = Path(t.plan_log) if getattr(t, "plan_log", None) else None
        self.counts: dict[str, int] = {}

    def __enter__(self) -> "CacheMarks":
        self._pos = self.path.stat().st_size if self.path and self.path.exists() else 0
        return self

    def __exit__(self, *exc) -> None:
        if not self.path or not self.path.exists():
            return
        time.sleep(0.3)         # access lines are written as responses close
        with open(self.path, "rb") as f:
            f.seek(self._pos)
            text = f.read().decode(errors="replace")
        for line in text.splitlines():
            if line.startswith("aspen: ") and "service=upload-pack" in line and "method=POST" in line:
                mark = next((w[6:] for w in line.split() if w.startswith("cache=")), None)
                if mark:
                    self.counts[mark] = self.counts.get(mark, 0) + 1

    def metrics(self) -> dict:
        return {f"cache_{k}": v for k, v in sorted(self.counts.items())}


def wait_prewarm(ctx: WorkloadContext, t: TargetInfo, timeout: float = 120.0) -> Optional[float]:
    """Wait until the target's pre-warmer (started by the push just made)
    lets go of its mutex; ms waited, or None for targets without one. The
    pre-warm is the push's work (the depth-1 clones of the new tip), done
    before CI jobs arrive: the storm's server CPU is the storm's own."""
    if getattr(t, "plan_log", None) is None or t.root is None:
        return None
    start = time.monotonic()
    targets.wait_prewarm(Path(t.root) / ctx.repo / "aspen" / "cache" / "prewarm.mutex", timeout)
    return round((time.monotonic() - start) * 1000, 1)


def _storm(ctx: WorkloadContext, name: str, t: TargetInfo, jobs: list, k: int, pool: int, rep: int,
           extra: dict) -> Measurement:
    with ServerUsage(ctx, t) as usage, Wire(ctx, t) as w, CacheMarks(t) as marks:
        results, total_ms = run_jobs(jobs, pool, lambda d: report(ctx, d, k, f"{name} {t.name}"))
    samples = [r.wall_ms for r in results if r.ok]
    m = {"jobs": k, "pool": pool, "failures": sum(not r.ok for r in results), "total_wall_ms": total_ms, **extra}
    m.update({f"{key}_ms": v for key, v in stats.summary(samples).items() if key != "n"})
    m.update(w.metrics())
    m.update(usage.metrics())
    m.update(marks.metrics())
    served = [r.ms for r in (w.records or []) if r.pack_bytes > 0]
    if served:   # the server's side: from the fetch's request head to its last response byte, at the proxy
        m.update({"pack_response_p50_ms": stats.percentile(served, 50),
                  "pack_response_p99_ms": stats.percentile(served, 99)})
    return Measurement(name, t.name, {"jobs": k, "rep": rep}, m, samples, first_failure(results))


def _sizes(ctx: WorkloadContext) -> tuple[int, int, int]:
    k = int(ctx.param("jobs", 200, quick=20))
    return k, int(ctx.param("pool", k)), int(ctx.param("reps", 1))


@register("storm-depth1")
def storm_depth1(ctx: WorkloadContext) -> list[Measurement]:
    """K concurrent `--depth 1` clones (no checkout) of the repository."""
    k, pool, reps = _sizes(ctx)
    out = []
    for rep in range(reps):
        for t in ordered(ctx, rep):
            d = ctx.workdir / "storm-depth1" / t.name / str(rep)
            d.mkdir(parents=True, exist_ok=True)
            url = repo_url(ctx, t)
            jobs = [lambda i=i: gitclient.clone(url, d / f"c{i}", depth=1) for i in range(k)]
            out.append(_storm(ctx, "storm-depth1", t, jobs, k, pool, rep, {}))
            rmtree(d)
    return out


@register("storm-warm")
def storm_warm(ctx: WorkloadContext) -> list[Measurement]:
    """K clients one push behind (one clone, copied K times with hard-linked
    objects) fetch the one new commit at once. The pushed commit is the same on
    every target; a target that builds version packs is first left to build the
    push's pack (not timed: packs_wait_ms)."""
    k, pool, reps = _sizes(ctx)
    out = []
    for rep in range(reps):
        for t in ordered(ctx, rep):
            url = repo_url(ctx, t)
            d = ctx.workdir / "storm-warm" / t.name / str(rep)
            d.mkdir(parents=True, exist_ok=True)
            base, pusher = d / "base", d / "pusher"
            if not (gitclient.clone(url, base).ok and gitclient.clone(url, pusher, bare=True).ok):
                raise RuntimeError(f"storm-warm: cannot clone {t.name}")
            quiet_repo(base)
            for i in range(k):
                copy_client(base, d / f"c{i}")
            report(ctx, 0, k, f"storm-warm {t.name} prepared")
            sha = gitclient.commit_file(pusher, "bench/storm.txt", f"storm {rep}\n", f"storm {rep}\n",
                                        parent=ctx.trunk, when=gitclient.BASE_TIME + 1000 + rep)
            p = gitclient.push(pusher, url, sha or "HEAD", ctx.trunk)
            if not (sha and p.ok):
                raise RuntimeError(f"storm-warm: cannot push to {t.name}: {p.stderr_tail}")
            settle = wait_target_packs(ctx, t, quiet=0.05)     # aspen, aspen-packs: the push's pack, not timed
            prewarm_ms = wait_prewarm(ctx, t)                   # aspen: the push's pre-warm, not timed

            def job(i: int) -> gitclient.ClientResult:
                r = gitclient.fetch(d / f"c{i}", url, [f"+{ctx.trunk}:refs/remotes/origin/{ctx.trunk_name}"])
                if r.ok and gitclient.rev_parse(d / f"c{i}", f"refs/remotes/origin/{ctx.trunk_name}") != sha:
                    return gitclient.ClientResult(False, r.wall_ms, "fetched tip differs", r.stdout)
                return r
            jobs = [lambda i=i: job(i) for i in range(k)]
            extra = {"packs_wait_ms": settle["packs_wait_ms"]} if settle else {}
            if prewarm_ms is not None:
                extra["prewarm_wait_ms"] = prewarm_ms
            out.append(_storm(ctx, "storm-warm", t, jobs, k, pool, rep, extra))
            rmtree(d)
    return out
