"""Negotiation rounds: a round the planner cannot prove, open or `done`,
is git's, so the negotiation is stock's own (Aspen's own acknowledgments
of such rounds had made git's final answers larger than stock's); a round
it proves is planned.

The repository: a short imported history, main pushed once (the client's
stale tip), then 24 branches cut from the import's main with newer commit
dates, so that a client's first 16 haves are branch tips, none of them on
main: no proof from them, while ACKing them makes the client send its stale
main next. Then main moves on twice."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aspen_cgi.runtime.repository import Repository

from . import differential as d
from . import harness as h
from . import pushkit as pk

BRANCHES = 24
CAPS = "multi_ack_detailed no-done side-band-64k thin-pack ofs-delta agent=git/2.39.5"


def _import(repo: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "aspen_cgi.cli", "import", "-q", str(repo)],
                         capture_output=True, text=True, cwd=h.REPO_DIR)
    assert res.returncode == 0, res.stderr


def _posts(log: str) -> list[str]:
    return [line for line in re.findall(r"service=upload-pack method=POST .*", log) if "plan=" in line]


def _objects(repo: Path) -> set[str]:
    out = h.out("rev-list", "--objects", "--all", cwd=str(repo))
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _commit(work: Path, name: str, clock) -> str:
    (work / f"{name}.txt").write_text(f"{name}\n" * 40)
    h.git("add", "-A", cwd=str(work))
    date = f"{next(clock)} +0000"
    h.git("commit", "-q", "-m", name, cwd=str(work), env={"GIT_COMMITTER_DATE": date, "GIT_AUTHOR_DATE": date})
    return h.out("rev-parse", "HEAD", cwd=str(work))


class Repo:
    def __init__(self, server, root: Path, repo: Path, work: Path, client: Path, clock):
        self.server, self.root, self.repo, self.work, self.client, self.clock = server, root, repo, work, client, clock

    def rev(self, what: str) -> str:
        return h.out("rev-parse", what, cwd=str(self.repo))

    def post(self, program: str, body: bytes, version: int) -> h.CgiResult:
        extra = {"HTTP_GIT_PROTOCOL": "version=2"} if version == 2 else {}
        env = d.post_env(self.root, "repo.git", "upload-pack", body, ASPEN_ACCESS_LOG="1", **extra)
        return h.aspen(env, body) if program == "aspen" else h.stock(env, body)


@pytest.fixture
def branchy(tmp_path, server_factory) -> Repo:
    root = tmp_path / "root"
    root.mkdir()
    repo = pk.enable_push(h.make_history(root / "repo.git", commits=3, branches=(), tags=False))
    server = server_factory(root, ASPEN_ACCESS_LOG="1")
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    clock = itertools.count(int(time.time()) + 10)
    _commit(work, "stale", clock)
    h.git("push", "-q", "origin", "main", cwd=str(work))
    for i in range(BRANCHES):
        h.git("checkout", "-q", "-b", f"b{i}", "main~1", cwd=str(work))
        _commit(work, f"b{i}", clock)
    h.git("checkout", "-q", "main", cwd=str(work))
    h.git("push", "-q", "origin", *[f"b{i}" for i in range(BRANCHES)], cwd=str(work))
    for x in ("x1", "x2"):
        h.git("checkout", "-q", "-b", x, "main~1", cwd=str(work))
        _commit(work, x, clock)
    h.git("checkout", "-q", "main", cwd=str(work))
    h.git("push", "-q", "--atomic", "origin", "x1", "x2", cwd=str(work))      # one version, two refs
    client = tmp_path / "client"
    h.git("clone", "-q", server.url + "/repo.git", str(client))
    for i in range(2):
        _commit(work, f"m{i}", clock)
        h.git("push", "-q", "origin", "main", cwd=str(work))
    _import(repo)
    return Repo(server, root, repo, work, client, clock)


@pytest.mark.parametrize("version", [0, 2])
def test_client_behind_on_main_negotiates_with_git_like_stock(version, branchy, cgi_server_factory, tmp_path):
    """The client's first haves are branch tips that prove nothing about
    main: git answers that round (a later one, with more haves, may be
    planned), and the fetch ends with exactly the objects a stock fetch
    leaves."""
    twin = tmp_path / "twin"
    shutil.copytree(branchy.client, twin)
    stock = cgi_server_factory(branchy.root, "stock")
    h.git("remote", "set-url", "origin", stock.url + "/repo.git", cwd=str(twin))
    before = len(_posts(branchy.server.log_text()))
    for c in (branchy.client, twin):
        h.git("-c", f"protocol.version={version}", "-c", "transfer.fsckObjects=true", "fetch", "-q", "origin",
              cwd=str(c))
        h.fsck_strict(str(c))
    posts = _posts(branchy.server.log_text())[before:]
    assert posts and _not_proved(posts[0]), posts
    assert all(_not_proved(p) or "plan=planned" in p for p in posts), posts
    traces = [json.loads(x) for x in re.findall(r"aspen-plan (\{.*\})", branchy.server.log_text())][-len(posts):]
    assert all(t["lookups"] >= 16 for t in traces)       # each round looked up at least its 16 haves
    assert h.out("rev-parse", "origin/main", cwd=str(branchy.client)) == branchy.rev("main")
    assert h.refs_of(str(branchy.client)) == h.refs_of(str(twin))
    assert _objects(branchy.client) == _objects(twin)


def _not_proved(line: str) -> bool:
    """An open round git answers: its proof fell short (the cost rule), or it
    needs versions to hold commits and stock would not end the round."""
    return ("plan=fallback why=haves-not-proved" in line
            or ("plan=fallback why=open-round-holders" in line and "checked=not-ready" in line))


def _branch_tips(r: Repo, n: int = 16) -> list[str]:
    return [r.rev(f"b{i}") for i in range(BRANCHES - 1, BRANCHES - 1 - n, -1)]


def _v2_fetch(wants, haves, done=False) -> bytes:
    args = [f"want {w}" for w in wants] + ["thin-pack", "ofs-delta", "no-progress"] + [f"have {x}" for x in haves]
    return d.v2_request("fetch", ["agent=git/2.39.5"], args + (["done"] if done else []))


@pytest.mark.parametrize("version", [0, 2])
def test_an_open_round_not_proved_is_stocks_bytes(version, branchy):
    """An open round of branch tips alone: git's answer, byte for byte stock's."""
    haves = _branch_tips(branchy)
    haves += haves[:1]                    # a have sent twice is ACKed twice, as stock does
    want = [branchy.rev("main")]
    body = _v2_fetch(want, haves) if version == 2 else d.v0_request(want, haves, caps=CAPS, done=False)
    a, s = branchy.post("aspen", body, version), branchy.post("stock", body, version)
    assert _not_proved(_posts(a.stderr.decode(errors="replace"))[-1])
    assert a.status == s.status == 200
    assert a.body == s.body and b"ACK" in a.body


@pytest.mark.parametrize("version", [0, 2])
@pytest.mark.parametrize("shape", ["unknown-have", "done"])
def test_rounds_with_unknown_haves_or_not_proved_go_to_git(shape, version, branchy):
    """A round with a have Aspen does not know (v0: any round; v2: one that
    is not proved): git answers, as stock. A `done` round not proved (x1's
    version moved two refs: nothing below it is proved) is planned once git's
    object walk lists every object of the refused plan (plancheck.py): the
    client gets the objects stock sends."""
    if shape == "done":
        haves = [branchy.rev("x1")]
    else:
        haves = _branch_tips(branchy, 15) + ["1" * 40]
    want = [branchy.rev("main")]
    done = shape == "done"
    body = _v2_fetch(want, haves, done) if version == 2 else d.v0_request(want, haves, caps=CAPS, done=done)
    a, s = branchy.post("aspen", body, version), branchy.post("stock", body, version)
    line = _posts(a.stderr.decode(errors="replace"))[-1]
    if shape == "done":
        assert "plan=planned" in line and "checked=ok" in line, line
    elif version == 0:
        assert "plan=fallback why=unknown-have" in line, line
    else:
        assert _not_proved(line), line
    ra, rs = (d.parse_upload_response(r.body, str(branchy.repo)) for r in (a, s))
    assert (ra.control, ra.objects, ra.error) == (rs.control, rs.objects, rs.error)
    if shape == "done":
        d.check_planned_bytes(rs.pack, ra.pack, "aspen")


@pytest.mark.parametrize("version", [0, 2])
def test_a_done_round_whose_proof_needs_held_versions_is_checked_against_git(version, branchy, tmp_path):
    """The client's `done` round: only branch tips
    (their ancestors, the stale main among them, are never sent). Proving
    main's boundary would pull in main's earlier versions, which the client
    saw (they are no newer than its haves): the cost rule refuses them, since
    their packs may send it again what it has (in the bench's
    lagging-clients such plans carried 1.7x to 2.9x stock's bytes). The
    refused plan is checked against git's object walk for the same request
    (plancheck.py): here it lists every object of those packs, so the plan
    is sent, with exactly stock's objects."""
    haves = _branch_tips(branchy)
    want = [branchy.rev("main")]
    body = _v2_fetch(want, haves, done=True) if version == 2 else d.v0_request(want, haves, caps=CAPS, done=True)
    a, s = branchy.post("aspen", body, version), branchy.post("stock", body, version)
    line = _posts(a.stderr.decode(errors="replace"))[-1]
    assert "plan=planned" in line and "checked=ok" in line, line
    ra, rs = (d.parse_upload_response(r.body, str(branchy.repo)) for r in (a, s))
    assert ra.control == rs.control and not ra.error
    assert ra.objects == rs.objects
    d.check_planned_bytes(rs.pack, ra.pack, "aspen")
    client = tmp_path / "client.git"
    shutil.copytree(branchy.client / ".git", client)
    h.git("index-pack", "--stdin", "--fix-thin", "--strict", cwd=str(client), input=ra.pack)
    h.git("update-ref", "refs/heads/fetched", want[0], cwd=str(client))
    h.fsck_strict(str(client))


def test_v2_sideband_all_goes_to_git(branchy):
    """sideband-all frames every section on band 1. Stock refuses it unless
    allowed, after its 200 (an empty answer); Aspen says so with a 400.
    Allowed, it is not planned: git answers, as stock."""
    args = [f"want {branchy.rev('main')}", "thin-pack", "ofs-delta", "sideband-all", f"have {branchy.rev('main~1')}"]
    body = d.v2_request("fetch", ["agent=git/2.39.5"], args + ["done"])
    a, s = branchy.post("aspen", body, 2), branchy.post("stock", body, 2)
    assert (a.status, s.status, s.body) == (400, 200, b"")
    assert b"unexpected line: 'sideband-all'" in a.stderr
    h.git("config", "uploadpack.allowSidebandAll", "true", cwd=str(branchy.repo))
    a, s = branchy.post("aspen", body, 2), branchy.post("stock", body, 2)
    assert "plan=fallback why=sideband-all" in _posts(a.stderr.decode(errors="replace"))[-1]
    assert a.status == s.status == 200

    def band1(body: bytes) -> bytes:     # progress on band 2 is chunked by timing; the pack is not
        return b"".join(t[2] for t in d.tokens(body) if t[0] == "band" and t[1] == 1)
    assert band1(a.body) == band1(s.body) and b"PACK" in band1(a.body)


def _answer_like_stock(branchy, body: bytes, version: int, plan: str):
    a, s = branchy.post("aspen", body, version), branchy.post("stock", body, version)
    line = _posts(a.stderr.decode(errors="replace"))[-1]
    assert plan in line, line
    ra, rs = (d.parse_upload_response(r.body, str(branchy.repo)) for r in (a, s))
    assert a.status == s.status == 200 and not ra.error
    assert ra.objects == rs.objects
    if d.planned(a):
        d.check_planned_bytes(rs.pack, ra.pack, "aspen")
    return ra


@pytest.mark.parametrize("version", [0, 2])
def test_haves_a_client_walked_back_to_are_known_and_planned(version, branchy):
    """A client's haves after its tips are their ancestors: commits some
    version introduced (here the import's), which are no ref value. They are
    common, as stock finds, so the round is planned (v0 used to go to git:
    unknown-have), with stock's objects."""
    stale = branchy.rev("main~2")
    haves = [stale, branchy.rev(f"{stale}~1"), branchy.rev(f"{stale}~2")]
    want = [branchy.rev("main")]
    body = _v2_fetch(want, haves, done=True) if version == 2 else d.v0_request(want, haves, caps=CAPS, done=True)
    ra = _answer_like_stock(branchy, body, version, "plan=planned")
    assert branchy.rev("main") in ra.objects


def test_a_want_the_client_holds_through_its_haves_is_not_sent_again(branchy):
    """A want (a new branch `old` at main's earlier value) that is an
    earlier value of a ref whose later value is a have (git's client sends
    such wants when it lacks the ref and its own walk stopped short): stock
    sends none of its objects, and neither does the plan."""
    h.git("push", "-q", "origin", "main~2:refs/heads/old", cwd=str(branchy.work))
    h.wait_packs_built(branchy.repo)
    body = _v2_fetch([branchy.rev("old")], [branchy.rev("main")], done=True)
    ra = _answer_like_stock(branchy, body, 2, "plan=planned")
    assert ra.objects == set()


def test_an_annotated_tag_on_a_commit_the_client_has_is_sent(branchy):
    """The tips index files a tag's commit under the tag's ref too; a want
    of the tag object is never taken as held because its commit is a have:
    the tag object is sent, as stock sends it."""
    h.git("tag", "-a", "t1", "-m", "t1", "main", cwd=str(branchy.work))
    h.git("push", "-q", "origin", "t1", cwd=str(branchy.work))
    tag = branchy.rev("refs/tags/t1")
    body = _v2_fetch([tag], [branchy.rev("main")], done=True)
    ra = _answer_like_stock(branchy, body, 2, "plan=")
    assert tag in ra.objects


def test_plancheck_calls_stock_ready_exactly_when_stock_says_ready(branchy):
    """plancheck's readiness (upload-pack's ok_to_give_up, from one cat-file
    walk) against stock's own answer to open v2 rounds: `ready` or not; and
    the ref store's recorded parents, asked first, never rule out a round
    stock ends."""
    import os

    from aspen_cgi.fetch import plancheck
    main, stale, root = branchy.rev("main"), branchy.rev("main~2"), branchy.rev("main~3")
    rounds = [([main], [stale]),                       # main reaches stale: ready
              ([main], _branch_tips(branchy, 3)),      # branch tips beside main: main reaches none
              ([main], [branchy.rev("x1")]),
              ([main], [root]),                        # the root's parents: none; main reaches it
              ([branchy.rev("b3")], [main]),           # b3 is below no have
              ([main, branchy.rev("x2")], [stale, branchy.rev("x1")]),
              ([main], ["1" * 40])]                    # unknown have: no THEY_HAVE at all
    from aspen_cgi.fetch.history import StoreHistory
    from aspen_cgi.refstore.store import RefStore
    store = RefStore.open(Repository.of(str(branchy.repo), dict(os.environ, GIT_DIR=str(branchy.repo))))
    store.sync()
    seen, pruned, from_store = set(), 0, set()
    for wants, haves in rounds:
        s = branchy.post("stock", _v2_fetch(wants, haves), 2)
        stock_ready = b"ready\n" in s.body
        ours = plancheck.stock_ready(str(branchy.repo), dict(os.environ), wants, haves, {})
        assert ours == stock_ready, (wants, haves, s.body[:200])
        seen.add(ours)
        # the store's parents and committer times answer as git's commits do, or not at all
        stored = plancheck.store_ready(StoreHistory(store), wants, haves, {})
        assert stored is None or stored == stock_ready, (wants, haves, stored)
        if stored is not None:
            from_store.add(stored)
        # the store's parents alone never rule out a round stock ends, and rule out some it does not
        may = plancheck.may_be_ready(StoreHistory(store), wants, haves, {})
        assert may or not stock_ready, (wants, haves)
        pruned += not may
    assert seen == {True, False} and pruned >= 2
    assert from_store == {True, False}
    assert plancheck.store_ready(StoreHistory(store), [main], ["1" * 40], {}) is None    # no record: git is asked


def test_an_open_round_whose_plan_needs_holders_is_planned_only_when_stock_ends_it(tmp_path, server_factory):
    """Branch h (a recent commit on the first commit t0) is in the repository
    when Aspen imports it; then trunk t1 and branch x on it are pushed, both
    dated long ago. An open round wanting x with haves [h]: the plan needs
    t1's version only to hold x's boundary (the client may have it and not
    have said so yet: git.git's stale-branch client was sent 10 trunk pushes
    again), and stock is not ready (x's commits are older than the oldest
    have, so its walk never reaches h's parent t0): git answers, byte for
    byte stock's. The same round with `done` is planned."""
    root = tmp_path / "root"
    root.mkdir()
    repo = pk.enable_push(h.make_history(root / "repo.git", commits=2, branches=(), tags=False))
    t0 = h.out("rev-parse", "main", cwd=str(repo))
    date = {"GIT_COMMITTER_DATE": f"{int(time.time()) + 10} +0000"}
    have = h.git("commit-tree", "-p", t0, "-m", "h", h.out("rev-parse", "main^{tree}", cwd=str(repo)),
                 cwd=str(repo), env=date).stdout.decode().strip()
    h.git("update-ref", "refs/heads/h", have, cwd=str(repo))
    server = server_factory(root, ASPEN_ACCESS_LOG="1")
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    old = itertools.count(1_000_000_000)
    _commit(work, "t1", old)
    h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    h.git("checkout", "-q", "-b", "x", cwd=str(work))
    x = _commit(work, "x", old)
    h.git("push", "-q", "origin", "x", cwd=str(work))
    h.wait_packs_built(repo)
    r = Repo.__new__(Repo)
    r.root, r.repo = root, repo
    open_round, done_round = _v2_fetch([x], [have]), _v2_fetch([x], [have], done=True)
    a, s = r.post("aspen", open_round, 2), r.post("stock", open_round, 2)
    log = _posts(a.stderr.decode(errors="replace"))[-1]
    assert "plan=fallback why=open-round-holders" in log and "checked=not-ready ready_by=store" in log, log
    assert a.status == s.status == 200 and a.body == s.body
    a = r.post("aspen", done_round, 2)
    assert "plan=planned" in _posts(a.stderr.decode(errors="replace"))[-1]
