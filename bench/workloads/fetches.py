"""Fetch workloads: `warm-fetch` (a client one push behind fetches one new
commit) and `stale-branch` (a client current on trunk fetches a branch created
N trunk pushes ago). Pushed commits have fixed dates, so every target receives
the same commits and their bytes compare."""

from __future__ import annotations

from .. import gitclient, stats
from ..model import Measurement, TargetInfo
from .base import WorkloadContext, register
from .common import PlanLog, PlanStats, ServerUsage, Wire, copy_client, ordered, quiet_repo, repo_url, report, rmtree
from .storeprobe import Probe, repo_dir, stale_branch_figures, visits_bound, wait_target_packs

STALE_NS = (10, 100, 1000, 10000)


def _median_metrics(rows: list[dict]) -> dict:
    """Per key: median of numbers, last value of anything else."""
    out: dict = {}
    for key in {k for r in rows for k in r}:
        vals = [r[key] for r in rows if key in r]
        nums = [v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)]
        out[key] = stats.median(nums) if len(nums) == len(vals) else vals[-1]
    return out


@register("warm-fetch")
def warm_fetch(ctx: WorkloadContext) -> list[Measurement]:
    """Per repetition: push one commit to main (not timed), then a client one push
    behind fetches it (timed). Medians of wall, bytes (whole exchange) and pack
    bytes; the server's CPU per fetch; Aspen's plan trace.

    Server CPU (`server_cpu_s`, seconds per fetch, median over repetitions): the
    CPU of the target's server tree (gunicorn master, workers and their
    children; live threads in ns, reaped children in clock ticks) measured
    around the timed fetch and around params cpu_fetches (default 12, quick 2)
    more fetches of the same commit by copies of the client as it was before
    the fetch, divided by the number of fetches (1 + cpu_fetches), so the
    10 ms tick of reaped children weighs less. A target that builds version
    packs (aspen, aspen-packs) is first left to finish the push's pack (not timed,
    `packs_wait_ms`), so the fetch is served from it and the build's CPU is
    not the fetch's."""
    reps = int(ctx.param("reps", 7, quick=3))
    extra = max(0, int(ctx.param("cpu_fetches", 12, quick=2)))
    state = {}
    for t in ctx.targets:
        d = ctx.workdir / "warm-fetch" / t.name
        d.mkdir(parents=True, exist_ok=True)
        client, pusher = d / "client", d / "pusher"
        a = gitclient.clone(repo_url(ctx, t), client)
        b = gitclient.clone(repo_url(ctx, t), pusher, bare=True)
        if not (a.ok and b.ok):
            raise RuntimeError(f"warm-fetch: cannot clone {t.name}: {a.stderr_tail or b.stderr_tail}")
        quiet_repo(client)
        state[t.name] = {"client": client, "pusher": pusher, "tip": gitclient.rev_parse(pusher, ctx.trunk),
                         "walls": [], "rows": [], "cpu": [], "waits": [], "settled": [], "failures": 0,
                         "cpu_failures": 0,
                         "error": "", "plans": PlanStats(t)}
    total = reps * len(ctx.targets)
    refspec = [f"+{ctx.trunk}:refs/remotes/origin/{ctx.trunk_name}"]
    for rep in range(reps):
        for t in ordered(ctx, rep):
            s = state[t.name]
            url = repo_url(ctx, t)
            sha = gitclient.commit_file(s["pusher"], "bench/warm.txt", f"warm fetch {rep}\n" * (rep + 1),
                                        f"warm fetch {rep}\n", parent=s["tip"], when=gitclient.BASE_TIME + rep)
            p = gitclient.push(s["pusher"], url, sha or "HEAD", ctx.trunk)
            if not (sha and p.ok):
                s["failures"] += 1
                s["error"] = p.stderr_tail[-300:]
                continue
            s["tip"] = sha
            settle = wait_target_packs(ctx, t, quiet=0.05)
            if settle:
                s["waits"].append(settle["packs_wait_ms"])
                s["settled"].append(settle["packs_settled"])
            copies = [s["client"].parent / f"cpu-{i}" for i in range(extra)]
            for c in copies:
                copy_client(s["client"], c)
            with ServerUsage(ctx, t, precise=True) as u1, Wire(ctx, t) as w, PlanLog(t) as plan:
                r = gitclient.fetch(s["client"], url, refspec)
            ok = r.ok and gitclient.rev_parse(s["client"], f"refs/remotes/origin/{ctx.trunk_name}") == sha
            with ServerUsage(ctx, t, precise=True) as u2:
                for c in copies:
                    rc = gitclient.fetch(c, url, refspec)
                    if not (rc.ok and gitclient.rev_parse(c, f"refs/remotes/origin/{ctx.trunk_name}") == sha):
                        s["cpu_failures"] += 1
            for c in copies:
                rmtree(c)
            if ok:
                s["walls"].append(r.wall_ms)
                s["rows"].append(w.metrics())
                s["plans"].add(plan.metrics())
                cpu = [x.metrics().get("server_cpu_s") for x in (u1, u2)]
                if all(v is not None for v in cpu):
                    s["cpu"].append((cpu[0] + cpu[1]) / (1 + len(copies)))
            else:
                s["failures"] += 1
                s["error"] = r.stderr_tail[-300:] or "fetched tip differs"
            report(ctx, rep * len(ctx.targets) + ctx.targets.index(t) + 1, total, f"warm-fetch {t.name}")
    out = []
    for t in ctx.targets:
        s = state[t.name]
        ls = gitclient.ls_remote(repo_url(ctx, t))
        v = gitclient.verify(s["client"], gitclient.parse_refs(ls.stdout), mirror=False) if ls.ok else None
        m = {"reps": reps, "failures": s["failures"], "verified": bool(v and v.ok), "cpu_fetches": 1 + extra}
        if extra:
            m["cpu_failures"] = s["cpu_failures"]
        if s["walls"]:
            m["wall_ms"] = stats.median(s["walls"])
        m.update(_median_metrics(s["rows"]))
        if s["cpu"]:
            m["server_cpu_s"] = stats.median(s["cpu"])
        if s["waits"]:
            m["packs_wait_ms"] = stats.median(s["waits"])
            m["packs_settled"] = all(s["settled"])       # every fetch came after its push's packs were built
        m.update(s["plans"].summary())
        out.append(Measurement("warm-fetch", t.name, {}, m, s["walls"], s["error"] or (v.detail if v else "")))
        rmtree(ctx.workdir / "warm-fetch" / t.name)
    return out


