"""The operators' metrics (ASPEN_METRICS=1): `GET /_aspen/metrics` over real
HTTP after clones, a fetch, a push, a fetch that waited in the admission
queue and one refused past it (503), counted across gunicorn's two workers
and a CGI process and kept through kill -9 of the workers; the same numbers
from `aspen stats --server`; and, with ASPEN_METRICS unset, stock's 404."""

from __future__ import annotations

import collections
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from aspen_cgi import settings
from aspen_cgi import settings as aspen_settings
from aspen_cgi.http import backend
from aspen_cgi.packs import background
from aspen_cgi.runtime import admission, metrics
from aspen_cgi.runtime.repository import Repository

from . import harness as h
from . import pushkit as pk
from .harness import Server, make_history

pytestmark = pytest.mark.timeout(300)

ASPEN = str(Path(sys.executable).parent / "aspen")


# -- reading the endpoint and the access lines ------------------------------------------------------

def scrape(url: str) -> tuple[str, dict[str, float]]:
    with urllib.request.urlopen(url + metrics.PATH, timeout=30) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        text = resp.read().decode()
    check_format(text)
    return text, metrics.parse(text)


def check_format(text: str) -> None:
    """Text exposition 0.0.4: HELP then TYPE before a family's samples, counters named *_total."""
    described: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split()[2]
            assert name not in described, f"{name} described twice"
            described[name] = ""
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert name in described and kind in ("counter", "gauge")
            described[name] = kind
            assert (kind == "counter") == name.endswith("_total"), name
        else:
            assert re.fullmatch(r'[a-z_]+(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? -?[0-9.e+]+', line), line
            assert described.get(metrics.family(line.rpartition(" ")[0])), f"sample before its TYPE: {line}"


def requests_of(values: dict[str, float], *, without: str = "metrics") -> dict[tuple[str, str, str], float]:
    out = {}
    for k, v in values.items():
        if metrics.family(k) == "aspen_requests_total":
            lab = metrics.labels_of(k)
            if lab["service"] != without:
                out[(lab["service"], lab["method"], lab["status"])] = v
    return out


def access_lines(text: str) -> list[dict[str, str]]:
    out = []
    for line in text.splitlines():
        if line.startswith("aspen: repo="):
            out.append(dict(f.split("=", 1) for f in line[len("aspen: "):].split() if "=" in f))
    return out


def expected_requests(lines: list[dict[str, str]]) -> dict[tuple[str, str, str], int]:
    c = collections.Counter()
    for f in lines:
        service = "none" if f["service"] == "-" else f["service"]
        if service != "metrics":
            c[(service, f["method"], f["status"])] += 1
    return dict(c)


def settled_lines(server: Server, at_least: int, timeout: float = 30) -> list[dict[str, str]]:
    """The server's access lines once AT_LEAST are there and none came for 0.5 s
    (each is written as its response closes, after its count is saved)."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while True:
        lines = access_lines(server.log_text())
        if len(lines) != last:
            last, since = len(lines), time.monotonic()
        elif len(lines) >= at_least and time.monotonic() - since > 0.5:
            return lines
        assert time.monotonic() < deadline, f"{len(lines)} access lines, wanted {at_least}"
        time.sleep(0.05)


def series(values: dict[str, float], name: str, **labels: str) -> float:
    return values.get(metrics.key(name, **labels), 0)


def worker_pids(master: int) -> list[int]:
    """gunicorn's workers: the processes whose parent is MASTER."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == master:
                pids.append(int(name))
    return pids


