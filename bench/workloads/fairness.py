"""Fairness between clients (issue 43, item 3): one client storms, another
makes single fetches. Per target, the second client's fetches alone, then
the same number while the first client keeps `jobs` K (default 40, quick 8)
cold requests in flight.

Every request is a `--depth 1` fetch of a commit nobody asked for before
(trunk's first-parent history, each commit once: a cold computation on
every server, response cache or not; `uploadpack.allowReachableSHA1InWant`
is set in each target's copy so that stock answers a fetch by commit id).
The two clients are told apart as behind nginx: each sends its own
`X-Forwarded-For` (10.0.0.1 the stormer, 10.0.0.2 the other) and the Aspen
targets trust the bench's proxy on loopback (ASPEN_TRUSTED_PROXIES=127.0.0.1,
set by the bench for this workload); stock ignores the header. The other
client makes `fetches` F single fetches one after the other (default 20,
quick 5), alone and then under the storm (which starts first, and stops once
the F are done); the stormer's git processes run at nice 19 (a CI
farm's clients are machines of their own; here they share the server's
cores, and the measured client's), after one untimed full clone (the server's first fetch:
Aspen imports the repository then and starts building its packs) and, on
targets that build version packs, once those are built. Each of its fetches is checked (the fetched commit is the
one asked for; `git fsck --strict` over them after the run).

Metrics: the other client's `alone_p50_ms`, `alone_p99_ms`, `storm_p50_ms`,
`storm_p99_ms`, their ratios `storm_alone_p50`, `storm_alone_p99` (target:
at most 1.5 on Aspen), `failures` (its failed fetches); the same for the
server's side of its fetches (`*_served_*`: per fetch, its requests' times
at the bench's proxy, head in to last byte out, added up: what the 40
stormers' own git processes on the same cores add to its client's time is
left out); and the storm's own
`storm_fetches`, `storm_failures` (a 503 is one), `stormer_p50_ms`;
`server_cpu_s` over the storm phase. The table's first columns are each
Aspen target's over stock under the same storm."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from .. import gitclient, stats
from ..model import Measurement, TargetInfo
from .base import WorkloadContext, register
from .common import ServerUsage, ordered, repo_url, report, rmtree
from .storeprobe import wait_target_packs

STORMER, OTHER = "10.0.0.1", "10.0.0.2"
ENV = {"ASPEN_TRUSTED_PROXIES": "127.0.0.1"}     # what the bench sets on its targets for this workload
NICE = 19       # the stormer's git clients' nice value


def _fetch(url: str, dest: Path, sha: str, depth: int, who: str) -> gitclient.ClientResult:
    """A `--depth DEPTH` fetch of SHA into a new bare repository DEST, as client WHO."""
    dest.mkdir(parents=True, exist_ok=True)
    init = gitclient.run(["init", "-q", "--bare", str(dest)])
    if not init.ok:
        return init
    r = gitclient.run(["-c", f"http.extraHeader=X-Forwarded-For: {who}", "fetch", "-q", "--no-tags",
                       "--depth", str(depth), url, sha], cwd=dest)
    if r.ok and gitclient.rev_parse(dest, "FETCH_HEAD") != sha:
        return gitclient.ClientResult(False, r.wall_ms, "fetched commit differs", r.stdout)
    return r


class Storm:
    """K threads, each fetching the next unasked commit as the stormer, until stop()."""

    def __init__(self, url: str, workdir: Path, commits: list[str], k: int, first: int = 0):
        self.url, self.workdir, self.commits, self.k = url, workdir, commits, k
        self.lock = threading.Lock()
        self.next = first           # where the previous repetition's storm on this target stopped
        self.results: list[gitclient.ClientResult] = []
        self.started = 0
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(k)]

    def _take(self) -> tuple[int, str, int]:
        with self.lock:
            i = self.next
            self.next += 1
            self.started += 1
        # past the list, the same commits again one deeper: still a request nobody made before
        return i, self.commits[i % len(self.commits)], 1 + i // len(self.commits)

    def _run(self) -> None:
        # The stormer's git processes (forked from this thread: they inherit its nice value) at the lowest
        # priority: a CI farm's clients run on machines of their own, here they share the server's cores.
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
        except OSError:
            pass
        while not self.stopping.is_set():
            i, sha, depth = self._take()
            r = _fetch(self.url, self.workdir / f"s{i}", sha, depth, STORMER)
            with self.lock:
                self.results.append(r)
            rmtree(self.workdir / f"s{i}")

    def start(self) -> "Storm":
        for t in self.threads:
            t.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=600)


def _trunk_commits(ctx: WorkloadContext, t: TargetInfo) -> list[str]:
    root = ctx.roots.get(t.name)
    if root is None:
        raise RuntimeError(f"fairness: {t.name} has no local repository (a URL target cannot be measured)")
    r = gitclient.run(["rev-list", "--first-parent", ctx.trunk], cwd=Path(root) / ctx.repo)
    if not r.ok:
        raise RuntimeError(f"fairness: rev-list on {t.name}: {r.stderr_tail}")
    return r.stdout.split()


def _singles(ctx: WorkloadContext, t: TargetInfo, url: str, d: Path, commits: list[str],
             label: str) -> tuple[list[gitclient.ClientResult], list[float]]:
    """The other client's fetches of COMMITS, one after the other: their results, and per fetch the
    server's time as the bench's proxy saw it (its requests' head in to last byte out, added up)."""
    proxy = ctx.proxies.get(t.name)
    mark = proxy.mark() if proxy is not None else None
    out, windows = [], []
    for i, sha in enumerate(commits):
        t0 = time.time()
        out.append(_fetch(url, d / f"{label}{i}", sha, 1, OTHER))
        windows.append((t0, time.time()))
        report(ctx, i + 1, len(commits), f"fairness {t.name} {label}")
    served: list[float] = []
    if proxy is not None:
        mine = [r for r in proxy.since(mark) if r.forwarded == OTHER]
        served = [round(sum(r.ms for r in mine if t0 <= r.started <= t1), 1) for t0, t1 in windows]
    return out, served


def _fsck(d: Path, n: int, label: str) -> int:
    bad = 0
    for i in range(n):
        repo = d / f"{label}{i}"
        if repo.exists() and not gitclient.run(["fsck", "--strict", "--no-progress"], cwd=repo).ok:
            bad += 1
    return bad


@register("fairness")
def fairness(ctx: WorkloadContext) -> list[Measurement]:
    """One client keeps K cold depth-1 fetches in flight while another makes single fetches: its p50 and p99
    against the same fetches with no storm, and against stock under the same storm."""
    k = int(ctx.param("jobs", 40, quick=8))
    n = int(ctx.param("fetches", 20, quick=5))
    ramp_s = float(ctx.param("ramp_s", 2.0, quick=1.0))
    reps = int(ctx.param("reps", 1))
    out = []
    stopped: dict[str, int] = {}
    for rep, t in [(rep, t) for rep in range(reps) for t in ordered(ctx, rep)]:
        commits = _trunk_commits(ctx, t)
        if len(commits) < 2 * n * reps + k:
            raise RuntimeError(f"fairness: {len(commits)} trunk commits; need {2 * n * reps + k} (a bigger preset)")
        served = Path(ctx.roots[t.name]) / ctx.repo
        gitclient.run(["config", "uploadpack.allowReachableSHA1InWant", "true"], cwd=served)
        url = repo_url(ctx, t)
        d = ctx.workdir / "fairness" / t.name / str(rep)
        d.mkdir(parents=True, exist_ok=True)
        # untimed: the server's first request (Aspen imports the repository then), and the packs it builds after
        if rep == 0 and not gitclient.clone(url, d / "warm", bare=True).ok:    # a whole clone: Aspen starts its builds
            raise RuntimeError(f"fairness: the first clone from {t.name} failed")
        rmtree(d / "warm")
        settle = wait_target_packs(ctx, t)
        # each repetition's single fetches ask for commits of their own; the storm's carry on where it stopped
        mine = commits[2 * n * rep:2 * n * (rep + 1)]
        alone, alone_served = _singles(ctx, t, url, d, mine[:n], "alone")
        storm = Storm(url, d / "storm", commits[2 * n * reps:], k, stopped.get(t.name, 0))
        with ServerUsage(ctx, t) as usage:
            storm.start()
            deadline = time.monotonic() + 60
            while storm.started < k and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(ramp_s)       # every stormer has its request in: the queue is full of them
            under, under_served = _singles(ctx, t, url, d, mine[n:], "storm")
            storm.stop()
        stopped[t.name] = storm.next
        bad = _fsck(d, n, "alone") + _fsck(d, n, "storm")
        a = [r.wall_ms for r in alone if r.ok]
        s = [r.wall_ms for r in under if r.ok]
        m = {"jobs": k, "fetches": n, "failures": sum(not r.ok for r in alone + under) + bad, "fsck_failures": bad,
             "alone_p50_ms": stats.percentile(a, 50) if a else None,
             "alone_p99_ms": stats.percentile(a, 99) if a else None,
             "storm_p50_ms": stats.percentile(s, 50) if s else None,
             "storm_p99_ms": stats.percentile(s, 99) if s else None,
             "storm_fetches": len(storm.results), "storm_failures": sum(not r.ok for r in storm.results)}
        if a and s:
            m["storm_alone_p50"] = round(m["storm_p50_ms"] / m["alone_p50_ms"], 3)
            m["storm_alone_p99"] = round(m["storm_p99_ms"] / m["alone_p99_ms"], 3)
        if alone_served and under_served:
            m.update({"alone_served_p50_ms": stats.percentile(alone_served, 50),
                      "alone_served_p99_ms": stats.percentile(alone_served, 99),
                      "storm_served_p50_ms": stats.percentile(under_served, 50),
                      "storm_served_p99_ms": stats.percentile(under_served, 99)})
            m["storm_alone_served_p50"] = round(m["storm_served_p50_ms"] / m["alone_served_p50_ms"], 3)
            m["storm_alone_served_p99"] = round(m["storm_served_p99_ms"] / m["alone_served_p99_ms"], 3)
        stormed = [r.wall_ms for r in storm.results if r.ok]
        if stormed:
            m["stormer_p50_ms"] = stats.percentile(stormed, 50)
        m.update(usage.metrics())
        if settle:
            m["packs_wait_ms"] = settle["packs_wait_ms"]
        failed = next((r.stderr_tail.strip()[-300:] for r in alone + under + storm.results if not r.ok), "")
        out.append(Measurement("fairness", t.name, {"jobs": k, "rep": rep}, m, s, failed,
                               {"alone_ms": [r.wall_ms for r in alone], "storm_ms": [r.wall_ms for r in under],
                                "alone_served_ms": alone_served, "storm_served_ms": under_served}))
        rmtree(d)
    return out
