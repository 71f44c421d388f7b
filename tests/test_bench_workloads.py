"""bench/: the repository generator's determinism and sizes, percentile maths,
and quick workloads end to end against real Aspen and stock servers."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from bench import gitclient, repogen, stats
from bench.workloads import WORKLOADS, WorkloadContext


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


@pytest.fixture
def bench_ctx(tmp_path):
    """Aspen and stock, started by bench.targets over copies of a tiny generated root."""
    from bench import targets
    root = tmp_path / "root"
    root.mkdir()
    repogen.generate(repogen.PRESETS["tiny"], root / "bench.git")
    with targets.running_targets(["aspen", "stock"], root, tmp_path / "servers") as started:
        infos = [t.info for t in started]
        yield WorkloadContext(targets=infos, repo="bench.git", proxies={t.info.name: t.proxy for t in started},
                              roots={i.name: i.root for i in infos}, workdir=tmp_path / "work", quick=True,
                              params={}, procs={i.name: list(i.pids) for i in infos})


def test_warm_fetch_end_to_end(bench_ctx):
    rows = WORKLOADS["warm-fetch"](bench_ctx)
    assert sorted(r.target for r in rows) == ["aspen", "stock"]
    for r in rows:
        assert r.metrics["failures"] == 0, r.notes
        assert r.metrics["verified"] is True
        assert r.metrics["wall_ms"] > 0 and r.samples
        assert r.metrics["bytes"] > 0 and r.metrics["exchange_bytes"] > r.metrics["bytes"]
        assert r.metrics["pack_bytes"] > 0
    aspen = next(r for r in rows if r.target == "aspen")
    assert aspen.metrics.get("plan") == "fallback"
    # the same commits were pushed to every target, so their bytes compare
    refs = [gitclient.local_refs(bench_ctx.roots[t.name] / "bench.git") for t in bench_ctx.targets]
    assert refs[0] == refs[1] and "refs/heads/main" in refs[0]


def test_depth1_clone_and_random_fetch_end_to_end(bench_ctx):
    bench_ctx.params.update(reps=1, fetches=3)
    for r in WORKLOADS["depth1-clone"](bench_ctx):
        assert r.metrics["failures"] == 0, r.notes
        assert r.metrics["wall_ms"] > 0 and r.metrics["bytes"] > 0 and r.metrics["pack_bytes"] > 0
    rows = WORKLOADS["random-fetch"](bench_ctx)
    for r in rows:
        assert r.metrics["failures"] == 0 and r.metrics["verified"] == 3, r.notes
        assert r.metrics["bytes"] > 0


def test_gitclient_failure_is_a_result(tmp_path):
    r = gitclient.ls_remote("http://127.0.0.1:9/nothing.git", timeout=30)
    assert not r.ok and r.wall_ms > 0 and r.stderr_tail
