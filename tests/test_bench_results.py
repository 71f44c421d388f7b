"""The bench's own logic: results folder (raw records, tables, plots), the
machine record, the progress bar, the campaign page, and one `--quick`
workload end to end through the CLI against real Aspen and stock servers."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

from bench import machine, page, results
from bench.model import Measurement
from bench.progress import Progress, render

REPO_ROOT = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def synthetic() -> list[Measurement]:
    ms = []
    for target, wall, nbytes in (("aspen", 50.0, 800), ("stock", 100.0, 1000)):
        for rep, jitter in enumerate((0.0, 10.0, -10.0)):   # medians: aspen 50/800, stock 100/1000
            ms.append(Measurement("depth1-clone", target, {}, {"wall_ms": wall + jitter, "bytes": nbytes}))
    for target, base in (("aspen", 20.0), ("stock", 40.0)):
        samples = [base + i for i in range(50)]
        ms.append(Measurement("storm-depth1", target, {"jobs": 50},
                              {"p50_ms": base + 24.5, "p99_ms": base + 48.5, "failures": 0, "server_cpu_s": 1.5},
                              samples=samples))
    for n in (10, 100, 1000):
        ms.append(Measurement("stale-branch", "aspen", {"n": n},
                              {"wall_ms": 30.0, "bytes": 5000, "versions_visited": n.bit_length(), "planning_us": 50.0}))
        ms.append(Measurement("stale-branch", "stock", {"n": n}, {"wall_ms": 20.0 + n, "bytes": 4000}))
    for start in range(0, 1500, 50):                     # 30 windows: more rows than a table shows
        for t in ("aspen", "stock"):
            ms.append(Measurement("push-history", t, {"window": 50, "from": start},
                                  {"after": start + 50, "p50_ms": 10.0 + start / 100, "p99_ms": 30.0}))
    for t in ("aspen", "stock"):
        ms.append(Measurement("push-history", t, {"window": "all"}, {"p50_ms": 12.0, "pushes": 1500}))
    return ms


def write_folder(tmp_path: Path, ms: list[Measurement]) -> Path:
    info = machine.collect("ci")
    folder = tmp_path / results.folder_name(info)
    results.ResultsWriter(folder, info, {"workloads": sorted({m.workload for m in ms})}).add(ms)
    return folder


def test_raw_jsonl_round_trip(tmp_path):
    ms = synthetic()
    folder = write_folder(tmp_path, ms)
    assert folder.name.endswith("-ci") and folder.name[:4].isdigit()
    lines = [json.loads(l) for l in (folder / "raw.jsonl").read_text().splitlines()]
    assert lines[0]["type"] == "run" and lines[0]["machine"]["cores"] >= 1
    assert sum(1 for l in lines if l["type"] == "measurement") == len(ms)
    data = results.load(folder)
    assert [r.m for r in data.rows] == ms
    assert data.machine.tag == "ci"
    assert json.loads((folder / "machine.json").read_text())["tag"] == "ci"


def test_latest_run_per_workload(tmp_path):
    info = machine.collect("ci")
    folder = tmp_path / "r"
    results.ResultsWriter(folder, info).add([Measurement("full-clone", "aspen", {}, {"wall_ms": 1.0})])
    results.ResultsWriter(folder, info).add([Measurement("full-clone", "aspen", {}, {"wall_ms": 2.0}),
                                             Measurement("warm-fetch", "aspen", {}, {"wall_ms": 3.0})])
    latest = results.load(folder).latest()
    assert sorted((m.workload, m.metrics["wall_ms"]) for m in latest) == [("full-clone", 2.0), ("warm-fetch", 3.0)]


def _table(md: str, workload: str) -> list[list[str]]:
    """The first (main) table of WORKLOAD's section, as cells."""
    section = md.split(f"## {workload}\n", 1)[1].split("\n## ", 1)[0]
    rows = section.strip().split("\n\n", 1)[0].splitlines()
    return [[c.strip() for c in r.strip("|").split("|")] for r in rows if not r.startswith("|---")]


