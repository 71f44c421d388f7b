"""The typed records that cross the bench's module boundaries: targets,
requests seen on the wire, workload measurements, and the run context."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional


@dataclass
class RequestRecord:
    """One HTTP request as the counting proxy saw it on the wire."""
    target: str
    method: str
    path: str                 # request path with query string
    status: int
    request_bytes: int        # bytes client -> server, head and body as sent
    response_bytes: int       # bytes server -> client, head and body as sent
    pack_bytes: int           # bytes of pack data inside an upload-pack response (0 if none)
    started: float            # time.time() when the request head arrived
    ms: float                 # until the last response byte
    forwarded: str = ""       # the request's X-Forwarded-For (the client a workload names, as `fairness` does)


@dataclass
class Measurement:
    """One result row: a workload's figures for one target at one parameter point."""
    workload: str
    target: str
    params: dict = field(default_factory=dict)      # e.g. {"n": 100} or {"jobs": 200}
    metrics: dict = field(default_factory=dict)     # e.g. {"wall_ms": 812.0, "bytes": 123456, "failures": 0}
    samples: list = field(default_factory=list)     # raw latencies in ms, for CDFs and percentiles
    notes: str = ""
    extra: dict = field(default_factory=dict)       # raw data kept in raw.jsonl, never tabulated (per-fetch rows)


@dataclass
class TargetInfo:
    """What a workload needs to know about a running target."""
    name: str                 # "aspen", "aspen-packs", "aspen-git", "stock", "stock-maintained", "stock-apache", or a user-given name
    url: str                  # base URL through the counting proxy, e.g. http://127.0.0.1:PORT
    root: Optional[Path]      # directory of repositories it serves (None for URL targets)
    pids: list = field(default_factory=list)   # server process ids whose CPU/RSS we may read (tree roots)
    can_push: bool = True
    plan_log: Optional[Path] = None             # Aspen's log with per-request lines, when known
    version_packs: bool = False                 # builds version packs after pushes (aspen, aspen-packs)
    setup: dict = field(default_factory=dict)   # untimed preparation figures (stock-maintained: repack_s)
