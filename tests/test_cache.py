"""The response cache, pre-warm and admission control, end to end: real git
clients and raw HTTP requests against gunicorn (and the CGI program), real
files on disk, a real tmpfs for the full disk.

What each case gets:
- N identical concurrent requests: one computation, N byte-identical 200s.
- a slow reader: served the whole entry while faster readers finish first.
- a small byte bound: older entries evicted, superseded versions first.
- a corrupt or truncated entry: recomputed (cold), never an error.
- a full disk: every request still answered in full (uncached or spilled).
- a push to HEAD's branch: the first depth-1 clone after it is a hit.
- more cold requests than slots and queue places: 503 with Retry-After.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import threading
import time
import zlib
from pathlib import Path

import pytest

from aspen_cgi.cache import evict
from aspen_cgi.cache.entries import HEADER, HEADER_SIZE, KEPT, MAGIC
from aspen_cgi.cache.prewarm import clone_request

from .harness import fsck_strict, git, out, refs_of

SLOW_HOOK = """#!/bin/sh
echo run >> {counter}
sleep {delay}
exec "$@"
"""


def _hooked_env(tmp_path: Path, delay: float, **extra: str) -> dict[str, str]:
    """A server environment whose git pack-objects runs are counted and slowed
    (uploadpack.packObjectsHook from command-scope config, as operators set it)."""
    counter = tmp_path / "computations"
    hook = tmp_path / "slow-hook.sh"
    hook.write_text(SLOW_HOOK.format(counter=counter, delay=delay))
    hook.chmod(0o755)
    env = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "uploadpack.packObjectsHook",
           "GIT_CONFIG_VALUE_0": str(hook), "ASPEN_ACCESS_LOG": "1", "ASPEN_RUN_DIR": str(tmp_path / "run"),
           "ASPEN_WIDE_DEPTH1": "0"}
    env.update(extra)
    return env


def _computations(tmp_path: Path) -> int:
    f = tmp_path / "computations"
    return len(f.read_text().splitlines()) if f.exists() else 0


def _tip(repo: Path, ref: str = "refs/heads/main") -> str:
    return out("rev-parse", ref, cwd=str(repo))


def _post(server, body: bytes, read_delay: float = 0.0) -> tuple[int, dict, bytes]:
    """One v2 upload-pack POST; READ_DELAY seconds between 4 KiB reads (a slow client)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    conn.request("POST", "/repo.git/git-upload-pack", body=body,
                 headers={"Content-Type": "application/x-git-upload-pack-request", "Git-Protocol": "version=2"})
    resp = conn.getresponse()
    chunks = []
    while True:
        chunk = resp.read(4096)
        if not chunk:
            break
        chunks.append(chunk)
        if read_delay:
            time.sleep(read_delay)
    conn.close()
    return resp.status, dict(resp.getheaders()), b"".join(chunks)


def _marks(server) -> list[str]:
    return [w.split("=", 1)[1] for line in server.log_text().splitlines()
            if "service=upload-pack" in line and "method=POST" in line
            for w in line.split() if w.startswith("cache=")]


def _settled_marks(server) -> list[str]:
    """The marks once no new access line has come for 0.3 s (lines are written as bodies close)."""
    last, since = None, time.time()
    while time.time() - since < 0.3:
        now = _marks(server)
        if now != last:
            last, since = now, time.time()
        time.sleep(0.05)
    return last


def _cache_dir(root: Path) -> Path:
    return root / "repo.git" / "aspen" / "cache"


def _stats(repo: Path) -> dict:
    from .harness import aspen_cli
    res = aspen_cli("stats", "--json", str(repo))
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["repositories"][0]


def _clone_ok(url: str, dest: Path, server_repo: Path, *args: str) -> None:
    git("clone", "-q", *args, url, str(dest))
    fsck_strict(str(dest))
    theirs = refs_of(str(server_repo))
    mine = refs_of(str(dest))
    for name, oid in mine.items():
        if name.startswith("refs/remotes/origin/") and not name.endswith("/HEAD"):
            assert theirs["refs/heads/" + name[len("refs/remotes/origin/"):]] == oid


