"""`lagging-clients`: clients k pushes behind, spread over several branches,
each fetch's bytes compared with stock's answer to the same fetch.

One seeded history is pushed to every target (so the same object ids and refs
everywhere): at the start params branches B (default 4, quick 3) branches
`lag-0..` are cut from main, then random pushes, each of one ref with its own
`git push` (so every push is a server version): 1-4 commits on a random
branch, sometimes a merge of another branch (merge-tree's tree), a revert-like
commit that restores a file's older content (or removes a file added since),
an occasional force-push (back a few commits, then new ones), a few tags;
edits of existing files (so that reverts have older contents to restore).

Fetch i (params fetches, default 120, quick 12) comes after params
pushes_between pushes (default 3; before the first fetch, as many as the
largest k): k is drawn from params behind (default "1,2,5,10,20,50", quick
"1,3,10"), and the client is exactly the server's state k pushes ago: a bare
repository filled over file:// from the pusher with the refs the servers had
then (so it holds exactly what a clone then would hold), copied for every
target. Fetches alternate two shapes, a whole mirror fetch (`+refs/*:refs/*`
with prune) and a single-branch fetch (`+refs/heads/B:refs/remotes/origin/B`
into a `--single-branch --no-tags` clone of B, B one of the branches moved in
those k pushes when any did); the protocols of params protocols (default
"0,2") in turn, every two fetches; half the clients fetch with
transfer.fsckObjects. Every fetch is verified (`git fsck --strict`, refs equal
to the server's `ls-remote`, only B for a single-branch fetch). A target that
builds version packs is first left to finish the pushes' packs (params
wait_packs, default 1), and the run stops issuing fetches after params
time_limit seconds (default 3600, quick 600).

Fetch i is the same request on every target, so at the end each fetch's bytes
are divided by the baseline's (stock) for the same i: per Aspen target the
distribution of the exchange ratio (`ratio_p50`, `ratio_p99`, `ratio_max`,
`ratio_total` of the summed bytes, `over_2pct`: fetches over 1.02x stock's), the same
for pack bytes (`pack_ratio_*`) and over the planned fetches only
(`planned_ratio_*`, `planned_over_2pct`), and `worst_fetch` (i, k, shape,
protocol, plan, extents, both byte counts). The per-fetch rows (target, i, k,
branch, protocol, shape, bytes, wall, plan trace, the baseline's bytes and the
ratios) are in each measurement's `extra["fetches"]` (raw.jsonl)."""

from __future__ import annotations

import random
import subprocess
import time
from pathlib import Path
from typing import Optional

from .. import gitclient, stats
from ..model import Measurement, TargetInfo
from ..results import is_subject
from .base import WorkloadContext, register
from .common import PlanLog, PlanStats, Wire, copy_client, ordered, quiet_repo, repo_url, report, rmtree
from .randomfetch import parse_protocols
from .ratios import compare
from .storeprobe import wait_target_packs

NAME = "lagging-clients"
SHAPES = ("mirror", "branch")
FETCH_TIMEOUT = 600  # seconds, each git operation (gitclient's convention)


def parse_behind(value) -> list[int]:
    """params behind: "1,2,5" or 5 or [1, 2] -> the k (pushes behind) fetches draw from."""
    if isinstance(value, int):
        items = [value]
    elif isinstance(value, str):
        items = [x.strip() for x in value.replace(";", ",").split(",") if x.strip()]
    else:
        items = list(value)
    out = [int(x) for x in items]
    if not out or any(k < 1 for k in out):
        raise ValueError(f"{NAME}: behind {value!r}: expected pushes behind >= 1 (e.g. \"1,2,5,10\")")
    return out


