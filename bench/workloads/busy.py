"""`busy-repo`: a repository pushed to all day (issue 40), every target at once.

One writer pushes to trunk for the whole script: a steady rate (params
push_rate pushes a second, default 1) broken by bursts of params burst
back-to-back pushes (default 100, quick 20), the first after params
first_burst seconds (default 15, quick 5), then every params burst_every
seconds (default 90, quick 20). Every target gets the same commits in the
same sequence. A steady push goes to every target in a random order; a burst,
like any other event of the script, is made against one target after the
other in a random order (params burst_mode=target, the default: each target
takes its 100 pushes back to back, so a server that builds after each push
meets the backlog a real burst makes; `interleaved`: push by push, which
leaves it the other targets' pushes to catch up in). A burst started before
the end is finished on every target.

Meanwhile clients, at seeded random moments (exponential gaps of mean params
event_gap seconds, default 2, quick 1; at most params events, default 200,
quick 40), each make one request shape drawn from a shuffled deck of
params mix (default "full-clone=1,depth1-clone=2,fetch-behind=3,
fetch-stale=2,info-refs=4"):

- `full-clone`: `git clone --no-checkout`;
- `depth1-clone`: the same with `--depth 1`;
- `fetch-behind`: a client one push behind (a mirror kept, per target, at the
  push before the latest one the target acknowledged) fetches `+refs/*:refs/*`;
- `fetch-stale`: a client current on the target's trunk fetches `busy-stale`,
  a branch cut at the start from trunk params stale_back commits back
  (default 100, quick 10) with one commit of its own;
- `info-refs`: `GET /info/refs?service=git-upload-pack` on a fresh connection.

An event runs its shape against every target, one after the other, in a
random order of its own (so no target gets a systematically quieter moment);
at most params concurrency events run at once (default 2), and one operation
per target at a time (so the proxy's records and Aspen's trace lines of an
operation are its own). Events not started by the end of the script (params
seconds, default 180, quick 30) are skipped and counted.

Every operation is checked: its refs against what the server held during it
(every ref but trunk as set up; trunk a value the writer had pushed to that
target between the operation's start and end), and every clone and fetch
with `git fsck --strict` (params fsck=0: refs only), after the script on
every core (beside it, niced, only once more than params max_pending clients
wait, default 60). Aspen's version packs are then given params packs_timeout
seconds (default 120, quick 60) to catch up, inside the CPU measurement. The
figures are made by busysummary.py."""

from __future__ import annotations

import os
import queue
import random
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from .. import gitclient
from ..model import Measurement, TargetInfo
from .adverts import parse_v0, request
from .base import WorkloadContext, register
from .busysummary import summarise
from .common import PlanLog, ServerUsage, byte_metrics, copy_client, plan_metrics, quiet_repo, repo_url, report, rmtree
from .storeprobe import wait_target_packs

NAME = "busy-repo"
SHAPES = ("full-clone", "depth1-clone", "fetch-behind", "fetch-stale", "info-refs")
DEFAULT_MIX = "full-clone=1,depth1-clone=2,fetch-behind=3,fetch-stale=2,info-refs=4"
STALE = "refs/heads/busy-stale"
OP_TIMEOUT = 600            # seconds, each git operation
WAIT_KEYS = ("build_wait_ms", "wait_ms")     # Aspen's trace: how long a fetch waited for a pack build


