"""`random-fetch`: random client states against a randomly evolving history,
every fetch verified.

Per target, a seeded world (the same seed on every target, so the same commits
and refs): a pool of clients, each a `--mirror` clone made at some earlier
round (so clients sit at random earlier states; half of them fetch with
`transfer.fsckObjects`); each round the server history advances by 1-3 random
operations (commits, new branches, merges, force-pushes, branch deletes,
annotated and lightweight tags, tag deletes) made in a mirror clone and sent
with one real `git push --mirror`; then a random client fetches
`+refs/*:refs/*` with prune and is verified (`git fsck --strict`, refs equal
to the server's `ls-remote`). Rounds interleave the targets.

The fetches alternate protocols (params protocols, default "0,2": fetch i uses
the i-th in turn, the same on every target). On Aspen targets every fetch's
plan trace is read (planned or fallback, and why); a target that builds
version packs is first left to finish the round's packs (params wait_packs,
default 1; 0 fetches at once, so `not-built` fallbacks count too)."""

from __future__ import annotations

import random
from pathlib import Path

from .. import gitclient, stats
from ..model import Measurement, TargetInfo
from .base import WorkloadContext, register
from .common import PlanLog, PlanStats, Wire, ordered, repo_url, report, rmtree
from .ratios import compare
from .storeprobe import visits_bound, wait_target_packs

MAX_POOL = 6


