"""Helpers shared by the workload families: URLs, target order per repetition,
wire bytes from the counting proxy, Aspen's plan lines, server CPU/RSS, client
directory copies, and a bounded thread pool of git jobs."""

from __future__ import annotations

import os
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from .. import gitclient
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


class PlanLog:
    """New `aspen: ...` lines in a target's plan log written while the block runs."""

    def __init__(self, t: TargetInfo):
        self.path = Path(t.plan_log) if t.plan_log else None
        self.lines: list[dict] = []

    def __enter__(self) -> "PlanLog":
        self._pos = self.path.stat().st_size if self.path and self.path.exists() else 0
        return self

    def __exit__(self, *exc) -> None:
        if not self.path:
            return
        deadline = time.monotonic() + 1.0
        while True:   # the access line is written when the response body is closed
            self.lines = self._read()
            if any("plan" in d for d in self.lines) or time.monotonic() > deadline:
                return
            time.sleep(0.02)

    def _read(self) -> list[dict]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self._pos)
            text = f.read().decode(errors="replace")
        return [dict(_KV.findall(line)) for line in text.splitlines() if line.startswith("aspen: ")]

    def metrics(self) -> dict:
        """plan/why of the upload-pack POST, and versions_visited/planning_us when traced."""
        posts = [d for d in self.lines if "plan" in d] or [d for d in self.lines if d.get("service") == "git-upload-pack"]
        if not posts:
            return {}
        d = posts[-1]
        out = {}
        for key, names in (("plan", ("plan",)), ("why", ("why",)),
                           ("versions_visited", ("versions_visited", "visited", "versions")),
                           ("planning_us", ("planning_us", "plan_us"))):
            for n in names:
                if n in d:
                    v = d[n]
                    out[key] = float(v) if key in ("versions_visited", "planning_us") and _num(v) else v
                    break
        return out


def _num(v: str) -> bool:
    try:
        float(v)
        return True
    except ValueError:
        return False


class ServerUsage:
    """CPU seconds and peak RSS of a target's server process trees during a block
    (metrics empty when procstats or pids are unavailable)."""

    def __init__(self, ctx: WorkloadContext, t: TargetInfo):
        self.pids = list(ctx.procs.get(t.name) or t.pids or [])
        self.stats = None
        self._tree = None

    def __enter__(self) -> "ServerUsage":
        if self.pids:
            try:
                from ..procstats import ProcTree
                self._tree = ProcTree(self.pids).start()
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
