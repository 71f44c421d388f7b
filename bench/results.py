"""The results folder: raw JSON lines in, Markdown tables and PNG plots out.

Layout of `bench/results/<YYYY-MM-DD>-<machine tag>/`:

    raw.jsonl      one header record per run ({"type": "run", "run": id, "machine": {...}, "args": {...}}),
                   one record per Measurement ({"type": "measurement", "run": id, "workload", "target",
                   "params", "metrics", "samples", "notes", "extra"}), and one per workload that produced
                   nothing ({"type": "failure", "run": id, "workload", "error"})
    machine.json   the machine record of the latest run
    tables.md      per workload: Aspen/stock ratios first, then absolute medians per target
    *.png          plots (latency CDFs, stale-branch against N, push p50 over history)

Several runs may append to one folder (the campaign runs each workload in
turn); tables and plots use, for each workload, only its latest run, so a
ratio always compares medians measured in the same run.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import statistics
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from .machine import MachineInfo
from .model import Measurement

RAW = "raw.jsonl"
MACHINE = "machine.json"
TABLES = "tables.md"

# Ratio columns come first, in this order when present; other comparable metrics follow.
KEY_METRICS = ("wall_ms", "wall_p50_ms", "wall_p99_ms", "wall_max_ms", "bytes", "pack_bytes", "exchange_bytes",
               "p50_ms", "p90_ms", "p99_ms",
               "req_per_s", "push_p50_ms", "push_p99_ms", "pushes_per_s", "visible_p50_ms", "visible_p99_ms",
               "cpu_s", "server_cpu_s", "peak_rss_bytes", "server_peak_rss_bytes", "rss_bytes")
# Metrics where a bigger number is better (a ratio below 1 is a loss).
HIGHER_IS_BETTER = ("per_s", "throughput")         # name endings
# Parameters that only number a repetition: grouped together, so repeats become medians.
REPEAT_PARAMS = ("rep",)
# Spread figures of a latency summary: shown as absolutes, not ratios.
SPREAD = ("min_ms", "mean_ms", "max_ms")
# Counts and flags: shown as absolutes, never turned into ratios.
NO_RATIO = ("failures", "errors", "count", "requests", "verified", "mismatches", "jobs",
            "clients", "writers", "readers", "n", "reps", "versions_visited", "objects", "commits",
            "pushes", "fetches", "fsck_failures", "planning_us", "plan_ms", "planning_ms",
            # Aspen's ref store (stale-branch): no stock counterpart
            "segments_visited", "visits_total", "visits_bound", "query_us", "tips_us", "tips_found",
            "tips_visits", "versions_span", "ancestor", "j", "k",
            "store_versions_visited", "store_segments_visited", "store_visits_total",
            # push-history's flatness and ref-advertisement's size: figures of one target each
            "last_first", "span", "refs", "body_bytes",
            # Aspen's plan trace (issue 5) and version packs: no stock counterpart
            "plan_share", "planned", "fallback", "untraced", "plan_rounds", "visits_max", "planning_us_max",
            "visits_p99", "visits_over_bound", "extents_over_bound",
            "extents", "serve_ms", "packs_wait_ms", "packs_settled", "packs_pending", "pack_files", "packs_bytes",
            "segment_packs",
            "plan_share_v0", "plan_share_v1", "plan_share_v2", "fetches_v0", "fetches_v1", "fetches_v2",
            "cpu_fetches", "cpu_failures", "history", "history_push_failures", "protocol",
            # busy-repo: Aspen's waits for pack builds, the script's counts, stock-maintained's set-up
            "build_waited", "build_wait_max_ms", "build_wait_over_50ms", "events", "events_skipped", "ops",
            "burst_pushes", "push_failures", "behind_max", "repack_s", "repacked", "bytes_total",
            # polls: what nginx answered from poll files, polls that missed a push, the pollers beside it
            "from_files", "stale_polls", "background_polls", "threads")
# Section order in tables and pages (as `aspen-bench list`); other names follow alphabetically.
WORKLOAD_ORDER = ("full-clone", "history-clone", "depth1-clone", "warm-fetch", "stale-branch", "ref-advertisement", "poll-storm",
                  "push-history", "storm-depth1", "storm-warm", "fairness", "writers", "clone-concurrency", "random-fetch",
                  "lagging-clients", "busy-repo")
BASELINE = "stock"
SUBJECT = "aspen"          # the subject; every `aspen-*` target (aspen-packs, aspen-git) is one too


def is_subject(target: str) -> bool:
    """Aspen targets, whose medians are divided by the baseline's: aspen, aspen-packs, aspen-git, ..."""
    return target == SUBJECT or target.startswith(SUBJECT + "-")