class _World:
    def __init__(self, ctx: WorkloadContext, t: TargetInfo, seed: int):
        self.t, self.url = t, repo_url(ctx, t)
        self.dir = ctx.workdir / "random-fetch" / t.name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(seed)
        self.pusher = self.dir / "pusher"
        if not gitclient.clone(self.url, self.pusher, mirror=True).ok:
            raise RuntimeError(f"random-fetch: cannot clone {t.name}")
        self.clients: list[Path] = []
        self.op = 0
        self.walls: list[float] = []
        self.bytes = {"bytes": 0, "pack_bytes": 0, "exchange_bytes": 0}
        self.n = {"fetches": 0, "verified": 0, "failures": 0, "clones": 0, "clone_failures": 0,
                  "push_failures": 0, "ops": 0}
        self.by_protocol: dict[int, int] = {}
        self.plans = PlanStats(t)
        self.fetch_rows: list[dict] = []
        self.waits: list[float] = []
        self.error = ""

    def when(self) -> int:
        self.op += 1
        return gitclient.BASE_TIME + 10_000 + self.op * 13

    def g(self, *args: str) -> gitclient.ClientResult:
        return gitclient.run(list(args), cwd=self.pusher, when=self.when())

    def heads(self) -> list[str]:
        return sorted(k[len("refs/heads/"):] for k in gitclient.local_refs(self.pusher) if k.startswith("refs/heads/"))

    def tags(self) -> list[str]:
        return sorted(k for k in gitclient.local_refs(self.pusher) if k.startswith("refs/tags/"))

    def ancestor(self, branch: str, back: int) -> str:
        r = self.g("rev-list", "--first-parent", "-n", str(back + 1), f"refs/heads/{branch}")
        ids = r.stdout.split()
        return ids[-1] if ids else gitclient.rev_parse(self.pusher, f"refs/heads/{branch}")

    def random_op(self) -> None:
        rng, heads = self.rng, self.heads()
        kind = rng.choices(["commits", "branch", "merge", "force", "delete", "tag", "untag"],
                           [5, 2, 2, 1, 1, 2, 1])[0]
        b = rng.choice(heads)
        tag = f"rf{self.op}"
        if kind == "commits" or (kind in ("merge", "delete") and len(heads) < 2):
            gitclient.fast_import_chain(self.pusher, gitclient.rev_parse(self.pusher, f"refs/heads/{b}"),
                                        rng.randint(1, 4), f"refs/heads/{b}", when=self.when(), tag=tag)
        elif kind == "branch":
            base = self.ancestor(b, rng.randint(0, 8))
            gitclient.fast_import_chain(self.pusher, base, rng.randint(1, 3), f"refs/heads/topic-{self.op}",
                                        when=self.when(), tag=tag)
        elif kind == "merge":
            other = rng.choice([h for h in heads if h != b])
            tree = self.g("rev-parse", f"refs/heads/{b}^{{tree}}").stdout.strip()
            c = self.g("commit-tree", tree, "-p", f"refs/heads/{b}", "-p", f"refs/heads/{other}",
                       "-m", f"merge {other} into {b}")
            if c.ok:
                self.g("update-ref", f"refs/heads/{b}", c.stdout.strip())
        elif kind == "force":
            base = self.ancestor(b, rng.randint(1, 5))
            gitclient.fast_import_chain(self.pusher, base, rng.randint(1, 2), f"refs/heads/{b}",
                                        when=self.when(), tag=tag)
        elif kind == "delete":
            victim = rng.choice([h for h in heads if h != "main"] or heads)
            if victim != "main":
                self.g("update-ref", "-d", f"refs/heads/{victim}")
        elif kind == "tag":
            at = self.ancestor(b, rng.randint(0, 5))
            if rng.random() < 0.5:
                self.g("tag", "-a", f"rt-{self.op}", "-m", f"tag {self.op}", at)
            else:
                self.g("update-ref", f"refs/tags/rl-{self.op}", at)
        elif kind == "untag":
            tags = self.tags()
            if tags:
                self.g("update-ref", "-d", rng.choice(tags))
        self.n["ops"] += 1

    def new_client(self) -> None:
        c = self.dir / f"client{len(self.clients)}"
        r = gitclient.clone(self.url, c, mirror=True)
        self.n["clones"] += 1
        if not r.ok:
            self.n["clone_failures"] += 1
            self.error = r.stderr_tail[-300:]
            rmtree(c)
            return
        gitclient.run(["config", "transfer.fsckObjects", "true" if self.rng.random() < 0.5 else "false"], cwd=c)
        gitclient.run(["config", "gc.auto", "0"], cwd=c)
        self.clients.append(c)

    def round(self, ctx: WorkloadContext, protocol: int = 2, wait_packs: bool = True) -> None:
        rng = self.rng
        if not self.clients or (len(self.clients) < MAX_POOL and rng.random() < 0.3):
            self.new_client()
        for _ in range(rng.randint(1, 3)):
            try:
                self.random_op()
            except RuntimeError as e:   # fast-import failed: counted, the round goes on
                self.n["op_failures"] = self.n.get("op_failures", 0) + 1
                self.error = str(e)[-300:]
        p = gitclient.run(["push", "-q", "--mirror", self.url], cwd=self.pusher)
        if not p.ok:
            self.n["push_failures"] += 1
            self.error = p.stderr_tail[-300:]
        if not self.clients:
            return
        client = rng.choice(self.clients)
        if wait_packs:
            settle = wait_target_packs(ctx, self.t, quiet=0.0)
            if settle:
                self.waits.append(settle["packs_wait_ms"])
        with Wire(ctx, self.t) as w, PlanLog(self.t) as plan:
            r = gitclient.fetch(client, self.url, ["+refs/*:refs/*"], prune=True, protocol=protocol)
        self.n["fetches"] += 1
        self.by_protocol[protocol] = self.by_protocol.get(protocol, 0) + 1
        if r.ok:
            self.plans.add(plan.metrics())
        if not r.ok:
            self.n["failures"] += 1
            self.error = r.stderr_tail[-300:]
            return
        self.walls.append(r.wall_ms)
        wire = w.metrics()
        for k, v in wire.items():
            if k in self.bytes:
                self.bytes[k] += v
        trace = plan.metrics()
        row = {"i": self.n["fetches"] - 1, "k": 0, "shape": "random", "protocol": protocol,
               "exchange_bytes": wire.get("exchange_bytes"), "pack_bytes": wire.get("pack_bytes"),
               "wall_ms": round(r.wall_ms, 1),
               **{key: trace[key] for key in ("plan", "why", "extents", "planning_us", "check_us", "visits_total", "version") if key in trace}}
        ls = gitclient.ls_remote(self.url)
        v = gitclient.verify(client, gitclient.parse_refs(ls.stdout), mirror=True) if ls.ok else None
        row["ok"] = bool(v and v.ok)
        self.fetch_rows.append(row)
        if v and v.ok:
            self.n["verified"] += 1
        else:
            self.n["failures"] += 1
            self.error = v.detail if v else ls.stderr_tail[-300:]