@dataclass
class Sizes:
    """The workload's parameters (ctx.params, quick defaults when --quick)."""
    seconds: float
    burst: int
    burst_every: float
    first_burst: float
    push_rate: float
    event_gap: float
    events: int
    concurrency: int
    max_pushes: int
    stale_back: int
    mix: dict[str, int]
    seed: int
    fsck: bool
    max_pending: int
    packs_timeout: float
    burst_mode: str

    @classmethod
    def of(cls, ctx: WorkloadContext) -> "Sizes":
        return cls(seconds=float(ctx.param("seconds", 180, quick=30)), burst=int(ctx.param("burst", 100, quick=20)),
                   burst_every=float(ctx.param("burst_every", 90, quick=20)),
                   first_burst=float(ctx.param("first_burst", 15, quick=5)),
                   push_rate=float(ctx.param("push_rate", 1.0)),
                   event_gap=float(ctx.param("event_gap", 2.0, quick=1.0)),
                   events=int(ctx.param("events", 200, quick=40)), concurrency=int(ctx.param("concurrency", 2)),
                   max_pushes=int(ctx.param("max_pushes", 1000, quick=300)),
                   stale_back=int(ctx.param("stale_back", 100, quick=10)),
                   mix=parse_mix(ctx.param("mix", DEFAULT_MIX)), seed=int(ctx.param("seed", 1) or 1),
                   fsck=bool(int(ctx.param("fsck", 1))), max_pending=int(ctx.param("max_pending", 60)),
                   packs_timeout=float(ctx.param("packs_timeout", 120, quick=60)),
                   burst_mode=parse_burst_mode(ctx.param("burst_mode", "target")))

    def describe(self) -> str:
        mix = ",".join(f"{k}={v}" for k, v in self.mix.items())
        return (f"script {self.seconds:g} s: bursts of {self.burst} pushes ({self.burst_mode}) at "
                f"{self.first_burst:g} s and every {self.burst_every:g} s, {self.push_rate:g} push/s between; "
                f"events every {self.event_gap:g} s on "
                f"average (seed {self.seed}, at most {self.events}, {self.concurrency} at once), mix {mix}")


BURST_MODES = ("target", "interleaved")


def parse_burst_mode(value) -> str:
    mode = str(value).strip()
    if mode not in BURST_MODES:
        raise ValueError(f"{NAME}: burst_mode {value!r}: expected one of {', '.join(BURST_MODES)}")
    return mode


def parse_mix(value) -> dict[str, int]:
    """params mix: "full-clone=1,info-refs=4" (or a dict) -> shape -> weight; unknown shapes refused."""
    if isinstance(value, dict):
        items = list(value.items())
    else:
        items = [part.partition("=")[::2] for part in str(value).replace(";", ",").split(",") if part.strip()]
    out = {}
    for shape, weight in items:
        shape = str(shape).strip()
        if shape not in SHAPES:
            raise ValueError(f"{NAME}: mix: unknown shape {shape!r} (known: {', '.join(SHAPES)})")
        w = int(str(weight).strip() or 1)
        if w > 0:
            out[shape] = w
    if not out:
        raise ValueError(f"{NAME}: mix {value!r}: no shape with a positive weight")
    return out


@dataclass
class Event:
    """One moment of the script: a request shape, made against every target in ORDER."""
    i: int
    at: float               # seconds after the script's start
    shape: str
    order: list[str]


def script(sizes: Sizes, targets: list[str]) -> list[Event]:
    """The seeded events: exponential gaps, shapes dealt from shuffled decks of the mix
    (so every shape comes round), a random target order per event."""
    rng = random.Random(sizes.seed)
    deck: list[str] = []
    out: list[Event] = []
    at = 0.0
    while len(out) < sizes.events:
        at += rng.expovariate(1.0 / max(sizes.event_gap, 1e-3))
        if at >= sizes.seconds:
            break
        if not deck:
            deck = [s for s, w in sizes.mix.items() for _ in range(w)]
            rng.shuffle(deck)
        out.append(Event(len(out), round(at, 3), deck.pop(), rng.sample(targets, len(targets))))
    return out


@dataclass
class OpRow:
    """One operation of one event on one target (kept in raw.jsonl's extra)."""
    event: int
    shape: str
    target: str
    position: int                   # its place in the event's target order
    start_s: float                  # seconds after the script's start
    ok: bool = False
    verified: Optional[bool] = None  # None until checked
    wall_ms: float = 0.0
    bytes: Optional[int] = None     # server -> client, as the proxy counted
    pack_bytes: Optional[int] = None
    request_bytes: Optional[int] = None
    requests: Optional[int] = None
    behind: Optional[int] = None    # fetch-behind: pushes the target had beyond the client
    plan: Optional[str] = None
    why: Optional[str] = None
    build_wait_ms: Optional[float] = None
    cache: Optional[str] = None     # Aspen's response cache on the last response (hit, shared, cold, ...)
    error: str = ""

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None and v != ""}


@dataclass
class PushRow:
    j: int
    target: str
    at_s: float
    wall_ms: float
    ok: bool
    burst: bool
    error: str = ""

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v != ""}