class _History:
    """The pusher: a mirror clone of the first target, where every push is made
    and from which it is pushed to each target in turn; snaps[p] is the refs
    after push p (snaps[0]: as cloned), and moved[p] the ref push p changed."""

    def __init__(self, ctx: WorkloadContext, targets: list[TargetInfo], seed: int, branches: int):
        self.ctx, self.targets = ctx, targets
        self.dir = ctx.workdir / NAME
        rmtree(self.dir)
        self.dir.mkdir(parents=True)
        self.rng = random.Random(seed)
        self.pusher = self.dir / "pusher"
        r = gitclient.clone(repo_url(ctx, targets[0]), self.pusher, mirror=True)
        if not r.ok:
            raise RuntimeError(f"{NAME}: cannot clone {targets[0].name}: {r.stderr_tail}")
        for k, v in (("gc.auto", "0"), ("uploadpack.allowAnySHA1InWant", "true"), ("core.logAllRefUpdates", "false")):
            gitclient.run(["config", k, v], cwd=self.pusher)
        self.branches = [f"lag-{j}" for j in range(branches)]
        self.op = 0
        self.snaps: list[dict[str, str]] = [gitclient.local_refs(self.pusher)]
        self.moved: list[str] = [""]
        self.kinds: dict[str, int] = {}
        self.push_failures = {t.name: 0 for t in targets}
        self.error = ""

    @property
    def current(self) -> int:
        return len(self.snaps) - 1

    def when(self) -> int:
        self.op += 1
        return gitclient.BASE_TIME + 50_000 + self.op * 13

    def g(self, *args: str, input: Optional[bytes] = None) -> gitclient.ClientResult:
        return gitclient.run(list(args), cwd=self.pusher, when=self.when(), input=input)

    def tip(self, branch: str) -> str:
        return gitclient.rev_parse(self.pusher, f"refs/heads/{branch}")

    def ancestor(self, branch: str, back: int) -> str:
        ids = self.g("rev-list", "--first-parent", "-n", str(back + 1), f"refs/heads/{branch}").stdout.split()
        return ids[-1] if ids else self.tip(branch)

    # ------------------------------------------------------------ pushes

    def push(self, ref: str, force: bool = False) -> None:
        """Push REF (one ref) to every target, in turn; then snapshot the refs."""
        for t in self.targets:
            r = gitclient.run(["push", "-q", repo_url(self.ctx, t), f"{'+' if force else ''}{ref}:{ref}"],
                              cwd=self.pusher, timeout=FETCH_TIMEOUT)
            if not r.ok:
                self.push_failures[t.name] += 1
                self.error = f"push {ref} to {t.name}: {r.stderr_tail[-300:]}"
        self.snaps.append(gitclient.local_refs(self.pusher))
        self.moved.append(ref)

    def start(self) -> None:
        main = gitclient.rev_parse(self.pusher, "HEAD") or self.tip("main")
        for b in self.branches:
            self.g("update-ref", f"refs/heads/{b}", main)
            self.push(f"refs/heads/{b}")

    def random_push(self) -> None:
        rng = self.rng
        b = rng.choice(self.branches)
        kind = rng.choices(["commits", "edit", "merge", "revert", "force", "tag"], [8, 4, 3, 2, 1, 1])[0]
        tag = f"lc{self.op}"
        ref, force = f"refs/heads/{b}", False
        others = [x for x in self.branches if x != b]
        if kind == "merge" and not (others and self._merge(b, rng.choice(others))):
            kind = "commits"
        if kind == "revert" and not self._revert(b, rng.randint(1, 6)):
            kind = "commits"
        if kind == "edit" and not all([self._edit(b) for _ in range(rng.randint(1, 2))]):
            kind = "commits"
        if kind == "commits":
            gitclient.fast_import_chain(self.pusher, self.tip(b), rng.randint(1, 4), ref, when=self.when(), tag=tag)
        elif kind == "force":
            base = self.ancestor(b, rng.randint(1, 4))
            gitclient.fast_import_chain(self.pusher, base, rng.randint(1, 2), ref, when=self.when(), tag=tag)
            force = True
        elif kind == "tag":
            at = self.ancestor(b, rng.randint(0, 3))
            if rng.random() < 0.5:
                ref = f"refs/tags/lt-{self.op}"
                self.g("tag", "-a", ref[len("refs/tags/"):], "-m", f"tag {self.op}", at)
            else:
                ref = f"refs/tags/ll-{self.op}"
                self.g("update-ref", ref, at)
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        self.push(ref, force)

    def _merge(self, b: str, other: str) -> bool:
        """B := merge of B and OTHER (merge-tree's tree; B's tree on conflict)."""
        r = self.g("merge-tree", "--write-tree", f"refs/heads/{b}", f"refs/heads/{other}")
        tree = r.stdout.split()[0] if r.ok and r.stdout.split() else ""
        if not tree:
            tree = self.g("rev-parse", f"refs/heads/{b}^{{tree}}").stdout.strip()
        c = self.g("commit-tree", tree, "-p", f"refs/heads/{b}", "-p", f"refs/heads/{other}",
                   "-m", f"merge {other} into {b}")
        return c.ok and self.g("update-ref", f"refs/heads/{b}", c.stdout.strip()).ok

    def _commit(self, b: str, files: dict[str, Optional[str]], message: str) -> bool:
        """A commit on B's tip setting each path of FILES to its blob (None: removed)."""
        tip = self.tip(b)
        idx = self.dir / "edit.index"
        env = dict(gitclient.git_env(self.when()), GIT_INDEX_FILE=str(idx))

        def git(*args: str, input: Optional[bytes] = None) -> subprocess.CompletedProcess:
            return subprocess.run(["git", *args], cwd=str(self.pusher), env=env, input=input,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=FETCH_TIMEOUT)
        try:
            info = "".join(f"100644 {blob}\t{path}\n" if blob else f"0 {'0' * 40}\t{path}\n"
                           for path, blob in sorted(files.items()))
            if git("read-tree", tip).returncode or git("update-index", "--index-info", input=info.encode()).returncode:
                return False
            tree = git("write-tree")
            c = git("commit-tree", tree.stdout.decode().strip(), "-p", tip, "-m", message) if tree.returncode == 0 \
                else None
            if c is None or c.returncode:
                return False
            return self.g("update-ref", f"refs/heads/{b}", c.stdout.decode().strip()).ok
        finally:
            idx.unlink(missing_ok=True)

    def _edit(self, b: str) -> bool:
        """A commit on B changing a few lines of one of its text files (a new version
        of an existing file: what a later revert-like commit restores)."""
        rng = self.rng
        files = [line.split("\t", 1)[1] for line in self.g("ls-tree", "-r", self.tip(b)).stdout.splitlines()
                 if " blob " in line]
        if not files:
            return False
        path = rng.choice(sorted(files))
        lines = self.g("cat-file", "blob", f"{self.tip(b)}:{path}").stdout.splitlines() or [""]
        for _ in range(rng.randint(1, 3)):
            j = rng.randrange(len(lines) + 1)
            if j < len(lines) and rng.random() < 0.7:
                lines[j] = f"edited at {self.op}: {lines[j][:60]}"
            else:
                lines.insert(j, f"inserted at {self.op}")
        blob = self.g("hash-object", "-w", "--stdin", input=("\n".join(lines) + "\n").encode()).stdout.strip()
        return bool(blob) and self._commit(b, {path: blob}, f"edit {path}")

    def _revert(self, b: str, back: int) -> bool:
        """A commit on B restoring a file changed in its last BACK commits to its
        content then (an object the history already holds), or, when every such
        file was added since, removing one (reverting its addition)."""
        old, tip = self.ancestor(b, back), self.tip(b)
        if old == tip:
            return False
        changed = self.g("diff", "--name-status", "--no-renames", old, tip).stdout.splitlines()
        modified = sorted(l.split("\t", 1)[1] for l in changed if l[:1] in ("M", "D"))
        added = sorted(l.split("\t", 1)[1] for l in changed if l[:1] == "A")
        if modified:
            path = self.rng.choice(modified)
            blob = self.g("rev-parse", "--verify", "-q", f"{old}:{path}").stdout.strip()
            return bool(blob) and self._commit(b, {path: blob}, f"restore {path} as of {old[:12]}")
        if added:
            path = self.rng.choice(added)
            return self._commit(b, {path: None}, f"revert the addition of {path}")
        return False

    # ------------------------------------------------------------ clients

    def client(self, path: Path, at: int, shape: str, branch: str, fsck: bool) -> bool:
        """A bare repository holding exactly what a clone made after push AT held
        (the whole mirror, or branch BRANCH as refs/remotes/origin/BRANCH only)."""
        snap = self.snaps[at]
        if shape == "mirror":
            specs = [f"{oid}:{ref}" for ref, oid in sorted(snap.items())]
        else:
            specs = [f"{snap[f'refs/heads/{branch}']}:refs/remotes/origin/{branch}"]
        if not gitclient.run(["init", "-q", "--bare", str(path)]).ok:
            return False
        quiet_repo(path)
        gitclient.run(["config", "transfer.fsckObjects", "true" if fsck else "false"], cwd=path)
        r = gitclient.run(["fetch", "-q", "--no-tags", f"file://{self.pusher}", *specs], cwd=path, protocol=2,
                          timeout=FETCH_TIMEOUT)
        if not r.ok:
            self.error = f"client at push {at}: {r.stderr_tail[-300:]}"
        return r.ok


