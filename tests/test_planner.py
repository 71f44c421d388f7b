"""The planner over a real ref store with built version packs: whatever it
plans, the client completes from those packs alone (each applied with
index-pack --fix-thin --strict, then fsck --strict), and what it cannot
prove falls back."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from aspen_cgi.fetch.history import StoreHistory
from aspen_cgi.model.versions import PackInfo
from aspen_cgi.packs import builder
from aspen_cgi.planner.plan import Fallback, Plan, plan
from aspen_cgi.protocol.requests import FetchRequest
from aspen_cgi.refstore.store import RefStore
from aspen_cgi.runtime.repository import Repository

from . import harness as h
from . import pushkit as pk

CAPS = ["multi_ack_detailed", "thin-pack", "side-band-64k", "ofs-delta", "agent=git/2.39"]


def _store(repo: Path) -> RefStore:
    s = RefStore.open(Repository.of(str(repo), dict(os.environ, GIT_DIR=str(repo))))
    s.sync()
    return s


def _advertised(repo: Path) -> frozenset[str]:
    return frozenset(h.refs_of(str(repo)).values())


def _tags(repo: Path) -> dict[str, str]:
    """Annotated refs/tags/* values -> their peeled objects, as upload.py gives them to the planner."""
    out = h.out("for-each-ref", "--format=%(objectname) %(*objectname)", "refs/tags", cwd=str(repo))
    return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)


def _complete(client: Path, store: RefStore, p: Plan, wants: dict[str, str]) -> None:
    for name in p.packs:
        if not name:
            continue
        with open(os.path.join(store.packs_dir, f"pack-{name}.pack"), "rb") as f:
            h.git("index-pack", "--stdin", "--fix-thin", "--strict", cwd=str(client), input=f.read())
    for ref, oid in wants.items():
        h.git("update-ref", ref, oid, cwd=str(client))
    h.fsck_strict(str(client))


def test_clients_at_every_earlier_state_complete_from_the_plan(root, server, tmp_path):
    repo = pk.enable_push(root / "repo.git")
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    snapshots = []          # (client mirror at that moment)
    rng = random.Random(7)
    for i in range(8):
        snap = tmp_path / f"client{i}.git"
        h.git("clone", "-q", "--mirror", server.url + "/repo.git", str(snap))
        snapshots.append(snap)
        (work / f"f{rng.randrange(3)}.txt").write_text("".join(f"{i} {n}\n" for n in range(rng.randrange(50, 400))))
        pk.commit(work, f"c{i}")
        if i == 4:
            h.git("push", "-q", "origin", "HEAD:refs/heads/cut", cwd=str(work))   # a branch cut mid-history
        h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    store = _store(repo)
    builder.build_packs(store)
    history = StoreHistory(store)
    server_refs = h.refs_of(str(repo))
    planned = 0
    for snap in snapshots:
        haves = sorted(set(h.refs_of(str(snap)).values()))
        wants = {"refs/heads/main": server_refs["refs/heads/main"]}
        req = FetchRequest(version=0, wants=[server_refs["refs/heads/main"]], haves=haves, capabilities=CAPS)
        p = plan(req, history, _advertised(repo))
        if isinstance(p, Fallback):
            continue
        planned += 1
        assert 1 not in p.versions
        client = tmp_path / "apply.git"
        shutil.rmtree(client, ignore_errors=True)
        shutil.copytree(snap, client)
        _complete(client, store, p, wants)
    assert planned == len(snapshots)       # every client state here is a fast-forward of trunk: all proved


def test_full_clone_is_the_whole_history_from_the_import_pack_up(root, server, tmp_path):
    repo = pk.enable_push(root / "repo.git")
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    for i in range(3):
        (work / "a.txt").write_text(f"{i}\n" * (i + 10))
        pk.commit(work, f"c{i}")
        h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    store = _store(repo)
    builder.build_packs(store)
    refs = h.refs_of(str(repo))
    req = FetchRequest(version=2, wants=sorted(set(refs.values())), capabilities=["thin-pack", "ofs-delta"])
    p = plan(req, StoreHistory(store), _advertised(repo))
    assert isinstance(p, Plan) and p.versions[0] == 1
    client = tmp_path / "empty.git"
    h.git("init", "-q", "--bare", str(client))
    _complete(client, store, p, refs)


def test_what_cannot_be_proved_falls_back(root, server_factory, tmp_path):
    # the server builds no packs: its in-process builder would otherwise race the last assertion
    # to the pushed version's pack (it won once in a clean-clone run)
    server = server_factory(root, ASPEN_VERSION_PACKS="off")
    repo = pk.enable_push(root / "repo.git")
    side = h.git("commit-tree", "-m", "no parent", "main^{tree}", cwd=str(repo)).stdout.decode().strip()
    h.git("update-ref", "refs/heads/side", side, cwd=str(repo))     # a branch main does not reach
    store = _store(repo)
    refs = h.refs_of(str(repo))
    main = refs["refs/heads/main"]
    hist = StoreHistory(store)
    adv = _advertised(repo)
    base = dict(version=0, wants=[main], capabilities=CAPS)
    assert plan(FetchRequest(**base, deepen=1), hist, adv).reason == "shallow"
    assert plan(FetchRequest(**base, filter="blob:none"), hist, adv).reason == "filter"
    assert plan(FetchRequest(**base), hist, adv).reason == "not-built"
    builder.build_packs(store)
    assert plan(FetchRequest(version=0, wants=["1" * 40], capabilities=CAPS), hist, adv).reason == "want-not-advertised"
    assert plan(FetchRequest(version=0, wants=[main], haves=[main], capabilities=["ofs-delta"]),
                hist, adv).reason == "no-thin-pack"
    assert plan(FetchRequest(version=0, wants=[main], capabilities=["thin-pack"]), hist, adv).reason == "no-ofs-delta"
    tags = _tags(repo)
    assert tags
    # main alone: the import pack holds side's commit too, which a stock fetch would not send
    assert plan(FetchRequest(version=2, wants=[main], capabilities=["ofs-delta", "include-tag"]),
                hist, adv, tags).reason == "extra-objects"
    assert isinstance(plan(FetchRequest(version=2, wants=sorted(set(refs.values())),
                                        capabilities=["ofs-delta", "include-tag"]), hist, adv, tags), Plan)
    # a client whose haves prove nothing would need the whole repository: git answers it
    assert plan(FetchRequest(**base, haves=["2" * 40]), hist, adv).reason == "haves-not-proved"
    # a push not yet packed makes every plan wait
    work = tmp_path / "w"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    pk.commit(work, "more")
    h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    store.sync()
    assert plan(FetchRequest(**base), hist, adv).reason == "not-built"


def test_stale_branch_is_its_own_pack_and_a_log_n_proof(root, server, tmp_path):
    """A client current on trunk fetches a branch cut N trunk pushes ago: one
    version pack, its base proved an ancestor of the client's trunk."""
    repo = pk.enable_push(root / "repo.git")
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    h.git("checkout", "-q", "-b", "stale", cwd=str(work))
    (work / "stale.txt").write_text("branch work\n")
    pk.commit(work, "stale")
    h.git("push", "-q", "origin", "stale", cwd=str(work))
    h.git("checkout", "-q", "main", cwd=str(work))
    for i in range(20):
        (work / "t.txt").write_text(f"{i}\n")
        pk.commit(work, f"t{i}")
        h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    client = tmp_path / "client.git"
    h.git("clone", "-q", "--bare", server.url + "/repo.git", str(client))
    h.git("update-ref", "-d", "refs/heads/stale", cwd=str(client))
    store = _store(repo)
    builder.build_packs(store)
    refs = h.refs_of(str(repo))
    haves = sorted(set(h.refs_of(str(client)).values()))
    req = FetchRequest(version=2, wants=[refs["refs/heads/stale"]], haves=haves, capabilities=["thin-pack", "ofs-delta"])
    p = plan(req, StoreHistory(store), _advertised(repo))
    assert isinstance(p, Plan), p
    assert len(p.versions) == 1
    assert p.segments_visited + p.versions_visited <= 2 * 5 + 4      # log2(22) < 5
    _complete(client, store, p, {"refs/heads/stale": refs["refs/heads/stale"]})


# -- full clones from segment packs -----------------------------------------------------------

def test_cover_takes_the_longest_built_run_at_each_step():
    from aspen_cgi.planner.plan import cover
    assert cover(2, 1, []) == []
    assert cover(2, 4, []) == [(2, 2), (3, 3), (4, 4)]
    assert cover(2, 9, [(2, 9)]) == [(2, 9)]
    assert cover(2, 12, [(2, 9), (10, 11)]) == [(2, 9), (10, 11), (12, 12)]
    # nested runs (a larger one built, the smaller not pruned yet): the larger wins
    assert cover(2, 12, [(2, 3), (2, 5), (2, 9), (6, 7)]) == [(2, 9), (10, 10), (11, 11), (12, 12)]
    # a run ending past the clone's version is not used
    assert cover(2, 8, [(2, 9), (2, 5), (6, 7)]) == [(2, 5), (6, 7), (8, 8)]
    # runs need not be aligned to be used
    assert cover(2, 7, [(3, 6)]) == [(2, 2), (3, 6), (7, 7)]


def test_segment_schedule_is_a_binary_counter_over_the_versions_after_the_import():
    import math

    from aspen_cgi.packs.segmentpack import schedule
    assert schedule(1) == schedule(2) == []
    assert schedule(3) == [(2, 3)]
    assert schedule(9) == [(2, 9)]
    assert schedule(12) == [(2, 9), (10, 11)]
    for n in range(2, 300):
        runs = schedule(n)
        singles = bin(n - 1).count("1") - len(runs)
        assert 1 + len(runs) + singles <= math.ceil(math.log2(n)) + 2
        spans = [(lo, hi) for lo, hi in runs]
        assert all(hi - lo + 1 >= 2 and (hi - lo + 1) & (hi - lo) == 0 for lo, hi in spans)
        assert all((lo - 2) % (hi - lo + 1) == 0 for lo, hi in spans)          # aligned from version 2


class _FakeHistory:
    """Only what the clone plan asks: the view and the version packs."""

    def __init__(self, view):
        self.view = view

    def clone_view(self):
        return self.view

    def pack_of(self, version):
        return PackInfo(f"{version:040x}", (), ("refs/heads/main",))

    def all_packs_built(self):
        return True

    def tips(self, commit):
        from aspen_cgi.model.versions import TipAnswer, Visits
        return TipAnswer(commit, (), Visits(1, 0))

    def tips_many(self, commits):
        return {c: self.tips(c) for c in commits}

    def pack_holds(self, name, oids):
        return frozenset()

    def introduced_by(self, commit):
        return []

    def introduced_many(self, commits):
        return {c: [] for c in commits}

    def bounded_by(self, commits):
        return {c: () for c in commits}

    def introduced_commits(self, version):
        return ()

    def commit_facts(self, commits):
        return {}

    def is_ancestor(self, ref, j, k):
        raise AssertionError("a clone proves nothing")


def test_a_clone_of_every_ref_is_the_import_pack_then_the_runs():
    from aspen_cgi.model.versions import CloneView, SegmentPack
    a, b, t, peeled = "a" * 40, "b" * 40, "c" * 40, "d" * 40
    view = CloneView(12, frozenset({a, b, t}), frozenset({peeled}),
                     (SegmentPack(2, 9, "9" * 40), SegmentPack(10, 11, "")))
    hist = _FakeHistory(view)
    adv = frozenset({a, b, t, peeled})
    p = plan(FetchRequest(version=2, wants=[a, b, t], capabilities=["ofs-delta"]), hist, adv)
    assert isinstance(p, Plan)
    assert p.packs == (f"{1:040x}", "9" * 40, f"{12:040x}")        # the empty run 10-11 is skipped
    assert p.spans == ((1, 1), (2, 9), (12, 12))
    assert p.thin == (False, False, False)           # every delta base comes from an earlier extent
    assert (p.versions_visited, p.segments_visited) == (2, 2)
    # a client that does not want every ref, or wants what is no ref value now: the version walk
    assert plan(FetchRequest(version=2, wants=[a, b], capabilities=["ofs-delta"]), hist, adv).reason == \
        "want-not-a-tip"
    assert plan(FetchRequest(version=2, wants=[a, b, t, peeled, "e" * 40], capabilities=["ofs-delta"]), hist,
                adv | {"e" * 40}).reason == "want-not-a-tip"
    assert isinstance(plan(FetchRequest(version=2, wants=[a, b, t, peeled], capabilities=["ofs-delta"]), hist, adv),
                      Plan)
    hist.view = None            # a version without its pack, or pending
    assert plan(FetchRequest(version=2, wants=[a, b, t], capabilities=["ofs-delta"]), hist, adv).reason == \
        "want-not-a-tip"


def test_full_clone_from_segment_packs_completes_an_empty_client(root, server_factory, tmp_path):
    """The packs are built here, after the pushes (the server builds none:
    version packs off), so that the build makes the segments this checks."""
    from aspen_cgi.packs import background
    server = server_factory(root, ASPEN_VERSION_PACKS="off")
    repo = pk.enable_push(root / "repo.git")
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    for i in range(9):
        (work / "a.txt").write_text("".join(f"{i} {n}\n" for n in range(100 + 40 * i)))
        pk.commit(work, f"c{i}")
        if i == 3:
            h.git("push", "-q", "origin", "HEAD:refs/heads/side", cwd=str(work))
        h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    store = _store(repo)
    rep = background.build(store)
    assert rep.segments and not rep.busy
    refs = h.refs_of(str(repo))
    req = FetchRequest(version=2, wants=sorted(set(refs.values())), capabilities=["thin-pack", "ofs-delta"])
    p = plan(req, StoreHistory(store), _advertised(repo))
    assert isinstance(p, Plan)
    runs = {(s.lo, s.hi) for s in store.segment_packs()}
    assert p.spans[0] == (1, 1) and set(p.spans[1:]) & runs
    assert len(p.packs) <= 1 + len(runs) + 1
    client = tmp_path / "empty.git"
    h.git("init", "-q", "--bare", str(client))
    _complete(client, store, p, refs)
    # pushes after the compaction: their version packs follow the runs
    for i in range(3):
        pk.commit(work, f"after{i}")
        h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    store.sync()
    builder.build_packs(store)
    refs = h.refs_of(str(repo))
    req = FetchRequest(version=2, wants=sorted(set(refs.values())), capabilities=["thin-pack", "ofs-delta"])
    p = plan(req, StoreHistory(store), _advertised(repo))
    assert isinstance(p, Plan)
    assert p.spans[-3:] == tuple((v, v) for v in range(store.latest() - 2, store.latest() + 1))
    again = tmp_path / "again.git"
    h.git("init", "-q", "--bare", str(again))
    _complete(again, store, p, refs)


# -- visits are distinct versions and segments; lookups are counted apart ------------------------

def _stale_history(repo: Path, n: int, tags: int, parents: bool = False) -> tuple[RefStore, list[str], str, list[str]]:
    """Through the ref store API: an import with main and TAGS annotated tags
    (on a side chain), version 2 cuts `stale` from main, versions 3 … N move
    main one commit each; version packs recorded by hand (name, boundary,
    introduced) as the builder would, with PARENTS the commits' recorded
    parents and the import's introduced commit too. Returns the store,
    main's chain, the stale tip and the tags' peeled commits."""
    from aspen_cgi.model.versions import RefChange, VersionMeta
    from aspen_cgi.refstore import db

    from .test_refstore import commits, empty_repo
    empty_repo(repo)
    chain = commits(repo, n - 1)
    stale = commits(repo, 1, parent=chain[0], tag="stale")[0]
    peeled = commits(repo, tags, tag="tagged")
    stream = "".join(f"tag t{i}\nfrom {c}\ntagger T <t@x> 1600000000 +0000\ndata 3\nt{i}\n" for i, c in enumerate(peeled))
    h.git("fast-import", "--quiet", cwd=str(repo), input=stream.encode())
    h.git("update-ref", "refs/heads/main", chain[0], cwd=str(repo))
    store = _store(repo)
    assert store.latest() == 1
    assert not store.commit([RefChange("refs/heads/stale", "0" * 40, stale)], VersionMeta("push"), fast=True)
    for v in range(3, n + 1):
        assert not store.commit([RefChange("refs/heads/main", chain[v - 3], chain[v - 2], ff=True)],
                                VersionMeta("push"), fast=True)
    assert store.latest() == n

    def record(conn) -> None:
        db.record_pack(conn, 1, "1" * 40, 1, 1, 0.0, 0, 0, 0, ())
        db.record_pack(conn, 2, "2" * 40, 1, 1, 0.0, 0, 0, 0, (chain[0],))
        db.insert_introduced(conn, 2, (stale,))
        for v in range(3, n + 1):
            db.record_pack(conn, v, f"{v:040x}", 1, 1, 0.0, 0, 0, 0, (chain[v - 3],))
            db.insert_introduced(conn, v, (chain[v - 2],))
        if parents:
            db.insert_introduced(conn, 1, (chain[0],))
            db.insert_parents(conn, {c: (chain[i - 1],) if i else () for i, c in enumerate(chain)}, {})
    db.write(store.conn, record)
    return store, chain, stale, peeled


@pytest.mark.parametrize("n", [10, 100, 1000])
def test_stale_branch_visits_count_each_version_once(tmp_path, n):
    """A client current on main with 30 tags fetches a branch cut N versions
    ago: 31 have lookups all land on two versions; what is visited stays
    within 2·log2(N)+4, the lookups are reported apart."""
    import math
    store, chain, stale, peeled = _stale_history(tmp_path / "repo.git", n, 30)
    haves = [chain[-1]] + peeled
    req = FetchRequest(version=2, wants=[stale], haves=haves, capabilities=["thin-pack", "ofs-delta"])
    p = plan(req, StoreHistory(store), frozenset({stale}))
    assert isinstance(p, Plan), p
    assert p.versions == (2,)
    assert p.versions_visited + p.segments_visited <= 2 * math.log2(n) + 4, (p.versions_visited, p.segments_visited)
    assert p.lookups >= len(haves) + 1 > p.versions_visited


@pytest.mark.parametrize("n", [10, 100])
def test_stale_branch_haves_walked_back_on_trunk_cost_no_visit_each(tmp_path, n):
    """git's client sends trunk's tip and then its ancestors, each trunk's
    value at some version: the want (not in the client's closure) and the
    stale base (proved by trunk's fast-forwards) read none of those versions.
    Measured before: 104 versions visited at N=10 on git.git (rule 4 read
    every have's version to prove the want absent)."""
    import math
    store, chain, stale, peeled = _stale_history(tmp_path / "repo.git", n, 3)
    haves = chain[-16:][::-1] + peeled
    req = FetchRequest(version=2, wants=[stale], haves=haves, capabilities=["thin-pack", "ofs-delta"])
    p = plan(req, StoreHistory(store), frozenset({stale}))
    assert isinstance(p, Plan), p
    assert p.versions == (2,)
    assert p.versions_visited + p.segments_visited <= 2 * math.log2(n) + 4, (p.versions_visited, p.segments_visited)


def test_an_open_round_stock_would_not_end_stops_at_the_first_holder(tmp_path):
    """A client N-2 pushes behind on main: the proof holds each push's
    parent in the push before it. In a round without `done` the service is
    asked once, at the first holder, whether such a plan may go now; no
    ends the walk there, not after the N-2 versions."""
    from aspen_cgi.planner.plan import OPEN_ROUND_HOLDERS
    n = 40
    store, chain, _, _ = _stale_history(tmp_path / "repo.git", n, 0)
    req = FetchRequest(version=2, wants=[chain[-1]], haves=[chain[0]], capabilities=["thin-pack", "ofs-delta"])
    asked = []

    def holders_ok(answer):
        return lambda: asked.append(answer) or answer
    refused = plan(req, StoreHistory(store), frozenset({chain[-1]}), holders_ok=holders_ok(False))
    assert isinstance(refused, Fallback) and refused.reason == OPEN_ROUND_HOLDERS, refused
    assert refused.versions_visited <= 3 and asked == [False]
    made = plan(req, StoreHistory(store), frozenset({chain[-1]}), holders_ok=holders_ok(True))
    assert isinstance(made, Plan) and made.versions == tuple(range(3, n + 1)) and asked == [False, True]
    assert made.holders == tuple(range(3, n))
    assert plan(req, StoreHistory(store), frozenset({chain[-1]})).versions == made.versions


def test_commits_newer_than_every_have_are_not_asked_of_the_rules(tmp_path):
    """A client N-2 pushes behind on main: every boundary commit but the
    last was first introduced after the client's have, so it is in no
    have's closure (all a commit reaches was reachable when it first was):
    rule 4's index is asked about none of them, and the plan is the same."""
    n = 40
    store, chain, _, _ = _stale_history(tmp_path / "repo.git", n, 0, parents=True)
    req = FetchRequest(version=2, wants=[chain[-1]], haves=[chain[0]], capabilities=["thin-pack", "ofs-delta"])
    asked = []

    class Asking(StoreHistory):
        def bounded_by(self, commits):
            asked.append(tuple(commits))
            return super().bounded_by(commits)
    p = plan(req, Asking(store), frozenset({chain[-1]}))
    assert isinstance(p, Plan) and p.versions == tuple(range(3, n + 1)), p
    assert asked == [], asked


# -- include-tag ------------------------------------------------------------------------------------

class _TagHistory:
    """Version 1 imports main=C1 and tag X (-> C1); 2 moves main to C2; 3
    pushes tag T (-> C2) alone; 4 moves main to C4. Packs hold what the
    builder would put in them."""
    C1, C2, C4, T, X = "c1" * 20, "c2" * 20, "c4" * 20, "7a" * 20, "7b" * 20
    TIPS = {C1: ((1, "refs/heads/main"), (1, "refs/tags/x")), C2: ((2, "refs/heads/main"), (3, "refs/tags/t")),
            C4: ((4, "refs/heads/main"),), T: ((3, "refs/tags/t"),), X: ((1, "refs/tags/x"),)}
    PACKS = {1: ("p1", (), ("refs/heads/main", "refs/tags/x")), 2: ("p2", (C1,), ("refs/heads/main",)),
             3: ("p3", (C2,), ("refs/tags/t",)), 4: ("p4", (C2,), ("refs/heads/main",))}
    HELD = {"p1": {C1, X}, "p2": {C2}, "p3": {T}, "p4": {C4}}
    INTRODUCED = {C1: [1], C2: [2], C4: [4]}
    VALUES = {1: (C1, X), 2: (C2,), 3: (T,), 4: (C4,)}

    def version_values(self, version):
        return self.VALUES[version]

    def tips(self, commit):
        from aspen_cgi.model.versions import TipAnswer, Visits
        rows = self.TIPS.get(commit, ())
        return TipAnswer(commit, rows, Visits(1, 0, tuple(sorted({v for v, _ in rows}))))

    def tips_many(self, commits):
        return {c: self.tips(c) for c in commits}

    def is_ancestor(self, ref, j, k):
        from aspen_cgi.model.versions import AncestryAnswer, Visits
        return AncestryAnswer(ref, j, k, ref == "refs/heads/main" and j <= k, None, None,
                              Visits(k - j, 0, tuple(range(j + 1, k + 1))))

    def introduced_by(self, commit):
        return self.INTRODUCED.get(commit, [])

    def introduced_many(self, commits):
        return {c: self.introduced_by(c) for c in commits}

    def bounded_by(self, commits):
        return {c: tuple(v for v, (_, boundary, _) in sorted(self.PACKS.items()) if c in boundary) for c in commits}

    def introduced_commits(self, version):
        return [c for c, vs in self.INTRODUCED.items() if version in vs]

    def commit_facts(self, commits):
        return {}

    def pack_of(self, version):
        return PackInfo(*self.PACKS[version])

    def pack_holds(self, name, oids):
        return frozenset(set(oids) & self.HELD[name])

    def all_packs_built(self):
        return True

    def clone_view(self):
        return None


def test_include_tag_adds_the_version_holding_a_tag_whose_commit_is_sent():
    hist, H = _TagHistory(), _TagHistory
    tags = {H.T: H.C2, H.X: H.C1}
    adv = frozenset({H.C4, H.T, H.C2, H.X, H.C1})
    caps = ["thin-pack", "ofs-delta", "include-tag"]
    # behind at C1: C2 and C4 arrive, and T (-> C2) with them; X's commit is a have
    p = plan(FetchRequest(version=2, wants=[H.C4], haves=[H.C1], capabilities=caps), hist, adv, tags)
    assert isinstance(p, Plan) and p.versions == (2, 3, 4), p
    assert any("include-tag" in proof for proof in p.proofs)
    # without include-tag, or with the tag already had: no tag version
    p = plan(FetchRequest(version=2, wants=[H.C4], haves=[H.C1], capabilities=caps[:2]), hist, adv, tags)
    assert p.versions == (2, 4)
    p = plan(FetchRequest(version=2, wants=[H.C4], haves=[H.C2], capabilities=caps), hist, adv, tags)
    assert p.versions == (4,)                 # C2 is not sent: T is not due
    # a tag only the import holds, whose commit a later version sends to a client with haves
    hist.TIPS = dict(H.TIPS, **{H.T: ((1, "refs/tags/t"),)})
    p = plan(FetchRequest(version=2, wants=[H.C4], haves=[H.C1], capabilities=caps), hist, adv, tags)
    assert isinstance(p, Fallback) and p.reason == "include-tag"


class _BranchHistory(_TagHistory):
    """Version 1 imports main=C1; 2 creates branch b=B2 on C1 (one ref); 3
    moves main to C3 on C1; 4 moves b and creates c together (two refs)."""
    C1, B2, C3, B4, D4 = "c1" * 20, "b2" * 20, "c3" * 20, "b4" * 20, "d4" * 20
    TIPS = {C1: ((1, "refs/heads/main"),), B2: ((2, "refs/heads/b"),), C3: ((3, "refs/heads/main"),),
            B4: ((4, "refs/heads/b"),), D4: ((4, "refs/heads/c"),)}
    PACKS = {1: ("p1", (), ("refs/heads/main",)), 2: ("p2", (C1,), ("refs/heads/b",)),
             3: ("p3", (C1,), ("refs/heads/main",)), 4: ("p4", (C1, B2), ("refs/heads/b", "refs/heads/c"))}
    HELD = {"p1": {C1}, "p2": {B2}, "p3": {C3}, "p4": {B4, D4}}
    INTRODUCED = {C1: [1], B2: [2], C3: [3], B4: [4], D4: [4]}
    VALUES = {1: (C1,), 2: (B2,), 3: (C3,), 4: (B4, D4)}

    def is_ancestor(self, ref, j, k):
        raise AssertionError("no ref here fast-forwards from one version to another")


def test_any_round_proves_what_lies_below_a_haves_own_version():
    """The client has branch b (so C1 below it) and sent only B2: the
    negotiation acknowledged B2, so the client never sends C1. B2's version
    updated b alone, so its boundary (C1) is the client's: planned in the
    open round already (`ready`, as stock), and at `done`."""
    hist, H = _BranchHistory(), _BranchHistory
    adv = frozenset({H.C3, H.B2, H.B4, H.D4})
    caps = ["thin-pack", "ofs-delta"]
    req = dict(version=2, wants=[H.C3], haves=[H.B2], capabilities=caps)
    for done in (False, True):
        p = plan(FetchRequest(**req, done=done), hist, adv)
        assert isinstance(p, Plan) and p.versions == (3,), p
        assert any("boundary of a have's version" in proof for proof in p.proofs)
    # a have whose version updated two refs proves nothing below it
    req = dict(version=2, wants=[H.C3], haves=[H.D4], capabilities=caps, done=True)
    assert plan(FetchRequest(**req), hist, adv).reason == "haves-not-proved"


def _main_only(server, client: Path) -> None:
    """A single-branch clone of main, without tags."""
    h.git("clone", "-q", "--bare", "--single-branch", "--branch", "main", "--no-tags", server.url + "/repo.git",
          str(client))


def _built(repo: Path) -> RefStore:
    store = _store(repo)
    builder.build_packs(store)
    return store


class _NoParents(StoreHistory):
    """The same store without rule 5's parents: what rules 1-4 alone prove."""

    def commit_facts(self, commits):
        return {}


class _Unchecked(_NoParents):
    """... and without what each version introduced: no check for a have sent again."""

    def introduced_commits(self, version):
        return ()


def test_a_commit_behind_a_merge_into_another_branch_is_proved_by_walking_parents(root, server, tmp_path):
    repo = pk.enable_push(root / "repo.git")
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    h.git("checkout", "-q", "-b", "feature", cwd=str(work))
    t1 = pk.commit(work, "t1")
    pk.push(work, "origin", "feature")
    h.git("checkout", "-q", "main", cwd=str(work))
    h.git("merge", "-q", "--no-ff", "-m", "merge feature", "feature", cwd=str(work))
    pk.push(work, "origin", "main")
    pk.commit(work, "c2")
    pk.push(work, "origin", "main")
    c3 = pk.commit(work, "c3")
    pk.push(work, "origin", "main")
    client = tmp_path / "client.git"         # main only: feature's t1 is behind main's merge, two pushes down
    _main_only(server, client)
    h.git("checkout", "-q", "feature", cwd=str(work))
    t2 = pk.commit(work, "t2")
    pk.push(work, "origin", "feature")
    store = _built(repo)
    req = FetchRequest(version=2, wants=[t2], haves=[c3], capabilities=CAPS)
    assert plan(req, _NoParents(store), _advertised(repo)).reason == "haves-not-proved"
    p = plan(req, StoreHistory(store), _advertised(repo))
    assert isinstance(p, Plan), p
    assert len(p.versions) == 1 and t1 in p.held
    assert any(t1[:12] in proof and "parents walked" in proof for proof in p.proofs)
    _complete(client, store, p, {"refs/heads/feature": t2})


def test_a_version_that_introduced_a_have_again_is_not_planned(root, server, tmp_path):
    repo = pk.enable_push(root / "repo.git")
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    h.git("checkout", "-q", "-b", "gone", cwd=str(work))
    pk.commit(work, "x")
    pk.push(work, "origin", "gone")
    client_haves = sorted(set(h.refs_of(str(repo)).values()))       # the client has x, and main
    pk.push(work, "origin", ":gone")                                 # deleted: x is reachable from no ref
    y = pk.commit(work, "y")
    pk.push(work, "origin", "HEAD:back")                             # x comes back below y
    store = _built(repo)
    req = FetchRequest(version=2, wants=[y], haves=client_haves, capabilities=CAPS)
    # rules 1-4 prove x (a have) and its parent: the plan would be the version that
    # introduced x again, whose pack sends x to a client that has it
    assert isinstance(plan(req, _Unchecked(store), _advertised(repo)), Plan)
    p = plan(req, StoreHistory(store), _advertised(repo))
    assert isinstance(p, Fallback) and p.reason == "haves-not-proved", p


def test_a_have_made_a_ref_value_again_later_does_not_hide_what_the_client_lacks(root, server, tmp_path):
    repo = pk.enable_push(root / "repo.git")
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    client = tmp_path / "client.git"
    _main_only(server, client)
    a = h.out("rev-parse", "HEAD", cwd=str(work))
    h.git("checkout", "-q", "-b", "feature", cwd=str(work))
    f1 = pk.commit(work, "f1")
    pk.push(work, "origin", "feature")                       # the client never fetched this
    pk.push(work, "origin", f"{a}:refs/heads/mark")          # the client's main becomes a ref value again
    f2 = pk.commit(work, "f2")
    pk.push(work, "origin", "feature")
    store = _built(repo)
    req = FetchRequest(version=2, wants=[f2], haves=[a], capabilities=CAPS)
    # the client state (the latest version where a have was a ref value) is after f1's version:
    # without the walk, f1's pack might hold what the client has
    assert plan(req, _NoParents(store), _advertised(repo)).reason == "haves-not-proved"
    p = plan(req, StoreHistory(store), _advertised(repo))
    assert isinstance(p, Plan), p
    assert len(p.versions) == 2 and f1 not in p.held
    _complete(client, store, p, {"refs/heads/feature": f2})