class Writer:
    """Pushes IDS[j] to every target on the script's timeline (steady pushes in a
    random target order each; bursts as Sizes.burst_mode says); knows, per
    target, the last push acknowledged and the last started."""

    def __init__(self, ctx: WorkloadContext, pusher: Path, ids: list[str], base: str, sizes: Sizes):
        self.ctx, self.pusher, self.ids, self.base, self.sizes = ctx, pusher, ids, base, sizes
        self.names = [t.name for t in ctx.targets]
        self.by_name = {t.name: t for t in ctx.targets}
        self.lock = threading.Lock()
        self.acked = {n: -1 for n in self.names}       # index of the last acknowledged push (-1: none)
        self.started = {n: 0 for n in self.names}      # pushes started
        self.rows: list[PushRow] = []
        self.rounds = 0                                # commits handed out (each to every target)
        self.rng = random.Random(sizes.seed + 7919)

    def trunk_at(self, j: int) -> str:
        return self.base if j < 0 else self.ids[j]

    def acked_of(self, name: str) -> int:
        with self.lock:
            return self.acked[name]

    def allowed(self, name: str, lo: int) -> set[str]:
        """Trunk values NAME may have shown since its acknowledged push LO (taken before the operation)."""
        with self.lock:
            hi = self.started[name] - 1
        return {self.trunk_at(j) for j in range(lo, max(lo, hi) + 1)}

    @property
    def exhausted(self) -> bool:
        return self.rounds >= len(self.ids)

    def run(self, t0: float, stop_at: float) -> None:
        s = self.sizes
        next_burst = t0 + s.first_burst if s.burst > 0 else float("inf")
        step = 1.0 / s.push_rate if s.push_rate > 0 else float("inf")
        next_steady = t0
        while not self.exhausted:
            now = time.monotonic()
            if now >= stop_at:
                return
            if now >= next_burst:
                next_burst += s.burst_every
                self._burst(t0)
                next_steady = time.monotonic() + step
            elif now >= next_steady:
                self._push(t0, self._next(1), self.rng.sample(self.names, len(self.names)), False)
                next_steady = max(next_steady + step, time.monotonic() - step)
            else:
                time.sleep(max(0.0, min(next_steady, next_burst, stop_at) - now))

    def _next(self, n: int) -> range:
        j = self.rounds
        n = min(n, len(self.ids) - j)
        self.rounds += n
        return range(j, j + n)

    def _burst(self, t0: float) -> None:
        js = self._next(self.sizes.burst)
        order = self.rng.sample(self.names, len(self.names))
        if self.sizes.burst_mode == "interleaved":
            for j in js:
                self._push(t0, range(j, j + 1), self.rng.sample(self.names, len(self.names)), True)
        else:
            for name in order:
                self._push(t0, js, [name], True)

    def _push(self, t0: float, js: range, names: list[str], burst: bool) -> None:
        """Push each commit of JS, in turn, to each target of NAMES."""
        for name in names:
            t = self.by_name[name]
            for j in js:
                with self.lock:
                    self.started[name] = j + 1
                at = time.monotonic() - t0
                r = gitclient.push(self.pusher, repo_url(self.ctx, t), self.ids[j], self.ctx.trunk,
                                   timeout=OP_TIMEOUT)
                with self.lock:
                    if r.ok:
                        self.acked[name] = j
                    self.rows.append(PushRow(j, name, round(at, 3), round(r.wall_ms, 1), r.ok, burst,
                                             "" if r.ok else r.stderr_tail[-300:]))