def _clones_at_once(server, root: Path, tmp_path: Path, n: int) -> list[str]:
    """N real `git clone --depth 1` at once, each checked; their failures."""
    errors: list[str] = []

    def clone(i: int) -> None:
        try:
            _clone_ok(f"{server.url}/repo.git", tmp_path / f"c{i}", root / "repo.git", "--depth", "1")
        except Exception as e:          # a failed git command too, not only an assertion
            errors.append(f"clone {i}: {e!r}")
    threads = [threading.Thread(target=clone, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    errors += [f"clone {i}: still running after 120 s" for i, t in enumerate(threads) if t.is_alive()]
    return errors


def test_identical_concurrent_requests_are_computed_once(root, server_factory, tmp_path):
    server = server_factory(root, **_hooked_env(tmp_path, 1.5))
    body = clone_request([_tip(root / "repo.git")] * 2)
    results: list = [None] * 8

    def one(i: int) -> None:
        results[i] = _post(server, body)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join(60)
    assert all(r is not None and r[0] == 200 for r in results)
    assert len({r[2] for r in results}) == 1, "every response byte-identical"
    assert b"packfile\n" in results[0][2]
    assert _computations(tmp_path) == 1
    deadline = time.time() + 10
    while len(_marks(server)) < 8 and time.time() < deadline:     # access lines are written as bodies close
        time.sleep(0.05)
    marks = _marks(server)
    assert marks.count("cold") == 1 and marks.count("shared") + marks.count("hit") == 7, marks
    # a real client gets the same cached answer and a correct repository
    _clone_ok(f"{server.url}/repo.git", tmp_path / "c", root / "repo.git", "--depth", "1")
    assert _computations(tmp_path) == 1
    assert _settled_marks(server)[-1] == "hit"
    s = _stats(root / "repo.git")
    assert s["cold"] == 1 and s["hits"] + s["shared"] == 8 and s["entries"] == 1


def test_many_real_clients_at_once_all_succeed_from_one_computation(root, server_factory, tmp_path):
    server = server_factory(root, **_hooked_env(tmp_path, 1.0))
    assert _clones_at_once(server, root, tmp_path, 12) == []
    assert _computations(tmp_path) == 1


def test_slow_reader_streams_while_faster_ones_finish(root, server_factory, tmp_path):
    # a bigger answer than the socket buffers hold: the slow reader really lags
    work = tmp_path / "w"
    git("clone", "-q", str(root / "repo.git"), str(work))
    (work / "big.bin").write_bytes(os.urandom(3 << 20))
    git("add", "big.bin", cwd=str(work))
    git("commit", "-q", "-m", "big", cwd=str(work))
    git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    server = server_factory(root, **_hooked_env(tmp_path, 0.5))
    body = clone_request([_tip(root / "repo.git")] * 2)
    got: dict[str, tuple] = {}
    finished: dict[str, float] = {}

    def run(name: str, delay: float) -> None:
        got[name] = _post(server, body, read_delay=delay)
        finished[name] = time.monotonic()
    slow = threading.Thread(target=run, args=("slow", 0.01))
    slow.start()
    time.sleep(0.2)
    fast = [threading.Thread(target=run, args=(f"fast{i}", 0)) for i in range(3)]
    for t in fast:
        t.start()
    for t in fast:
        t.join(60)
    assert all(f"fast{i}" in got for i in range(3))
    assert "slow" not in finished, "the slow reader is still reading when the fast ones are done"
    entries = list(_cache_dir(root).glob("*.entry"))
    assert len(entries) == 1, "the producer finished the entry while the slow reader lags"
    slow.join(120)
    assert got["slow"][0] == 200 and len(got["slow"][2]) > 3 << 20
    assert len({v[2] for v in got.values()}) == 1
    assert _computations(tmp_path) == 1


def test_small_bound_evicts_least_recently_used(root, server_factory, tmp_path):
    server = server_factory(root, **_hooked_env(tmp_path, 0, ASPEN_CACHE_MAX_BYTES="1"))
    tip = _tip(root / "repo.git")
    sizes = []
    for depth in (1, 2, 3):
        body = clone_request([tip, tip]).replace(b"deepen 1", f"deepen {depth}".encode())
        status, _, data = _post(server, body)
        assert status == 200
        sizes.append(len(data))
    # a bound of one byte keeps nothing: every entry is larger (so none is kept)
    assert list(_cache_dir(root).glob("*.entry")) == []
    server.stop()
    bound = sizes[1] + sizes[2] + HEADER_SIZE * 2 + 10
    server = server_factory(root, **_hooked_env(tmp_path, 0, ASPEN_CACHE_MAX_BYTES=str(bound)))
    for depth in (1, 2, 3):
        body = clone_request([tip, tip]).replace(b"deepen 1", f"deepen {depth}".encode())
        assert _post(server, body)[0] == 200
    names = sorted(p.stat().st_size for p in _cache_dir(root).glob("*.entry"))
    assert sum(names) <= bound
    assert len(names) == 2, "depth 1, the least recently used, went"
    s = _stats(root / "repo.git")
    assert s["evictions"] >= 1 and s["entry_bytes"] <= bound


def test_eviction_order_superseded_versions_first(tmp_path):
    d = tmp_path / "cache"
    d.mkdir()
    now = time.time()
    for name, version, used in (("aaaa-x", 5, now - 10), ("aaaa-y", 4, now), ("aaaa-z", 5, now - 100),
                                ("bbbb-w", 1, now - 50)):
        p = d / (name + ".entry")
        body = b"\0" * 60
        p.write_bytes(HEADER.pack(MAGIC, len(body), zlib.crc32(body), KEPT, 0, version) + body)
        os.utime(p, (used, used))
    order = [Path(e.path).name[:-len(".entry")] for e in evict.order(evict.entries(str(d)))]
    assert order == ["aaaa-y", "aaaa-z", "bbbb-w", "aaaa-x"]
    removed, freed = evict.evict(str(d), 250)
    assert (removed, freed) == (2, 200)
    assert sorted(p.name for p in d.iterdir()) == ["aaaa-x.entry", "bbbb-w.entry"]


@pytest.mark.parametrize("damage", ["flip", "truncate", "header"])
def test_corrupt_or_truncated_entry_is_recomputed(root, server_factory, tmp_path, damage):
    server = server_factory(root, **_hooked_env(tmp_path, 0))
    body = clone_request([_tip(root / "repo.git")] * 2)
    status, _, first = _post(server, body)
    assert status == 200
    [entry] = _cache_dir(root).glob("*.entry")
    raw = bytearray(entry.read_bytes())
    if damage == "flip":
        raw[len(raw) // 2] ^= 0xFF
    elif damage == "truncate":
        raw = raw[:len(raw) - 100]
    else:
        raw[:8] = b"garbage!"
    entry.write_bytes(bytes(raw))
    status, _, again = _post(server, body)
    assert status == 200
    assert b"packfile\n" in again and again.endswith(b"0000")
    assert _settled_marks(server)[-1] == "cold", "recomputed, not served"
    assert _computations(tmp_path) == 2
    _clone_ok(f"{server.url}/repo.git", tmp_path / "c", root / "repo.git", "--depth", "1")
    assert _settled_marks(server)[-1] == "hit"


@pytest.fixture
def tiny_fs(tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], check=True)
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_degrades_to_computing(root, server_factory, tmp_path, tiny_fs):
    work = tmp_path / "w"
    git("clone", "-q", str(root / "repo.git"), str(work))
    (work / "big.bin").write_bytes(os.urandom(400 << 10))      # the answer cannot fit in 64 KiB
    git("add", "big.bin", cwd=str(work))
    git("commit", "-q", "-m", "big", cwd=str(work))
    git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    # reserve 0: entries are started and the disk fills mid-answer
    server = server_factory(root, **_hooked_env(tmp_path, 0.5, ASPEN_CACHE_DIR=str(tiny_fs),
                                                ASPEN_CACHE_RESERVE_BYTES="0"))
    assert _clones_at_once(server, root, tmp_path, 4) == []
    assert list(tiny_fs.glob("*.entry")) == [] and list(tiny_fs.glob("*.part")) == []
    server.stop()
    # the default reserve (64 MiB free) is not there: nothing is started, every request computes
    server = server_factory(root, **_hooked_env(tmp_path, 0, ASPEN_CACHE_DIR=str(tiny_fs)))
    for i in range(2):
        _clone_ok(f"{server.url}/repo.git", tmp_path / f"d{i}", root / "repo.git", "--depth", "1")
    assert _settled_marks(server)[-2:] == ["uncached", "uncached"]


def test_prewarm_makes_the_first_clone_after_a_push_a_hit(root, server_factory, tmp_path):
    git("config", "http.receivepack", "true", cwd=str(root / "repo.git"))
    server = server_factory(root, ASPEN_ACCESS_LOG="1", ASPEN_RUN_DIR=str(tmp_path / "run"))
    work = tmp_path / "w"
    git("clone", "-q", f"{server.url}/repo.git", str(work))
    _clone_ok(f"{server.url}/repo.git", tmp_path / "before", root / "repo.git", "--depth", "1")   # the demand
    (work / "new.txt").write_text("pushed\n")
    git("add", "new.txt", cwd=str(work))
    git("commit", "-q", "-m", "new", cwd=str(work))
    git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    deadline = time.time() + 60
    while time.time() < deadline and _stats(root / "repo.git")["prewarmed"] < 2:
        time.sleep(0.2)
    assert _stats(root / "repo.git")["prewarmed"] == 2      # `clone --depth 1` and `--branch main`
    _clone_ok(f"{server.url}/repo.git", tmp_path / "c", root / "repo.git", "--depth", "1")
    assert _settled_marks(server)[-1] == "hit"
    _clone_ok(f"{server.url}/repo.git", tmp_path / "b", root / "repo.git", "--depth", "1", "--branch", "main")
    assert _settled_marks(server)[-1] == "hit"
    assert _tip(tmp_path / "c", "HEAD") == _tip(root / "repo.git")


def test_prewarm_only_where_depth1_clones_were_asked_for(root, server_factory, tmp_path):
    """A push starts a pre-warmer only once a client asked for a depth-1 clone
    within ASPEN_PREWARM_DEMAND_S: a full clone is no such demand."""
    from aspen_cgi.cache import prewarm
    repo = root / "repo.git"
    git("config", "http.receivepack", "true", cwd=str(repo))
    server = server_factory(root, ASPEN_RUN_DIR=str(tmp_path / "run"))
    git("clone", "-q", f"{server.url}/repo.git", str(tmp_path / "full"))
    env = {"ASPEN_PREWARM": "default"}
    sdir = str(repo / "aspen")
    assert not prewarm.demanded(sdir, env)
    assert prewarm.kick(str(repo), env, in_process=False) is False
    _clone_ok(f"{server.url}/repo.git", tmp_path / "shallow", repo, "--depth", "1")
    assert prewarm.demanded(sdir, env)
    assert not prewarm.demanded(sdir, {**env, "ASPEN_PREWARM_DEMAND_S": "-1"})   # outside the window
    assert prewarm.kick(str(repo), {**env, "ASPEN_PREWARM": "off"}, in_process=False) is False


def test_prewarm_off_and_other_branches_leave_the_cache_cold(root, server_factory, tmp_path):
    git("config", "http.receivepack", "true", cwd=str(root / "repo.git"))
    server = server_factory(root, ASPEN_ACCESS_LOG="1", ASPEN_RUN_DIR=str(tmp_path / "run"))
    work = tmp_path / "w"
    git("clone", "-q", f"{server.url}/repo.git", str(work))
    git("push", "-q", "origin", "HEAD:refs/heads/side", cwd=str(work))   # not HEAD's branch
    time.sleep(1.0)
    assert _stats(root / "repo.git")["prewarmed"] == 0


def test_past_the_queue_bound_requests_get_503_with_retry_after(root, server_factory, tmp_path):
    env = _hooked_env(tmp_path, 2.0, ASPEN_CACHE="off", ASPEN_COLD_PER_REPO="1", ASPEN_COLD_PER_SERVER="1",
                      ASPEN_QUEUE="1")
    server = server_factory(root, **env)
    tip = _tip(root / "repo.git")
    results: dict[int, tuple] = {}

    def one(i: int) -> None:
        body = clone_request([tip, tip]).replace(b"deepen 1", f"deepen {i + 1}".encode())
        results[i] = _post(server, body)
    threads = []
    for i in range(3):
        threads.append(threading.Thread(target=one, args=(i,)))
        threads[-1].start()
        time.sleep(0.4)
    for t in threads:
        t.join(60)
    statuses = sorted(r[0] for r in results.values())
    assert statuses == [200, 200, 503], statuses
    refused = next(r for r in results.values() if r[0] == 503)
    assert refused[1].get("Retry-After") == "5"
    assert b"retry" in refused[2].lower() and b"Traceback" not in refused[2]
    assert _computations(tmp_path) == 2, "the queued request ran once the first ended"
    # and the server serves normally right after
    _clone_ok(f"{server.url}/repo.git", tmp_path / "c", root / "repo.git")


def test_queue_wait_over_gets_503(root, server_factory, tmp_path):
    env = _hooked_env(tmp_path, 3.0, ASPEN_CACHE="off", ASPEN_COLD_PER_REPO="1", ASPEN_QUEUE="4",
                      ASPEN_QUEUE_WAIT="1")
    server = server_factory(root, **env)
    tip = _tip(root / "repo.git")
    results: dict[int, int] = {}

    def one(i: int) -> None:
        body = clone_request([tip, tip]).replace(b"deepen 1", f"deepen {i + 1}".encode())
        results[i] = _post(server, body)[0]
    a = threading.Thread(target=one, args=(0,))
    a.start()
    time.sleep(0.5)
    one(1)
    a.join(60)
    assert results == {0: 200, 1: 503}


def test_cgi_requests_share_the_cache(root, cgi_server_factory, tmp_path):
    env = _hooked_env(tmp_path, 0)
    server = cgi_server_factory(root, "aspen", **env)
    for i in range(3):
        _clone_ok(f"{server.url}/repo.git", tmp_path / f"c{i}", root / "repo.git", "--depth", "1")
    assert _computations(tmp_path) == 1
    s = _stats(root / "repo.git")
    assert s["cold"] == 1 and s["hits"] == 2


def test_depth1_clone_pack_is_smaller_than_stocks(tmp_path, server_factory, cgi_server_factory):
    """A depth-1 clone through Aspen, once the wide answer is built (in the
    background after the first, cold, clone got git's: test_depth1_cold.py),
    gets the pack made with the wider search and recompressed: fewer bytes
    than stock's for the same objects."""
    from aspen_cgi.cache.entries import DEPTH1_WIDE, peek
    from bench import repogen
    root = tmp_path / "gen"
    root.mkdir()
    repogen.generate(repogen.PRESETS["small"], root / "repo.git")
    aspen = server_factory(root, ASPEN_ACCESS_LOG="1", ASPEN_RUN_DIR=str(tmp_path / "run"))
    stock = cgi_server_factory(root, "stock")
    _clone_ok(f"{aspen.url}/repo.git", tmp_path / "cold", root / "repo.git", "--depth", "1", "--bare")
    [entry] = _cache_dir(root).glob("*.entry")
    deadline = time.time() + 120
    while time.time() < deadline and getattr(peek(str(entry)), "depth1", None) != DEPTH1_WIDE:
        time.sleep(0.05)
    sizes = {}
    for name, url in (("aspen", aspen.url), ("stock", stock.url)):
        dest = tmp_path / name
        _clone_ok(f"{url}/repo.git", dest, root / "repo.git", "--depth", "1", "--bare")
        [pack] = (dest / "objects" / "pack").glob("*.pack")
        sizes[name] = pack.stat().st_size
        objects = out("cat-file", "--batch-all-objects", "--batch-check=%(objectname)", cwd=str(dest)).split()
        sizes[name + "-objects"] = sorted(objects)
    assert sizes["aspen-objects"] == sizes["stock-objects"]
    assert sizes["aspen"] < sizes["stock"] * 0.99, sizes
