"""Protocol v0/v1 fetches answered from stored packs, end to end, beside
stock: a clone and a warm fetch one push behind are planned (the access log
says which path answered: plan=planned why=done|no-done|ready, or
plan=fallback why=...), their ACK/NAK lines and framing are stock's, and the
clients' strict fsck passes with the same refs and objects as stock's
twins. Rounds Aspen does not answer (unknown haves, shallow, several rounds
in one request, ...) go to git and still end right.

The repository: a short imported history, then 18 branches pushed at once
and main pushed one commit at a time, with commit dates one second apart so
that a client's first 16 haves are version tips (its stale main and its
ancestors, then the branches)."""

from __future__ import annotations

import hashlib
import itertools
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from . import differential as d
from . import harness as h
from . import pushkit as pk

CAPS = "multi_ack_detailed no-done side-band-64k thin-pack ofs-delta agent=git/2.39.5"
BRANCHES = 18


def _import(repo: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "aspen_cgi.cli", "import", "-q", str(repo)],
                         capture_output=True, text=True, cwd=h.REPO_DIR)
    assert res.returncode == 0, res.stderr


def _posts(log: str) -> list[str]:
    return re.findall(r"service=upload-pack method=POST .*", log)


def _objects(repo: Path) -> set[str]:
    out = h.out("rev-list", "--objects", "--all", cwd=str(repo))
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _commit(work: Path, name: str, clock, text: str = "") -> str:
    (work / f"{name}.txt").write_text(text or f"{name}\n" * 40)
    h.git("add", "-A", cwd=str(work))
    date = f"{next(clock)} +0000"
    h.git("commit", "-q", "-m", name, cwd=str(work), env={"GIT_COMMITTER_DATE": date, "GIT_AUTHOR_DATE": date})
    return h.out("rev-parse", "HEAD", cwd=str(work))


class Fleet:
    def __init__(self, server, root: Path, repo: Path, work: Path, clock):
        self.server, self.root, self.repo, self.work, self.clock = server, root, repo, work, clock

    @property
    def url(self) -> str:
        return self.server.url + "/repo.git"

    def rev(self, what: str) -> str:
        return h.out("rev-parse", what, cwd=str(self.repo))

    def push_main(self, name: str) -> str:
        """One more commit on main, pushed and imported (its version pack built)."""
        oid = _commit(self.work, name, self.clock)
        h.git("push", "-q", "origin", "main", cwd=str(self.work))
        _import(self.repo)
        return oid

    def post(self, program: str, body: bytes) -> h.CgiResult:
        env = d.post_env(self.root, "repo.git", "upload-pack", body, ASPEN_ACCESS_LOG="1")
        return h.aspen(env, body) if program == "aspen" else h.stock(env, body)


@pytest.fixture
def fleet(tmp_path, server_factory) -> Fleet:
    root = tmp_path / "root"
    root.mkdir()
    repo = pk.enable_push(h.make_history(root / "repo.git", commits=3, branches=(), tags=False))
    server = server_factory(root, ASPEN_ACCESS_LOG="1")
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    clock = itertools.count(int(time.time()) + 10)
    for i in range(BRANCHES):
        h.git("checkout", "-q", "-b", f"b{i}", "main", cwd=str(work))
        _commit(work, f"b{i}", clock)
    h.git("checkout", "-q", "main", cwd=str(work))
    h.git("push", "-q", "origin", *[f"b{i}" for i in range(BRANCHES)], cwd=str(work))
    rng = random.Random(5)
    big = "".join(f"{rng.getrandbits(128):032x}\n" for _ in range(6000))     # a pack of several 64k packets
    for i in range(3):
        _commit(work, f"c{i}", clock, big if i == 1 else "")
        h.git("push", "-q", "origin", "main", cwd=str(work))
    _import(repo)
    return Fleet(server, root, repo, work, clock)


def _git(version: int, *args: str, cwd=None, strict: bool = True) -> subprocess.CompletedProcess:
    return h.git("-c", f"protocol.version={version}", "-c", f"transfer.fsckObjects={str(strict).lower()}",
                 *args, cwd=str(cwd) if cwd else None)


def _mirror(url: str, dest: Path, version: int = 0) -> Path:
    _git(version, "clone", "-q", "--mirror", url, str(dest))
    return dest


# -- real clients ---------------------------------------------------------------------------------