def subjects(targets: Iterable[str]) -> list[str]:
    return [t for t in target_order(targets) if is_subject(t)]


# Per-event ratios a workload computes itself (busy-repo): the distribution, over
# the events both targets ran, of one Aspen target's wall time over one stock
# target's for the same event. Metric `wall_ratio_<stock target>_<stat>` on the
# Aspen target's row; shown first in its table, one column per stock target and stat.
EVENT_RATIO = "wall_ratio_"
EVENT_STATS = ("p50", "p99", "max")


def event_ratio_metric(base: str, stat: str) -> str:
    return f"{EVENT_RATIO}{base}_{stat}"


def event_ratio(metric: str) -> Optional[tuple[str, str]]:
    """(stock target, stat) of a per-event ratio metric, else None."""
    if not metric.startswith(EVENT_RATIO):
        return None
    base, _, stat = metric[len(EVENT_RATIO):].rpartition("_")
    return (base, stat) if base and stat in EVENT_STATS else None


# ---------------------------------------------------------------- raw records

@dataclass
class RunHeader:
    run: str                                   # run id, unique per `aspen-bench run`
    started: str                               # UTC ISO 8601
    machine: dict = field(default_factory=dict)
    args: dict = field(default_factory=dict)   # command line and repository facts


@dataclass
class Row:
    """A Measurement with the run it belongs to."""
    run: str
    m: Measurement


@dataclass
class Failure:
    run: str
    workload: str
    error: str


@dataclass
class RunData:
    folder: Path
    headers: list[RunHeader]
    rows: list[Row]
    failures: list[Failure] = field(default_factory=list)

    def unmeasured(self) -> dict[str, str]:
        """Workloads some run asked for that have no measurement in any run -> last known error."""
        measured = {r.m.workload for r in self.rows}
        out: dict[str, str] = {}
        for h in self.headers:
            for w in (h.args or {}).get("workloads") or []:
                if w not in measured:
                    out.setdefault(w, "no result (run stopped before it)")
        for f in self.failures:
            if f.workload not in measured:
                out[f.workload] = f.error
        return out

    @property
    def machine(self) -> MachineInfo:
        if self.headers:
            return MachineInfo.from_dict(self.headers[-1].machine)
        p = self.folder / MACHINE
        if p.exists():
            return MachineInfo.from_dict(json.loads(p.read_text()))
        return MachineInfo()

    def latest(self) -> list[Measurement]:
        """For each workload, the measurements of the latest run that measured it."""
        order = {h.run: i for i, h in enumerate(self.headers)}
        last: dict[str, int] = {}
        for r in self.rows:
            i = order.get(r.run, -1)
            last[r.m.workload] = max(last.get(r.m.workload, -1), i)
        return [r.m for r in self.rows if order.get(r.run, -1) == last[r.m.workload]]


def folder_name(machine: MachineInfo, date: Optional[str] = None) -> str:
    day = date or (machine.date[:10] if machine.date else _dt.date.today().isoformat())
    return f"{day}-{machine.tag or machine.hostname or 'machine'}"


def _jsonable(x):
    if isinstance(x, Path):
        return str(x)
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


