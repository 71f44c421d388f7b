"""bench/: the repository generator's determinism and sizes, percentile maths,
the plan trace's parsing and summaries, and quick workloads end to end against
real Aspen (with and without version packs) and stock servers."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from bench import gitclient, repogen, stats
from bench.model import TargetInfo
from bench.workloads import WORKLOADS, WorkloadContext
from bench.workloads.common import PlanStats, parse_plan_line, plan_metrics
from bench.workloads.randomfetch import parse_protocols, visit_bounds


def _all_refs(repo: Path) -> str:
    return subprocess.run(["git", "rev-parse", "--all"], cwd=repo, check=True, stdout=subprocess.PIPE).stdout.decode()


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, stdout=subprocess.PIPE).stdout.decode()


def test_generator_is_deterministic(tmp_path):
    spec = repogen.PRESETS["tiny"]
    a = repogen.generate(spec, tmp_path / "a.git")
    b = repogen.generate(spec, tmp_path / "b.git")
    c = repogen.generate(replace(spec, seed=spec.seed + 1), tmp_path / "c.git")
    assert _all_refs(a.path) == _all_refs(b.path)
    assert _all_refs(a.path) != _all_refs(c.path)
    assert (a.commits, a.objects, a.refs) == (b.commits, b.objects, b.refs)


def test_tiny_preset_shape(tmp_path):
    info = repogen.generate(repogen.PRESETS["tiny"], tmp_path / "t.git")
    assert info.commits == 50
    assert 200 <= info.objects <= 1500
    repo = info.path
    assert int(_git(repo, "rev-list", "--merges", "--count", "--all")) >= 1
    kinds = _git(repo, "for-each-ref", "--format=%(objecttype) %(refname)", "refs/tags").split("\n")
    assert any(k.startswith("tag ") for k in kinds) and any(k.startswith("commit ") for k in kinds)
    assert len(_git(repo, "for-each-ref", "refs/heads").splitlines()) >= 2
    assert _git(repo, "log", "--diff-filter=R", "-M", "--format=%H", "main").split()
    depths = {p.count("/") for p in _git(repo, "ls-tree", "-r", "--name-only", "main").split()}
    assert len(depths) >= 3
    subprocess.run(["git", "fsck", "--strict", "--no-progress"], cwd=repo, check=True)
    assert repogen.use_repo(repo).commits == 50


def test_use_repo_rejects_non_bare(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path / "w")], check=True)
    with pytest.raises(ValueError):
        repogen.use_repo(tmp_path / "w")
    with pytest.raises(ValueError):
        repogen.use_repo(tmp_path / "missing")


def test_percentiles_by_hand():
    assert stats.percentile([7], 50) == stats.percentile([7], 99) == 7.0
    assert stats.percentile([1, 2], 50) == 1.5
    assert stats.percentile([1, 2], 90) == pytest.approx(1.9)
    assert stats.percentile([2, 1], 99) == pytest.approx(1.99)
    assert stats.percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)
    xs = [50, 10, 40, 20, 30]
    assert stats.median(xs) == 30
    assert stats.percentile(xs, 99) == pytest.approx(49.6)
    assert stats.percentile(xs, 0) == 10 and stats.percentile(xs, 100) == 50
    with pytest.raises(ValueError):
        stats.percentile([], 50)
    s = stats.summary([1, 2])
    assert (s["n"], s["p50"], s["min"], s["max"], s["mean"]) == (2, 1.5, 1.0, 2.0, 1.5)
    assert stats.summary([]) == {"n": 0}
    assert stats.cdf([3, 1, 2]) == [(1.0, 1 / 3), (2.0, 2 / 3), (3.0, 1.0)]
    assert stats.cdf(list(range(100)), points=10)[-1] == (99.0, 1.0)
    assert len(stats.cdf(list(range(100)), points=10)) == 10


# ---------------------------------------------------------------- the plan trace

PLAN_JSON = ('aspen-plan {"bytes":1513,"extents":2,"objects":4,"plan":"planned","plan_us":169,"protocol":2,'
             '"repo":"bench.git","segments_visited":1,"serve_ms":4.5,"status":200,"version":12,"versions_visited":3}')


def test_plan_lines_parse_json_and_the_older_access_line():
    d = parse_plan_line(PLAN_JSON)
    assert d["plan"] == "planned" and d["plan_us"] == 169 and d["extents"] == 2
    old = parse_plan_line("aspen: repo=bench.git service=git-upload-pack method=POST path=/bench.git/git-upload-pack "
                          "status=200 bytes=900 ms=7.5 version=9 plan=fallback why=not-built plan_us=12 visits=4+2")
    assert (old["plan"], old["why"], old["plan_us"], old["versions_visited"], old["segments_visited"],
            old["serve_ms"]) == ("fallback", "not-built", 12, 4, 2, 7.5)
    assert parse_plan_line("[2026-01-01] [INFO] Booting worker") is None
    assert parse_plan_line("aspen-plan {not json") is None
    # JSON lines win over access lines of the same operation; a negotiation's rounds add up
    rounds = [old, parse_plan_line(PLAN_JSON.replace('"planned"', '"fallback","why":"haves-not-proved"')),
              parse_plan_line(PLAN_JSON)]
    m = plan_metrics(rounds)
    assert m["plan"] == "planned" and m["plan_rounds"] == 2 and "why" not in m
    assert (m["planning_us"], m["versions_visited"], m["segments_visited"], m["visits_total"]) == (338, 6, 2, 8)
    assert m["extents"] == 2 and m["objects"] == 4 and m["serve_ms"] == 9.0 and m["protocol"] == 2
    assert plan_metrics([old]) == {"plan": "fallback", "plan_rounds": 1, "why": "not-built", "planning_us": 12,
                                   "versions_visited": 4, "segments_visited": 2, "serve_ms": 7.5, "visits_total": 6,
                                   "version": 9}
    assert plan_metrics([]) == {}


def test_plan_stats_summarise_shares_and_why_counts():
    t = TargetInfo("aspen-packs", "http://x", None, plan_log=Path("/nonexistent.log"))
    st = PlanStats(t)
    for proto, plan, why, us in ((2, "planned", None, 100), (2, "planned", None, 300), (0, "fallback", "v0", 50),
                                 (0, "fallback", "v0", None), (2, "fallback", "unknown-have", 70)):
        m = {"plan": plan, "protocol": proto, "visits_total": 4}
        if why:
            m["why"] = why
        if us is not None:
            m["planning_us"] = us
        st.add(m)
    st.add({})                                       # a fetch that left no trace line
    out = st.summary()
    assert out["plan_share"] == pytest.approx(2 / 5, abs=1e-4)      # of the fetches traced
    assert (out["planned"], out["fallback"], out["untraced"]) == (2, 3, 1)
    assert out["fallbacks"] == "v0=2, unknown-have=1" and out["why"] == "v0" and out["plan"] == "fallback"
    assert out["planning_us"] == 85 and out["planning_us_max"] == 300 and out["visits_max"] == 4
    assert out["plan_share_v2"] == pytest.approx(2 / 3, abs=1e-4)
    assert out["plan_share_v0"] == 0 and out["fetches_v0"] == 2
    stock = PlanStats(TargetInfo("stock", "http://x", None))
    stock.add({"plan": "planned"})
    assert stock.summary() == {}


def test_protocols_param():
    assert parse_protocols("0,2") == [0, 2] and parse_protocols("v2") == [2] and parse_protocols(0) == [0]
    assert parse_protocols([2, 0]) == [2, 0]
    for bad in ("", "3", "0,x"):
        with pytest.raises(ValueError):
            parse_protocols(bad)


def test_run_knobs_from_the_command_line():
    from bench.cli import _knobs, build_parser
    args = build_parser().parse_args(["run", "random-fetch", "--fetches", "7", "--protocols", "2", "--history", "9",
                                      "--cpu-fetches", "3", "-p", "packs_timeout=30", "-p", "wait-packs=0",
                                      "-p", "label=x,y"])
    assert _knobs(args) == {"fetches": 7, "protocols": "2", "history": 9, "cpu_fetches": 3, "packs_timeout": 30,
                            "wait_packs": 0, "label": "x,y"}
    with pytest.raises(SystemExit):
        _knobs(build_parser().parse_args(["run", "x", "-p", "novalue"]))


# ---------------------------------------------------------------- end to end

@pytest.fixture
def bench_ctx(tmp_path):
    """Aspen with version packs off (aspen-git) and pre-imported (aspen-packs),
    and stock, started by bench.targets over copies of a tiny generated root."""
    from bench import targets
    root = tmp_path / "root"
    root.mkdir()
    repogen.generate(repogen.PRESETS["tiny"], root / "bench.git")
    with targets.running_targets(["aspen-git", "aspen-packs", "stock"], root, tmp_path / "servers") as started:
        infos = [t.info for t in started]
        yield WorkloadContext(targets=infos, repo="bench.git", proxies={t.info.name: t.proxy for t in started},
                              roots={i.name: i.root for i in infos}, workdir=tmp_path / "work", quick=True,
                              params={}, procs={i.name: list(i.pids) for i in infos})


def test_warm_fetch_end_to_end(bench_ctx):
    rows = WORKLOADS["warm-fetch"](bench_ctx)
    assert sorted(r.target for r in rows) == ["aspen-git", "aspen-packs", "stock"]
    for r in rows:
        assert r.metrics["failures"] == 0 and r.metrics["cpu_failures"] == 0, r.notes
        assert r.metrics["verified"] is True
        assert r.metrics["wall_ms"] > 0 and r.samples
        assert r.metrics["bytes"] > 0 and r.metrics["exchange_bytes"] > r.metrics["bytes"]
        assert r.metrics["pack_bytes"] > 0
        assert r.metrics["cpu_fetches"] == 3 and r.metrics["server_cpu_s"] > 0   # quick: 1 timed + 2 more
    by = {r.target: r.metrics for r in rows}
    assert by["aspen-git"]["plan"] == "fallback" and by["aspen-git"]["plan_share"] == 0
    assert by["aspen-git"]["fallbacks"] == "not-built=3"                        # every fetch traced, none planned
    assert by["aspen-packs"]["planned"] + by["aspen-packs"]["fallback"] == 3
    # aspen-packs waited for each push's packs, and they were built; aspen-git builds none and waits for none
    assert "packs_wait_ms" in by["aspen-packs"] and by["aspen-packs"]["packs_settled"] is True
    assert "packs_wait_ms" not in by["aspen-git"] and "packs_settled" not in by["aspen-git"]
    assert "plan" not in by["stock"] and "plan_share" not in by["stock"]
    # the same commits were pushed to every target, so their bytes compare
    refs = [gitclient.local_refs(bench_ctx.roots[t.name] / "bench.git") for t in bench_ctx.targets]
    assert refs[0] == refs[1] == refs[2] and "refs/heads/main" in refs[0]


def test_depth1_clone_and_random_fetch_end_to_end(bench_ctx):
    bench_ctx.params.update(reps=1, fetches=4)
    for r in WORKLOADS["depth1-clone"](bench_ctx):
        assert r.metrics["failures"] == 0, r.notes
        assert r.metrics["wall_ms"] > 0 and r.metrics["bytes"] > 0 and r.metrics["pack_bytes"] > 0
    rows = WORKLOADS["random-fetch"](bench_ctx)
    for r in rows:
        assert r.metrics["failures"] == 0 and r.metrics["verified"] == 4, r.notes
        assert r.metrics["bytes"] > 0
        assert r.params["protocols"] == "0,2" and r.metrics["fetches_v0"] == r.metrics["fetches_v2"] == 2
    by = {r.target: r.metrics for r in rows}
    for t in ("aspen-git", "aspen-packs"):
        assert by[t]["planned"] + by[t]["fallback"] == 4 and 0 <= by[t]["plan_share"] <= 1
    assert by["aspen-git"]["fallbacks"] == "not-built=4" and "packs_wait_ms" in by["aspen-packs"]
    assert "plan_share" not in by["stock"]
    bench_ctx.params.update(fetches=2, protocols="2", wait_packs=0)
    for r in WORKLOADS["random-fetch"](bench_ctx):
        assert r.metrics["verified"] == 2 and r.metrics["fetches_v2"] == 2 and "fetches_v0" not in r.metrics
        assert "packs_wait_ms" not in r.metrics


def test_history_clone_end_to_end(bench_ctx):
    bench_ctx.params.update(history=6, reps=2)
    rows = WORKLOADS["history-clone"](bench_ctx)
    by = {r.target: r.metrics for r in rows}
    assert set(by) == {"aspen-git", "aspen-packs", "stock"}
    for t, m in by.items():
        assert m["failures"] == 0 and m["verified"] is True and m["history_push_failures"] == 0, t
        assert m["history"] == 6 and m["reps"] == 2 and m["pack_bytes"] > 0 and m["server_cpu_s"] > 0
    packs = by["aspen-packs"]
    assert packs["packs_settled"] is True and packs["packs_pending"] == 0
    assert packs["pack_files"] >= 2 and packs["packs_bytes"] > 0          # the import's and the pushes'
    assert packs["planned"] + packs["fallback"] == 2
    if packs["planned"]:
        assert packs["extents"] >= 1
    assert by["aspen-git"]["fallbacks"] == "not-built=2" and "packs_wait_ms" not in by["aspen-git"]
    # the same history reached every target
    refs = [gitclient.local_refs(bench_ctx.roots[t.name] / "bench.git")["refs/heads/main"] for t in bench_ctx.targets]
    assert len(set(refs)) == 1


def test_offload_clone_end_to_end(tmp_path, monkeypatch):
    """offload-clone: Aspen's answer to a packfile-uris client carries only what the
    import pack does not (the import pack by URI, through the same proxy); stock's
    carries everything. Both verified (fsck --strict, refs)."""
    from bench import targets
    monkeypatch.setenv("ASPEN_OFFLOAD_MIN_BYTES", "1")          # the tiny repository's import pack goes by URI
    root = tmp_path / "root"
    root.mkdir()
    repogen.generate(repogen.PRESETS["tiny"], root / "bench.git")
    with targets.running_targets(["aspen-packs", "stock"], root, tmp_path / "servers") as started:
        infos = [t.info for t in started]
        ctx = WorkloadContext(targets=infos, repo="bench.git", proxies={t.info.name: t.proxy for t in started},
                              roots={i.name: i.root for i in infos}, workdir=tmp_path / "work", quick=True,
                              params={"reps": 2}, procs={i.name: list(i.pids) for i in infos})
        rows = WORKLOADS["offload-clone"](ctx)
        log = next(t for t in started if t.info.name == "aspen-packs").log_text()
    by = {r.target: r.metrics for r in rows}
    for t, m in by.items():
        assert m["failures"] == 0 and m["verified"] is True and m["server_cpu_s"] >= 0, t
    assert by["aspen-packs"]["pack_bytes"] < by["stock"]["pack_bytes"] / 10       # the inline part only
    assert by["aspen-packs"]["bytes"] > by["stock"]["bytes"] / 2                 # ... the pack came by its URI
    assert log.count("offload=uri") == 2 and "service=pack method=GET" in log
    assert all(r.params == {"uri_protocols": "http"} for r in rows)


def test_gitclient_failure_is_a_result(tmp_path):
    r = gitclient.ls_remote("http://127.0.0.1:9/nothing.git", timeout=30)
    assert not r.ok and r.wall_ms > 0 and r.stderr_tail


def test_lagging_clients_end_to_end(tmp_path):
    """lagging-clients at its quick sizes on aspen (the product's defaults) and
    stock: every fetch verified, a per-fetch row with its ratio to stock's same
    fetch on both targets, the ratio metrics on aspen, and raw.jsonl keeps the rows."""
    from bench import results, targets
    from bench.machine import MachineInfo
    root = tmp_path / "root"
    root.mkdir()
    repogen.generate(repogen.PRESETS["tiny"], root / "bench.git")
    with targets.running_targets(["aspen", "stock"], root, tmp_path / "servers") as started:
        infos = [t.info for t in started]
        assert [(i.name, i.version_packs) for i in infos] == [("aspen", True), ("stock", False)]
        ctx = WorkloadContext(targets=infos, repo="bench.git", proxies={t.info.name: t.proxy for t in started},
                              roots={i.name: i.root for i in infos}, workdir=tmp_path / "work", quick=True,
                              params={}, procs={i.name: list(i.pids) for i in infos})
        rows = WORKLOADS["lagging-clients"](ctx)
    by = {r.target: r for r in rows}
    assert set(by) == {"aspen", "stock"}
    for t, r in by.items():
        m = r.metrics
        assert m["fetches"] == 12 and m["verified"] == 12 and m["failures"] == 0, (t, r.notes)
        assert m["push_failures"] == 0 and m["pushes"] >= 3 + 10 + 11 * 3
        assert m["fetches_v0"] == m["fetches_v2"] == 6 and m["exchange_bytes"] > 0
        fetched = r.extra["fetches"]
        assert [f["i"] for f in fetched] == list(range(12))
        assert {f["shape"] for f in fetched} == {"mirror", "branch"} and {f["k"] for f in fetched} <= {1, 3, 10}
        for f in fetched:
            assert f["verified"] and f["exchange_bytes"] > 0 and f["base_exchange_bytes"] > 0, f
            assert f["ratio"] is not None and "pack_ratio" in f
    assert all(f["ratio"] == 1 for f in by["stock"].extra["fetches"])             # the baseline's own
    assert all("plan" in f for f in by["aspen"].extra["fetches"])                 # every fetch traced
    aspen = by["aspen"].metrics
    for key in ("ratio_p50", "ratio_p99", "ratio_max", "ratio_total", "over_2pct", "pack_ratio_p50",
                "pack_ratio_max", "planned_compared", "planned_over_2pct", "worst_fetch", "compared", "plan_share"):
        assert key in aspen, key
    assert aspen["compared"] == 12 and "ratio_p50" not in by["stock"].metrics
    w = results.ResultsWriter(tmp_path / "res", MachineInfo())
    w.add(rows)
    loaded = {r.m.target: r.m for r in results.load(tmp_path / "res").rows}
    assert loaded["aspen"].extra["fetches"][3]["ratio"] == by["aspen"].extra["fetches"][3]["ratio"]
    assert "lagging-clients" in results.render_tables([r.m for r in results.load(tmp_path / "res").rows])


def test_random_fetch_counts_fetches_over_the_visits_bound_of_their_history():
    rows = [{"visits_total": 11, "version": 8, "plan": "planned", "extents": 3},      # bound 2*3+4 = 10
            {"visits_total": 10, "version": 8, "plan": "planned", "extents": 11},     # at the bound; extents over
            {"visits_total": 4, "version": 1024, "plan": "fallback"},                 # bound 24
            {"visits_total": 30, "plan": "planned"}]                                  # no version: not counted
    got = visit_bounds(rows)
    assert (got["visits_over_bound"], got["extents_over_bound"]) == (1, 1)
    assert got["visits_p99"] > 10
    assert visit_bounds([{"plan": "planned"}]) == {}


def test_busy_repo_script_mix_and_ratio_columns():
    """busy-repo's pure parts: the seeded script deals every shape of the mix,
    per-event ratios and their table columns, and the refs check's trunk window."""
    from bench import results
    from bench.model import Measurement
    from bench.workloads import busy, busysummary
    sizes = busy.Sizes.of(WorkloadContext(targets=[], quick=True, params={}))
    a = busy.script(sizes, ["aspen", "stock"])
    assert a == busy.script(sizes, ["aspen", "stock"]) and a
    assert {e.shape for e in a[:12]} == set(busy.SHAPES)          # one deck of the default mix
    assert all(sorted(e.order) == ["aspen", "stock"] for e in a) and all(e.at < sizes.seconds for e in a)
    assert busy.parse_mix("info-refs=2,full-clone=0") == {"info-refs": 2}
    with pytest.raises(ValueError):
        busy.parse_mix("clone=1")
    with pytest.raises(ValueError):
        busy.parse_burst_mode("sometimes")
    got = busysummary.event_ratios({1: 10.0, 2: 30.0, 3: 5.0}, {1: 10.0, 2: 10.0}, "stock-maintained")
    assert got == {"wall_ratio_stock-maintained_p50": 2.0, "wall_ratio_stock-maintained_p99": 2.98,
                   "wall_ratio_stock-maintained_max": 3.0}
    assert results.event_ratio("wall_ratio_stock-maintained_p99") == ("stock-maintained", "p99")
    assert results.event_ratio("wall_ratio_p50") is None and busysummary.bases(["aspen", "stock"]) == ["stock"]
    assert busysummary.bases(["aspen", "stock-maintained", "stock"]) == ["stock", "stock-maintained"]
    table = results.render_tables([Measurement("busy-repo", "aspen", {"shape": "push"}, {"wall_p50_ms": 2.0, **got}),
                                   Measurement("busy-repo", "stock", {"shape": "push"}, {"wall_p50_ms": 1.0})])
    head = next(line for line in table.splitlines() if line.startswith("| params"))
    assert head.startswith("| params | event wall p50 aspen/stock-maintained | event wall p99 aspen/stock-maintained |")
    assert "wall p50 aspen/stock" in head
    assert busysummary._compared("stock-maintained", ["aspen"], ["stock", "stock-maintained"]) == ["stock"]
    assert busysummary._compared("stock", ["aspen"], ["stock", "stock-maintained"]) == []
    floor = busysummary.event_ratios({1: 20.0}, {1: 10.0}, "stock")
    table = results.render_tables([Measurement("busy-repo", "aspen", {"shape": "push"}, {**got}),
                                   Measurement("busy-repo", "stock-maintained", {"shape": "push"}, floor),
                                   Measurement("busy-repo", "stock", {"shape": "push"}, {"wall_p50_ms": 1.0})])
    head = next(line for line in table.splitlines() if line.startswith("| params"))
    assert "| event wall p99 aspen/stock-maintained |" in head and "| event wall p99 stock-maintained/stock |" in head
    assert head.index("aspen/stock-maintained") < head.index("stock-maintained/stock")
    static = {"refs/heads/x": "1" * 40}
    assert busy._compare({"refs/heads/main": "a", **static}, static, "refs/heads/main", {"a", "b"}) == ""
    assert "no value" in busy._compare({"refs/heads/main": "c", **static}, static, "refs/heads/main", {"a"})
    assert "refs differ" in busy._compare({"refs/heads/main": "a"}, static, "refs/heads/main", {"a"})


def test_busy_repo_end_to_end(tmp_path):
    """busy-repo at its quick sizes against aspen (the defaults), stock and
    stock-maintained (its copy repacked into one pack with a bitmap before it
    starts): a row per request shape, pushes and the whole script on every
    target, every operation verified, Aspen's per-event wall ratios to both
    stock targets, and the records and table written by the results machinery."""
    from bench import results, targets
    from bench.machine import MachineInfo
    from bench.workloads.busy import SHAPES
    root = tmp_path / "root"
    root.mkdir()
    repogen.generate(repogen.PRESETS["tiny"], root / "bench.git")
    names = ["aspen", "stock", "stock-maintained"]
    with targets.running_targets(names, root, tmp_path / "servers", env={"ASPEN_CACHE": "on"}) as started:
        infos = [t.info for t in started]
        maintained = next(i for i in infos if i.name == "stock-maintained")
        packs = sorted(p.suffix for p in (maintained.root / "bench.git" / "objects" / "pack").iterdir())
        assert packs.count(".pack") == 1 and ".bitmap" in packs and maintained.setup["repack_s"] >= 0
        ctx = WorkloadContext(targets=infos, repo="bench.git", proxies={t.info.name: t.proxy for t in started},
                              roots={i.name: i.root for i in infos}, workdir=tmp_path / "work", quick=True,
                              params={}, procs={i.name: list(i.pids) for i in infos})
        rows = WORKLOADS["busy-repo"](ctx)
    by = {(r.params["shape"], r.target): r for r in rows}
    assert set(by) == {(s, t) for s in (*SHAPES, "push", "all") for t in names}
    for (shape, t), r in by.items():
        m = r.metrics
        assert m["failures"] == 0, (shape, t, r.notes)
        if shape == "all":
            assert m["ops"] > 0 and m["pushes"] > 0 and m["push_failures"] == 0 and m["server_cpu_s"] > 0
            continue
        assert m["wall_p50_ms"] > 0 and m["wall_p99_ms"] >= m["wall_p50_ms"] and m["wall_max_ms"] >= m["wall_p99_ms"]
        assert r.samples
        if shape == "push":
            assert m["pushes"] == by[("all", t)].metrics["pushes"] and m["burst_pushes"] > 0
            continue
        assert m["ops"] > 0 and m["bytes"] > 0
        assert all(op["ok"] and op["verified"] for op in r.extra["ops"]), r.extra["ops"]
    for shape in (*SHAPES, "push"):
        a = by[(shape, "aspen")].metrics
        for base in ("stock", "stock-maintained"):
            assert a[f"wall_ratio_{base}_p50"] > 0 and a[f"wall_ratio_{base}_max"] >= a[f"wall_ratio_{base}_p99"]
        assert "wall_ratio_stock_p50" not in by[(shape, "stock")].metrics
    # every target got the same pushes, and the ops of one event the same shape
    assert len({by[("all", t)].metrics["pushes"] for t in names}) == 1
    clones = by[("full-clone", "aspen")].metrics          # Aspen's trace: every clone planned, fallback or untraced
    assert sum(clones.get(k, 0) for k in ("planned", "fallback", "untraced")) == clones["ops"]
    w = results.ResultsWriter(tmp_path / "res", MachineInfo())
    w.add(rows)
    loaded = [r.m for r in results.load(tmp_path / "res").rows]
    assert len(loaded) == len(rows)
    table = results.render_tables(loaded)
    assert "## busy-repo" in table and "event wall p99 aspen/stock-maintained" in table
    assert "| shape=fetch-stale |" in table


def test_fairness_end_to_end(tmp_path):
    """fairness at small sizes against aspen (trusting the bench's proxy, as
    `aspen-bench run` sets it) and stock: every single fetch of the second
    client verified and timed alone and under the storm, the storm's fetches
    made, the proxy's records telling the two clients apart; Aspen's access
    lines count each to its client, and the second client's never waited."""
    from bench import targets
    from bench.workloads import fairness
    root = tmp_path / "root"
    root.mkdir()
    repogen.generate(repogen.PRESETS["tiny"], root / "bench.git")
    env = {"ASPEN_CACHE": "on", "ASPEN_COLD_PER_REPO": "2", "ASPEN_COLD_PER_SERVER": "4", **fairness.ENV}
    with targets.running_targets(["aspen", "stock"], root, tmp_path / "servers", env=env) as started:
        infos = [t.info for t in started]
        ctx = WorkloadContext(targets=infos, repo="bench.git", proxies={t.info.name: t.proxy for t in started},
                              roots={i.name: i.root for i in infos}, workdir=tmp_path / "work", quick=True,
                              params={"jobs": 3, "fetches": 2, "ramp_s": 0.2},
                              procs={i.name: list(i.pids) for i in infos})
        rows = WORKLOADS["fairness"](ctx)
        log = Path(next(i for i in infos if i.name == "aspen").plan_log).read_text(errors="replace")
    assert sorted(r.target for r in rows) == ["aspen", "stock"]
    for r in rows:
        m = r.metrics
        assert m["failures"] == 0 and m["storm_failures"] == 0, r.notes
        assert m["storm_fetches"] >= 3 and len(r.extra["storm_ms"]) == 2 and len(r.extra["alone_ms"]) == 2
        assert m["alone_p50_ms"] > 0 and m["storm_p99_ms"] >= m["storm_p50_ms"] > 0
        assert len(r.extra["alone_served_ms"]) == 2 and all(ms > 0 for ms in r.extra["alone_served_ms"])
    mine = [line for line in log.splitlines() if " client=addr:10.0.0.2 " in line]
    assert len(mine) == 4 and not any("queued_ms=" in line for line in mine), mine
    assert " client=addr:10.0.0.1 " in log


def test_offload_clone_raw_storm(monkeypatch, capsys):
    """bench.offload_clone --storm --raw: the storm's clients send git's
    request and download what the answer names by URI (no index-pack): with
    offload the import pack comes from the static route and Aspen's answers
    carry only the rest; every answer of a kind is as long as the first."""
    import json

    from bench import offload_clone
    monkeypatch.setenv("ASPEN_OFFLOAD_MIN_BYTES", "1")          # the tiny repository's import pack goes by URI
    assert offload_clone.main(["--preset", "tiny", "--reps", "1", "--storm", "4", "--jobs", "2", "--raw",
                               "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    inline, uris = out["storm"]["inline"], out["storm"]["uris"]
    assert inline["check"] == uris["check"] == "raw clients: 4/4 answers of the first's length"
    assert inline["static_bytes"] == 0 and uris["static_bytes"] > 0
    assert uris["answer_bytes"] < inline["answer_bytes"] / 2
    assert out["tracebacks"] == 0


def test_offload_storm_end_to_end(tmp_path, monkeypatch):
    """offload-storm: a real clone verified per target, then a storm of raw
    clients; Aspen names its import pack by URI (static bytes, a small answer),
    stock sends everything inline; every answer the same; server CPU counted."""
    from bench import targets
    monkeypatch.setenv("ASPEN_OFFLOAD_MIN_BYTES", "1")          # the tiny repository's import pack goes by URI
    root = tmp_path / "root"
    root.mkdir()
    repogen.generate(repogen.PRESETS["tiny"], root / "bench.git")
    with targets.running_targets(["aspen-packs", "stock"], root, tmp_path / "servers") as started:
        infos = [t.info for t in started]
        ctx = WorkloadContext(targets=infos, repo="bench.git", proxies={t.info.name: t.proxy for t in started},
                              roots={i.name: i.root for i in infos}, workdir=tmp_path / "work", quick=True,
                              params={}, procs={i.name: list(i.pids) for i in infos})
        rows = WORKLOADS["offload-storm"](ctx)
    assert sorted((r.target, r.params["uri_protocols"]) for r in rows) == [
        ("aspen-packs", "http"), ("aspen-packs", "none"), ("stock", "http"), ("stock", "none")]
    by = {(r.target, r.params["uri_protocols"]): r.metrics for r in rows}
    for k, m in by.items():
        assert m["failures"] == 0 and m["verified"] is True and m["clones"] == 6, (k, m)
        assert m["server_cpu_s"] >= 0 and m["p50"] <= m["p99"] <= m["max"]
    assert by["aspen-packs", "http"]["same_answers"] == by["aspen-packs", "none"]["same_answers"] == 6   # stored bytes
    assert by["aspen-packs", "http"]["static_bytes"] > 0
    assert by["stock", "http"]["static_bytes"] == by["aspen-packs", "none"]["static_bytes"] == 0
    assert by["aspen-packs", "http"]["answer_bytes"] < by["aspen-packs", "none"]["answer_bytes"] / 2