@pytest.mark.parametrize("version", [0, 1])
def test_v0_clone_is_planned_and_equals_stock(version, fleet, cgi_server_factory, tmp_path):
    client = _mirror(fleet.url, tmp_path / "client.git", version)
    h.fsck_strict(str(client))
    assert h.refs_of(str(client)) == h.refs_of(str(fleet.repo))
    last = h.last_fetch_line(fleet.server)
    assert "plan=planned why=done" in last and re.search(r"extents=\d+ objects=\d+", last), last
    stock = cgi_server_factory(fleet.root, "stock")
    other = _mirror(stock.url + "/repo.git", tmp_path / "stock.git", version)
    assert h.refs_of(str(other)) == h.refs_of(str(client))
    assert _objects(other) == _objects(client)


def test_v0_warm_fetch_one_push_behind_is_one_planned_post(fleet, cgi_server_factory, tmp_path):
    client = _mirror(fleet.url, tmp_path / "client.git")
    twin = tmp_path / "twin.git"
    shutil.copytree(client, twin)
    fleet.push_main("c3")
    before = len(_posts(fleet.server.log_text()))
    _git(0, "fetch", "-q", fleet.url, "+refs/*:refs/*", cwd=client)
    posts = h.fetch_lines(fleet.server, before)
    assert len(posts) == 1 and "plan=planned why=no-done" in posts[0], posts
    h.fsck_strict(str(client))
    assert h.refs_of(str(client)) == h.refs_of(str(fleet.repo))
    stock = cgi_server_factory(fleet.root, "stock")
    _git(0, "fetch", "-q", stock.url + "/repo.git", "+refs/*:refs/*", cwd=twin)
    assert h.refs_of(str(twin)) == h.refs_of(str(client))
    assert _objects(twin) == _objects(client)


def test_v0_local_commits_go_to_git_and_the_fetch_is_right(fleet, cgi_server_factory, tmp_path):
    """The first rounds' haves are the client's own commits (unknown): git
    answers them; the fetch ends right whoever answers the last round."""
    client = tmp_path / "client"
    _git(0, "clone", "-q", fleet.url, str(client))
    for i in range(20):
        _commit(client, f"local{i}", fleet.clock)
    twin = tmp_path / "twin"
    shutil.copytree(client, twin)
    new = fleet.push_main("c3")
    before = len(_posts(fleet.server.log_text()))
    _git(0, "fetch", "-q", "origin", cwd=client)
    posts = h.fetch_lines(fleet.server, before)
    assert len(posts) >= 2 and "plan=fallback why=unknown-have" in posts[0], posts
    assert h.out("rev-parse", "origin/main", cwd=str(client)) == new
    h.fsck_strict(str(client))
    stock = cgi_server_factory(fleet.root, "stock")
    _git(0, "fetch", "-q", stock.url + "/repo.git", "+refs/heads/*:refs/remotes/origin/*", cwd=twin)
    assert h.refs_of(str(twin)) == h.refs_of(str(client))
    assert _objects(twin) == _objects(client)


def test_v0_shallow_clone_goes_to_git(fleet, tmp_path):
    before = len(_posts(fleet.server.log_text()))
    client = tmp_path / "shallow.git"
    _git(0, "clone", "-q", "--bare", "--depth", "1", fleet.url, str(client))
    assert h.out("rev-parse", "main", cwd=str(client)) == fleet.rev("main")
    h.fsck_strict(str(client))
    posts = h.fetch_lines(fleet.server, before)
    assert posts and all("plan=fallback why=shallow" in p for p in posts), posts


# -- hand-built requests, stock side by side -------------------------------------------------------

def _split(body: bytes) -> tuple[list[bytes], list[tuple], bytes]:
    """(ACK/NAK lines, the side-band tokens after them, the raw pack after them)."""
    lines, i = [], 0
    while body[i:i + 4] not in (b"", b"PACK"):
        n = int(body[i:i + 4], 16)
        payload = body[i + 4:i + n]
        if not (payload.startswith(b"ACK ") or payload == b"NAK\n"):
            break
        lines.append(payload)
        i += n
    rest = body[i:]
    if rest.startswith(b"PACK") or not rest:
        return lines, [], rest
    return lines, d.tokens(rest), b""