# -- the scenario -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    """gunicorn (2 workers) with ASPEN_METRICS=1 over a pre-imported repository,
    one cold slot on the machine and one queue place, then: two identical
    clones, a push (its pack held back by the test holding the build lock and slot),
    a fetch, a `--depth 1` clone that waits in the queue while the test holds
    the cold slot, a `--depth 2` clone refused with 503 while the test holds
    the slot and the queue place, and one CGI request. Yields what each test
    reads."""
    base = tmp_path_factory.mktemp("metrics")
    root = base / "root"
    root.mkdir()
    repo = pk.enable_push(make_history(root / "repo.git"))
    run = base / "run"
    env = {"ASPEN_METRICS": "1", "ASPEN_RUN_DIR": str(run), "ASPEN_COLD_PER_SERVER": "1", "ASPEN_QUEUE": "1",
           "ASPEN_QUEUE_WAIT": "60", "ASPEN_BUILDS_PER_SERVER": "1", "ASPEN_PREWARM": "off",
           "ASPEN_WIDE_DEPTH1": "0", "ASPEN_ACCESS_LOG": "1"}
    # every version has its pack before the first clone, so that clone is planned
    imp = subprocess.run([sys.executable, "-m", "aspen_cgi.cli", "import", "-q", str(repo)], capture_output=True,
                         text=True, timeout=120, env={**os.environ, **env}, cwd=h.REPO_DIR)
    assert imp.returncode == 0, imp.stderr
    server = Server(root, env).start()
    url = f"{server.url}/repo.git"
    lim = admission.capacity(settings.of(env))
    out: dict = {"server": server, "env": env, "repo": repo, "run": run, "url": url}
    try:
        a, b = base / "a", base / "b"
        pk.clone(url, a)
        h.git("clone", "-q", url, str(b))                       # the same request again: from the cache

        # the push's version waits for its pack: the test holds the repository's build lock (so the push
        # cannot adopt its client's pack) and the machine's build slot
        packs = repo / "aspen" / "packs"
        lock = background.BuildLock(str(packs))
        assert lock.acquire()
        build = admission.acquire_build(lim)
        pk.commit(a, "one more")
        pk.push(a, "origin", "main")
        _, out["held_build"] = scrape(server.url)
        lock.release()
        build.release()
        background.kick(Repository.of(str(repo), {**os.environ, **env}), str(packs))
        h.wait_packs_built(repo)
        h.git("fetch", "-q", "origin", cwd=str(b))

        slot = admission.acquire(lim, str(repo))                # the machine's one cold slot
        waiting = subprocess.Popen(["git", "clone", "-q", "--bare", "--depth", "1", url, str(base / "c")],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while True:
            _, values = scrape(server.url)
            if values.get("aspen_admission_queue_depth") == 1:
                out["queued"] = values
                break
            assert waiting.poll() is None and time.monotonic() < deadline, "the clone never queued"
            time.sleep(0.05)
        time.sleep(0.3)                                         # it waits measurably
        slot.release()
        assert waiting.wait(timeout=120) == 0, waiting.stderr.read()

        slot = admission.acquire(lim, str(repo))
        place = os.open(run / "queue.0", os.O_RDWR | os.O_CREAT)
        fcntl.flock(place, fcntl.LOCK_EX | fcntl.LOCK_NB)       # and its one queue place: refused at once
        refused = h.git("clone", "-q", "--bare", "--depth", "2", url, str(base / "d"), check=False)
        out["refused_stderr"] = refused.stderr.decode()
        assert refused.returncode != 0
        os.close(place)
        slot.release()

        cgi = h.aspen({"GIT_PROJECT_ROOT": str(root), "GIT_HTTP_EXPORT_ALL": "1", "REQUEST_METHOD": "GET",
                       "PATH_INFO": "/repo.git/info/refs", "QUERY_STRING": "service=git-upload-pack", **env})
        assert cgi.status == 200
        out["cgi_lines"] = access_lines(cgi.stderr.decode())
        assert len(out["cgi_lines"]) == 1

        out["lines"] = settled_lines(server, at_least=1)
        out["text"], out["values"] = scrape(server.url)
        yield out
    finally:
        server.stop()


def test_counters_match_the_requests_made(scenario):
    values, lines = scenario["values"], scenario["lines"] + scenario["cgi_lines"]
    # every request of both workers and the CGI process, by service, method and status
    assert requests_of(values) == expected_requests(lines)
    assert series(values, "aspen_requests_total", service="upload-pack", method="GET", status="200") == 6
    assert series(values, "aspen_requests_total", service="receive-pack", method="GET", status="200") == 1
    assert series(values, "aspen_requests_total", service="receive-pack", method="POST", status="200") == 1
    assert series(values, "aspen_requests_total", service="upload-pack", method="POST", status="503") == 1
    assert series(values, "aspen_requests_total", service="metrics", method="GET", status="200") >= 2  # earlier scrapes
    for service in ("upload-pack", "receive-pack"):
        assert series(values, "aspen_response_bytes_total", service=service) == sum(
            int(f["bytes"]) for f in lines if f["service"] == service)
    # plans and fallbacks by reason: the first clone and the fetch from stored packs, the depth-1 clone git's
    planned = sum(v for k, v in values.items() if k.startswith('aspen_fetch_plans_total{plan="planned"'))
    assert planned >= 2
    assert series(values, "aspen_fetch_plans_total", plan="fallback", why="shallow") == 1
    fetches = [f for f in lines if f["service"] == "upload-pack" and f["method"] == "POST" and f["status"] == "200"]
    for plan in ("planned", "fallback"):
        assert sum(v for k, v in values.items() if k.startswith(f'aspen_fetch_plans_total{{plan="{plan}"')) == \
            sum(1 for f in fetches if f.get("plan") == plan)
    # the response cache: the second clone from the first one's entry; the 503 is `overloaded`
    cache = {metrics.labels_of(k)["result"]: v for k, v in values.items()
             if metrics.family(k) == "aspen_fetch_cache_total"}
    assert cache.get("hit", 0) + cache.get("shared", 0) == 1
    assert cache["cold"] == sum(1 for f in fetches if f.get("cache") == "cold") >= 3
    assert cache["overloaded"] == 1
    # bytes served from stored packs, computed by git, and from the cache
    for source in ("stored", "git", "cache"):
        assert series(values, "aspen_fetch_bytes_total", source=source) > 0, source
    assert sum(v for k, v in values.items() if metrics.family(k) == "aspen_fetch_bytes_total") == \
        sum(int(f["bytes"]) for f in lines if f["service"] == "upload-pack" and f["method"] == "POST"
            and f["status"] == "200")
    # admission: one fetch waited in the queue, one was refused
    assert values["aspen_admission_queued_total"] == 1
    assert values["aspen_admission_wait_seconds_total"] >= 0.2
    assert values["aspen_admission_rejected_total"] == 1
    assert "503" in scenario["refused_stderr"]
    # the push: one version, one ref updated
    assert values["aspen_push_versions_total"] == 1
    assert series(values, "aspen_push_ref_updates_total", result="ok") == 1
    assert series(values, "aspen_push_ref_updates_total", result="rejected") == 0
    # gauges now: nothing running, nothing waiting, every pack built
    for gauge in ("aspen_admission_queue_depth", "aspen_admission_cold_running", "aspen_pack_builds_running",
                  "aspen_version_pack_backlog", "aspen_version_pack_backlog_repositories"):
        assert values[gauge] == 0, gauge


def test_gauges_while_work_waits(scenario):
    held = scenario["held_build"]          # the test held the build slot: the push's version waited for it
    assert held["aspen_pack_builds_running"] == 1
    assert held["aspen_version_pack_backlog"] == 1
    assert held["aspen_version_pack_backlog_repositories"] == 1
    queued = scenario["queued"]            # the test held the cold slot: the depth-1 clone waited for it
    assert queued["aspen_admission_queue_depth"] == 1
    assert queued["aspen_admission_cold_running"] == 1


def test_stats_server_prints_the_same_numbers(scenario):
    env = {**os.environ, "ASPEN_RUN_DIR": scenario["env"]["ASPEN_RUN_DIR"]}
    _, scraped = scrape(scenario["server"].url)
    res = subprocess.run([ASPEN, "stats", "--server", "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    server = json.loads(res.stdout)["server"]
    assert server["metrics_dir"] == str(scenario["run"] / "metrics")
    printed = {metrics.key(name, **s["labels"]): s["value"] for name, samples in server["metrics"].items()
               for s in samples}
    # the scrape counted itself as it closed, after it was written: all else is the same
    mine = metrics.key("aspen_requests_total", service="metrics", method="GET", status="200")
    bytes_key = metrics.key("aspen_response_bytes_total", service="metrics")
    assert printed.pop(mine) == scraped.pop(mine) + 1
    printed.pop(bytes_key), scraped.pop(bytes_key)
    assert printed == scraped
    assert (server["cold_running"], server["queue_depth"], server["builds_running"]) == (0, 0, 0)

    text = subprocess.run([ASPEN, "stats", "--server"], capture_output=True, text=True, env=env, timeout=60)
    assert text.returncode == 0, text.stderr
    out = text.stdout
    assert out.startswith(f"server metrics ({scenario['run'] / 'metrics'}):")
    assert re.search(r"^    upload-pack +GET +200 +6$", out, re.M), out
    assert re.search(r"^    upload-pack +POST +503 +1$", out, re.M), out
    assert re.search(r"^    fallback +shallow +1$", out, re.M), out
    assert "  fetches refused with 503 by admission: 1\n" in out
    assert "  ref-store versions pushed: 1\n" in out
    assert "  versions waiting for their version pack: 0\n" in out
    for source in ("stored", "git", "cache"):
        n = metrics.number_text(scraped[metrics.key("aspen_fetch_bytes_total", source=source)])
        assert re.search(rf"^    {source} +{n}$", out, re.M), out


def test_counts_survive_kill_9_of_the_workers(scenario):
    server = scenario["server"]
    _, before = scrape(server.url)
    old = worker_pids(server.proc.pid)
    assert len(old) == 2
    for pid in old:
        os.kill(pid, signal.SIGKILL)       # gunicorn's workers, children of the server this module started
    deadline = time.monotonic() + 60
    while True:
        try:
            _, after = scrape(server.url)
            if not set(worker_pids(server.proc.pid)) & set(old):
                break
        except (urllib.error.URLError, ConnectionError):
            pass
        assert time.monotonic() < deadline, "gunicorn did not replace its workers"
        time.sleep(0.2)
    assert requests_of(after) == requests_of(before)
    assert {k: v for k, v in after.items() if "metrics" not in k} == \
        {k: v for k, v in before.items() if "metrics" not in k}
    h.git("ls-remote", scenario["url"])    # the new workers count on from where the dead ones stopped
    _, later = scrape(server.url)
    assert series(later, "aspen_requests_total", service="upload-pack", method="GET", status="200") == \
        series(before, "aspen_requests_total", service="upload-pack", method="GET", status="200") + 1


# -- off by default ---------------------------------------------------------------------------------

def test_the_path_is_stocks_404_when_metrics_are_off(server, root, tmp_path):
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(server.url + metrics.PATH, timeout=30)
    assert e.value.code == 404 and e.value.read() == b""
    env = {"GIT_PROJECT_ROOT": str(root), "GIT_HTTP_EXPORT_ALL": "1", "REQUEST_METHOD": "GET",
           "PATH_INFO": metrics.PATH, "ASPEN_RUN_DIR": str(tmp_path / "run")}
    stock = h.stock(env)
    assert stock.status == 404
    for off in ({}, {"ASPEN_METRICS": "0"}, {"ASPEN_METRICS": ""}, {"ASPEN_METRICS": "off"}):
        cgi = h.aspen({**env, **off})
        assert (cgi.status, cgi.headers, cgi.body) == (stock.status, stock.headers, stock.body)
        wsgi = h.wsgi({**env, **off})         # the same, with the Status line lifted out
        assert (wsgi.status, wsgi.headers, wsgi.body) == \
            (stock.status, [kv for kv in stock.headers if kv[0] != "Status"], stock.body)
    assert not (tmp_path / "run" / "metrics").exists()        # nothing counted either


def test_only_get_of_the_exact_path_is_metrics_and_repositories_stay_reachable(tmp_path):
    """With ASPEN_METRICS=1, a repository named `_aspen/metrics` is served as
    ever (its URLs match a route first), and anything but GET of the exact
    path is stock's 404."""
    root = tmp_path / "root"
    (root / "_aspen").mkdir(parents=True)
    make_history(root / "_aspen" / "metrics")
    env = {"GIT_PROJECT_ROOT": str(root), "GIT_HTTP_EXPORT_ALL": "1", "REQUEST_METHOD": "GET",
           "ASPEN_RUN_DIR": str(tmp_path / "run")}
    on = {**env, "ASPEN_METRICS": "1"}
    refs = {**env, "PATH_INFO": metrics.PATH + "/info/refs", "QUERY_STRING": "service=git-upload-pack"}
    assert h.aspen({**refs, "ASPEN_METRICS": "1"}).body == h.aspen(refs).body
    assert h.aspen({**refs, "ASPEN_METRICS": "1"}).status == 200
    assert h.aspen({**on, "PATH_INFO": metrics.PATH}).status == 200
    assert h.aspen({**on, "REQUEST_METHOD": "HEAD", "PATH_INFO": metrics.PATH}).status == 200
    for other in ({"REQUEST_METHOD": "POST", "PATH_INFO": metrics.PATH}, {"PATH_INFO": metrics.PATH + "/"},
                  {"PATH_INFO": "/x" + metrics.PATH}):
        a, s = h.aspen({**on, **other}), h.stock({**env, **other})
        assert (a.status, a.headers, a.body) == (s.status, s.headers, s.body) and s.status == 404, other
    assert backend.METRICS_PATH == metrics.PATH


