"""Fetch workloads: `warm-fetch` (a client one push behind fetches one new
commit) and `stale-branch` (a client current on trunk fetches a branch created
N trunk pushes ago). Pushed commits have fixed dates, so every target receives
the same commits and their bytes compare."""

from __future__ import annotations

from .. import gitclient, stats
from ..model import Measurement, TargetInfo
from .base import WorkloadContext, register
from .common import PlanLog, Wire, copy_client, ordered, quiet_repo, report, repo_url, rmtree
from .storeprobe import Probe, repo_dir, stale_branch_figures

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
    behind fetches it (timed). Medians of wall, bytes (whole exchange) and pack bytes."""
    reps = int(ctx.param("reps", 7, quick=3))
    state = {}
    for t in ctx.targets:
        d = ctx.workdir / "warm-fetch" / t.name
        d.mkdir(parents=True, exist_ok=True)
        client, pusher = d / "client", d / "pusher"
        a = gitclient.clone(repo_url(ctx, t), client)
        b = gitclient.clone(repo_url(ctx, t), pusher, bare=True)
        if not (a.ok and b.ok):
            raise RuntimeError(f"warm-fetch: cannot clone {t.name}: {a.stderr_tail or b.stderr_tail}")
        state[t.name] = {"client": client, "pusher": pusher, "tip": gitclient.rev_parse(pusher, "refs/heads/main"),
                         "walls": [], "rows": [], "failures": 0, "error": ""}
    total = reps * len(ctx.targets)
    for rep in range(reps):
        for t in ordered(ctx, rep):
            s = state[t.name]
            sha = gitclient.commit_file(s["pusher"], "bench/warm.txt", f"warm fetch {rep}\n" * (rep + 1),
                                        f"warm fetch {rep}\n", parent=s["tip"], when=gitclient.BASE_TIME + rep)
            p = gitclient.push(s["pusher"], repo_url(ctx, t), sha or "HEAD", "refs/heads/main")
            if not (sha and p.ok):
                s["failures"] += 1
                s["error"] = p.stderr_tail[-300:]
                continue
            s["tip"] = sha
            with Wire(ctx, t) as w, PlanLog(t) as plan:
                r = gitclient.fetch(s["client"], repo_url(ctx, t), ["+refs/heads/main:refs/remotes/origin/main"])
            if r.ok and gitclient.rev_parse(s["client"], "refs/remotes/origin/main") == sha:
                s["walls"].append(r.wall_ms)
                s["rows"].append({**w.metrics(), **plan.metrics()})
            else:
                s["failures"] += 1
                s["error"] = r.stderr_tail[-300:] or "fetched tip differs"
            report(ctx, rep * len(ctx.targets) + ctx.targets.index(t) + 1, total, f"warm-fetch {t.name}")
    out = []
    for t in ctx.targets:
        s = state[t.name]
        ls = gitclient.ls_remote(repo_url(ctx, t))
        v = gitclient.verify(s["client"], gitclient.parse_refs(ls.stdout), mirror=False) if ls.ok else None
        m = {"reps": reps, "failures": s["failures"], "verified": bool(v and v.ok)}
        if s["walls"]:
            m["wall_ms"] = stats.median(s["walls"])
        m.update(_median_metrics(s["rows"]))
        out.append(Measurement("warm-fetch", t.name, {}, m, s["walls"], s["error"] or (v.detail if v else "")))
        rmtree(ctx.workdir / "warm-fetch" / t.name)
    return out


def _build_stale_history(ctx: WorkloadContext, t: TargetInfo, ns: list[int], pusher, done0: int, total: int) -> dict:
    """Branch `stale-N` (one commit) created just before the last N trunk pushes,
    for every N in NS; max(NS) real HTTP pushes of one commit each to main.
    Returns N -> branch commit id, plus the count of failed pushes under key -1 and
    N -> the branch's base (trunk's value when it was cut) under key "bases"."""
    url = repo_url(ctx, t)
    base = gitclient.rev_parse(pusher, "refs/heads/main")
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
        if not gitclient.push(pusher, url, ids[k], "refs/heads/main").ok:
            failed += 1
        if k % 10 == 0 or k == top - 1:
            report(ctx, done0 + k + 1, total, f"stale-branch history {t.name}")
    branches[-1] = failed
    branches["bases"] = bases
    return branches


@register("stale-branch")
def stale_branch(ctx: WorkloadContext) -> list[Measurement]:
    """A client current on trunk (single-branch clone of main) fetches `stale-N`, a
    branch created N trunk pushes ago, N in {10, 100, 1000, 10000} up to
    params["max_n"] (default 10000; quick 100). The history is built with real
    HTTP pushes (one server version each). Medians of wall and bytes; for Aspen,
    plan/why (and planning_us once the planner traces it) from its log, and from
    its ref store on disk: is trunk's value at the version that created the
    branch (j) an ancestor of trunk's value now (k = latest)? with
    versions_visited, segments_visited, visits_total (against visits_bound =
    2*log2(N)+4), query_us (median of several runs), and tips() of the branch's
    base. A wrong answer or a bound exceeded fails the workload."""
    max_n = int(ctx.param("max_n", 10000, quick=100))
    ns = [n for n in STALE_NS if n <= max_n] or [min(STALE_NS)]
    reps = int(ctx.param("reps", 5, quick=2))
    built, clients = {}, {}
    total = max(ns) * len(ctx.targets)
    for i, t in enumerate(ctx.targets):
        d = ctx.workdir / "stale-branch" / t.name
        d.mkdir(parents=True, exist_ok=True)
        pusher = d / "pusher"
        if not gitclient.clone(repo_url(ctx, t), pusher, bare=True).ok:
            raise RuntimeError(f"stale-branch: cannot clone {t.name}")
        built[t.name] = _build_stale_history(ctx, t, ns, pusher, i * max(ns), total)
        client = d / "client"
        r = gitclient.clone(repo_url(ctx, t), client, branch="main")
        if not r.ok:
            raise RuntimeError(f"stale-branch: cannot clone {t.name}: {r.stderr_tail}")
        quiet_repo(client)
        clients[t.name] = client
    store_rows, store_problems = _store_figures(ctx, ns, built)
    out = []
    for n in ns:
        walls = {t.name: [] for t in ctx.targets}
        rows = {t.name: [] for t in ctx.targets}
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
                    rows[t.name].append({**w.metrics(), **plan.metrics()})
                else:
                    fails[t.name] += 1
                    errs[t.name] = r.stderr_tail[-300:] or "fetched branch differs"
                rmtree(work)
        for t in ctx.targets:
            m = {"n": n, "reps": reps, "failures": fails[t.name], "history_push_failures": built[t.name][-1]}
            if walls[t.name]:
                m["wall_ms"] = stats.median(walls[t.name])
            m.update(_median_metrics(rows[t.name]))
            m.update(store_rows.get((t.name, n), {}))   # the store's figures, not the (absent) plan trace's
            out.append(Measurement("stale-branch", t.name, {"n": n}, m, walls[t.name], errs[t.name]))
    for t in ctx.targets:
        rmtree(ctx.workdir / "stale-branch" / t.name)
    if store_problems:
        raise RuntimeError("stale-branch: Aspen's ref store answered wrongly: " + " | ".join(store_problems)
                           + " || figures: " + "; ".join(f"{k}: {v}" for k, v in sorted(store_rows.items())))
    return out


def _store_figures(ctx: WorkloadContext, ns: list[int], built: dict) -> tuple[dict, list[str]]:
    """(target, N) -> the ref store's figures for the local Aspen target (its
    repository's store on disk), and the problems found (no store is one)."""
    rows, problems = {}, []
    for t in ctx.targets:
        gitdir = repo_dir(ctx, t)
        if gitdir is None or t.name != "aspen":
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
                m, problem = stale_branch_figures(p.store, n, f"refs/heads/stale-{n}", sha, base)
                rows[(t.name, n)] = m
                if problem:
                    problems.append(f"{t.name} N={n}: {problem}")
    return rows, problems