class ResultsWriter:
    """Appends one run's header and measurements to a folder's raw.jsonl."""

    def __init__(self, folder: Path, machine: MachineInfo, args: Optional[dict] = None) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.machine = machine
        self.header = RunHeader(run=uuid.uuid4().hex[:12],
                                started=_dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
                                machine=machine.to_dict(), args=_jsonable(args or {}))
        (self.folder / MACHINE).write_text(json.dumps(machine.to_dict(), indent=2) + "\n")
        self._write({"type": "run", **asdict(self.header)})

    @property
    def raw_path(self) -> Path:
        return self.folder / RAW

    def _write(self, obj: dict) -> None:
        with open(self.raw_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(_jsonable(obj), sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def fail(self, workload: str, error: str) -> None:
        """Record that WORKLOAD produced no measurements in this run, and why."""
        self._write({"type": "failure", "run": self.header.run, "workload": workload, "error": error[-2000:]})

    def add(self, measurements: Iterable[Measurement]) -> int:
        n = 0
        for m in measurements:
            self._write({"type": "measurement", "run": self.header.run, **asdict(m)})
            n += 1
        return n


def load(folder: Path) -> RunData:
    """Read a results folder's raw.jsonl (lines that do not parse are skipped)."""
    folder = Path(folder)
    headers: list[RunHeader] = []
    rows: list[Row] = []
    failures: list[Failure] = []
    path = folder / RAW
    if not path.exists():
        raise FileNotFoundError(f"{path}: no raw results here")
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        kind = obj.pop("type", "measurement")
        if kind == "run":
            headers.append(RunHeader(run=obj.get("run", ""), started=obj.get("started", ""),
                                     machine=obj.get("machine", {}), args=obj.get("args", {})))
        elif kind == "measurement":
            run = obj.pop("run", "")
            rows.append(Row(run, Measurement(
                workload=obj.get("workload", "?"), target=obj.get("target", "?"),
                params=obj.get("params") or {}, metrics=obj.get("metrics") or {},
                samples=obj.get("samples") or [], notes=obj.get("notes") or "",
                extra=obj.get("extra") or {})))
        elif kind == "failure":
            failures.append(Failure(obj.get("run", ""), obj.get("workload", "?"), obj.get("error", "")))
    return RunData(folder, headers, rows, failures)


# ---------------------------------------------------------------- tables

def _num(v) -> Optional[float]:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)) and math.isfinite(v):
        return float(v)
    return None


def params_key(params: dict) -> tuple:
    return tuple(sorted((str(k), json.dumps(v, sort_keys=True)) for k, v in params.items()
                        if k not in REPEAT_PARAMS))


def params_label(params: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(params.items())) or "—"