def _build_stale_history(ctx: WorkloadContext, t: TargetInfo, ns: list[int], pusher, done0: int, total: int) -> dict:
    """Branch `stale-N` (one commit) created just before the last N trunk pushes,
    for every N in NS; max(NS) real HTTP pushes of one commit each to main.
    Returns N -> branch commit id, plus the count of failed pushes under key -1 and
    N -> the branch's base (trunk's value when it was cut) under key "bases"."""
    url = repo_url(ctx, t)
    base = gitclient.rev_parse(pusher, ctx.trunk)
    top = max(ns)
    ids = gitclient.fast_import_chain(pusher, base, top, "refs/bench/trunk", tag="trunk")
    branches, bases, failed = {}, {}, 0
    for k in range(top):
        left = top - k
        if left in ns:
            parent = ids[k - 1] if k else base
            sha = gitclient.commit_file(pusher, f"stale/{left}.txt", f"branch made {left} pushes ago\n",
                                        f"stale branch {left}\n", parent=parent, when=gitclient.BASE_TIME + left)
            r = gitclient.push(pusher, url, sha, f"refs/heads/stale-{left}")
            branches[left] = sha if r.ok else None
            bases[left] = parent
        if not gitclient.push(pusher, url, ids[k], ctx.trunk).ok:
            failed += 1
        if k % 10 == 0 or k == top - 1:
            report(ctx, done0 + k + 1, total, f"stale-branch history {t.name}")
    branches[-1] = failed
    branches["bases"] = bases
    return branches