class Followers:
    """The clients one target's fetch shapes start from, kept up to date from the
    pusher over file:// (untimed): `behind`, a bare mirror of the server's refs
    with trunk at a given push; `current`, a bare repository holding only trunk
    (as refs/remotes/origin/TRUNK) at a given push. Each holds exactly what a
    clone then would hold, and only ever moves forward, as its target's trunk."""

    def __init__(self, root: Path, pusher: Path, trunk: str):
        self.root, self.pusher, self.trunk = root, pusher, trunk
        self.lock = threading.Lock()
        self.behind, self.current = root / "behind", root / "current"
        self.remote_trunk = "refs/remotes/origin/" + trunk[len("refs/heads/"):]

    def start(self, static: dict[str, str], base: str) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for path, specs in ((self.behind, [f"{o}:{r}" for r, o in sorted(static.items())] + [f"{base}:{self.trunk}"]),
                            (self.current, [f"{base}:{self.remote_trunk}"])):
            gitclient.run(["init", "-q", "--bare", str(path)])
            quiet_repo(path)
            r = gitclient.run(["fetch", "-q", "--no-tags", f"file://{self.pusher}", *specs], cwd=path, protocol=2,
                              timeout=OP_TIMEOUT)
            if not r.ok:
                raise RuntimeError(f"{NAME}: cannot make the client {path}: {r.stderr_tail}")

    def copy(self, which: str, commit: str, dest: Path) -> str:
        """DEST: a copy of follower WHICH with its trunk moved to COMMIT first
        (never back: a COMMIT behind it is the caller's mistake). '' or the error."""
        with self.lock:
            path = self.behind if which == "behind" else self.current
            ref = self.trunk if which == "behind" else self.remote_trunk
            r = gitclient.run(["fetch", "-q", "--no-tags", f"file://{self.pusher}", f"+{commit}:{ref}"],
                              cwd=path, protocol=2, timeout=OP_TIMEOUT)
            if not r.ok:
                return f"client at {commit[:12]}: {r.stderr_tail[-300:]}"
            copy_client(path, dest)
            return ""


def fsck(path: Path) -> str:
    """`git fsck --strict` of PATH at nice 19: '' when clean, else the end of its message."""
    p = subprocess.run(["nice", "-n", "19", "git", "fsck", "--strict", "--no-progress", "--no-dangling"],
                       cwd=str(path), env=gitclient.git_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=OP_TIMEOUT)
    return "" if p.returncode == 0 else "fsck: " + p.stderr.decode(errors="replace")[-300:]


class Verifier:
    """Runs `git fsck --strict` over the clients the operations left, then removes
    them: after the script on every core, or beside it (one at a time, niced)
    once more than MAX_PENDING wait."""

    def __init__(self, enabled: bool, max_pending: int):
        self.enabled, self.max_pending = enabled, max_pending
        self.items: "queue.Queue[tuple[Optional[OpRow], Optional[Path]]]" = queue.Queue()
        self.go = threading.Event()
        self.threads = [self._start()]

    def _start(self) -> threading.Thread:
        th = threading.Thread(target=self._run, daemon=True, name="busy-verifier")
        th.start()
        return th

    def add(self, row: OpRow, path: Path) -> None:
        self.items.put((row, path))
        if self.items.qsize() > self.max_pending:
            self.go.set()

    def _run(self) -> None:
        while True:
            self.go.wait()
            row, path = self.items.get()
            if row is None or path is None:
                return
            try:
                if self.enabled and row.verified is not False:
                    problem = fsck(path)
                    row.verified = not problem
                    if problem:
                        row.error = problem
                elif row.verified is None:
                    row.verified = True
            except Exception as e:
                row.verified, row.error = False, f"fsck: {type(e).__name__}: {e}"
            finally:
                rmtree(path)
                self.items.task_done()

    def finish(self) -> None:
        """Verify what is left on every core, and stop."""
        self.threads += [self._start() for _ in range(max(0, (os.cpu_count() or 1) - 1))]
        self.go.set()
        self.items.join()
        for _ in self.threads:
            self.items.put((None, None))


