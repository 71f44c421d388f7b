"""Clone workloads: `full-clone` and `depth1-clone` (repeated, interleaved,
medians of wall and bytes) and `clone-concurrency` (C clients at once)."""

from __future__ import annotations

from typing import Optional

from .. import gitclient, stats
from ..model import Measurement
from .base import WorkloadContext, register
from .common import Wire, ordered, report, repo_url, rmtree, run_jobs, first_failure


def _clone_series(ctx: WorkloadContext, name: str, depth: Optional[int]) -> list[Measurement]:
    reps = int(ctx.param("reps", 5, quick=2))
    walls = {t.name: [] for t in ctx.targets}
    wires = {t.name: [] for t in ctx.targets}
    fails = {t.name: 0 for t in ctx.targets}
    errors = {t.name: "" for t in ctx.targets}
    total = reps * len(ctx.targets)
    for rep in range(reps):
        for t in ordered(ctx, rep):
            dest = ctx.workdir / name / t.name / str(rep)
            dest.parent.mkdir(parents=True, exist_ok=True)
            with Wire(ctx, t) as w:
                r = gitclient.clone(repo_url(ctx, t), dest, depth=depth)
            if r.ok:
                walls[t.name].append(r.wall_ms)
                wires[t.name].append(w.metrics())
            else:
                fails[t.name] += 1
                errors[t.name] = r.stderr_tail[-300:]
            rmtree(dest)
            report(ctx, rep * len(ctx.targets) + ctx.targets.index(t) + 1, total, f"{name} {t.name}")
    out = []
    for t in ctx.targets:
        m = {"reps": reps, "failures": fails[t.name]}
        if walls[t.name]:
            m["wall_ms"] = stats.median(walls[t.name])
        for key in (wires[t.name][0] if wires[t.name] else {}):
            m[key] = stats.median([x[key] for x in wires[t.name]])
        out.append(Measurement(name, t.name, {"depth": depth or 0}, m, walls[t.name], errors[t.name]))
    return out


@register("full-clone")
def full_clone(ctx: WorkloadContext) -> list[Measurement]:
    """Full clone (no checkout): median wall ms and wire bytes over repetitions."""
    return _clone_series(ctx, "full-clone", None)


@register("depth1-clone")
def depth1_clone(ctx: WorkloadContext) -> list[Measurement]:
    """`--depth 1` clone (no checkout): median wall ms and wire bytes over repetitions."""
    return _clone_series(ctx, "depth1-clone", 1)


@register("clone-concurrency")
def clone_concurrency(ctx: WorkloadContext) -> list[Measurement]:
    """C full clones started at once: per-clone wall samples and the total wall."""
    clients = int(ctx.param("clients", 16, quick=4))
    reps = int(ctx.param("reps", 3, quick=1))
    out = []
    for rep in range(reps):
        for t in ordered(ctx, rep):
            base = ctx.workdir / "clone-concurrency" / t.name / str(rep)
            base.mkdir(parents=True, exist_ok=True)
            url = repo_url(ctx, t)
            jobs = [lambda i=i: gitclient.clone(url, base / f"c{i}") for i in range(clients)]
            with Wire(ctx, t) as w:
                results, total_ms = run_jobs(jobs, clients,
                                             lambda d: report(ctx, d, clients, f"clone-concurrency {t.name}"))
            rmtree(base)
            samples = [r.wall_ms for r in results if r.ok]
            m = {"clients": clients, "total_wall_ms": total_ms, "failures": sum(not r.ok for r in results)}
            m.update({f"{k}_ms": v for k, v in stats.summary(samples).items() if k != "n"})
            m.update(w.metrics())
            out.append(Measurement("clone-concurrency", t.name, {"clients": clients, "rep": rep}, m, samples,
                                   first_failure(results)))
    return out
