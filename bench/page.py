"""The campaign's `BENCHMARKS.md`: method, machine, every table, limits, and
where Aspen loses (every time/bytes ratio above 1, every rate ratio below 1),
generated from one or more results folders."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Optional

from . import results
from .results import Comparison, fmt, fmt_ratio, short

METHOD = """\
Every figure comes from `aspen-bench` (`bench/`), measured side by side in the
same run on the same machine:

- **Targets.** Aspen under gunicorn (`aspen_cgi.wsgi:application`) with the
  product's defaults (`aspen`: version packs on, built by the server itself in
  the background after pushes, fetches planned and spliced from stored
  packs), the same pre-imported (`aspen-packs`: `aspen import` before it
  starts) and with version packs off (`aspen-git`: every fetch is git's); stock
  `git http-backend` behind the same gunicorn through a WSGI-to-CGI bridge
  (`stock`); stock under Apache CGI where Apache is installed
  (`stock-apache`), beside Aspen under the same Apache as a CGI
  (`aspen-apache`) and under mod_wsgi (`aspen-modwsgi`), compared with
  `stock-apache`; any other server by URL. Each target serves its own copy
  of the same generated repository, and each workload starts fresh servers
  over fresh copies, so pushes made by one workload never change the next.
- **Bytes** are counted on the wire by a proxy the tool runs in front of every
  target (request and response bytes, and the pack inside upload-pack
  responses), not reported by the servers.
- **Times** are wall-clock times of real `git` clients, measured by the tool.
  Server CPU seconds and peak RSS are read from the servers' process trees.
- **Ratios** are each Aspen target's median over stock's median (another
  baseline only when stock is absent) for the same parameter point in the same
  run; below 1 means Aspen is smaller or faster. Absolute medians follow the
  ratio columns.
- **Plan trace.** For every fetch response Aspen writes one `aspen-plan {...}`
  JSON line to its log (planned or fallback and why, versions and segments
  visited, planning µs, extents spliced, serving ms); the tool reads the lines
  of each client operation it times, so plan shares, planning times and
  visits are the served fetches' own.
- Raw records (`raw.jsonl`), the machine record and the plots sit next to the
  tables in each results folder; `aspen-bench report DIR` regenerates them."""

NOISE = 1.1       # time ratios up to this are reported, but flagged as noise
TRIVIAL = 0.005   # losses smaller than this fraction are listed in one line

LIMITS = """\
- One machine, loopback networking: no network latency or bandwidth limit,
  so byte savings show up in wall time less than they would over a WAN.
- Client and servers share the machine's cores; storms measure the pair.
- Generated repositories are realistic in shape (edit histories, renames,
  merges, tags) but synthetic; `--repo PATH` runs the same workloads on a
  real repository.
- Medians of few repeats on a shared machine: small differences (ratios
  within about 0.9–1.1 for times) are noise, not findings.
- Aspen-only figures have no stock counterpart and are shown as absolutes.
  In `stale-branch`, planning time and the versions and segments visited
  come from the plan trace of the served fetches; the `store_` visits and the
  query time are the ref store's answer to the planner's question (is trunk's
  value when the branch was cut an ancestor of trunk now?), asked again by
  the bench of the Aspen target's repository after the pushes.
- Server CPU per fetch (`warm-fetch`) counts live threads in nanoseconds but
  reaped children (git processes) in clock ticks (10 ms); it is averaged over
  several identical fetches per repetition to weigh the tick less."""


def _run_lines(data: results.RunData) -> list[str]:
    lines = []
    for h in data.headers:
        a = h.args or {}
        repo = a.get("repo") or {}
        src = f"preset `{a['preset']}`" if a.get("preset") else f"repository `{a.get('repo_path')}`"
        knobs = ", ".join(f"{k}={v}" for k, v in sorted((a.get("knobs") or {}).items())) or "defaults"
        lines.append(f"- {h.started}: `{' '.join(a.get('workloads') or [])}` on "
                     f"{', '.join(a.get('targets') or [])}; {src} ({repo.get('commits', '?')} commits, "
                     f"{repo.get('objects', '?')} objects, {repo.get('refs', '?')} refs); "
                     f"{'quick; ' if a.get('quick') else ''}{knobs}")
    return lines


def _machine_table(m) -> list[str]:
    rows = [("cores", m.cores), ("memory", f"{m.memory_gib:.1f} GiB"), ("CPU", m.cpu_model),
            ("OS", m.os), ("kernel", m.kernel), ("git", m.git_version), ("Python", m.python_version),
            ("Aspen", m.aspen_version), ("gunicorn", m.gunicorn_version),
            ("Apache", m.apache_version or "not installed"), ("date", m.date)]
    return ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]


def _badness(c: Comparison) -> float:
    """How much worse than the baseline, as a factor >= 1 when Aspen loses."""
    return 1 / c.ratio if results.higher_is_better(c.metric) else c.ratio


def _note(c: Comparison) -> str:
    if c.metric.endswith("bytes"):
        return ""
    return "within noise" if round(_badness(c), 2) <= NOISE else ""


def losses(comps: Iterable[Comparison]) -> list[Comparison]:
    """Comparisons where Aspen is worse than its baseline, worst first."""
    return sorted((c for c in comps if c.loses), key=lambda c: -_badness(c))


def where_aspen_loses(measurements: list, groups: Optional[list[list]] = None) -> list[str]:
    """Markdown lines: one row per (workload, metric) Aspen loses on, at its worst
    parameter point; losses under TRIVIAL (header bytes, agent strings) summarised in one line.
    GROUPS: the measurements of each results folder, compared within their folder only
    (folders over different repositories share target names and parameters)."""
    groups = groups if groups is not None else [measurements]
    if not any(groups):
        return ["No measurements."]
    all_comps = [c for ms in groups for c in results.comparisons(ms)]
    lost = losses(all_comps)
    real = [c for c in lost if _badness(c) - 1 >= TRIVIAL]
    trivial = [c for c in lost if _badness(c) - 1 < TRIVIAL]
    if not lost:
        return ["Nowhere in this run: no time, bytes or resource ratio above 1, no rate ratio below 1."]
    out: list[str] = []
    if real:
        worst: dict[tuple, list[Comparison]] = {}
        for c in real:
            worst.setdefault((c.workload, c.metric, c.subject_name), []).append(c)
        out += ["Every figure where an Aspen target is worse than its baseline (time, bytes or resource ratio "
                "above 1, or a rate ratio below 1), at its worst parameter point, worst first:", "",
                "| workload | metric | params | aspen/baseline | aspen | baseline | points losing | |",
                "|---|---|---|---|---|---|---|---|"]
        comps = all_comps
        for (wl, metric, subject), cs in sorted(worst.items(), key=lambda kv: -_badness(kv[1][0])):
            c = cs[0]
            total = sum(1 for x in comps if x.workload == wl and x.metric == metric and x.subject_name == subject)
            who = "" if subject == results.SUBJECT else f" ({subject})"
            out.append(f"| {wl} | {short(metric)} | {results.params_label(c.params)} | {fmt_ratio(c.ratio)} | "
                       f"{fmt(c.subject, metric)}{who} | {fmt(c.baseline, metric)} ({c.baseline_name}) | "
                       f"{len(cs)} of {total} | {_note(c)} |")
    if trivial:
        names = sorted({f"{c.workload} {short(c.metric)}" for c in trivial})
        out += ([""] if out else []) + [
            f"Above 1 by less than {TRIVIAL:.1%}, not a finding (bytes: response headers and agent "
            "strings; times: noise): "
            + ", ".join(names) + "."]
    return out


def render_page(folders: list[Path], page_dir: Path, command: str = "") -> str:
    out = ["# Aspen benchmarks", "",
           "Generated by `aspen-bench report`" + (f" from the results of {command}" if command else "") +
           "; do not edit by hand: regenerate it.", "", "## Method", "", METHOD, ""]
    datas = []
    for folder in folders:
        data = results.load(folder)
        datas.append((folder, data))
    if datas:
        out += ["## Machine", ""]
        machines: dict[str, tuple[list[str], list[Path]]] = {}
        for folder, data in datas:          # folders measured on different machines each say which
            table = _machine_table(data.machine)
            same = "\n".join(line for line in table if not line.startswith("| date |"))
            machines.setdefault(same, (table, []))[1].append(folder)
        for table, where in machines.values():
            if len(machines) > 1:
                out += ["Results folders " + ", ".join(f"`{os.path.relpath(f, page_dir)}`" for f in where) + ":", ""]
            out += table + [""]
        out += ["## Runs", ""]
        for folder, data in datas:
            out += [f"Results folder: `{os.path.relpath(folder, page_dir)}`", ""] + _run_lines(data) + [""]
    groups = [data.latest() for _, data in datas]
    out += ["## Where Aspen loses", ""] + where_aspen_loses([m for g in groups for m in g], groups) + [""]
    for folder, data in datas:
        measurements = data.latest()
        plots = results.write_plots(measurements, folder)
        title = "Results" if len(datas) == 1 else f"Results: `{os.path.relpath(folder, page_dir)}`"
        out.append(results.render_tables(measurements, plots, title=title, heading="##",
                                         link_base=page_dir).rstrip())
        out.append("")
    out += ["## Limits", "", LIMITS]
    for _, data in datas:
        for w, why in sorted(data.unmeasured().items()):
            out.append(f"- `{w}` was requested but has no results: {' '.join(why.split())[:300]}")
    if any((h.args or {}).get("quick") for _, d in datas for h in d.headers):
        out.append("- This is a `--quick` run: tiny sizes, for checking the pipeline, not for conclusions.")
    return "\n".join(out).rstrip() + "\n"


def write_page(path: Path, folders: list[Path], command: str = "") -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_page([Path(f) for f in folders], path.parent.resolve(), command), encoding="utf-8")
    return path