class Busy:
    """The script's state: targets, writer, followers, verifier and the rows."""

    def __init__(self, ctx: WorkloadContext, sizes: Sizes):
        self.ctx, self.sizes = ctx, sizes
        self.dir = ctx.workdir / NAME
        rmtree(self.dir)
        self.dir.mkdir(parents=True)
        self.by_name = {t.name: t for t in ctx.targets}
        self.op_locks = {t.name: threading.Lock() for t in ctx.targets}
        self.rows: list[OpRow] = []
        self.plans: dict[tuple[int, str], dict] = {}
        self.skipped: list[int] = []
        self.late: list[float] = []
        self.lock = threading.Lock()
        self.t0 = self.stop_at = 0.0

    # ------------------------------------------------------------ set-up (untimed)

    def prepare(self) -> None:
        ctx, s = self.ctx, self.sizes
        first = ctx.targets[0]
        self.pusher = self.dir / "pusher"
        r = gitclient.clone(repo_url(ctx, first), self.pusher, mirror=True)
        if not r.ok:
            raise RuntimeError(f"{NAME}: cannot clone {first.name}: {r.stderr_tail}")
        for k, v in (("gc.auto", "0"), ("uploadpack.allowAnySHA1InWant", "true"), ("core.logAllRefUpdates", "false")):
            gitclient.run(["config", k, v], cwd=self.pusher)
        base = gitclient.rev_parse(self.pusher, ctx.trunk)
        if base is None:
            raise RuntimeError(f"{NAME}: no {ctx.trunk} in the repository")
        line = gitclient.run(["rev-list", "--first-parent", "-n", str(s.stale_back + 1), base], cwd=self.pusher)
        cut = line.stdout.split()[-1] if line.ok and line.stdout.split() else base
        stale = gitclient.commit_file(self.pusher, "busy/stale.txt", "a branch cut long ago\n", "busy-stale\n",
                                      parent=cut, when=gitclient.BASE_TIME + 7)
        if stale is None or not gitclient.run(["update-ref", STALE, stale], cwd=self.pusher).ok:
            raise RuntimeError(f"{NAME}: cannot make {STALE}")
        for t in ctx.targets:
            p = gitclient.push(self.pusher, repo_url(ctx, t), STALE, STALE, timeout=OP_TIMEOUT)
            if not p.ok:
                raise RuntimeError(f"{NAME}: cannot push {STALE} to {t.name}: {p.stderr_tail}")
        ids = gitclient.fast_import_chain(self.pusher, base, s.max_pushes, "refs/bench/busy", tag="busy")
        # every ref the servers hold but trunk, as they stay for the whole script
        self.static = {r: o for r, o in gitclient.local_refs(self.pusher).items()
                       if not r.startswith("refs/bench/") and r != ctx.trunk}
        self.writer = Writer(ctx, self.pusher, ids, base, s)
        self.followers = {t.name: Followers(self.dir / "clients" / t.name, self.pusher, ctx.trunk)
                          for t in ctx.targets}
        for f in self.followers.values():
            f.start(self.static, base)
        self.verifier = Verifier(s.fsck, s.max_pending)

    # ------------------------------------------------------------ the script

    def run(self, events: list[Event]) -> None:
        s = self.sizes
        self.t0 = time.monotonic()
        self.stop_at = self.t0 + s.seconds
        writer = threading.Thread(target=self.writer.run, args=(self.t0, self.stop_at), daemon=True,
                                  name="busy-writer")
        writer.start()
        with ThreadPoolExecutor(max_workers=max(1, s.concurrency)) as pool:
            futures = []
            for ev in events:
                while time.monotonic() < self.t0 + ev.at:
                    self._progress()
                    time.sleep(min(0.5, max(0.0, self.t0 + ev.at - time.monotonic())))
                futures.append(pool.submit(self._event, ev))
            while any(not f.done() for f in futures) or writer.is_alive():
                self._progress()
                time.sleep(0.5)
            for f in futures:
                f.result()
        writer.join()

    def _progress(self) -> None:
        el = min(self.sizes.seconds, time.monotonic() - self.t0)
        report(self.ctx, int(el), int(self.sizes.seconds),
               f"{NAME}: {self.writer.rounds} pushes, {len(self.rows)} operations")

    def _event(self, ev: Event) -> None:
        start = time.monotonic()
        if start >= self.stop_at:
            with self.lock:
                self.skipped.append(ev.i)
            return
        with self.lock:
            self.late.append(max(0.0, start - (self.t0 + ev.at)))
        for pos, name in enumerate(ev.order):
            try:
                self._op(ev, pos, self.by_name[name])
            except Exception as e:       # an operation's failure is counted, never raised
                self._add(OpRow(ev.i, ev.shape, name, pos, round(time.monotonic() - self.t0, 3),
                                verified=False, error=f"{type(e).__name__}: {e}"))

    def _add(self, row: OpRow) -> None:
        with self.lock:
            self.rows.append(row)

    def _op(self, ev: Event, pos: int, t: TargetInfo) -> None:
        ctx = self.ctx
        url = repo_url(ctx, t)
        client = self.dir / f"e{ev.i}-{t.name}"
        proxy = ctx.proxies.get(t.name) or getattr(t, "proxy", None)
        plan = PlanLog(t) if ev.shape != "info-refs" else None
        with self.op_locks[t.name]:
            if ev.shape in ("fetch-behind", "fetch-stale"):     # the client, as the target is now (untimed)
                at = self.writer.acked_of(t.name) - (ev.shape == "fetch-behind")
                problem = self.followers[t.name].copy("behind" if ev.shape == "fetch-behind" else "current",
                                                      self.writer.trunk_at(max(-1, at)), client)
                if problem:
                    rmtree(client)
                    self._add(OpRow(ev.i, ev.shape, t.name, pos, round(time.monotonic() - self.t0, 3),
                                    verified=False, error=f"untimed set-up: {problem}"))
                    return
            row = OpRow(ev.i, ev.shape, t.name, pos, round(time.monotonic() - self.t0, 3))
            lo = self.writer.acked_of(t.name)
            if ev.shape == "fetch-behind":
                row.behind = lo - max(-1, at)
            mark = proxy.mark() if proxy is not None else None
            if plan is not None:
                plan.__enter__()
            body = b""
            if ev.shape == "info-refs":
                try:
                    status, body, wall = request(url, "v0", timeout=120)
                    r = gitclient.ClientResult(status == 200, wall, "" if status == 200 else f"status {status}")
                except OSError as e:
                    r = gitclient.ClientResult(False, 0.0, f"{type(e).__name__}: {e}")
            elif ev.shape in ("full-clone", "depth1-clone"):
                r = gitclient.clone(url, client, depth=1 if ev.shape == "depth1-clone" else None, timeout=OP_TIMEOUT)
            elif ev.shape == "fetch-behind":
                r = gitclient.fetch(client, url, ["+refs/*:refs/*"], prune=True, timeout=OP_TIMEOUT)
            else:
                name = STALE[len("refs/heads/"):]
                r = gitclient.fetch(client, url, [f"+{STALE}:refs/remotes/origin/{name}"], timeout=OP_TIMEOUT)
            allowed = self.writer.allowed(t.name, lo)
            if plan is not None:
                plan.__exit__(None, None, None)
            records = _records(proxy, mark)
        row.ok, row.wall_ms = r.ok, round(r.wall_ms, 1)
        wire = byte_metrics(records)
        for k in ("bytes", "pack_bytes", "request_bytes", "requests"):
            if k in wire:
                setattr(row, k, wire[k])
        if plan is not None and plan.path is not None:
            pm = plan_metrics(plan.lines)
            row.plan, row.why = pm.get("plan"), pm.get("why")
            row.build_wait_ms = build_wait(plan.lines)
            row.cache = cache_mark(plan.lines)
            with self.lock:
                self.plans[(ev.i, t.name)] = pm
        if not r.ok:
            row.verified, row.error = False, r.stderr_tail[-300:]
        else:
            problem = self._check(ev.shape, client, body, allowed)
            if problem:
                row.verified, row.error = False, problem
            elif ev.shape == "info-refs":
                row.verified = True
        self._add(row)
        if ev.shape != "info-refs":
            self.verifier.add(row, client)

    def _check(self, shape: str, client: Path, body: bytes, allowed: set[str]) -> str:
        """'' when what the operation got is what the server held during it."""
        trunk = self.ctx.trunk
        remote = "refs/remotes/origin/"
        remote_trunk = remote + trunk[len("refs/heads/"):]
        if shape == "info-refs":
            try:
                refs, _ = parse_v0(body)
            except ValueError as e:
                return f"advertisement: {e}"
            got = {k: v for k, v in refs.items() if k != "HEAD" and not k.endswith("^{}")}
            return _compare(got, self.static, trunk, allowed)
        got = gitclient.local_refs(client)
        if shape == "fetch-behind":
            return _compare(got, self.static, trunk, allowed)
        if shape == "fetch-stale":
            name = remote + STALE[len("refs/heads/"):]
            return "" if got.get(name) == self.static[STALE] else f"{name} is {got.get(name)}, not {self.static[STALE]}"
        want = {(remote + r[len("refs/heads/"):] if r.startswith("refs/heads/") else r): o
                for r, o in self.static.items() if r.startswith(("refs/heads/", "refs/tags/"))}
        tip = got.get(remote_trunk)
        if got.get(trunk) != tip:
            return f"{trunk} {got.get(trunk)} is not {remote_trunk} {tip}"
        mine = {k: v for k, v in got.items() if k not in (trunk, remote + "HEAD")}
        if shape == "depth1-clone":     # one branch, and the tags that point into it
            extra = sorted(k for k in mine if k != remote_trunk and want.get(k) != mine[k])
            if extra:
                return f"refs not on the server: {extra[:5]}"
            mine = {remote_trunk: tip}
            want = {}
        return _compare(mine, want, remote_trunk, allowed)

    # ------------------------------------------------------------ after the script

    def finish(self) -> None:
        self.verifier.finish()