def _sort_key(params: dict) -> tuple:
    out = []
    for k, v in sorted(params.items()):
        out.append((k, 0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (k, 1, 0, str(v)))
    return tuple(out)


@dataclass
class Cell:
    """Median of each metric for one (workload, params, target)."""
    target: str
    metrics: dict
    samples: list
    count: int


def medians(measurements: list[Measurement]) -> dict:
    """Per metric: the median of its numbers, or for text (e.g. plan=fallback) the most common value."""
    values: dict[str, list[float]] = {}
    texts: dict[str, list[str]] = {}
    for m in measurements:
        for k, v in m.metrics.items():
            x = _num(v)
            if x is not None:
                values.setdefault(k, []).append(x)
            elif isinstance(v, str) and v:
                texts.setdefault(k, []).append(v)
    out: dict = {k: max(set(v), key=v.count) for k, v in texts.items() if k not in values}
    out.update({k: statistics.median(v) for k, v in values.items()})
    return out


def group(measurements: list[Measurement]) -> dict[str, dict[tuple, dict[str, Cell]]]:
    """workload -> params key -> target -> Cell (metric medians over repeats)."""
    raw: dict[str, dict[tuple, dict[str, list[Measurement]]]] = {}
    for m in measurements:
        raw.setdefault(m.workload, {}).setdefault(params_key(m.params), {}).setdefault(m.target, []).append(m)
    out: dict[str, dict[tuple, dict[str, Cell]]] = {}
    for wl, by_params in raw.items():
        for pk, by_target in by_params.items():
            for t, ms in by_target.items():
                samples = [s for m in ms for s in m.samples if _num(s) is not None]
                out.setdefault(wl, {}).setdefault(pk, {})[t] = Cell(t, medians(ms), samples, len(ms))
    return out


def workload_rank(name: str) -> tuple:
    return (WORKLOAD_ORDER.index(name), "") if name in WORKLOAD_ORDER else (len(WORKLOAD_ORDER), name)


def target_order(targets: Iterable[str]) -> list[str]:
    first = {"aspen": 0, "stock": 2, "stock-maintained": 3, "stock-apache": 3}
    return sorted(set(targets), key=lambda t: (first.get(t, 1 if is_subject(t) else 4), t))


def higher_is_better(metric: str) -> bool:
    return metric.endswith(HIGHER_IS_BETTER)


def comparable(metric: str) -> bool:
    """Whether an Aspen/baseline ratio of this metric means something."""
    return metric not in NO_RATIO and not metric.startswith("n_")


def ratio_metrics(metric_names: Iterable[str]) -> list[str]:
    """The metrics that get an Aspen/baseline column: key figures and any other time."""
    names = [m for m in set(metric_names)
             if comparable(m) and (m in KEY_METRICS or (m.endswith("_ms") and m not in SPREAD))]
    key = {m: i for i, m in enumerate(KEY_METRICS)}
    return sorted(names, key=lambda m: (key.get(m, len(KEY_METRICS)), m))


def short(metric: str) -> str:
    """Column label of a metric: `wall_ms` -> `wall`, `pack_bytes` -> `pack bytes`."""
    s = metric
    if s.endswith("_per_s"):
        return s[:-len("_per_s")].replace("_", " ") + "/s"
    if s.endswith("_us") and s != "_us":
        return s[:-3].replace("_", " ") + " µs"
    if s == "last_first":
        return "last/first"
    for suffix in ("_ms", "_s"):
        if s.endswith(suffix) and s != suffix:
            s = s[: -len(suffix)]
            break
    return s.replace("_", " ")


def ratio(a, b) -> Optional[float]:
    a, b = _num(a), _num(b)
    if a is None or b is None or b == 0:
        return None
    return a / b


def fmt(v, metric: str = "") -> str:
    if v is None:
        return "—"
    if isinstance(v, str):
        return v.replace("|", "/")
    if "rss" in metric and metric.endswith("bytes"):
        return f"{v / 2**20:,.1f} MiB"
    if metric.endswith("bytes") or metric == "bytes":
        return f"{v:,.0f}"
    if float(v).is_integer() and abs(v) < 1e15:
        return f"{int(v):,}"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}" if abs(v) < 1 else f"{v:.2f}"


def fmt_ratio(r: Optional[float]) -> str:
    return "—" if r is None else f"{r:.2f}"


@dataclass
class Comparison:
    """One ratio: the subject's median over the baseline's, same run."""
    workload: str
    params: dict
    metric: str
    subject: float
    baseline: float
    baseline_name: str
    subject_name: str = SUBJECT

    @property
    def ratio(self) -> float:
        return self.subject / self.baseline

    @property
    def loses(self) -> bool:
        return self.ratio < 1 if higher_is_better(self.metric) else self.ratio > 1


def baseline_for(targets: Iterable[str]) -> Optional[str]:
    ts = [t for t in target_order(targets) if not is_subject(t)]
    if BASELINE in ts:
        return BASELINE
    return ts[0] if ts else None


def comparisons(measurements: list[Measurement]) -> list[Comparison]:
    out: list[Comparison] = []
    for wl, by_params in group(measurements).items():
        targets = {t for cells in by_params.values() for t in cells}
        base = baseline_for(targets)
        if base is None:
            continue
        for subject in subjects(targets):
            for pk, cells in by_params.items():
                a, b = cells.get(subject), cells.get(base)
                if not a or not b:
                    continue
                params = {k: json.loads(v) for k, v in pk}
                for metric in ratio_metrics(set(a.metrics) & set(b.metrics)):
                    if ratio(a.metrics[metric], b.metrics[metric]) is not None:
                        out.append(Comparison(wl, params, metric, a.metrics[metric], b.metrics[metric], base,
                                              subject))
    return out