GETS = metrics.key("aspen_requests_total", service="upload-pack", method="GET", status="200")
COUNT_ONE = ("import os, sys; from aspen_cgi.runtime import metrics\n"
             "os.makedirs(sys.argv[1], exist_ok=True)\n"
             "metrics.count(sys.argv[1], 'GET', 200, 10, {'service': 'upload-pack'})\n")


def _count_in_a_process(where: str, extra: str = "") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", COUNT_ONE + extra, where], cwd=h.REPO_DIR)


def test_slots_are_reused_by_later_processes_and_added_up(tmp_path):
    """Counts of processes that ended stay, and the next process continues
    them in the same slot; a process holding slot 0 makes another take slot 1."""
    where = str(tmp_path / "m")
    for _ in range(3):
        assert _count_in_a_process(where).wait(timeout=60) == 0
    assert sorted(os.listdir(where)) == ["p0.0", "p0.1"]
    got = metrics.totals(where)
    assert got[GETS] == 3 and got[metrics.key("aspen_response_bytes_total", service="upload-pack")] == 30
    held = _count_in_a_process(where, "import time; time.sleep(60)\n")
    try:
        deadline = time.monotonic() + 30
        while metrics.totals(where).get(GETS) != 4:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert _count_in_a_process(where).wait(timeout=60) == 0
        assert sorted(os.listdir(where)) == ["p0.0", "p0.1", "p1.0", "p1.1"]
        assert metrics.totals(where)[GETS] == 5
    finally:
        held.kill()
        held.wait()
    threads = [threading.Thread(target=metrics.count,
                                args=(where, "POST", 200, 1, {"service": "receive-pack", "pushed_versions": 1}))
               for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert metrics.totals(where)["aspen_push_versions_total"] == 20


def test_readers_never_see_a_torn_count_and_kill_9_loses_nothing_written(tmp_path):
    """A process counting as fast as it can, read all the while, then killed
    with -9 in the middle: every read is a whole record (counts only grow),
    and the next owner of the slot continues from the last one."""
    where = str(tmp_path / "m")
    busy = _count_in_a_process(where, "while True:\n    metrics.count(sys.argv[1], 'GET', 200, 10, "
                                      "{'service': 'upload-pack'})\n")
    try:
        seen = [0]
        deadline = time.monotonic() + 30
        while seen[-1] < 3000:
            assert time.monotonic() < deadline and busy.poll() is None
            seen.append(metrics.totals(where).get(GETS, 0))
        assert seen == sorted(seen)
    finally:
        busy.send_signal(signal.SIGKILL)      # the process this test started
        busy.wait()
    last = metrics.totals(where)[GETS]
    assert last >= seen[-1]
    assert metrics.totals(where)[metrics.key("aspen_response_bytes_total", service="upload-pack")] == last * 10
    assert _count_in_a_process(where).wait(timeout=60) == 0
    assert metrics.totals(where)[GETS] == last + 1
    assert sorted(os.listdir(where)) == ["p0.0", "p0.1"]


def test_the_directory_is_made_as_admission_makes_the_run_directory(tmp_path):
    """A missing ASPEN_RUN_DIR is made sticky and open to every user, as admission
    makes it (mod_wsgi's and Apache's users share it); a missing
    ASPEN_STATE_DIR for this user only (it holds ref stores)."""
    old = os.umask(0o022)
    try:
        run = tmp_path / "run"
        assert metrics.prepare(aspen_settings.of({"ASPEN_RUN_DIR": str(run)})) == str(run / "metrics")
        assert (run / "metrics").is_dir() and run.stat().st_mode & 0o7777 == 0o1755
        state = tmp_path / "state"
        assert metrics.prepare(aspen_settings.of({"ASPEN_STATE_DIR": str(state), "ASPEN_RUN_DIR": str(run)})) == str(state / "metrics")
        assert (state / "metrics").is_dir() and state.stat().st_mode & 0o7777 == 0o755
    finally:
        os.umask(old)
