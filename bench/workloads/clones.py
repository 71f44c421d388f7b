"""Clone workloads: `full-clone` and `depth1-clone` (repeated, interleaved,
medians of wall and bytes), `offload-clone` (full clones by a client that
offers packfile-uris), `offload-storm` (N such clones at once, the clients'
side reduced to reading: bench/rawclone.py), `history-clone` (full `--mirror` clones after a
history of K trunk pushes, once version packs are built) and
`clone-concurrency` (C clients at once)."""

from __future__ import annotations

import time
from typing import Optional

from .. import gitclient, stats
from ..model import Measurement
from .base import WorkloadContext, register
from .common import PlanLog, PlanStats, ServerUsage, Wire, first_failure, ordered, repo_url, report, rmtree, run_jobs
from .storeprobe import wait_target_packs


def _clone_series(ctx: WorkloadContext, name: str, depth: Optional[int], mirror: bool = False,
                  params: Optional[dict] = None, extra: Optional[dict] = None, cpu: bool = False,
                  verify: bool = False, config: tuple[str, ...] = ()) -> list[Measurement]:
    """REPS clones per target, targets alternating: median wall and wire bytes; the
    plan trace (Aspen targets); with CPU the server tree's CPU per clone
    (`server_cpu_s`, median); with VERIFY the last clone of each target is checked
    (`git fsck --strict`, refs equal to the server's). EXTRA: target -> more metrics.
    The first clone of each target is also reported alone (`wall_first_ms`,
    `pack_bytes_first`, `bytes_first`) beside the median of the later ones
    (`wall_later_ms`, `pack_bytes_later`, `bytes_later`): a server may answer
    the first from git and the later ones from what it built meanwhile.
    Params settle (seconds, default 0) waits that long after the first round
    of clones. CONFIG: the clients' `-c` settings."""
    reps = int(ctx.param("reps", 5, quick=2))
    settle = float(ctx.param("settle", 0))
    walls = {t.name: [] for t in ctx.targets}
    wires = {t.name: [] for t in ctx.targets}
    cpus = {t.name: [] for t in ctx.targets}
    plans = {t.name: PlanStats(t) for t in ctx.targets}
    fails = {t.name: 0 for t in ctx.targets}
    errors = {t.name: "" for t in ctx.targets}
    verified: dict[str, bool] = {}
    firsts: dict[str, list[bool]] = {t.name: [] for t in ctx.targets}   # per successful clone: the first?
    total = reps * len(ctx.targets)
    for rep in range(reps):
        for t in ordered(ctx, rep):
            dest = ctx.workdir / name / t.name / str(rep)
            dest.parent.mkdir(parents=True, exist_ok=True)
            with ServerUsage(ctx, t, precise=True) if cpu else _Nothing() as u, Wire(ctx, t) as w, \
                    PlanLog(t) as plan:
                r = gitclient.clone(repo_url(ctx, t), dest, depth=depth, mirror=mirror, config=config)
            if r.ok:
                walls[t.name].append(r.wall_ms)
                wires[t.name].append(w.metrics())
                plans[t.name].add(plan.metrics())
                if cpu and "server_cpu_s" in u.metrics():
                    cpus[t.name].append(u.metrics()["server_cpu_s"])
                if verify and rep == reps - 1:      # the last clone of each target
                    ls = gitclient.ls_remote(repo_url(ctx, t))
                    v = gitclient.verify(dest, gitclient.parse_refs(ls.stdout), mirror=True) if ls.ok else None
                    verified[t.name] = bool(v and v.ok)
                    if not verified[t.name]:
                        errors[t.name] = (v.detail if v else ls.stderr_tail)[-300:]
            else:
                fails[t.name] += 1
                errors[t.name] = r.stderr_tail[-300:]
            rmtree(dest)
            report(ctx, rep * len(ctx.targets) + ctx.targets.index(t) + 1, total, f"{name} {t.name}")
            if r.ok:
                firsts[t.name].append(rep == 0)
        if rep == 0 and settle > 0 and reps > 1:
            report(ctx, 0, None, f"{name}: settling {settle:g} s")
            time.sleep(settle)
    out = []
    for t in ctx.targets:
        m = {"reps": reps, "failures": fails[t.name]}
        if walls[t.name]:
            m["wall_ms"] = stats.median(walls[t.name])
        for key in (wires[t.name][0] if wires[t.name] else {}):
            m[key] = stats.median([x[key] for x in wires[t.name]])
        if cpus[t.name]:
            m["server_cpu_s"] = stats.median(cpus[t.name])
        m.update(_first_and_later(walls[t.name], wires[t.name], firsts[t.name]))
        if verify:
            m["verified"] = verified.get(t.name, False)
        m.update(plans[t.name].summary())
        m.update((extra or {}).get(t.name, {}))
        out.append(Measurement(name, t.name, dict(params if params is not None else {"depth": depth or 0}), m,
                               walls[t.name], errors[t.name]))
    return out


