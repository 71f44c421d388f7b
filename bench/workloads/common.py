"""Helpers shared by the workload families: URLs, target order per repetition,
wire bytes from the counting proxy, Aspen's plan lines, server CPU/RSS, client
directory copies, and a bounded thread pool of git jobs."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from .. import gitclient, stats
from ..model import RequestRecord, TargetInfo
from .base import WorkloadContext


def repo_url(ctx: WorkloadContext, t: TargetInfo) -> str:
    return f"{t.url.rstrip('/')}/{ctx.repo}"


def ordered(ctx: WorkloadContext, rep: int) -> list[TargetInfo]:
    """Targets in run order for repetition REP: reversed on odd repetitions."""
    return list(ctx.targets) if rep % 2 == 0 else list(reversed(ctx.targets))


def report(ctx: WorkloadContext, done: int, total: int, label: str) -> None:
    try:
        ctx.progress(done, total, label)
    except Exception:
        pass


def byte_metrics(records: Optional[list[RequestRecord]]) -> dict:
    """bytes (server->client), request_bytes, exchange_bytes (both ways), pack_bytes, requests;
    empty when the target has no proxy."""
    if records is None:
        return {}
    resp = sum(r.response_bytes for r in records)
    req = sum(r.request_bytes for r in records)
    return {"bytes": resp, "request_bytes": req, "exchange_bytes": resp + req,
            "pack_bytes": sum(r.pack_bytes for r in records), "requests": len(records)}


class Wire:
    """`with Wire(ctx, t) as w: ...` then `w.records` (None without a proxy)."""

    def __init__(self, ctx: WorkloadContext, t: TargetInfo):
        self.proxy = ctx.proxies.get(t.name) or getattr(t, "proxy", None)
        self.records: Optional[list[RequestRecord]] = None

    def __enter__(self) -> "Wire":
        self._mark = self.proxy.mark() if self.proxy is not None else None
        return self

    def __exit__(self, *exc) -> None:
        if self.proxy is not None:
            deadline = time.monotonic() + 2.0
            while True:   # a record's counts are final once its response is complete
                recs = list(self.proxy.since(self._mark))
                if all(r.status for r in recs) or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            self.records = recs

    def metrics(self) -> dict:
        return byte_metrics(self.records)


_KV = re.compile(r"(\w+)=(\S+)")
PLAN_PREFIX = "aspen-plan "
# Numbers of a plan trace line summed over the lines of one client operation
# (a v2 negotiation of several rounds writes one line per round).
_SUMMED = (("plan_us", "planning_us"), ("check_us", "check_us"), ("versions_visited", "versions_visited"),
           ("segments_visited", "segments_visited"), ("serve_ms", "serve_ms"))


def parse_plan_line(line: str) -> Optional[dict]:
    """One line of Aspen's error log as a dict: the JSON of an `aspen-plan {...}`
    line, or the fields of an older `aspen: k=v ...` access line (with
    `visits=V+S` split and `ms` as serve_ms); None for any other line. Under
    Apache the line is the message of an error-log line (`[...] AH01215: aspen...`)."""
    if line.startswith("["):
        at = min((i for i in (line.find("] " + PLAN_PREFIX), line.find("] aspen: "), line.find(": " + PLAN_PREFIX),
                              line.find(": aspen: ")) if i >= 0), default=-1)
        if at < 0:
            return None
        line = line[line.index(" ", at) + 1:]
    if line.startswith(PLAN_PREFIX):
        try:
            d = json.loads(line[len(PLAN_PREFIX):])
        except ValueError:
            return None
        if isinstance(d, dict):
            d["_json"] = True
            return d
        return None
    if not line.startswith("aspen: "):
        return None
    d: dict = {}
    for k, v in _KV.findall(line):
        d[k] = _number(v)
    visits = d.get("visits")
    if isinstance(visits, str) and "+" in visits:
        a, _, b = visits.partition("+")
        if _num(a) and _num(b):
            d.setdefault("versions_visited", _number(a))
            d.setdefault("segments_visited", _number(b))
    if "ms" in d:
        d.setdefault("serve_ms", d["ms"])
    return d


def _number(v):
    if isinstance(v, str) and _num(v):
        f = float(v)
        return int(f) if f.is_integer() and "." not in v else f
    return v


def plan_metrics(lines: list[dict]) -> dict:
    """What the plan trace says about ONE client operation (one fetch or clone):
    `plan` and `why` of its last fetch response (the one that sent the pack),
    planning_us / versions_visited / segments_visited / serve_ms summed over its
    responses, visits_total, extents and objects of the planned response,
    protocol, version (the store's latest as it answered), and plan_rounds
    (responses traced). The `aspen-plan` JSON lines
    are used when there are any, else the older `aspen:` access lines that
    carry plan=; empty when neither is there."""
    plans = [d for d in lines if d.get("_json") and "plan" in d]
    if not plans:
        plans = [d for d in lines if not d.get("_json") and "plan" in d]
    if not plans:
        return {}
    last = plans[-1]
    out: dict = {"plan": str(last["plan"]), "plan_rounds": len(plans)}
    if out["plan"] != "planned" and last.get("why") is not None:
        out["why"] = str(last["why"])
    for src, dst in _SUMMED:
        vals = [d[src] for d in plans if isinstance(d.get(src), (int, float)) and not isinstance(d.get(src), bool)]
        if vals:
            out[dst] = sum(vals)
    if "versions_visited" in out or "segments_visited" in out:
        out["visits_total"] = out.get("versions_visited", 0) + out.get("segments_visited", 0)
    if out["plan"] == "planned":
        for key in ("extents", "objects"):
            if isinstance(last.get(key), (int, float)):
                out[key] = last[key]
    if isinstance(last.get("protocol"), int):
        out["protocol"] = last["protocol"]
    if isinstance(last.get("version"), int) and not isinstance(last.get("version"), bool):
        out["version"] = last["version"]        # the store's latest version as it answered: the history's N
    return out


class PlanLog:
    """The plan trace lines Aspen writes to a target's log while the block runs:
    `with PlanLog(t) as plan: ...` then `plan.metrics()` (see plan_metrics);
    nothing for targets without a plan log (stock)."""

    def __init__(self, t: TargetInfo):
        self.path = Path(t.plan_log) if getattr(t, "plan_log", None) else None
        self.lines: list[dict] = []

    def __enter__(self) -> "PlanLog":
        self._pos = self.path.stat().st_size if self.path and self.path.exists() else 0
        return self

    def __exit__(self, *exc) -> None:
        if not self.path:
            return
        deadline = time.monotonic() + 1.0
        size = -1
        while True:   # the trace is written when the response body is closed: wait for it, then for quiet
            self.lines = self._read()
            now = self.path.stat().st_size if self.path.exists() else 0
            if (any("plan" in d for d in self.lines) and now == size) or time.monotonic() > deadline:
                return
            size = now
            time.sleep(0.02)

    def _read(self) -> list[dict]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self._pos)
            text = f.read().decode(errors="replace")
        return [d for d in (parse_plan_line(line) for line in text.splitlines()) if d is not None]

    def metrics(self) -> dict:
        return plan_metrics(self.lines)


class PlanStats:
    """Plan traces of a workload's client operations on one target, summarised:
    `add(PlanLog.metrics())` per successful operation, then `summary()`.
    Empty for targets without a plan log."""

    def __init__(self, t: TargetInfo):
        self.traced = bool(getattr(t, "plan_log", None))
        self.ops: list[dict] = []

    def add(self, m: dict) -> None:
        if self.traced:
            self.ops.append(dict(m))

    def summary(self) -> dict:
        """plan_share (planned / operations traced), planned, fallback, untraced
        (operations that left no trace line: nothing to fetch, no fetch request), fallbacks ("why=count, ..." most frequent first), plan
        and why (the most frequent), medians of planning_us, versions_visited,
        segments_visited, visits_total, extents (planned ones), serve_ms;
        planning_us_p99, planning_us_max and visits_max; per protocol plan_share_vP when several
        protocols were traced."""
        if not self.traced or not self.ops:
            return {}
        n = len(self.ops)
        traced = [o for o in self.ops if "plan" in o]
        planned = [o for o in traced if o["plan"] == "planned"]
        whys: dict[str, int] = {}
        for o in traced:
            if o["plan"] != "planned":
                w = o.get("why", "?")
                whys[w] = whys.get(w, 0) + 1
        out: dict = {"planned": len(planned), "fallback": len(traced) - len(planned)}
        if traced:
            out["plan_share"] = round(len(planned) / len(traced), 4)
        if len(traced) < n:
            out["untraced"] = n - len(traced)
        if whys:
            ranked = sorted(whys.items(), key=lambda kv: (-kv[1], kv[0]))
            out["fallbacks"] = ", ".join(f"{w}={c}" for w, c in ranked)
            out["why"] = ranked[0][0]
        if traced:
            plans = [o["plan"] for o in traced]
            out["plan"] = max(sorted(set(plans)), key=plans.count)
        for key, pool in (("planning_us", traced), ("versions_visited", traced), ("segments_visited", traced),
                          ("visits_total", traced), ("serve_ms", traced), ("extents", planned),
                          ("objects", planned)):
            vals = [o[key] for o in pool if key in o]
            if vals:
                out[key] = stats.median(vals)
        us = [o["planning_us"] for o in traced if "planning_us" in o]
        if us:
            out["planning_us_p99"] = stats.percentile(us, 99)
            out["planning_us_max"] = max(us)
        visits = [o["visits_total"] for o in traced if "visits_total" in o]
        if visits:
            out["visits_max"] = max(visits)
        protos = sorted({o["protocol"] for o in traced if "protocol" in o})
        if len(protos) > 1:
            for p in protos:
                mine = [o for o in traced if o.get("protocol") == p]
                out[f"plan_share_v{p}"] = round(sum(o["plan"] == "planned" for o in mine) / len(mine), 4)
                out[f"fetches_v{p}"] = len(mine)
        return out


def _num(v: str) -> bool:
    try:
        float(v)
        return True
    except (TypeError, ValueError):
        return False


class ServerUsage:
    """CPU seconds and peak RSS of a target's server process trees during a block
    (metrics empty when procstats or pids are unavailable)."""

    def __init__(self, ctx: WorkloadContext, t: TargetInfo, precise: bool = False):
        self.pids = list(ctx.procs.get(t.name) or t.pids or [])
        self.precise = precise
        self.stats = None
        self._tree = None

    def __enter__(self) -> "ServerUsage":
        if self.pids:
            try:
                from ..procstats import ProcTree
                self._tree = ProcTree(self.pids, precise=self.precise).start()
            except Exception:
                self._tree = None
        return self

    def __exit__(self, *exc) -> None:
        if self._tree is not None:
            try:
                self.stats = self._tree.stop()
            except Exception:
                self.stats = None

    def metrics(self) -> dict:
        if self.stats is None:
            return {}
        return {"server_cpu_s": self.stats.cpu_s, "server_peak_rss_bytes": self.stats.peak_rss_bytes}


def quiet_repo(repo: Path) -> None:
    """Settings that keep a client repository's files private to it (no reflogs,
    no auto gc), so hard-linked copies never share a written file."""
    for k, v in (("core.logAllRefUpdates", "false"), ("gc.auto", "0"), ("maintenance.auto", "false"),
                 ("fetch.writeCommitGraph", "false")):
        gitclient.run(["config", k, v], cwd=repo)


def copy_client(src: Path, dest: Path) -> None:
    """Copy a client repository: object files hard-linked (git never rewrites them
    in place), everything else copied."""
    def copy(s: str, d: str) -> None:
        if f"{os.sep}objects{os.sep}" in s and f"{os.sep}objects{os.sep}info" not in s:
            try:
                os.link(s, d)
                return
            except OSError:
                pass
        shutil.copy2(s, d)
    shutil.copytree(src, dest, copy_function=copy, symlinks=True)


def rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


@dataclass
class JobResult:
    ok: bool
    wall_ms: float
    detail: str = ""


def run_jobs(jobs: list[Callable[[], gitclient.ClientResult]], pool: int,
             on_done: Optional[Callable[[int], None]] = None) -> tuple[list[JobResult], float]:
    """Run all JOBS on a pool of POOL threads (submitted at once); results in job
    order and the total wall ms. An exception is a failed job."""
    results: list[Optional[JobResult]] = [None] * len(jobs)
    done = [0]

    def one(i: int) -> None:
        try:
            r = jobs[i]()
            results[i] = JobResult(r.ok, r.wall_ms, "" if r.ok else r.stderr_tail[-200:])
        except Exception as e:  # a job's failure is counted, never raised
            results[i] = JobResult(False, 0.0, f"{type(e).__name__}: {e}")
        done[0] += 1
        if on_done:
            on_done(done[0])

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, min(pool, len(jobs) or 1))) as ex:
        list(ex.map(one, range(len(jobs))))
    return [r for r in results if r is not None], (time.perf_counter() - t0) * 1000


def first_failure(results: list) -> str:
    for r in results:
        if not r.ok:
            return (getattr(r, "detail", "") or getattr(r, "stderr_tail", "")).strip()[-300:]
    return ""