def _fetch(ctx: WorkloadContext, t: TargetInfo, client: Path, shape: str, branch: str, protocol: int) -> dict:
    """One verified fetch by CLIENT from T: the row of its figures."""
    url = repo_url(ctx, t)
    refspec = ["+refs/*:refs/*"] if shape == "mirror" else [f"+refs/heads/{branch}:refs/remotes/origin/{branch}"]
    with Wire(ctx, t) as w, PlanLog(t) as plan:
        r = gitclient.fetch(client, url, refspec, prune=shape == "mirror", protocol=protocol, timeout=FETCH_TIMEOUT)
    row: dict = {"ok": r.ok, "wall_ms": round(r.wall_ms, 1)}
    wire = w.metrics()
    for k in ("exchange_bytes", "pack_bytes", "bytes", "request_bytes", "requests"):
        if k in wire:
            row[k] = wire[k]
    pm = plan.metrics()
    for k in ("plan", "why", "extents", "objects", "plan_rounds", "serve_ms", "planning_us", "check_us", "visits_total"):
        if k in pm:
            row[k] = pm[k]
    row["_plan"] = pm
    if not r.ok:
        row["verified"] = False
        row["error"] = r.stderr_tail[-300:]
        return row
    ls = gitclient.ls_remote(url)
    if not ls.ok:
        row["verified"] = False
        row["error"] = "ls-remote: " + ls.stderr_tail[-300:]
        return row
    server = gitclient.parse_refs(ls.stdout)
    if shape == "mirror":
        v = gitclient.verify(client, server, mirror=True)
    else:
        v = gitclient.verify(client, {k: o for k, o in server.items() if k == f"refs/heads/{branch}"}, mirror=False)
    row["verified"] = v.ok
    if not v.ok:
        row["error"] = v.detail
    return row