def _first_and_later(walls: list, wires: list, firsts: list[bool]) -> dict:
    out: dict = {}
    for label, pick in (("first", True), ("later", False)):
        idx = [i for i, f in enumerate(firsts) if f is pick]
        if not idx:
            continue
        out[f"wall_{label}_ms"] = stats.median([walls[i] for i in idx])
        for key in ("pack_bytes", "bytes"):
            vals = [wires[i][key] for i in idx if key in wires[i]]
            if vals:
                out[f"{key}_{label}"] = stats.median(vals)
    return out


class _Nothing:
    def __enter__(self) -> "_Nothing":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def metrics(self) -> dict:
        return {}


@register("full-clone")
def full_clone(ctx: WorkloadContext) -> list[Measurement]:
    """Full clone (no checkout): median wall ms and wire bytes over repetitions."""
    return _clone_series(ctx, "full-clone", None)


@register("offload-clone")
def offload_clone(ctx: WorkloadContext) -> list[Measurement]:
    """Full `--mirror` clones by a client that offers packfile-uris (param
    uri_protocols, default `http`: git's `fetch.uriProtocols`): Aspen names its
    import pack by URI (downloaded from its `aspen/pack/` route, through the same
    counting proxy) and sends the rest inline; stock, which offers no
    packfile-uris, sends it all inline. Median wall, bytes on the wire (all
    requests: `bytes`; the pack inside upload-pack answers: `pack_bytes`), server
    CPU per clone; the last clone of each target verified (fsck --strict, refs).
    docs/offload.md."""
    protocols = str(ctx.param("uri_protocols", "http"))
    return _clone_series(ctx, "offload-clone", None, mirror=True, params={"uri_protocols": protocols}, cpu=True,
                         verify=True, config=(f"fetch.uriProtocols={protocols}",))


@register("offload-storm")
def offload_storm(ctx: WorkloadContext) -> list[Measurement]:
    """Storms of full clones, per target in turn, with offload and without:
    for each of params uri_protocols (default `http,`: a storm whose clients
    offer packfile-uris over http, then the same storm offering none), one
    real `git clone --mirror` first, verified (fsck --strict, refs), then
    params clones (100; quick 6), jobs (10; quick 3) at once, each the fetch
    that clone sends, its answer read whole and every pack it names
    downloaded, nothing indexed (bench/rawclone.py). The server's CPU over
    the storm (`server_cpu_s`), the storm's wall, each clone's wall (p50, p99,
    max), bytes: all (`bytes`), the upload-pack answers' (`answer_bytes`),
    the packs by URI (`static_bytes`); `same_answers`: how many answers were
    as long as the first (Aspen's, stored bytes, always are; git's pack may
    differ from run to run)."""
    offers = str(ctx.param("uri_protocols", "http,")).split(",")
    n = int(ctx.param("clones", 100, quick=6))
    jobs = int(ctx.param("jobs", 10, quick=3))
    out = []
    for rep, protocols in enumerate(offers):
        for t in ordered(ctx, rep):
            report(ctx, len(out), len(offers) * len(ctx.targets),
                   f"offload-storm {t.name}: {n} clones, {jobs} at once, offering {protocols or 'no'} packfile-uris")
            out.append(_offload_storm_one(ctx, t, protocols, n, jobs))
    return out


