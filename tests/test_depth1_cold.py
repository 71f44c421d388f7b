"""A cold `git clone --depth 1` is answered as stock answers it; the wider
pack (packhook) is built in the background and replaces the entry for the
clients after (fetch/depth1.py). Real git clients against gunicorn (and the
CGI program), stock `git http-backend` beside them.

What each case gets:
- the first depth-1 clone: stock's exact pack bytes, no packObjectsHook run
  (the background build is held back by the machine-wide lock this test
  holds, so any hook run in the git trace would be the request's), and no
  wider build for an answer asked for once;
- the second: a hit on git's entry, which starts the wider build;
- once the background build has replaced the entry (its header says wide):
  the next depth-1 clone is a hit with the wide pack, smaller or equal;
- concurrent depth-1 clones at the first moment: all succeed, all stock's
  bytes, one computation, and the wider build starts;
- under CGI the build runs detached and replaces the entry just the same;
- after `aspen import` the depth-1 clone of HEAD is pre-warmed (wide): the
  first clone is a hit.
No timed assertions: every wait is on a file's state, bounded generously.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

import pytest

from aspen_cgi.cache.entries import DEPTH1_STOCK, DEPTH1_STOCK_KEPT, DEPTH1_WIDE, peek

from .harness import aspen_cli, fsck_strict, git, refs_of

WAIT_S = 120        # a bound for waits on observable state, never a measurement


@pytest.fixture
def groot(tmp_path: Path) -> Path:
    """A project root with the bench's small repository (enough content for the
    wide pack to win), pack-objects single-threaded so its bytes are reproducible."""
    from bench import repogen
    root = tmp_path / "gen"
    root.mkdir()
    repogen.generate(repogen.PRESETS["small"], root / "repo.git")
    git("config", "pack.threads", "1", cwd=str(root / "repo.git"))
    return root


class MachineLock:
    """The machine's one build slot (ASPEN_BUILDS_PER_SERVER=1 in ASPEN_RUN_DIR),
    held by the test: a background build started meanwhile waits before its
    first git process."""

    def __init__(self, run_dir: Path):
        run_dir.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(run_dir / "build.slot.0", os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {"ASPEN_ACCESS_LOG": "1", "ASPEN_RUN_DIR": str(tmp_path / "run"), "GIT_TRACE": str(tmp_path / "trace"),
           "ASPEN_BUILDS_PER_SERVER": "1"}
    env.update(extra)
    return env


def _cache(root: Path) -> Path:
    return root / "repo.git" / "aspen" / "cache"


def _wait(what, cond, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"still waiting for {what} after {timeout} s")


def _entry(root: Path) -> Path:
    [entry] = _cache(root).glob("*.entry")
    return entry


def _state(entry: Path):
    h = peek(str(entry))
    return None if h is None else h.depth1


def _lock_file(entry: Path) -> Path:
    """The file a wider build of ENTRY is started by making (fetch/depth1.kick)."""
    return entry.parent / f".{entry.name[:-len('.entry')]}.wide.lock.tmp"


def _build_waiting(entry: Path) -> bool:
    """Has the background build of ENTRY started (it holds the entry's lock)?"""
    lock = _lock_file(entry)
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _clone(url: str, dest: Path, server_repo: Path) -> bytes:
    """A checked `git clone --depth 1 --bare` (fsck --strict, refs as the
    server's); the bytes of the one pack it received."""
    git("clone", "-q", "--depth", "1", "--bare", url, str(dest))
    fsck_strict(str(dest))
    theirs, mine = refs_of(str(server_repo)), refs_of(str(dest))
    assert mine and all(theirs[name] == oid for name, oid in mine.items()), (mine, theirs)
    [pack] = (dest / "objects" / "pack").glob("*.pack")
    return pack.read_bytes()


def _fields(server) -> list[dict[str, str]]:
    """The access-log fields of every upload-pack fetch POST, in order."""
    out = []
    for line in server.log_text().splitlines():
        if "service=upload-pack" in line and "method=POST" in line and "cache=" in line:
            out.append(dict(w.split("=", 1) for w in line.split() if "=" in w))
    return out


def _hook_runs(tmp_path: Path) -> int:
    trace = tmp_path / "trace"
    return trace.read_text(errors="replace").count("aspen_cgi.fetch.packobjectshook") if trace.exists() else 0


def _settled(server, n: int) -> list[dict[str, str]]:
    return _wait(f"{n} access lines", lambda: (f := _fields(server)) and len(f) >= n and f)


def test_first_depth1_clone_is_stocks_then_the_wide_pack_replaces_it(groot, tmp_path, server_factory,
                                                                     cgi_server_factory):
    repo = groot / "repo.git"
    stock = cgi_server_factory(groot, "stock")
    stock_pack = _clone(f"{stock.url}/repo.git", tmp_path / "stock", repo)
    held = MachineLock(tmp_path / "run")
    try:
        aspen = server_factory(groot, **_env(tmp_path))
        first = _clone(f"{aspen.url}/repo.git", tmp_path / "first", repo)
        [line] = _settled(aspen, 1)
        assert (line["cache"], line["depth1"]) == ("cold", "stock"), line
        assert first == stock_pack, "the cold answer is git's plain pack, byte for byte"
        entry = _entry(groot)
        assert _state(entry) == DEPTH1_STOCK
        assert not _lock_file(entry).exists(), "no wider build for an answer asked for once"
        again = _clone(f"{aspen.url}/repo.git", tmp_path / "again", repo)
        line = _settled(aspen, 2)[-1]
        assert (line["cache"], line["depth1"]) == ("hit", "stock"), line
        assert again == stock_pack
        _wait("the background build to start", lambda: _build_waiting(entry))
        assert _hook_runs(tmp_path) == 0, "no packObjectsHook ran for the requests"
    finally:
        held.release()
    _wait("the wide entry", lambda: _state(entry) == DEPTH1_WIDE)
    assert _hook_runs(tmp_path) >= 1, "the background build went through the hook"
    second = _clone(f"{aspen.url}/repo.git", tmp_path / "second", repo)
    line = _settled(aspen, 3)[-1]
    assert (line["cache"], line["depth1"]) == ("hit", "wide"), line
    assert len(second) < len(first), (len(second), len(first))
    assert refs_of(str(tmp_path / "second")) == refs_of(str(tmp_path / "first"))
    # the second client received the same objects, packed differently
    objects = [sorted(git("show-index", input=next((tmp_path / d / "objects" / "pack").glob("*.idx")).read_bytes())
                      .stdout.decode().split()[1::3]) for d in ("first", "second")]
    assert objects[0] == objects[1]
    s = _stats(repo)
    assert s["cold"] == 1 and s["hits"] == 2 and s["depth1_wide"] == 1, s


def _stats(repo: Path) -> dict:
    import json
    res = aspen_cli("stats", "--json", str(repo))
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["repositories"][0]


def test_concurrent_first_depth1_clones_all_succeed(groot, tmp_path, server_factory, cgi_server_factory):
    repo = groot / "repo.git"
    stock = cgi_server_factory(groot, "stock")
    stock_pack = _clone(f"{stock.url}/repo.git", tmp_path / "stock", repo)
    held = MachineLock(tmp_path / "run")
    try:
        aspen = server_factory(groot, **_env(tmp_path))
        n = 8
        packs: dict[int, bytes] = {}
        errors: list[str] = []

        def one(i: int) -> None:
            try:
                packs[i] = _clone(f"{aspen.url}/repo.git", tmp_path / f"c{i}", repo)
            except AssertionError as e:
                errors.append(str(e))
        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
        assert errors == [] and len(packs) == n
        assert all(p == stock_pack for p in packs.values()), "every client got git's pack"
        lines = _settled(aspen, n)
        assert [x["cache"] for x in lines].count("cold") == 1, lines
        assert {x["depth1"] for x in lines} == {"stock"}, lines
        assert _hook_runs(tmp_path) == 0
    finally:
        held.release()
    _wait("the wide entry", lambda: _state(_entry(groot)) == DEPTH1_WIDE)
    again = _clone(f"{aspen.url}/repo.git", tmp_path / "again", repo)
    assert len(again) < len(stock_pack)
    assert (_settled(aspen, n + 1)[-1]["cache"], _settled(aspen, n + 1)[-1]["depth1"]) == ("hit", "wide")


def test_cgi_builds_the_wide_pack_detached(groot, tmp_path, cgi_server_factory):
    repo = groot / "repo.git"
    aspen = cgi_server_factory(groot, "aspen", **_env(tmp_path))
    first = _clone(f"{aspen.url}/repo.git", tmp_path / "first", repo)
    entry = _entry(groot)
    # the CGI program has exited, its producer thread with it: had it started a build, the file would be there
    assert not _lock_file(entry).exists() and _state(entry) == DEPTH1_STOCK
    again = _clone(f"{aspen.url}/repo.git", tmp_path / "again", repo)
    assert again == first
    _wait("the wide entry", lambda: _state(entry) == DEPTH1_WIDE)
    second = _clone(f"{aspen.url}/repo.git", tmp_path / "second", repo)
    assert len(second) < len(first)
    marks = [(x["cache"], x["depth1"]) for x in _fields(aspen)]
    assert marks == [("cold", "stock"), ("hit", "stock"), ("hit", "wide")], marks


def test_a_wide_pack_not_smaller_keeps_stocks(root, tmp_path, server_factory):
    """A tip of near-identical incompressible files, stored as deltas on disk:
    git reuses those deltas; the wide search with ASPEN_DEPTH1_WINDOW=0
    finds none, so its pack is larger and git's entry is kept for good."""
    repo = root / "repo.git"
    work = tmp_path / "w"
    git("clone", "-q", str(repo), str(work))
    base = os.urandom(16 << 10)
    for i in range(24):
        (work / f"copy{i}.bin").write_bytes(base + f"copy {i}\n".encode())
    git("add", "-A", cwd=str(work))
    git("commit", "-q", "-m", "copies", cwd=str(work))
    git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    git("repack", "-adf", "-q", cwd=str(repo))
    aspen = server_factory(root, **_env(tmp_path, ASPEN_DEPTH1_WINDOW="0"))
    first = _clone(f"{aspen.url}/repo.git", tmp_path / "first", repo)
    entry = _entry(root)
    assert _clone(f"{aspen.url}/repo.git", tmp_path / "again", repo) == first     # asked again: the build starts
    _wait("the build's verdict", lambda: _state(entry) != DEPTH1_STOCK)
    assert _state(entry) == DEPTH1_STOCK_KEPT
    second = _clone(f"{aspen.url}/repo.git", tmp_path / "second", repo)
    line = _settled(aspen, 3)[-1]
    assert (line["cache"], line["depth1"]) == ("hit", "stock-kept"), line
    assert second == first
    assert _stats(repo)["depth1_kept"] == 1


@pytest.mark.parametrize("server_config", [{}, {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "http.receivepack",
                                                 "GIT_CONFIG_VALUE_0": "true"}], ids=["same", "receivepack"])
def test_aspen_import_prewarms_the_first_depth1_clone(groot, tmp_path, server_factory, server_config):
    """The server's own configuration may differ from the importing shell's
    where it cannot change an upload-pack answer (http.receivepack set in
    the server's environment only): its first clone still hits."""
    repo = groot / "repo.git"
    res = aspen_cli("import", "-q", str(repo))
    assert res.returncode == 0, res.stderr
    # `git clone --depth 1` and `--branch main`: both computed wide, nobody waiting
    _wait("the pre-warmed entries", lambda: [p for p in _cache(groot).glob("*.entry")
                                             if _state(p) == DEPTH1_WIDE][1:])
    aspen = server_factory(groot, **_env(tmp_path), **server_config)
    _clone(f"{aspen.url}/repo.git", tmp_path / "first", repo)
    [line] = _settled(aspen, 1)
    assert (line["cache"], line["depth1"]) == ("hit", "wide"), line
