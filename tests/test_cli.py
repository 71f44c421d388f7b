"""`aspen`, the operator's command line: help, `log` (text and JSON),
`verify` (exit status and problems), `compact`, `query`, and clear errors
for paths that are not repositories."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest

from aspen_cgi.model.versions import ZERO, RefChange, VersionMeta
from aspen_cgi.refstore import segments
from aspen_cgi.refstore.store import RefStore
from aspen_cgi.runtime.repository import Repository

from . import harness as h
from . import pushkit as pk

pytestmark = pytest.mark.timeout(120)

ASPEN = str(Path(sys.executable).parent / "aspen")
SUBCOMMANDS = ["dev", "log", "verify", "compact", "query"]


def aspen(*args: str, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([ASPEN, *args], capture_output=True, text=True, env=e, timeout=120)


def no_traceback(res: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in res.stderr and "Traceback" not in res.stdout, res.stderr


def log_json(repo: Path, *extra: str) -> list[dict]:
    res = aspen("log", str(repo), "--json", *extra)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines and all(line.startswith("{") for line in lines)
    return [json.loads(line) for line in lines]


# ---------------------------------------------------------------- help

def test_help_for_aspen():
    res = aspen("--help")
    assert res.returncode == 0
    assert res.stdout.startswith("usage: aspen")
    for sub in SUBCOMMANDS:
        assert sub in res.stdout
    version = aspen("--version")
    assert version.returncode == 0 and version.stdout.startswith("aspen ")


@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_help_for_each_subcommand(sub):
    res = aspen(sub, "--help")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"usage: aspen {sub}")
    assert res.stderr == ""


def test_no_command_prints_usage_and_fails():
    res = aspen()
    assert res.returncode == 2
    assert "usage: aspen" in res.stdout
    no_traceback(res)


def test_stats_help_describes_server_metrics_and_needs_something_to_report():
    res = aspen("stats", "--help")
    assert res.returncode == 0 and res.stdout.startswith("usage: aspen stats [-h] [--server]")
    text = " ".join(res.stdout.split())
    assert "--server" in text and "GET /_aspen/metrics" in text and "ASPEN_METRICS=1" in text
    res = aspen("stats")
    assert res.returncode != 0 and "--server" in res.stderr
    no_traceback(res)


def test_stats_server_with_nothing_counted_says_how_to_count(tmp_path):
    res = aspen("stats", "--server", env={"ASPEN_RUN_DIR": str(tmp_path / "run"), "ASPEN_STATE_DIR": ""})
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"server metrics ({tmp_path / 'run' / 'metrics'}):\n")
    assert "ASPEN_METRICS=1" in res.stdout
    assert "  ref-store versions pushed: 0\n" in res.stdout and "  admission queue depth now: 0\n" in res.stdout


# ---------------------------------------------------------------- log

@pytest.fixture
def pushed(root, server_factory, tmp_path):
    """repo.git after four pushes through Aspen as REMOTE_USER alice: create,
    fast-forward, force, delete."""
    repo = pk.enable_push(root / "repo.git")
    server = server_factory(root, REMOTE_USER="alice")
    work = pk.clone(f"{server.url}/repo.git", tmp_path / "work")
    base = pk.rev(work, "HEAD")
    steps = {}
    h.git("checkout", "-q", "-b", "feature", cwd=str(work))
    steps["create"] = pk.commit(work, "feature one")
    pk.push(work, "origin", "feature")
    steps["ff"] = pk.commit(work, "feature two")
    pk.push(work, "origin", "feature")
    h.git("reset", "-q", "--hard", "HEAD~2", cwd=str(work))
    steps["force"] = pk.commit(work, "feature rewritten")
    pk.push(work, "--force", "origin", "feature")
    pk.push(work, "origin", ":feature")
    steps["base"] = base
    return repo, steps


def test_log_json_lists_versions_newest_first_with_who_and_updates(pushed):
    repo, s = pushed
    entries = log_json(repo)
    assert [e["id"] for e in entries] == [5, 4, 3, 2, 1]
    assert [e["kind"] for e in entries] == ["push", "push", "push", "push", "import"]
    assert [e["who"] for e in entries] == ["alice"] * 4 + [None]
    for e in entries:
        assert set(e) >= {"id", "kind", "who", "at", "updates"}
        assert isinstance(e["at"], float)
        for u in e["updates"]:
            assert set(u) == {"ref", "old", "new", "fast_forward"}
    assert [e["at"] for e in entries] == sorted((e["at"] for e in entries), reverse=True)
    f = "refs/heads/feature"
    assert [e["updates"] for e in entries[:4]] == [
        [{"ref": f, "old": s["force"], "new": ZERO, "fast_forward": False}],
        [{"ref": f, "old": s["ff"], "new": s["force"], "fast_forward": False}],
        [{"ref": f, "old": s["create"], "new": s["ff"], "fast_forward": True}],
        [{"ref": f, "old": ZERO, "new": s["create"], "fast_forward": False}],
    ]
    assert {u["ref"] for u in entries[4]["updates"]} == set(h.refs_of(str(repo)))
    # -n limits, newest first
    assert [e["id"] for e in log_json(repo, "-n", "2")] == [5, 4]


def test_log_text(pushed):
    repo, s = pushed
    res = aspen("log", str(repo))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    heads = [line for line in lines if line.startswith("version ")]
    assert [line.split()[:4] for line in heads] == [
        ["version", "5", "push", "alice"], ["version", "4", "push", "alice"], ["version", "3", "push", "alice"],
        ["version", "2", "push", "alice"], ["version", "1", "import", "-"]]
    body = res.stdout
    assert f"    {s['create'][:12]}..{s['ff'][:12]}  refs/heads/feature ff\n" in body
    assert f"    {s['ff'][:12]}..{s['force'][:12]}  refs/heads/feature\n" in body
    assert f"    {ZERO[:12]}..{s['create'][:12]}  refs/heads/feature\n" in body
    assert f"    {s['force'][:12]}..{ZERO[:12]}  refs/heads/feature\n" in body
    limited = aspen("log", str(repo), "-n", "1")
    assert [line for line in limited.stdout.splitlines() if line.startswith("version ")] == [heads[0]]


def test_log_abbreviates_big_versions(tmp_path):
    repo = h.make_history(tmp_path / "repo.git")
    for i in range(25):
        h.git("update-ref", f"refs/heads/many/{i:02d}", "main", cwd=str(repo))
    res = aspen("log", str(repo))
    assert res.returncode == 0
    assert "... 9 more (--all-updates)" in res.stdout       # 4 refs + 25 = 29 in the import
    full = aspen("log", str(repo), "--all-updates")
    assert "more (--all-updates)" not in full.stdout
    assert sum(1 for line in full.stdout.splitlines() if line.startswith("    ")) == 29


# ---------------------------------------------------------------- verify

def test_verify_consistent_repository(pushed):
    repo, _ = pushed
    res = aspen("verify", str(repo), "--quiet")
    assert res.returncode == 0, res.stdout
    assert res.stdout.splitlines() == [f"consistent: 5 versions, {len(h.refs_of(str(repo)))} refs, 0 problems"]
    js = aspen("verify", str(repo), "--json", "--quiet")
    assert js.returncode == 0
    assert json.loads(js.stdout) == {"ok": True, "versions": 5, "refs": len(h.refs_of(str(repo))), "problems": []}


def settled(repo: Path) -> Path:
    """Wait until the ref files are older than the fingerprint's racy window, so
    that the store's next sync trusts its fingerprint and reads no ref file: a
    row changed behind its back then stays as it is (a sync that compared
    contents would record the disk's value as an external version)."""
    while True:
        paths = [repo / "HEAD", repo / "packed-refs"] + [Path(p) for p, _, _ in os.walk(repo / "refs")]
        newest = max(max(st.st_mtime_ns, st.st_ctime_ns) for st in (os.stat(p) for p in paths if p.exists()))
        if time.time_ns() - newest > 300_000_000:
            return repo
        time.sleep(0.05)


def test_verify_reports_a_store_that_disagrees_with_the_disk(tmp_path):
    repo = settled(h.make_history(tmp_path / "repo.git"))
    assert aspen("verify", str(repo)).returncode == 0           # imports, consistent
    topic = h.out("rev-parse", "topic", cwd=str(repo))
    conn = h.side_connection(repo)
    conn.execute("UPDATE refs SET oid = ? WHERE name = 'refs/heads/main'", (topic,))
    conn.commit()
    conn.close()
    res = aspen("verify", str(repo), "--quiet")
    assert res.returncode == 1
    problems = [line for line in res.stdout.splitlines() if line.startswith("problem: ")]
    main = h.out("rev-parse", "main", cwd=str(repo))
    assert f"problem: refs/heads/main: versions replay to {main}, current table says {topic}" in problems
    assert f"problem: refs/heads/main: disk has ('{main}', None), store has ('{topic}', None)" in problems
    assert res.stdout.splitlines()[-1].startswith("NOT consistent: ")
    no_traceback(res)
    js = aspen("verify", str(repo), "--json", "--quiet")
    assert js.returncode == 1
    rep = json.loads(js.stdout)
    assert rep["ok"] is False and len(rep["problems"]) == len(problems)


def test_verify_reports_history_that_does_not_replay_to_the_refs(tmp_path):
    repo = h.make_history(tmp_path / "repo.git")
    assert aspen("verify", str(repo)).returncode == 0
    topic = h.out("rev-parse", "topic", cwd=str(repo))
    main = h.out("rev-parse", "main", cwd=str(repo))
    conn = h.side_connection(repo)
    conn.execute("UPDATE updates SET new = ? WHERE version = 1 AND ref = 'refs/heads/main'", (topic,))
    conn.commit()
    conn.close()
    res = aspen("verify", str(repo), "--quiet")
    assert res.returncode == 1
    assert res.stdout.splitlines() == [        # the edited row also breaks the hash chain (docs/ref-store.md)
        "problem: hash chain broken at version 1: its content changed after it was hashed",
        f"problem: refs/heads/main: versions replay to {topic}, current table says {main}",
        f"NOT consistent: 1 versions, {len(h.refs_of(str(repo)))} refs, 2 problems"]


def test_verify_reports_a_missing_object(tmp_path):
    repo = h.make_history(tmp_path / "repo.git")
    assert aspen("verify", str(repo)).returncode == 0
    topic = h.out("rev-parse", "topic", cwd=str(repo))
    loose = repo / "objects" / topic[:2] / topic[2:]
    assert loose.is_file()          # make_history's objects are loose
    loose.unlink()
    res = aspen("verify", str(repo), "--quiet")
    assert res.returncode == 1
    assert any(line.startswith("problem: objects: not every ref is connected") and topic in line
               for line in res.stdout.splitlines()), res.stdout
    no_traceback(res)


def test_verify_reports_a_pending_version_of_a_live_writer(tmp_path):
    repo = h.make_history(tmp_path / "repo.git")
    assert aspen("verify", str(repo)).returncode == 0
    conn = h.side_connection(repo)
    # a writer that is alive (this test process) and stuck between store and disk
    from aspen_cgi.runtime.owners import owner_id
    conn.execute("INSERT INTO versions(id, kind, at, state, owner) VALUES (2, 'push', 0, 'pending', ?)", (owner_id(),))
    conn.commit()
    conn.close()
    res = aspen("verify", str(repo), "--quiet")
    assert res.returncode == 1
    assert "problem: version 2 is pending (writer " in res.stdout and "alive)" in res.stdout


# ---------------------------------------------------------------- compact and query

def history(repo: Path, n: int) -> tuple[list[str], str]:
    """Versions 2..N written through the store in process: main fast-forwards in
    each (made[i] is its value after version i + 2); `side` is created at
    version 3 (on topic) and force-moved at version 5."""
    store = RefStore.open(Repository.of(str(repo), dict(os.environ, GIT_DIR=str(repo))))
    assert store.sync() == 1
    cur = h.out("rev-parse", "main", cwd=str(repo))
    topic = h.out("rev-parse", "topic", cwd=str(repo))
    made = []
    for v in range(2, n + 1):
        c = h.out("commit-tree", "-p", cur, "-m", f"c{v}", f"{cur}^{{tree}}", cwd=str(repo))
        ch = [RefChange("refs/heads/main", cur, c, ff=True)]
        if v == 3:
            ch.append(RefChange("refs/heads/side", ZERO, topic))
        if v == 5:
            ch.append(RefChange("refs/heads/side", topic, cur))
        assert store.commit(ch, VersionMeta("push", "q")) is None
        made.append(c)
        cur = c
    assert store.latest() == n
    return made, topic


def test_compact_output(tmp_path):
    repo = h.make_history(tmp_path / "repo.git")
    history(repo, 20)
    res = aspen("compact", str(repo), "--json")
    assert res.returncode == 0, res.stderr
    rep = json.loads(res.stdout)
    built = sum(1 for v in range(2, 21) for _ in segments.nodes_ending_at(v))
    assert rep == {"versions": 20, "nodes_built": 0, "segments": built, "segment_rows": rep["segment_rows"],
                   "levels": 3}
    assert built <= rep["segment_rows"] <= 2 * built                  # main, and side in some
    # lose the segments: compact builds them again and says so
    conn = h.side_connection(repo)
    conn.execute("DELETE FROM segments")
    conn.execute("DELETE FROM segment_refs")
    conn.execute("UPDATE state SET value = '1' WHERE key = 'compacted_through'")
    conn.commit()
    conn.close()
    text = aspen("compact", str(repo))
    assert text.returncode == 0
    assert text.stdout == (f"compacted: 20 versions, {built} segments built now, {built} segments "
                           f"({rep['segment_rows']} ref summaries) over 3 levels\n")
    again = json.loads(aspen("compact", str(repo), "--json").stdout)
    assert again == rep


def test_query_ancestor_and_tip(tmp_path):
    repo = h.make_history(tmp_path / "repo.git")
    made, topic = history(repo, 40)
    res = aspen("query", "ancestor", str(repo), "refs/heads/main", "1", "40")
    assert res.returncode == 0, res.stderr
    a = json.loads(res.stdout)
    assert (a["ref"], a["j"], a["k"], a["ancestor"]) == ("refs/heads/main", 1, 40, True)
    assert a["value_k"] == made[38]
    assert a["versions_visited"] + a["segments_visited"] <= 2 * 5.33 + 4      # 2*log2(40)+4
    assert a["segments_visited"] >= 1
    assert isinstance(a["us"], float)
    # side: created at 3, force-moved at 5
    res = aspen("query", "ancestor", str(repo), "refs/heads/side", "3", "40")
    assert res.returncode == 1
    a = json.loads(res.stdout)
    assert a["ancestor"] is False and (a["value_j"], a["value_k"]) == (topic, made[2])
    assert a["versions_visited"] + a["segments_visited"] >= 1
    res = aspen("query", "ancestor", str(repo), "refs/heads/side", "1", "3")
    assert res.returncode == 1 and json.loads(res.stdout)["value_j"] is None
    # tip
    res = aspen("query", "tip", str(repo), made[9])
    assert res.returncode == 0
    t = json.loads(res.stdout)
    assert t == {"commit": made[9], "tips": [{"version": 11, "ref": "refs/heads/main"}],
                 "versions_visited": 1, "segments_visited": 0}
    res = aspen("query", "tip", str(repo), topic)
    assert [x["version"] for x in json.loads(res.stdout)["tips"]] == [1, 3]
    res = aspen("query", "tip", str(repo), "f" * 40)
    assert res.returncode == 1 and json.loads(res.stdout)["tips"] == []


@pytest.mark.parametrize("args", [["ancestor", "refs/heads/main", "1"], ["tip"], ["tip", "a", "b"]],
                         ids=["ancestor-2-args", "tip-0-args", "tip-2-args"])
def test_query_with_wrong_arguments_says_usage(tmp_path, args):
    repo = h.make_history(tmp_path / "repo.git")
    res = aspen("query", args[0], str(repo), *args[1:])
    assert res.returncode != 0
    assert f"aspen query {args[0]} REPO" in res.stderr
    no_traceback(res)


def test_query_with_a_non_number_version_says_usage(tmp_path):
    repo = h.make_history(tmp_path / "repo.git")
    res = aspen("query", "ancestor", str(repo), "refs/heads/main", "one", "2")
    assert res.returncode != 0
    no_traceback(res)
    assert "aspen query ancestor REPO REF J K" in res.stderr


# ---------------------------------------------------------------- not a repository

@pytest.mark.parametrize("cmd", [["log"], ["verify"], ["compact"], ["query", "tip"], ["query", "ancestor"]],
                         ids=lambda c: "-".join(c))
@pytest.mark.parametrize("where", ["missing", "plain-dir", "file"])
def test_not_a_repository_is_a_clear_error(tmp_path, cmd, where):
    path = {"missing": tmp_path / "nope", "plain-dir": tmp_path, "file": tmp_path / "f.txt"}[where]
    if where == "file":
        path.write_text("hello\n")
    extra = {"query-tip": ["0" * 40], "query-ancestor": ["refs/heads/main", "1", "2"]}.get("-".join(cmd), [])
    if cmd[0] == "query":
        args = ["query", cmd[1], str(path), *extra]
    else:
        args = [cmd[0], str(path)]
    res = aspen(*args)
    assert res.returncode != 0
    assert res.stderr.strip() == f"aspen: not a git repository: {path}"
    assert res.stdout == ""
    no_traceback(res)
    assert not (Path(path) / "aspen").exists()


def test_work_tree_path_finds_its_git_dir(tmp_path):
    work = tmp_path / "work"
    h.git("init", "-q", "-b", "main", str(work))
    (work / "f").write_text("x\n")
    h.git("add", "f", cwd=str(work))
    h.git("commit", "-q", "-m", "one", cwd=str(work))
    entries = log_json(work)
    assert [e["kind"] for e in entries] == ["import"]
    assert entries[0]["updates"][0]["ref"] == "refs/heads/main"
    assert (work / ".git" / "aspen" / h.store_file(work)).is_file()
    assert aspen("verify", str(work), "--quiet").returncode == 0


# ---------------------------------------------------------------- dev

def _dev(root: Path, *flags: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([ASPEN, "dev", str(root), "--port", "0", "--workers", "1", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()                      # "Aspen serving ROOT on http://HOST:PORT/"
    assert " on http://" in line, line
    return proc, line.rsplit(" on ", 1)[1].strip().rstrip("/")


@pytest.mark.parametrize("no_push", [True, False])
def test_dev_demo_takes_pushes_only_without_no_push(tmp_path, no_push):
    root = tmp_path / "repos"
    proc, url = _dev(root, *(["--no-push"] if no_push else []))
    try:
        work = tmp_path / "work"
        h.git("clone", "-q", f"{url}/demo.git", str(work))
        (work / "new.txt").write_text("pushed\n")
        pk.commit(work, "a push")
        before = h.refs_of(str(root / "demo.git"))
        res = h.git("push", "origin", "HEAD:refs/heads/main", cwd=str(work), check=False)
        after = h.refs_of(str(root / "demo.git"))
        if no_push:
            assert res.returncode != 0 and after == before, res.stderr
        else:
            assert res.returncode == 0, res.stderr
            assert after["refs/heads/main"] == h.out("rev-parse", "HEAD", cwd=str(work))
        assert "receivepack" not in (root / "demo.git" / "config").read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