MAX_ROWS = 24


def _shown(keys: list[tuple]) -> list[tuple]:
    """At most MAX_ROWS parameter points, evenly spaced, always with the first, last and
    any point without numeric params (summary rows such as window=all)."""
    if len(keys) <= MAX_ROWS:
        return keys
    def numeric(k: tuple) -> bool:
        return all(_num(json.loads(v)) is not None for _, v in k)
    special = [k for k in keys if not numeric(k)]
    series = [k for k in keys if numeric(k)]
    room = max(2, MAX_ROWS - len(special))
    step = (len(series) - 1) / (room - 1)
    picked = sorted({round(i * step) for i in range(room)})
    return [series[i] for i in picked] + special


# Shown in the main table next to the ratio metrics, whenever present.
ALWAYS = ("failures", "plan_share", "plan", "why", "fallbacks", "planning_us", "versions_visited",
          "segments_visited", "visits_total", "visits_bound", "store_visits_total", "query_us", "extents",
          "last_first",
          # lagging-clients: the per-fetch ratio to stock's same fetch (Aspen targets only)
          "ratio_p50", "ratio_p99", "ratio_max", "over_2pct", "planned_ratio_max", "planned_over_2pct",
          # busy-repo: fetches that waited for a pack build, and the longest wait
          "build_waited", "build_wait_max_ms")


def _rows(by_params) -> list[tuple]:
    return _shown(sorted(by_params, key=lambda k: _sort_key({a: json.loads(b) for a, b in k})))


def _table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def workload_table(workload: str, by_params: dict[tuple, dict[str, Cell]]) -> str:
    """params | Aspen/baseline ratios | absolute medians of those metrics (and failures, plan) per target."""
    targets = target_order({t for cells in by_params.values() for t in cells})
    subs = subjects(targets)
    base = baseline_for(targets) if subs else None
    all_metrics: set[str] = set()
    for cells in by_params.values():
        for c in cells.values():
            all_metrics |= set(c.metrics)
    both: dict[str, set[str]] = {}
    if base:
        for subject in subs:
            for cells in by_params.values():
                if subject in cells and base in cells:
                    both.setdefault(subject, set()).update(set(cells[subject].metrics) & set(cells[base].metrics))
    ratio_names = ratio_metrics(set().union(*both.values())) if both else []
    ratios = [(m, subject) for m in ratio_names for subject in subs if m in both.get(subject, ())]
    first = ratio_metrics(all_metrics)
    always = [m for m in ALWAYS if not (m == "why" and "fallbacks" in all_metrics)]   # why-counts say more
    absolute = first + [m for m in always if m in all_metrics and m not in first]
    present = {(m, t) for cells in by_params.values() for t, c in cells.items() for m in c.metrics}
    columns = [(m, t) for m in absolute for t in targets if (m, t) in present]
    per_event = _event_columns(targets, present)
    head = (["params"] + [f"event wall {event_ratio(m)[1]} {t}/{event_ratio(m)[0]}" for m, t in per_event]
            + [f"{short(m)} {subject}/{base}" for m, subject in ratios]
            + [f"{short(m)} {t}" for m, t in columns])
    rows = []
    for pk in _rows(by_params):
        cells = by_params[pk]
        row = [params_label({k: json.loads(v) for k, v in pk})]
        for m, t in per_event:
            c = cells.get(t)
            row.append(fmt_ratio(_num(c.metrics.get(m)) if c else None))
        for m, subject in ratios:
            a, b = cells.get(subject), cells.get(base)
            row.append(fmt_ratio(ratio(a.metrics.get(m) if a else None, b.metrics.get(m) if b else None)))
        for m, t in columns:
            c = cells.get(t)
            row.append(fmt(c.metrics.get(m) if c else None, m))
        rows.append(row)
    return _table(head, rows)