def _pack_of(body: bytes, mode: str) -> tuple[list[bytes], bytes, bytes]:
    """The ACK/NAK lines, the pack and the progress text of a response,
    checking its framing for MODE (side-band-64k, side-band or none)."""
    lines, toks, raw = _split(body)
    if mode == "none":
        assert not toks and raw.startswith(b"PACK")
        assert hashlib.sha1(raw[:-20]).digest() == raw[-20:], "no flush or anything else after the raw pack"
        return lines, raw, b""
    limit = 65520 if mode == "side-band-64k" else 1000
    assert toks and toks[-1] == ("flush",) and all(t[0] == "band" for t in toks[:-1]), toks[-3:]
    assert all(len(t[2]) + 5 <= limit for t in toks[:-1])
    pack = b"".join(t[2] for t in toks if t[0] == "band" and t[1] == 1)
    progress = b"".join(t[2] for t in toks if t[0] == "band" and t[1] == 2)
    return lines, pack, progress


def _aspen_trace(res: h.CgiResult) -> str:
    return _posts(res.stderr.decode(errors="replace"))[-1]


@pytest.mark.parametrize("mode", ["side-band-64k", "side-band", "none"])
@pytest.mark.parametrize("warm", [False, True], ids=["clone", "warm"])
def test_v0_pack_framing_like_stock(mode, warm, fleet, tmp_path):
    """Requests with `done`: ACK lines equal stock's; the pack on band 1 in
    packets of at most 65520 or 1000 bytes and a flush, or raw with nothing
    after; it indexes (--fix-thin against a clone holding the haves) to
    stock's objects."""
    client = _mirror(fleet.url, tmp_path / "client.git") if warm else None
    new = fleet.push_main("c3")
    haves = [fleet.rev("main~1")] + [fleet.rev(f"b{i}") for i in range(3)] if warm else []
    caps = CAPS.replace("side-band-64k", "" if mode == "none" else mode)
    body = d.v0_request([new] + [fleet.rev(f"b{i}") for i in range(BRANCHES)], haves, caps=caps, done=True)
    a, s = fleet.post("aspen", body), fleet.post("stock", body)
    assert "plan=planned why=done" in _aspen_trace(a)
    a_lines, a_pack, a_progress = _pack_of(a.body, mode)
    s_lines, s_pack, s_progress = _pack_of(s.body, mode)
    assert a_lines == s_lines
    assert (b"Aspen: " in a_progress) == (mode != "none")
    # Aspen's line stands where stock sent git's progress, and counts the objects its pack holds
    d.compare_progress(s_progress, a_progress, body, "aspen", (s_pack, a_pack))
    repo = str(client) if client else None
    assert d.pack_objects(a_pack, repo) == d.pack_objects(s_pack, repo)
    d.check_planned_bytes(s_pack, a_pack, "aspen")


def test_v0_no_progress_is_honoured(fleet):
    new = fleet.push_main("c3")
    body = d.v0_request([new], [fleet.rev("main~1")], caps=CAPS + " no-progress", done=True)
    res = fleet.post("aspen", body)
    assert "plan=planned why=done" in _aspen_trace(res)
    lines, pack, progress = _pack_of(res.body, "side-band-64k")
    assert lines == [f"ACK {fleet.rev('main~1')} common\n".encode(), f"ACK {fleet.rev('main~1')}\n".encode()]
    assert pack.startswith(b"PACK") and progress == b""


def test_v0_round_with_no_done_is_one_response_like_stock(fleet, tmp_path):
    client = _mirror(fleet.url, tmp_path / "client.git")
    new = fleet.push_main("c3")
    haves = [fleet.rev("main~1"), fleet.rev("main~2"), fleet.rev("main~3")] + [fleet.rev(f"b{i}") for i in range(13)]
    body = d.v0_request([new], haves, caps=CAPS, done=False)
    a, s = fleet.post("aspen", body), fleet.post("stock", body)
    assert "plan=planned why=no-done" in _aspen_trace(a)
    a_lines, a_pack, _ = _pack_of(a.body, "side-band-64k")
    s_lines, s_pack, _ = _pack_of(s.body, "side-band-64k")
    last = haves[-1]
    assert a_lines == s_lines == [f"ACK {x} common\n".encode() for x in haves] + \
        [f"ACK {last} ready\n".encode(), b"NAK\n", f"ACK {last}\n".encode()]
    assert d.pack_objects(a_pack, str(client)) == d.pack_objects(s_pack, str(client))
    d.check_planned_bytes(s_pack, a_pack, "aspen")