def _compare(got: dict[str, str], static: dict[str, str], trunk: str, allowed: set[str]) -> str:
    problems = []
    if got.get(trunk) not in allowed:
        problems.append(f"{trunk} {got.get(trunk)} is no value the server had during the operation")
    rest = {k: v for k, v in got.items() if k != trunk}
    diff = sorted(k for k in rest.keys() | static.keys() if rest.get(k) != static.get(k))
    if diff:
        problems.append(f"refs differ: {diff[:5]}")
    return "; ".join(problems)


def _records(proxy, mark) -> Optional[list]:
    """The proxy's records of the upload-pack requests since MARK, once complete
    (the writer's receive-pack requests through the same proxy are left out)."""
    if proxy is None:
        return None
    deadline = time.monotonic() + 2.0
    while True:
        recs = [r for r in proxy.since(mark) if "receive-pack" not in r.path]
        if all(r.status for r in recs) or time.monotonic() > deadline:
            return recs
        time.sleep(0.01)


def build_wait(lines: list[dict]) -> Optional[float]:
    """How long the operation's fetch responses waited for a pack build, summed
    (Aspen's `build_wait_ms`, in its plan lines or else its access lines); None
    when the trace has no such key."""
    for pick in (lambda d: d.get("_json"), lambda d: not d.get("_json")):
        vals = [d[k] for d in lines if pick(d) for k in WAIT_KEYS
                if k in d and isinstance(d[k], (int, float)) and not isinstance(d[k], bool)]
        if vals:
            return round(float(sum(vals)), 1)
    return None