@register(NAME)
def lagging_clients(ctx: WorkloadContext) -> list[Measurement]:
    """Clients k pushes behind over B branches fetch; each fetch's bytes over stock's for the same fetch.

    Params: fetches 120 [quick 12], behind "1,2,5,10,20,50" ["1,3,10"], branches 4 [3], pushes_between 3,
    seed 1, protocols "0,2", wait_packs 1, time_limit 3600 [600] seconds. Metrics: fetches, verified,
    failures, pushes, push_failures, bytes/pack_bytes/exchange_bytes totals, wall_p50_ms, fetches_vP, the
    plan trace (PlanStats); on Aspen targets the per-fetch ratio to the baseline: ratio_p50/_p99/_max,
    ratio_total, over_2pct, pack_ratio_*, planned_ratio_*, planned_over_2pct, worst_fetch and
    worst_planned_fetch. extra["fetches"]: one row per fetch (see the module's doc)."""
    fetches = int(ctx.param("fetches", 120, quick=12))
    between = max(1, int(ctx.param("pushes_between", 3)))
    nbranch = max(1, int(ctx.param("branches", 4, quick=3)))
    behind = parse_behind(ctx.param("behind", "1,2,5,10,20,50", quick="1,3,10"))
    seed = int(ctx.param("seed", 1))
    protocols = parse_protocols(ctx.param("protocols", "0,2"))
    wait = str(ctx.param("wait_packs", 1)).lower() not in ("0", "false", "no", "")
    limit = float(ctx.param("time_limit", 3600, quick=600))
    t0 = time.monotonic()
    h = _History(ctx, list(ctx.targets), seed, nbranch)
    rows: dict[str, list[dict]] = {t.name: [] for t in ctx.targets}
    plans = {t.name: PlanStats(t) for t in ctx.targets}
    waits: dict[str, list[float]] = {t.name: [] for t in ctx.targets}
    errors = {t.name: "" for t in ctx.targets}
    notes = []
    try:
        h.start()
        warm = max(behind)
        for j in range(warm):
            h.random_push()
            if j % 10 == 9:
                report(ctx, 0, fetches, f"{NAME}: {j + 1}/{warm} pushes before the first fetch")
        for i in range(fetches):
            if time.monotonic() - t0 > limit:
                notes.append(f"time_limit {limit:.0f}s reached: {i} of {fetches} fetches")
                break
            if i:
                for _ in range(between):
                    h.random_push()
            k = h.rng.choice(behind)
            at = max(0, h.current - k)
            shape = SHAPES[i % 2]
            protocol = protocols[(i // 2) % len(protocols)]
            fsck = (i // 4) % 2 == 1
            branch = ""
            if shape == "branch":
                moved = sorted({ref[len("refs/heads/"):] for ref in h.moved[at + 1:]
                                if ref.startswith("refs/heads/")} & set(h.branches))
                branch = h.rng.choice(moved or h.branches)
            template = h.dir / f"client-{i}"
            if not h.client(template, at, shape, branch, fsck):
                for t in ctx.targets:
                    rows[t.name].append({"target": t.name, "i": i, "k": h.current - at, "branch": branch,
                                         "protocol": protocol, "shape": shape, "fsck": fsck, "ok": False,
                                         "verified": False, "error": h.error})
                rmtree(template)
                continue
            settle = {}
            if wait:
                for t in ctx.targets:
                    settle[t.name] = wait_target_packs(ctx, t, quiet=0.0)
                    if settle[t.name]:
                        waits[t.name].append(settle[t.name]["packs_wait_ms"])
            for t in ordered(ctx, i):
                c = h.dir / f"client-{i}-{t.name}"
                copy_client(template, c)
                row = {"target": t.name, "i": i, "k": h.current - at, "branch": branch, "protocol": protocol,
                       "shape": shape, "fsck": fsck, "push": h.current}
                row.update(_fetch(ctx, t, c, shape, branch, protocol))
                if settle.get(t.name):
                    row["packs_wait_ms"] = settle[t.name]["packs_wait_ms"]
                pm = row.pop("_plan", {})
                if row["ok"]:
                    plans[t.name].add(pm)
                if not row["verified"]:
                    errors[t.name] = f"fetch {i}: {row.get('error', '')}"
                rows[t.name].append(row)
                rmtree(c)
            rmtree(template)
            report(ctx, i + 1, fetches, NAME)
    finally:
        history_error = h.error
        rmtree(h.dir)
    ratios = compare(rows)
    out = []
    for t in ctx.targets:
        mine = rows[t.name]
        ok = [r for r in mine if r.get("ok")]
        m: dict = {"fetches": len(mine), "verified": sum(1 for r in mine if r.get("verified")),
                   "failures": sum(1 for r in mine if not r.get("verified")), "pushes": h.current,
                   "push_failures": h.push_failures[t.name]}
        for key in ("bytes", "pack_bytes", "exchange_bytes"):
            m[key] = sum(r.get(key, 0) for r in ok)
        for p in protocols:
            m[f"fetches_v{p}"] = sum(1 for r in mine if r["protocol"] == p)
        walls = [r["wall_ms"] for r in ok]
        if walls:
            m["wall_p50_ms"] = stats.median(walls)
        if waits[t.name]:
            m["packs_wait_ms"] = stats.median(waits[t.name])
        m.update({k: v for k, v in plans[t.name].summary().items() if not k.startswith("fetches_v")})
        if is_subject(t.name):
            m.update(ratios.get(t.name, {}))
        note = "; ".join(filter(None, [*notes, errors[t.name],
                                       history_error if h.push_failures[t.name] else ""]))
        out.append(Measurement(NAME, t.name,
                               {"fetches": fetches, "seed": seed, "protocols": ",".join(map(str, protocols)),
                                "branches": nbranch, "behind": ",".join(map(str, behind)),
                                "pushes_between": between},
                               m, walls, note,
                               extra={"fetches": mine, "push_kinds": dict(h.kinds)}))
    return out