def test_v0_without_no_done_gets_ready_then_a_done_round(fleet, tmp_path):
    """A client that did not ask no-done: the round ends at ready (the same
    bytes as stock), and its next request -- the common haves and `done` --
    is planned too."""
    client = _mirror(fleet.url, tmp_path / "client.git")
    new = fleet.push_main("c3")
    haves = [fleet.rev("main~1")] + [fleet.rev(f"b{i}") for i in range(15)]
    caps = CAPS.replace("no-done ", "")
    first = d.v0_request([new], haves, caps=caps, done=False)
    a, s = fleet.post("aspen", first), fleet.post("stock", first)
    assert "plan=planned why=ready" in _aspen_trace(a)
    assert a.body == s.body
    assert a.body.endswith(d.pkt(f"ACK {haves[-1]} ready\n") + d.pkt("NAK\n"))
    second = d.v0_request([new], haves, caps=caps, done=True)
    a, s = fleet.post("aspen", second), fleet.post("stock", second)
    assert "plan=planned why=done" in _aspen_trace(a)
    a_lines, a_pack, _ = _pack_of(a.body, "side-band-64k")
    s_lines, s_pack, _ = _pack_of(s.body, "side-band-64k")
    assert a_lines == s_lines
    assert new in d.pack_objects(a_pack, str(client)) == d.pack_objects(s_pack, str(client))
    d.check_planned_bytes(s_pack, a_pack, "aspen")


@pytest.mark.parametrize("shape,why", [
    ("two-rounds", "rounds"),
    ("bytes-after-done", "rounds"),
    ("later-caps", "later-capabilities"),
    ("multi-ack", "no-multi-ack-detailed"),
    ("no-multi-ack", "no-multi-ack-detailed"),
    ("empty-round", "empty-round"),
    ("unknown-have", "unknown-have"),
    ("deepen", "shallow"),
    ("filter", "filter"),
])
def test_v0_rounds_aspen_does_not_answer_go_to_git(shape, why, fleet):
    """Each answered by git as stock answers it (the same lines and objects;
    git's pack bytes may differ run to run), even bytes stock never reads."""
    new = fleet.push_main("c3")
    old, b0 = fleet.rev("main~1"), fleet.rev("b0")
    quiet = CAPS + " no-progress"
    want = d.pkt(f"want {new} {quiet}\n")
    body = {
        "two-rounds": want + d.FLUSH + d.pkt(f"have {old}\n") + d.FLUSH + d.pkt(f"have {b0}\n") + d.pkt("done\n"),
        "bytes-after-done": d.v0_request([new], [old], caps=quiet) + d.pkt("garbage\n") + b"00",
        "later-caps": d.pkt(f"want {new} {CAPS}\n") + d.pkt(f"want {b0} no-progress\n") + d.FLUSH
        + d.pkt(f"have {old}\n") + d.pkt("done\n"),
        "multi-ack": d.v0_request([new], [old], caps=quiet.replace("multi_ack_detailed", "multi_ack")),
        "no-multi-ack": d.v0_request([new], [old], caps=quiet.replace("multi_ack_detailed ", "")),
        "empty-round": d.v0_request([new], [], caps=quiet, done=False),
        "unknown-have": d.v0_request([new], [old, "1" * 40], caps=quiet),
        "deepen": d.v0_request([new], [], caps=quiet + " shallow", extra=["deepen 1"]),
        "filter": d.v0_request([new], [], caps=quiet + " filter", extra=["filter blob:none"]),
    }[shape]
    a, s = fleet.post("aspen", body), fleet.post("stock", body)
    assert f"plan=fallback why={why}" in _aspen_trace(a), _aspen_trace(a)
    assert a.status == s.status == 200
    ra, rs = (d.parse_upload_response(r.body, str(fleet.repo)) for r in (a, s))
    assert (ra.control, ra.objects, ra.error) == (rs.control, rs.objects, rs.error)




class _Splice:
    """A splice whose last chunk, carrying the trailer, is longer than asked (as SplicePlan's may be)."""
    objects, size = 1, 2000

    def chunks(self, size: int = 65536):
        return iter([b"P" * size, b"Q" * (size + 19)])


@pytest.mark.parametrize("mode,limit", [("side-band-64k", 65520), ("side-band", 1000)])
def test_v0_band_packets_never_exceed_the_limit(mode, limit):
    from aspen_cgi.fetch import planned as responder
    from aspen_cgi.planner.plan import Plan
    size = responder.BAND_DATA if mode == "side-band-64k" else responder.SIDEBAND_DATA
    plan = Plan((1,), ("x",), 0, 0)
    body = b"".join(responder.v0_pack(_Splice(), plan, size, progress=True))
    toks = d.tokens(body)
    assert toks[-1] == ("flush",) and all(len(t[2]) + 5 <= limit for t in toks[:-1])
    assert b"".join(t[2] for t in toks if t[0] == "band" and t[1] == 1) == b"P" * size + b"Q" * (size + 19)