def cache_mark(lines: list[dict]) -> Optional[str]:
    """The response cache's mark (`cache=`) on the operation's last fetch response
    (its plan line, else its access line); None when none says."""
    for pick in (lambda d: d.get("_json"), lambda d: not d.get("_json")):
        marks = [str(d["cache"]) for d in lines if pick(d) and d.get("cache") is not None]
        if marks:
            return marks[-1]
    return None


@register(NAME)
def busy_repo(ctx: WorkloadContext) -> list[Measurement]:
    """A writer pushes continuously (bursts and a steady rate) while clients at seeded random moments clone,
    depth-1 clone, fetch one push behind, fetch a branch cut long ago and poll info/refs, each event against
    every target in a random order: per shape and target the wall distribution, per-event wall ratios of each
    Aspen target to each stock target, bytes per operation, push latency and server CPU."""
    sizes = Sizes.of(ctx)
    busy = Busy(ctx, sizes)
    report(ctx, 0, None, f"{NAME}: set-up")
    busy.prepare()
    events = script(sizes, [t.name for t in ctx.targets])
    usage = {t.name: ServerUsage(ctx, t).__enter__() for t in ctx.targets}
    settled: dict[str, dict] = {}
    try:
        busy.run(events)
        report(ctx, int(sizes.seconds), int(sizes.seconds), f"{NAME}: version packs")
        for t in ctx.targets:
            settled[t.name] = wait_target_packs(ctx, t, timeout=sizes.packs_timeout)
    finally:
        for u in usage.values():
            u.__exit__(None, None, None)
        report(ctx, int(sizes.seconds), int(sizes.seconds), f"{NAME}: verifying")
        busy.finish()
    try:
        return summarise(ctx, sizes, events, busy, {n: u.metrics() for n, u in usage.items()}, settled)
    finally:
        rmtree(busy.dir)