def test_tables_ratio_columns_first_and_correct(tmp_path):
    md = results.render_tables(synthetic())
    head, row = _table(md, "depth1-clone")[:2]
    assert head[0] == "params"
    assert head[1:3] == ["wall aspen/stock", "bytes aspen/stock"]
    ratio_cols = [i for i, h in enumerate(head) if "/" in h]
    abs_cols = [i for i, h in enumerate(head) if h.endswith(" aspen") or h.endswith(" stock")]
    assert max(ratio_cols) < min(abs_cols)
    assert row[1] == "0.50" and row[2] == "0.80"          # medians 50/100 and 800/1000
    assert row[head.index("wall aspen")] == "50" and row[head.index("wall stock")] == "100"
    storm = _table(md, "storm-depth1")
    assert "failures aspen/stock" not in storm[0] and "failures aspen" in storm[0]
    stale = _table(md, "stale-branch")
    assert [r[0] for r in stale[1:]] == ["n=10", "n=100", "n=1000"]   # numeric order
    history = [r[0] for r in _table(md, "push-history")[1:]]
    assert len(history) == results.MAX_ROWS
    assert history[0] == "from=0, window=50" and history[-2:] == ["from=1450, window=50", "window=all"]
    assert "parameter points shown" in md


def test_tables_without_baseline_or_subject():
    md = results.render_tables([Measurement("full-clone", "aspen", {}, {"wall_ms": 5.0}),
                                Measurement("warm-fetch", "stock", {}, {"bytes": 7})])
    assert "aspen/" not in md
    assert "| 5 |" in md and "| 7 |" in md


def test_every_aspen_target_gets_ratios_to_stock(tmp_path):
    ms = [Measurement("full-clone", t, {"depth": 0}, {"wall_ms": w, "pack_bytes": b})
          for t, w, b in (("aspen", 80.0, 1000), ("aspen-packs", 60.0, 400), ("stock", 100.0, 1000))]
    ms += [Measurement("warm-fetch", t, {}, {"server_cpu_s": c, "plan_share": share, "fallbacks": fb})
           for t, c, share, fb in (("aspen-packs", 0.004, 1.0, ""), ("stock", 0.02, None, None))]
    md = results.render_tables(ms)
    head, row = _table(md, "full-clone")[:2]
    assert head[1:5] == ["wall aspen/stock", "wall aspen-packs/stock", "pack bytes aspen/stock",
                         "pack bytes aspen-packs/stock"]
    assert row[1:5] == ["0.80", "0.60", "1.00", "0.40"]
    assert head.index("wall aspen") < head.index("wall aspen-packs") < head.index("wall stock")
    head, row = _table(md, "warm-fetch")[:2]        # no `aspen` target at all: aspen-packs still has its ratios
    assert row[head.index("server cpu aspen-packs/stock")] == "0.20"
    assert row[head.index("plan share aspen-packs")] == "1" and "plan share aspen-packs/stock" not in head
    comps = {(c.workload, c.metric, c.subject_name): c.ratio for c in results.comparisons(ms)}
    assert comps[("full-clone", "wall_ms", "aspen-packs")] == 0.6 and comps[("full-clone", "wall_ms", "aspen")] == 0.8
    ms.append(Measurement("full-clone", "aspen-packs", {"depth": 1}, {"wall_ms": 30.0}))
    ms.append(Measurement("full-clone", "stock", {"depth": 1}, {"wall_ms": 20.0}))
    folder = write_folder(tmp_path, ms)
    text = page.write_page(tmp_path / "B.md", [folder]).read_text()
    loses = text.split("## Where Aspen loses", 1)[1].split("\n## ", 1)[0]
    assert "| full-clone | wall | depth=1 | 1.50 | 30 (aspen-packs) | 20 (stock) | 1 of 2 |" in loses