def _event_columns(targets: list[str], present: set[tuple[str, str]]) -> list[tuple[str, str]]:
    """(per-event ratio metric, target) columns: by Aspen target, then stock
    target in target order, then p50, p99, max; then a stock target's own
    ratios to another stock target (busy-repo's noise floor)."""
    metrics = {m for m, _ in present if event_ratio(m)}
    rank = {t: i for i, t in enumerate(targets)}
    ordered_metrics = sorted(metrics, key=lambda m: (rank.get(event_ratio(m)[0], len(rank)), event_ratio(m)[0],
                                                     EVENT_STATS.index(event_ratio(m)[1])))
    mine = subjects(targets)
    order = mine + [t for t in targets if t not in mine]
    return [(m, t) for t in order for m in ordered_metrics if (m, t) in present]


def details_table(workload: str, by_params: dict[tuple, dict[str, Cell]]) -> str:
    """Every other metric, one row per (params, target); empty when there is none."""
    targets = target_order({t for cells in by_params.values() for t in cells})
    all_metrics: set[str] = set()
    for cells in by_params.values():
        for c in cells.values():
            all_metrics |= set(c.metrics)
    main = set(ratio_metrics(all_metrics)) | set(ALWAYS) | {m for m in all_metrics if event_ratio(m)}
    if "fallbacks" in all_metrics:
        main.discard("why")
    rest = sorted(m for m in all_metrics if m not in main)
    if not rest:
        return ""
    rows = []
    for pk in _rows(by_params):
        for t in targets:
            c = by_params[pk].get(t)
            if c:
                rows.append([params_label({k: json.loads(v) for k, v in pk}), t] +
                            [fmt(c.metrics.get(m), m) for m in rest])
    return _table(["params", "target"] + [short(m) for m in rest], rows)


def render_tables(measurements: list[Measurement], plots: Optional[list["PlotResult"]] = None,
                  title: str = "Results", heading: str = "#", preface: str = "",
                  link_base: Optional[Path] = None) -> str:
    """Markdown: one section per workload (table, notes, plots)."""
    groups = group(measurements)
    out = [f"{heading} {title}", ""] + ([preface, ""] if preface else []) + [
           f"Ratios are {SUBJECT.capitalize()}'s median (each Aspen target's: aspen, aspen-packs, aspen-git) "
           "over the baseline's median (stock unless absent), both from the same run; below 1 means Aspen is "
           "smaller or faster. "
           "Absolute columns are medians over repeats; times in ms (µs where the column says so, seconds for `cpu`), "
           "bytes as counted on the wire by the bench's proxy.", ""]
    if not groups:
        out += ["No measurements.", ""]
    order = sorted(groups, key=workload_rank)
    for wl in order:
        out += [f"{heading}# {wl}", "", workload_table(wl, groups[wl]), ""]
        if len(groups[wl]) > MAX_ROWS:
            out += [f"({MAX_ROWS} of {len(groups[wl])} parameter points shown, evenly spaced; "
                    f"every point is in raw.jsonl and the plots.)", ""]
        details = details_table(wl, groups[wl])
        if details:
            out += ["<details><summary>Other figures</summary>", "", details, "", "</details>", ""]
        by_note: dict[str, set[str]] = {}
        for m in measurements:
            if m.workload == wl and m.notes:
                by_note.setdefault(" ".join(m.notes.split()), set()).add(m.target)
        if by_note:
            out += ["Notes:", ""] + [f"- {', '.join(target_order(ts))}: {n}" for n, ts in sorted(by_note.items())] + [""]
        for p in plots or []:
            if p.workload != wl:
                continue
            if p.path is not None:
                link = os.path.relpath(p.path, link_base) if link_base else p.path.name
                out += [f"![{p.title}]({link})", ""]
            elif p.note:
                out += [f"_{p.title}: {p.note}_", ""]
    return "\n".join(out).rstrip() + "\n"


# ---------------------------------------------------------------- plots

@dataclass
class PlotResult:
    workload: str
    title: str
    path: Optional[Path]          # None when skipped
    note: str = ""