PLANNING_TARGET_US = 2000     # issue 5: planning time at every N


@register("stale-branch")
def stale_branch(ctx: WorkloadContext) -> list[Measurement]:
    """A client current on trunk (single-branch clone of main) fetches `stale-N`, a
    branch created N trunk pushes ago, N in {10, 100, 1000, 10000} up to
    params["max_n"] (default 10000; quick 100). The history is built with real
    HTTP pushes (one server version each). Medians of wall and bytes; for Aspen
    targets, the plan trace of the fetches (plan_share, fallbacks, planning_us,
    versions_visited, segments_visited, visits_total and their maxima, extents),
    and, from the ref store on disk, the planner's question asked by the bench:
    is trunk's value at the version that created the branch (j) an ancestor of
    trunk's value now (k = latest)? with store_versions_visited,
    store_segments_visited, store_visits_total (against visits_bound =
    2*log2(N)+4), query_us (median of several runs), and tips() of the branch's
    base. A wrong store answer or a store bound exceeded fails the workload; the
    trace's figures are checked against issue 5's targets in the row's notes
    (planning <= 2 ms, visits <= bound, wall <= stock's). Targets that build
    version packs are left to finish them before the fetches (packs_wait_ms)."""
    max_n = int(ctx.param("max_n", 10000, quick=100))
    ns = [n for n in STALE_NS if n <= max_n] or [min(STALE_NS)]
    reps = int(ctx.param("reps", 5, quick=2))
    built, clients, settled = {}, {}, {}
    total = max(ns) * len(ctx.targets)
    for i, t in enumerate(ctx.targets):
        d = ctx.workdir / "stale-branch" / t.name
        d.mkdir(parents=True, exist_ok=True)
        pusher = d / "pusher"
        if not gitclient.clone(repo_url(ctx, t), pusher, bare=True).ok:
            raise RuntimeError(f"stale-branch: cannot clone {t.name}")
        built[t.name] = _build_stale_history(ctx, t, ns, pusher, i * max(ns), total)
        client = d / "client"
        r = gitclient.clone(repo_url(ctx, t), client, branch=ctx.trunk_name)
        if not r.ok:
            raise RuntimeError(f"stale-branch: cannot clone {t.name}: {r.stderr_tail}")
        quiet_repo(client)
        clients[t.name] = client
    for t in ctx.targets:
        settled[t.name] = wait_target_packs(ctx, t, timeout=float(ctx.param("packs_timeout", 1800)))
    store_rows, store_problems = _store_figures(ctx, ns, built)
    out = []
    for n in ns:
        walls = {t.name: [] for t in ctx.targets}
        rows = {t.name: [] for t in ctx.targets}
        plans = {t.name: PlanStats(t) for t in ctx.targets}
        fails = {t.name: 0 for t in ctx.targets}
        errs = {t.name: "" for t in ctx.targets}
        for rep in range(reps):
            for t in ordered(ctx, rep):
                want = built[t.name].get(n)
                work = ctx.workdir / "stale-branch" / t.name / f"fetch-{n}-{rep}"
                copy_client(clients[t.name], work)
                with Wire(ctx, t) as w, PlanLog(t) as plan:
                    r = gitclient.fetch(work, repo_url(ctx, t), [f"+refs/heads/stale-{n}:refs/remotes/origin/stale-{n}"])
                got = gitclient.rev_parse(work, f"refs/remotes/origin/stale-{n}") if r.ok else None
                if r.ok and want and got == want:
                    walls[t.name].append(r.wall_ms)
                    rows[t.name].append(w.metrics())
                    plans[t.name].add(plan.metrics())
                else:
                    fails[t.name] += 1
                    errs[t.name] = r.stderr_tail[-300:] or "fetched branch differs"
                rmtree(work)
        row_of = {}
        for t in ctx.targets:
            m = {"n": n, "reps": reps, "failures": fails[t.name], "history_push_failures": built[t.name][-1]}
            if walls[t.name]:
                m["wall_ms"] = stats.median(walls[t.name])
            m.update(_median_metrics(rows[t.name]))
            m.update(plans[t.name].summary())
            if plans[t.name].traced:
                m["visits_bound"] = round(visits_bound(n), 2)
            m.update({k: v for k, v in settled[t.name].items() if k in ("packs_wait_ms", "packs_settled")})
            m.update(store_rows.get((t.name, n), {}))
            row_of[t.name] = Measurement("stale-branch", t.name, {"n": n}, m, walls[t.name], errs[t.name])
        _note_stale_targets(row_of, n)
        out += row_of.values()
    for t in ctx.targets:
        rmtree(ctx.workdir / "stale-branch" / t.name)
    if store_problems:
        raise RuntimeError("stale-branch: Aspen's ref store answered wrongly: " + " | ".join(store_problems)
                           + " || figures: " + "; ".join(f"{k}: {v}" for k, v in sorted(store_rows.items())))
    return out