def test_other_figures_and_text_metrics():
    ms = [Measurement("warm-fetch", t, {}, {"wall_ms": w, "bytes": 10, "requests": 3, "plan": p, "why": y})
          for t, w, p, y in (("aspen", 5.0, "fallback", "no-planner"), ("stock", 10.0, None, None))]
    ms += [Measurement("warm-fetch", "aspen", {}, {"wall_ms": 7.0, "bytes": 10, "requests": 3, "plan": "fallback"})]
    md = results.render_tables(ms)
    head, row = _table(md, "warm-fetch")[:2]
    assert row[head.index("wall aspen/stock")] == "0.60"       # median of 5 and 7 over 10
    assert row[head.index("plan aspen")] == "fallback" and "plan stock" not in head
    assert "requests aspen" not in head                         # counts go to the collapsed table
    assert "<details><summary>Other figures</summary>" in md and "| — | aspen | 3 |" in md


def test_plots_written_as_png(tmp_path):
    folder = write_folder(tmp_path, synthetic())
    path = results.write_report(folder)
    pngs = sorted(folder.glob("*.png"))
    names = {p.name for p in pngs}
    assert {"storm-depth1-cdf-jobs50.png", "stale-branch-versions.png", "stale-branch-planning.png",
            "push-history-p50.png"} <= names
    for p in pngs:
        assert p.stat().st_size > 1000 and p.read_bytes()[:8] == PNG_MAGIC
    md = path.read_text()
    assert "![storm-depth1 latency CDF (jobs=50)](storm-depth1-cdf-jobs50.png)" in md


def test_missing_metrics_do_not_crash(tmp_path):
    ms = [Measurement("storm-warm", "aspen", {"jobs": 3}, {"p50_ms": 1.0}),      # no samples
          Measurement("stale-branch", "stock", {"n": 10}, {"wall_ms": 4.0, "bytes": 9}),  # no versions
          Measurement("stale-branch", "stock", {"n": 100}, {"wall_ms": 6.0, "bytes": 11}),
          Measurement("push-history", "aspen", {}, {}),                             # nothing at all
          Measurement("writers", "aspen", {}, {"push_p50_ms": None, "oops": "text"})]
    folder = write_folder(tmp_path, ms)
    md = results.write_report(folder).read_text()
    assert "CDF skipped" in md and "plot skipped" in md
    assert (folder / "stale-branch-bytes.png").stat().st_size > 0    # falls back to bytes/wall against N
    assert (folder / "stale-branch-wall.png").stat().st_size > 0
    assert not list(folder.glob("storm-warm*.png"))


def test_failed_workload_is_recorded_and_listed(tmp_path):
    info = machine.collect("ci")
    folder = tmp_path / "r"
    w = results.ResultsWriter(folder, info, {"workloads": ["full-clone", "writers", "storm-warm"]})
    w.add([Measurement("full-clone", "aspen", {}, {"wall_ms": 1.0})])
    w.fail("writers", "RuntimeError: writers: cannot clone stock")
    data = results.load(folder)
    assert data.unmeasured() == {"writers": "RuntimeError: writers: cannot clone stock",
                                 "storm-warm": "no result (run stopped before it)"}
    text = page.render_page([folder], tmp_path)
    assert "- `writers` was requested but has no results: RuntimeError: writers: cannot clone stock" in text


def test_campaign_page_lists_losses(tmp_path):
    folder = write_folder(tmp_path, synthetic())
    results.write_report(folder)
    text = page.write_page(tmp_path / "BENCHMARKS.md", [folder]).read_text()
    for heading in ("## Method", "## Machine", "## Where Aspen loses", "## Limits", "### depth1-clone"):
        assert heading in text
    loses = text.split("## Where Aspen loses", 1)[1].split("\n## ", 1)[0]
    rows = [l for l in loses.splitlines() if l.startswith("| stale-branch")]
    assert len(rows) == 1 and rows[0].startswith("| stale-branch | bytes | n=10 | 1.25 |")   # 5000/4000
    assert "| 3 of 3 |" in rows[0]                                  # wall at n=10 is 30/30: a tie
    assert "depth1-clone" not in loses
    assert f"]({folder.name}/storm-depth1-cdf-jobs50.png)" in text


