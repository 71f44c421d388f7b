"""bench/: the figures of issue 4's "Measure" section, quick: the ref store's
visits and query time in `stale-branch`, the `ref-advertisement` workload (and
its listing comparison), `push-history`'s first/last flatness, and how these
become table columns and plots."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench import repogen, results
from bench.model import Measurement
from bench.workloads import WORKLOADS, WorkloadContext, adverts, common, pushes, storeprobe
from bench.workloads.adverts import pkt

Z1, Z2, Z3 = "1" * 40, "2" * 40, "3" * 40


def _ctx(tmp_path, started, **params) -> WorkloadContext:
    infos = [t.info for t in started]
    return WorkloadContext(targets=infos, repo="bench.git", proxies={t.info.name: t.proxy for t in started},
                           roots={i.name: i.root for i in infos}, workdir=tmp_path / "work", quick=True,
                           params=params, procs={i.name: list(i.pids) for i in infos})


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    r.mkdir()
    repogen.generate(repogen.PRESETS["tiny"], r / "bench.git")
    return r


# ---------------------------------------------------------------- stale-branch: the ref store

def test_stale_branch_store_figures(tmp_path, root):
    """Both Aspen targets get the ref store's figures (store_ visits); the one with
    version packs also the plan trace of every fetch, checked in its notes."""
    from bench import targets
    with targets.running_targets(["aspen-git", "aspen-packs"], root, tmp_path / "servers") as started:
        rows = WORKLOADS["stale-branch"](_ctx(tmp_path, started, max_n=100, reps=2))
    assert sorted((r.params["n"], r.target) for r in rows) == [(10, "aspen-git"), (10, "aspen-packs"),
                                                               (100, "aspen-git"), (100, "aspen-packs")]
    for r in rows:
        m, n = r.metrics, r.params["n"]
        assert m["failures"] == 0, r.notes
        assert m["ancestor"] is True
        assert m["visits_bound"] == pytest.approx(storeprobe.visits_bound(n), abs=0.01)
        assert 1 <= m["store_visits_total"] == m["store_versions_visited"] + m["store_segments_visited"] \
            <= m["visits_bound"]
        assert m["versions_span"] >= n and m["k"] - m["j"] == m["versions_span"]
        assert m["query_us"] > 0 and m["tips_us"] > 0 and m["tips_found"] >= 1
        assert m["planned"] + m["fallback"] == 2                 # every fetch traced
    by = {(r.params["n"], r.target): r for r in rows}
    assert by[(100, "aspen-git")].metrics["store_segments_visited"] >= 1   # N=100 is answered from compacted segments
    assert by[(10, "aspen-git")].metrics["fallbacks"] == "not-built=2"     # no version packs: git answers
    for n in (10, 100):
        packs = by[(n, "aspen-packs")]
        assert packs.metrics["packs_settled"] is True
        if packs.metrics["planned"]:
            assert packs.metrics["planning_us"] > 0 and "versions_visited" in packs.metrics
            assert f"issue 5 at N={n}: planning" in packs.notes


def test_store_answers_are_checked():
    class Store:
        def __init__(self, ancestor, visits, value_j=Z2, tips=((5, "refs/heads/main"),)):
            self.a = SimpleNamespace(ancestor=ancestor, value_j=value_j,
                                     visits=SimpleNamespace(versions=visits, segments=0, total=visits))
            self._tips = tips

        def tips(self, commit):
            t = ((7, "refs/heads/stale-10"),) if commit == Z1 else self._tips
            return SimpleNamespace(tips=t, visits=SimpleNamespace(total=1))

        def latest(self):
            return 17

        def is_ancestor(self, ref, j, k):
            assert (ref, j, k) == ("refs/heads/main", 7, 17)
            return self.a

    def check(store, ref="refs/heads/stale-10", trunk="refs/heads/main") -> str:
        return storeprobe.stale_branch_figures(store, 10, ref, Z1, Z2, trunk)[1]

    m, problem = storeprobe.stale_branch_figures(Store(True, 3), 10, "refs/heads/stale-10", Z1, Z2, "refs/heads/main")
    assert problem == "" and m["ancestor"] is True and m["visits_total"] == 3 and m["versions_span"] == 10
    assert "answered false" in check(Store(False, 3))
    assert "exceed the bound" in check(Store(True, 11))
    assert "branch's base" in check(Store(True, 3, value_j=Z3))
    assert "tips(" in check(Store(True, 3, tips=((9, "refs/heads/main"),)))
    assert "no tip records" in check(Store(True, 3), "refs/heads/other")
    # a repository whose HEAD names another trunk (git.git: master): asked about that ref
    master = Store(True, 3, tips=((5, "refs/heads/master"),))
    master.is_ancestor = lambda ref, j, k: master.a if ref == "refs/heads/master" else None
    assert check(master, trunk="refs/heads/master") == ""


# ---------------------------------------------------------------- ref-advertisement

def test_ref_advertisement_end_to_end(tmp_path, root):
    from bench import targets
    with targets.running_targets(["aspen", "stock"], root, tmp_path / "servers") as started:
        listed = adverts.parse_v0(adverts.request(f"{started[0].info.url}/bench.git", "v0")[1])[0]
        before = sum(1 for n in listed if n != "HEAD" and not n.endswith("^{}"))
        rows = WORKLOADS["ref-advertisement"](_ctx(tmp_path, started, refs=60, reps=2))
    assert len(rows) == 2 * 2 * 2   # targets x storage x protocol
    assert {(r.params["storage"], r.params["protocol"]) for r in rows} == \
        {("loose", "v0"), ("loose", "v2"), ("packed", "v0"), ("packed", "v2")}
    for r in rows:
        m = r.metrics
        assert r.params["refs"] == 60 and m["failures"] == 0, r.notes
        assert m["p50_ms"] > 0 and len(r.samples) == 2
        assert m["bytes"] > m["body_bytes"] > 60 * 40
    assert {r.metrics["refs"] for r in rows} == {60 + before}   # the refs made and the repository's own


def test_listings_parse_and_compare():
    v0 = (pkt("# service=git-upload-pack\n") + b"0000"
          + pkt(f"{Z1} HEAD\0multi_ack symref=HEAD:refs/heads/main agent=x\n")
          + pkt(f"{Z1} refs/heads/main\n") + pkt(f"{Z2} refs/tags/v1\n") + pkt(f"{Z3} refs/tags/v1^{{}}\n") + b"0000")
    v2 = (pkt(f"{Z1} HEAD symref-target:refs/heads/main\n") + pkt(f"{Z1} refs/heads/main\n")
          + pkt(f"{Z2} refs/tags/v1 peeled:{Z3}\n") + b"0000")
    a, b = adverts.parse_v0(v0), adverts.parse_v2(v2)
    assert a == b == ({"HEAD": Z1, "refs/heads/main": Z1, "refs/tags/v1": Z2, "refs/tags/v1^{}": Z3},
                      {"HEAD": "refs/heads/main"})
    assert adverts.compare(a, b) == ""
    other = adverts.parse_v2(pkt(f"{Z1} HEAD symref-target:refs/heads/main\n") + pkt(f"{Z2} refs/heads/main\n")
                             + pkt(f"{Z2} refs/heads/extra\n") + b"0000")
    diff = adverts.compare(b, other)
    assert "only in the first" in diff and "only in the second" in diff and "differ" in diff
    with pytest.raises(ValueError):
        adverts.pkt_lines(b"00ffshort")
    stream = adverts.refs_stream([Z1, Z2], 20)
    assert stream.count(b"\ntag ") + stream.startswith(b"tag ") == 2 and stream.count(b"reset ") == 18


# ---------------------------------------------------------------- push-history: flat?

def test_first_last_span_and_ratio():
    assert [pushes.first_last_span(n) for n in (10000, 5000, 1000, 300, 5)] == [500, 500, 100, 30, 1]
    lat = [10.0] * 50 + [99.0] * 200 + [12.0] * 50
    ok = [True] * 300
    m = pushes.first_last(lat, ok)
    assert m["span"] == 30 and m["first_p50_ms"] == 10.0 and m["last_p50_ms"] == 12.0
    assert m["last_first"] == pytest.approx(1.2)
    ok[-30:] = [False] * 30                                  # failed pushes are not latencies
    assert "last_first" not in pushes.first_last(lat, ok)
    assert pushes.first_last([], []) == {}


def test_push_history_summary_has_last_first(tmp_path, root):
    from bench import targets
    with targets.running_targets(["aspen-git", "aspen-packs", "stock"], root, tmp_path / "servers") as started:
        rows = WORKLOADS["push-history"](_ctx(tmp_path, started, pushes=20, window=10))
    summary = {r.target: r for r in rows if r.params["window"] == "all"}
    for t in ("aspen-git", "aspen-packs", "stock"):
        m = summary[t].metrics
        assert m["failures"] == 0 and m["span"] == 2
        assert m["last_first"] == pytest.approx(m["last_p50_ms"] / m["first_p50_ms"], abs=6e-4)   # rounded to 3 places
        assert m["server_cpu_s"] > 0                 # the tree's own pushes (and builds) over the history
    for t in ("aspen-git", "aspen-packs"):
        assert "issue target: last/first" in summary[t].notes
    packs = summary["aspen-packs"].metrics
    assert packs["packs_settled"] is True and packs["packs_pending"] == 0 and packs["pack_files"] >= 1
    assert "version packs caught up" in summary["aspen-packs"].notes
    assert "packs_wait_ms" not in summary["aspen-git"].metrics
    md = results.render_tables(rows)
    assert "p50 aspen-git/stock" in md and "p50 aspen-packs/stock" in md and "server cpu aspen-packs/stock" in md


# ---------------------------------------------------------------- tables and plots

def test_new_figures_become_columns_and_plots(tmp_path):
    ms = []
    for n in (10, 100, 1000):
        ms.append(Measurement("stale-branch", "aspen", {"n": n}, {
            "wall_ms": 30.0, "bytes": 5000, "versions_visited": 2, "segments_visited": n.bit_length(),
            "visits_total": 2 + n.bit_length(), "visits_bound": storeprobe.visits_bound(n), "query_us": 40.0,
            "ancestor": True}))
        ms.append(Measurement("stale-branch", "stock", {"n": n}, {"wall_ms": 20.0, "bytes": 4000}))
        ms.append(Measurement("stale-branch", "aspen-packs", {"n": n}, {
            "wall_ms": 10.0, "bytes": 2000, "plan_share": 1.0, "planning_us": 300.0 + n, "versions_visited": 3,
            "segments_visited": 2, "visits_total": 5, "store_visits_total": 4}))
    for m in ms:
        if m.target == "aspen":
            m.metrics.update(plan_share=0.0, fallbacks="not-built=2", why="not-built")
    for t, p50 in (("aspen", 3.0), ("stock", 6.0)):
        ms.append(Measurement("ref-advertisement", t, {"refs": 5000, "storage": "packed", "protocol": "v0"},
                              {"p50_ms": p50, "bytes": 400000, "refs": 5007}))
        ms.append(Measurement("push-history", t, {"window": "all"},
                              {"p50_ms": p50, "first_p50_ms": p50, "last_p50_ms": p50 * 1.1, "last_first": 1.1}))
    md = results.render_tables(ms)
    stale = md.split("## stale-branch")[1].split("##")[0]
    head = stale.split("\n")[2]
    for col in ("versions visited aspen", "segments visited aspen", "visits total aspen", "visits bound aspen",
                "query µs aspen", "planning µs aspen-packs", "plan share aspen-packs", "fallbacks aspen",
                "store visits total aspen"):
        assert col in head
    assert "query µs aspen/stock" not in head and "planning µs aspen-packs/stock" not in head
    assert "wall aspen-packs/stock" in head and "why aspen" not in head     # the why-counts say it
    adv = md.split("## ref-advertisement")[1].split("##")[0]
    assert "p50 aspen/stock" in adv and "| 0.50 |" in adv
    hist = md.split("## push-history")[1]
    assert "last/first aspen" in hist and "last/first aspen/stock" not in hist and "first p50 aspen/stock" in hist
    assert md.index("## stale-branch") < md.index("## ref-advertisement") < md.index("## push-history")
    plots = results.write_plots(ms, tmp_path)
    by_title = {p.title: p for p in plots}
    assert by_title["stale-branch: visits against N"].path.stat().st_size > 1000
    assert by_title["stale-branch: ref-store ancestry query time against N"].path is not None
    assert by_title["stale-branch: planning time against N"].path is not None
    no_plan = [m for m in ms if m.target != "aspen-packs"]
    for m in no_plan:
        m.metrics.pop("planning_us", None)
    skipped = {p.title: p for p in results.write_plots(no_plan, tmp_path / "b")}
    assert "no planning time traced" in skipped["stale-branch: planning time against N"].note


# ---------------------------------------------------------------- poll-storm, and Aspen under Apache

def test_poll_storm_over_aspen_under_apache_cgi_and_mod_wsgi(tmp_path, root):
    """The aspen-apache (aspen-cgi under mod_cgi) and aspen-modwsgi targets
    start from the shipped configs beside stock-apache; every poll gets a 200
    listing, and aspen-cgi replays its recorded answers (its error log says so)."""
    from bench import targets

    from .harness import need_system
    need_system("apache2", "/usr/sbin/apache2")
    need_system("libapache2-mod-wsgi-py3", "/usr/lib/apache2/modules/mod_wsgi.so")
    names = ["aspen-apache", "aspen-modwsgi", "stock-apache"]
    with targets.running_targets(names, root, tmp_path / "servers") as started:
        rows = WORKLOADS["poll-storm"](_ctx(tmp_path, started, requests=24, threads=4, reps=1))
        logs = {t.info.name: t.log_text() for t in started}
    assert sorted((r.target, r.params["protocol"]) for r in rows) == sorted((n, p) for n in names for p in ("v0", "v2"))
    for r in rows:
        assert r.metrics["failures"] == 0, (r.target, r.notes)
        assert len(r.samples) == 24 and r.metrics["req_per_s"] > 0
        assert r.metrics["p50_ms"] <= r.metrics["p99_ms"] <= r.metrics["max_ms"]
    served = [common.parse_plan_line(line) for line in logs["aspen-apache"].splitlines()]
    served = [d for d in served if d and d.get("service") == "upload-pack"]
    assert any(d.get("replayed") == 1 for d in served) and any("replayed" not in d for d in served)
    assert any(common.parse_plan_line(line) for line in logs["aspen-modwsgi"].splitlines())


def test_plan_lines_are_read_from_apaches_error_log():
    line = ("[Wed Dec 02 10:11:26.619107 2026] [cgi:error] [pid 30681:tid 30681] [client 127.0.0.1:51786] "
            "AH01215: stderr from /opt/aspen/venv/bin/aspen-cgi: aspen: repo=/srv/r.git service=upload-pack "
            "method=GET path=/r.git/info/refs status=200 bytes=36475 ms=2.7 version=2 replayed=1")
    d = common.parse_plan_line(line)
    assert d["service"] == "upload-pack" and d["status"] == 200 and d["replayed"] == 1 and d["serve_ms"] == 2.7
    plan = ('[Wed Dec 02 10:11:26.6 2026] [wsgi:error] [pid 1:tid 2] aspen-plan {"bytes":10,"plan":"planned"}')
    assert common.parse_plan_line(plan)["plan"] == "planned"
    assert common.parse_plan_line("[Wed Dec 02 2026] [core:notice] AH00094: Command line: 'apache2'") is None