def _offload_storm_one(ctx: WorkloadContext, t, protocols: str, n: int, jobs: int) -> Measurement:
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from .. import rawclone
    url = repo_url(ctx, t)
    dest = ctx.workdir / "offload-storm" / t.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    real = gitclient.clone(url, dest, mirror=True, config=(f"fetch.uriProtocols={protocols}",) if protocols else ())
    ls = gitclient.ls_remote(url)
    refs = gitclient.parse_refs(ls.stdout) if ls.ok else {}
    v = gitclient.verify(dest, refs, mirror=True) if real.ok and ls.ok else None
    rmtree(dest)
    body = rawclone.fetch_body(sorted(set(refs.values())), protocols or None)
    got: list = []
    errors: list[str] = []
    lock = threading.Lock()

    def one(_: int) -> None:
        try:
            r = rawclone.clone(url, body)
        except OSError as e:
            with lock:
                errors.append(str(e)[-300:])
            return
        with lock:
            got.append(r)

    with ServerUsage(ctx, t, precise=True) as u, Wire(ctx, t) as w:
        start = time.perf_counter()
        with ThreadPoolExecutor(jobs) as pool:
            list(pool.map(one, range(n)))
        wall = time.perf_counter() - start
    walls = sorted(r.wall_s * 1000 for r in got)
    m: dict = {"clones": n, "jobs": jobs, "failures": len(errors) + (0 if real.ok else 1),
               "verified": bool(v and v.ok), "wall_ms": wall * 1000,
               "answer_bytes": sum(r.answer_bytes for r in got), "static_bytes": sum(r.static_bytes for r in got),
               "same_answers": sum(1 for r in got if (r.answer_bytes, r.static_bytes)
                                   == (got[0].answer_bytes, got[0].static_bytes)) if got else 0}
    if walls:
        m.update(p50=stats.median(walls), p99=walls[min(len(walls) - 1, int(len(walls) * 0.99))], max=walls[-1])
    m.update(u.metrics())
    m.update(w.metrics())
    err = errors[0] if errors else ("" if real.ok else real.stderr_tail[-300:]) or ("" if not v or v.ok else v.detail)
    return Measurement("offload-storm", t.name, {"uri_protocols": protocols or "none", "clones": n, "jobs": jobs}, m,
                       walls, err)


@register("depth1-clone")
def depth1_clone(ctx: WorkloadContext) -> list[Measurement]:
    """`--depth 1` clone (no checkout): median wall ms and wire bytes over repetitions."""
    return _clone_series(ctx, "depth1-clone", 1)


@register("history-clone")
def history_clone(ctx: WorkloadContext) -> list[Measurement]:
    """Full `--mirror` clones after a history of K trunk pushes (params history,
    default 1000, quick 50), each a real HTTP push of one commit, targets
    interleaved push by push. A target that builds version packs (aspen, aspen-packs)
    is first left to build them all, and to compact them when it does (no
    builder or lock in its packs directory, no version without its pack, the
    directory quiet for 1 s; bounded by params packs_timeout, default 1800 s):
    packs_wait_ms, packs_settled, pack_files, packs_bytes. Then reps clones
    (default 5, quick 2), targets alternating: median wall, bytes, pack_bytes,
    exchange_bytes, server_cpu_s per clone, and the plan trace (plan_share,
    extents, planning_us); the last clone of each target is verified."""
    k = int(ctx.param("history", 1000, quick=50))
    state = {}
    for t in ctx.targets:
        d = ctx.workdir / "history-clone" / t.name
        d.mkdir(parents=True, exist_ok=True)
        pusher = d / "pusher"
        if not gitclient.clone(repo_url(ctx, t), pusher, bare=True).ok:
            raise RuntimeError(f"history-clone: cannot clone {t.name}")
        base = gitclient.rev_parse(pusher, ctx.trunk)
        ids = gitclient.fast_import_chain(pusher, base, k, "refs/bench/history", tag="history")
        state[t.name] = {"pusher": pusher, "ids": ids, "lat": [], "failed": 0}
    for i in range(k):
        for t in ordered(ctx, i):
            s = state[t.name]
            r = gitclient.push(s["pusher"], repo_url(ctx, t), s["ids"][i], ctx.trunk)
            if r.ok:
                s["lat"].append(r.wall_ms)
            else:
                s["failed"] += 1
        if i % 10 == 9 or i == k - 1:
            report(ctx, i + 1, k, "history-clone pushes")
    extra = {}
    for t in ctx.targets:
        s = state[t.name]
        m = {"history": k, "history_push_failures": s["failed"]}
        if s["lat"]:
            m["history_push_p50_ms"] = stats.median(s["lat"])
        report(ctx, 0, None, f"history-clone: {t.name} packs")
        m.update(wait_target_packs(ctx, t, timeout=float(ctx.param("packs_timeout", 1800)), quiet=1.0))
        extra[t.name] = m
        rmtree(ctx.workdir / "history-clone" / t.name)
    rows = _clone_series(ctx, "history-clone", None, mirror=True, params={"history": k}, extra=extra, cpu=True,
                         verify=True)
    for r in rows:
        if r.metrics.get("packs_settled") is False:
            r.notes = (r.notes + " " if r.notes else "") + (
                f"packs not all built after {r.metrics.get('packs_wait_ms', 0) / 1000:.0f} s "
                f"({r.metrics.get('packs_pending')} pending): clones measured anyway")
    return rows


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