def _note_stale_targets(rows: dict, n: int) -> None:
    """On each Aspen row whose fetches were traced through the planner: issue 5's
    targets at this N (planning <= 2 ms, visits <= 2*log2(N)+4, wall <= stock's)."""
    stock = rows.get("stock")
    for name, row in rows.items():
        m = row.metrics
        if "planning_us" not in m and "visits_total" not in m:
            continue
        parts = []
        if "planning_us" in m:
            ok = m["planning_us"] <= PLANNING_TARGET_US
            parts.append(f"planning {m['planning_us'] / 1000:.2f} ms <= 2 ms {'met' if ok else 'MISSED'}")
        if "visits_max" in m:
            ok = m["visits_max"] <= visits_bound(n)
            parts.append(f"visits {m['visits_max']:g} <= {visits_bound(n):.1f} {'met' if ok else 'MISSED'}")
        if stock is not None and "wall_ms" in m and "wall_ms" in stock.metrics:
            ok = m["wall_ms"] <= stock.metrics["wall_ms"]
            parts.append(f"wall {m['wall_ms']:.1f} <= stock {stock.metrics['wall_ms']:.1f} ms "
                         f"{'met' if ok else 'MISSED'}")
        if m.get("plan_share", 1) < 1:
            parts.append(f"planned {m.get('planned', 0)} of {m.get('planned', 0) + m.get('fallback', 0)}"
                         f" ({m.get('fallbacks', '')})")
        text = f"issue 5 at N={n}: " + "; ".join(parts)
        row.notes = (row.notes + " " if row.notes else "") + text


STORE_PREFIXED = ("versions_visited", "segments_visited", "visits_total")


def _store_figures(ctx: WorkloadContext, ns: list[int], built: dict) -> tuple[dict, list[str]]:
    """(target, N) -> the ref store's figures for every local Aspen target (its
    repository's store on disk; visit counts prefixed `store_`, the trace has its
    own), and the problems found (no store is one)."""
    rows, problems = {}, []
    for t in ctx.targets:
        gitdir = repo_dir(ctx, t)
        if gitdir is None or not getattr(t, "plan_log", None):
            continue
        with Probe(gitdir) as p:
            if p.store is None:
                problems.append(f"{t.name}: no ref store under {gitdir}")
                continue
            for n in ns:
                sha, base = built[t.name].get(n), built[t.name]["bases"].get(n)
                if not sha:
                    problems.append(f"{t.name}: stale-{n} was not pushed")
                    continue
                m, problem = stale_branch_figures(p.store, n, f"refs/heads/stale-{n}", sha, base, ctx.trunk)
                rows[(t.name, n)] = {("store_" + k if k in STORE_PREFIXED else k): v for k, v in m.items()}
                if problem:
                    problems.append(f"{t.name} N={n}: {problem}")
    return rows, problems