def _pick(metrics: dict, *names: str) -> Optional[float]:
    for n in names:
        if n in metrics and _num(metrics[n]) is not None:
            return _num(metrics[n])
    return None


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def plot_cdfs(workload: str, by_params: dict[tuple, dict[str, Cell]], folder: Path) -> list[PlotResult]:
    """Latency CDF per parameter point, one line per target."""
    out: list[PlotResult] = []
    for pk, cells in sorted(by_params.items(), key=lambda kv: _sort_key({a: json.loads(b) for a, b in kv[0]})):
        params = {k: json.loads(v) for k, v in pk}
        suffix = "-".join(f"{k}{v}" for k, v in sorted(params.items()))
        title = f"{workload} latency CDF" + (f" ({params_label(params)})" if params else "")
        series = {t: sorted(c.samples) for t, c in cells.items() if c.samples}
        if not series:
            out.append(PlotResult(workload, title, None, "no latency samples recorded; CDF skipped"))
            continue
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for t in target_order(series):
            xs = series[t]
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.step(xs, ys, where="post", label=f"{t} (n={len(xs)})")
        ax.set_xlabel("latency (ms)")
        ax.set_ylabel("fraction of jobs done")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
        name = f"{workload}-cdf" + (f"-{suffix}" if suffix else "") + ".png"
        out.append(PlotResult(workload, title, _save(fig, folder / _safe(name))))
    return out


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def _xy_by_target(by_params, xkeys: tuple[str, ...], metric_names: tuple[str, ...]):
    """target -> sorted (x, y); x is the first of XKEYS found in the params or the metrics."""
    series: dict[str, list[tuple[float, float]]] = {}
    xkey_used = None
    for pk, cells in by_params.items():
        params = {k: json.loads(v) for k, v in pk}
        for t, c in cells.items():
            xk, x = None, None
            for k in xkeys:
                x = _num(params.get(k))
                x = x if x is not None else _num(c.metrics.get(k))
                if x is not None:
                    xk = k
                    break
            y = _pick(c.metrics, *metric_names)
            if x is not None and y is not None:
                xkey_used = xkey_used or xk
                series.setdefault(t, []).append((x, y))
    return {t: sorted(v) for t, v in series.items()}, xkey_used


def plot_against(workload: str, by_params, folder: Path, xkeys: tuple[str, ...], metric_names: tuple[str, ...],
                 ylabel: str, stem: str, title: str, logx: bool = True, xlabel: Optional[str] = None) -> PlotResult:
    series, xk = _xy_by_target(by_params, xkeys, metric_names)
    if not series:
        return PlotResult(workload, title, None,
                          f"no {'/'.join(metric_names)} against {'/'.join(xkeys)} recorded; plot skipped")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for t in target_order(series):
        pts = series[t]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=t)
    if logx and all(x > 0 for pts in series.values() for x, _ in pts):
        ax.set_xscale("log")
    ax.set_xlabel(xlabel or xk or "")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3, which="both")
    ax.legend()
    return PlotResult(workload, title, _save(fig, folder / f"{workload}-{stem}.png"))


VISIT_METRICS = ("visits_total", "versions_visited", "segments_visited", "visits_max", "store_visits_total",
                 "store_versions_visited", "store_segments_visited")


def plot_visits(workload: str, by_params, folder: Path) -> PlotResult:
    """stale-branch: visits against N — the planner's (plan trace: total, versions,
    segments, the most of one fetch) and the ref store's (`store_`, asked by the
    bench) — and the bound 2*log2(N)+4, one line each (a target's name is added
    when several have them)."""
    title = "stale-branch: visits against N"
    series: dict[str, list] = {}
    bound = "bound 2·log2(N)+4"
    for metric in VISIT_METRICS + ("visits_bound",):
        by_target, _ = _xy_by_target(by_params, N_KEYS, (metric,))
        for t, pts in by_target.items():
            if metric == "visits_bound":
                series.setdefault(bound, pts)
            else:
                series[short(metric) + (f" ({t})" if len(by_target) > 1 else "")] = pts
    if not any(k != bound for k in series):
        return PlotResult(workload, title, None, "no versions_visited against n/N/behind recorded; plot skipped")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, pts in series.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label,
                linestyle="--" if label == bound else "-")
    if all(x > 0 for pts in series.values() for x, _ in pts):
        ax.set_xscale("log")
    ax.set_xlabel("N (trunk pushes since the branch)")
    ax.set_ylabel("nodes visited")
    ax.set_title(title)
    ax.grid(True, alpha=0.3, which="both")
    ax.legend()
    return PlotResult(workload, title, _save(fig, folder / f"{workload}-versions.png"))