def parse_protocols(value) -> list[int]:
    """params protocols: "0,2", "2", 0, [0, 2] -> the protocol versions fetches take in turn."""
    if isinstance(value, int):
        items = [value]
    elif isinstance(value, str):
        items = [x.strip().lstrip("v") for x in value.replace(";", ",").split(",") if x.strip()]
    else:
        items = list(value)
    out = [int(x) for x in items]
    if not out or any(p not in (0, 1, 2) for p in out):
        raise ValueError(f"random-fetch: protocols {value!r}: expected versions among 0, 1, 2 (e.g. \"0,2\")")
    return out


@register("random-fetch")
def random_fetch(ctx: WorkloadContext) -> list[Measurement]:
    """params fetches (default 200, quick 20) verified fetches per target, seeded
    by params seed (default 1), alternating params protocols (default "0,2").
    Metrics: fetches, fetches_vP per protocol, verified, failures, clones, ops,
    total bytes / pack_bytes / exchange_bytes of the fetches, p50 wall; for Aspen
    targets the plan trace: plan_share, planned, fallback, fallbacks (why=count),
    planning_us and visits medians (and maxima, planning_us_p99), extents;
    packs_wait_ms. Fetch i is the same fetch on every target (same seed, same
    commits), so each Aspen fetch's bytes are divided by the baseline's for
    it, as lagging-clients does: ratio_p50/_p99/_max, over_2pct, the same
    over planned fetches (planned_ratio_*, planned_over_2pct), worst_fetch;
    visits against the bound 2*log2(N)+4 for each fetch's N (visit_bounds);
    the per-fetch rows are in raw.jsonl (extra["fetches"])."""
    fetches = int(ctx.param("fetches", 200, quick=20))
    seed = int(ctx.param("seed", 1))
    protocols = parse_protocols(ctx.param("protocols", "0,2"))
    wait = str(ctx.param("wait_packs", 1)).lower() not in ("0", "false", "no", "")
    worlds = {t.name: _World(ctx, t, seed) for t in ctx.targets}
    for i in range(fetches):
        for t in ordered(ctx, i):
            worlds[t.name].round(ctx, protocols[i % len(protocols)], wait)
        report(ctx, i + 1, fetches, "random-fetch")
    out = []
    label = ",".join(str(p) for p in protocols)
    ratios = compare({t.name: worlds[t.name].fetch_rows for t in ctx.targets})
    for t in ctx.targets:
        w = worlds[t.name]
        m = {**w.n, **w.bytes, **ratios.get(t.name, {})}
        m.update({f"fetches_v{p}": c for p, c in sorted(w.by_protocol.items())})
        if w.walls:
            m["wall_p50_ms"] = stats.median(w.walls)
        if w.waits:
            m["packs_wait_ms"] = stats.median(w.waits)
        m.update({k: v for k, v in w.plans.summary().items() if not k.startswith("fetches_v")})
        m.update(visit_bounds(w.fetch_rows))
        out.append(Measurement("random-fetch", t.name, {"fetches": fetches, "seed": seed, "protocols": label}, m,
                               w.walls, w.error, extra={"fetches": w.fetch_rows}))
        rmtree(w.dir)
    return out


def visit_bounds(rows: list[dict]) -> dict:
    """Per traced fetch, its visits against 2*log2(N)+4, N the store's latest
    version as it answered: visits_p99, visits_over_bound (fetches above
    it), and among those extents_over_bound: planned fetches whose answer
    alone names more stored packs than the bound (each extent is one
    version's or segment's pack read)."""
    traced = [r for r in rows if isinstance(r.get("visits_total"), (int, float)) and isinstance(r.get("version"), int)]
    if not traced:
        return {}
    visits = [r["visits_total"] for r in traced]
    return {"visits_p99": stats.percentile(visits, 99),
            "visits_over_bound": sum(1 for r in traced if r["visits_total"] > visits_bound(r["version"])),
            "extents_over_bound": sum(1 for r in traced if r.get("plan") == "planned"
                                      and r.get("extents", 0) > visits_bound(r["version"]))}