def test_machine_record_fields():
    m = machine.collect()
    d = m.to_dict()
    for key in ("cores", "memory_bytes", "cpu_model", "kernel", "git_version", "python_version",
                "aspen_version", "date", "hostname"):
        assert key in d
    assert m.cores >= 1 and m.memory_bytes > 0
    assert m.git_version[0].isdigit() and m.python_version.count(".") == 2
    assert m.aspen_version and m.date.startswith("20")
    assert machine.MachineInfo.from_dict(d) == m
    assert machine.safe_tag("my host/1") == "my-host-1"


def test_progress_bar_on_a_tty():
    buf = io.StringIO()
    p = Progress(stream=buf, tty=True, min_interval=0)
    p.start(200, "storm-depth1 aspen")
    p.update(12)
    p.close()
    out = buf.getvalue()
    assert "\r[#.........." in out and "12/200 storm-depth1 aspen" in out and out.endswith("\n")
    assert render(12, 200, "storm-depth1 aspen") == "[#...................] 12/200 storm-depth1 aspen"
    assert render(5, 10, width=10) == "[#####.....] 5/10"


def test_progress_bar_quiet_without_tty():
    buf = io.StringIO()
    p = Progress(total=3, label="full-clone", stream=buf, tty=False)
    for i in range(1, 4):
        p(i, 3, "full-clone stock")
    p.close()
    p.close()
    lines = buf.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("[####################] 3/3 full-clone stock")


def test_cli_report_regenerates(tmp_path):
    folder = write_folder(tmp_path, synthetic())
    p = subprocess.run([sys.executable, "-m", "bench", "report", str(folder), "--page", str(tmp_path / "B.md")],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert (folder / "tables.md").exists() and (tmp_path / "B.md").read_text().startswith("# Aspen benchmarks")
    assert list(folder.glob("*.png"))


def test_cli_help_on_every_subcommand():
    for args in ([], ["run"], ["gen"], ["report"], ["list"]):
        p = subprocess.run([sys.executable, "-m", "bench", *args, "--help"], cwd=REPO_ROOT,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        assert "usage: aspen-bench" in p.stdout


def test_quick_depth1_clone_end_to_end(tmp_path):
    """One --quick workload through the CLI against real Aspen and stock servers."""
    out = tmp_path / "results"
    env = dict(os.environ, ASPEN_BENCH_MACHINE="ci")
    p = subprocess.run([sys.executable, "-m", "bench", "run", "depth1-clone", "--quick", "--preset", "tiny",
                        "--targets", "aspen,stock", "--out", str(out), "--workdir", str(tmp_path)],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    (folder,) = out.iterdir()
    assert folder.name.endswith("-ci")
    for name in ("raw.jsonl", "machine.json", "tables.md"):
        assert (folder / name).stat().st_size > 0
    rows = [r.m for r in results.load(folder).rows]
    by_target = {}
    for m in rows:
        assert m.workload == "depth1-clone"
        by_target.setdefault(m.target, []).append(m)
    assert set(by_target) == {"aspen", "stock"}
    for target, ms in by_target.items():
        assert all(m.metrics.get("bytes", 0) > 0 for m in ms), (target, ms)
    tables = (folder / "tables.md").read_text()
    assert "## depth1-clone" in tables and "bytes aspen/stock" in tables


def test_sections_follow_the_workload_order():
    from bench.workloads import ORDER
    assert list(results.WORKLOAD_ORDER) == list(ORDER)
    md = results.render_tables(synthetic())
    assert md.index("## depth1-clone") < md.index("## stale-branch") < md.index("## push-history") \
        < md.index("## storm-depth1")