STORMS = ("storm-depth1", "storm-warm", "clone-concurrency")
N_KEYS = ("n", "N", "behind")
HISTORY_KEYS = ("after", "history", "window_end", "from")   # pushes so far: a metric or a param


def write_plots(measurements: list[Measurement], folder: Path) -> list[PlotResult]:
    """Every plot the measurements allow; a missing metric skips its plot with a note."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out: list[PlotResult] = []
    for wl, by_params in sorted(group(measurements).items(), key=lambda kv: workload_rank(kv[0])):
        try:
            if wl in STORMS or wl.startswith("storm"):
                out += plot_cdfs(wl, by_params, folder)
            elif wl == "busy-repo":     # one CDF per request shape (the summary rows have no samples)
                out += plot_cdfs(wl, {pk: cells for pk, cells in by_params.items()
                                      if any(c.samples for c in cells.values())}, folder)
            elif wl == "stale-branch":
                versions = plot_visits(wl, by_params, folder)
                in_us = any("planning_us" in c.metrics for cells in by_params.values() for c in cells.values())
                planning = plot_against(wl, by_params, folder, N_KEYS,
                                        ("planning_us",) if in_us else ("plan_ms", "planning_ms"),
                                        f"planning time ({'µs' if in_us else 'ms'})", "planning",
                                        "stale-branch: planning time against N",
                                        xlabel="N (trunk pushes since the branch)")
                if planning.path is None:
                    planning.note = "no planning time traced (no fetch reached the planner); plot skipped"
                out += [versions, planning]
                if any("query_us" in c.metrics for cells in by_params.values() for c in cells.values()):
                    out.append(plot_against(wl, by_params, folder, N_KEYS, ("query_us",), "query time (µs)",
                                            "query", "stale-branch: ref-store ancestry query time against N",
                                            xlabel="N (trunk pushes since the branch)"))
                if versions.path is None and planning.path is None:
                    out.append(plot_against(wl, by_params, folder, N_KEYS, ("bytes",), "bytes", "bytes",
                                            "stale-branch: bytes against N", xlabel="N (trunk pushes since the branch)"))
                    out.append(plot_against(wl, by_params, folder, N_KEYS, ("wall_ms",), "wall (ms)", "wall",
                                            "stale-branch: wall time against N", xlabel="N (trunk pushes since the branch)"))
            elif wl == "push-history":
                out.append(plot_against(wl, by_params, folder, HISTORY_KEYS, ("p50_ms", "push_p50_ms"),
                                        "push p50 (ms)", "p50", "push-history: push p50 over history",
                                        logx=False, xlabel="trunk history (pushes)"))
        except Exception as e:  # a plot must never lose the tables
            out.append(PlotResult(wl, f"{wl} plots", None, f"plotting failed: {type(e).__name__}: {e}"))
    return out


# ---------------------------------------------------------------- the whole folder

def write_report(folder: Path, plots: bool = True) -> Path:
    """Regenerate tables.md and the plots from raw.jsonl; returns tables.md's path."""
    folder = Path(folder)
    data = load(folder)
    measurements = data.latest()
    results = write_plots(measurements, folder) if plots else []
    machine = data.machine
    title = f"Aspen benchmark results — {folder.name}"
    preface = f"Machine: {machine.summary()}." if machine.cores else ""
    text = render_tables(measurements, results, title=title, preface=preface)
    path = folder / TABLES
    path.write_text(text, encoding="utf-8")
    return path
