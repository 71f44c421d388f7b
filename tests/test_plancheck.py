"""Refused plans checked against git's object walk (aspen_cgi/fetch/plancheck.py):
the planner's cost rule refuses a holder version when the client holds
commits introduced after it; the plan it refused is sent when `git
rev-list --objects WANTS --not HAVES` lists every object of its packs, or
as that listing's subset of them. A client that holds an unrelated later
commit gets the plan. One that holds a rewrite of the holder's commit (the
same tree), merged into the wanted commit, gets the subset: git's walk meets
the rewrite beside the holder's commit and leaves out its tree, which the
holder's pack would send again. A subset whose kept delta needs a left-out
base the client may lack is refused."""

from __future__ import annotations

import os
from pathlib import Path

from aspen_cgi.fetch import plancheck
from aspen_cgi.fetch.history import StoreHistory
from aspen_cgi.packs import builder
from aspen_cgi.planner.plan import Fallback, Plan, plan
from aspen_cgi.protocol.requests import FetchRequest
from aspen_cgi.refstore.store import RefStore
from aspen_cgi.runtime.repository import Repository

from . import harness as h
from . import pushkit as pk

CAPS = ["multi_ack_detailed", "thin-pack", "side-band-64k", "ofs-delta", "agent=git/2.39"]


def _built(repo: Path) -> RefStore:
    """The store with every version's pack: the server's builder first (it
    adopts each push's sent pack; building beside it would race it for the
    same file), then whatever is left, here."""
    if (repo / "aspen").is_dir():       # served: its store and builder exist
        h.wait_packs_built(repo)
    store = RefStore.open(Repository.of(str(repo), dict(os.environ, GIT_DIR=str(repo))))
    store.sync()
    builder.build_packs(store)
    return store


def _advertised(repo: Path) -> frozenset[str]:
    return frozenset(h.refs_of(str(repo)).values())


def _history(root: Path, server, tmp_path: Path, rewrite: bool) -> tuple[Path, Path, str, list[str]]:
    """main m; branch `a` gets a1 (version 2); branch `b` gets b1 (version 3): an
    unrelated commit, or with REWRITE a1 amended (a1's tree, another message);
    `a` then gets a2 (version 4): a child of a1, or with REWRITE the merge of
    a1 and b1. Returns repo, work clone, a2 and the haves of a client that
    fetched main and b after version 3."""
    repo = pk.enable_push(root / "repo.git")
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    m = h.out("rev-parse", "HEAD", cwd=str(work))
    h.git("checkout", "-q", "-b", "a", cwd=str(work))
    (work / "a.txt").write_text("".join(f"a line {i}\n" for i in range(400)))
    pk.commit(work, "a1")
    pk.push(work, "origin", "a")
    if rewrite:
        h.git("checkout", "-q", "-b", "b", cwd=str(work))
        h.git("commit", "-q", "--amend", "-m", "a1 again", cwd=str(work))
    else:
        h.git("checkout", "-q", "-b", "b", m, cwd=str(work))
        (work / "b.txt").write_text("".join(f"b line {i}\n" for i in range(400)))
        pk.commit(work, "b1")
    b1 = h.out("rev-parse", "HEAD", cwd=str(work))
    pk.push(work, "origin", "b")
    h.git("checkout", "-q", "a", cwd=str(work))
    if rewrite:      # git's walk meets b1 beside a1: b1's tree (a1's) is not sent
        h.git("merge", "-q", "--no-ff", "-m", "a2", "b", cwd=str(work))
        a2 = h.out("rev-parse", "HEAD", cwd=str(work))
    else:
        (work / "a2.txt").write_text("a2\n")
        a2 = pk.commit(work, "a2")
    pk.push(work, "origin", "a")
    return repo, work, a2, sorted({m, b1})


def _refused(repo: Path, a2: str, haves: list[str]) -> tuple[RefStore, Fallback]:
    store = _built(repo)
    req = FetchRequest(version=2, wants=[a2], haves=haves, capabilities=CAPS, done=True)
    got = plan(req, StoreHistory(store), _advertised(repo))
    assert isinstance(got, Fallback) and (got.reason, got.detail) == ("haves-not-proved", "held"), got
    assert got.candidate is not None, got
    candidate = got.candidate.plan()
    assert isinstance(candidate, Plan) and len(candidate.versions) == 2, got
    return store, got


def test_a_candidate_without_objects_the_client_has_passes_and_completes_it(root, server, tmp_path):
    repo, _, a2, haves = _history(root, server, tmp_path, rewrite=False)
    store, refused = _refused(repo, a2, haves)
    verdict = plancheck.check(str(repo), dict(os.environ), store.packs_dir, refused.candidate.plan().packs, [a2], haves,
                              {}, True)
    assert verdict.ok and verdict.objects > 0, verdict
    client = tmp_path / "client.git"
    h.git("init", "-q", "--bare", str(client))
    h.git("fetch", "-q", str(repo), *[f"{x}:refs/have/{i}" for i, x in enumerate(haves)], cwd=str(client))
    for name in refused.candidate.plan().packs:
        if name:
            with open(os.path.join(store.packs_dir, f"pack-{name}.pack"), "rb") as f:
                h.git("index-pack", "--stdin", "--fix-thin", "--strict", cwd=str(client), input=f.read())
    h.git("update-ref", "refs/heads/a", a2, cwd=str(client))
    h.fsck_strict(str(client))


def test_a_candidate_resending_a_rewritten_tree_is_refused_unless_partial(root, server, tmp_path):
    """Refused as it stands (its packs would resend the tree); as a partial
    candidate, the subset: exactly the objects git's walk lists, spliced
    from the candidate's packs; a client holding the haves ends complete."""
    from dataclasses import replace

    from aspen_cgi.fetch import planned
    repo, _, a2, haves = _history(root, server, tmp_path, rewrite=True)
    store, refused = _refused(repo, a2, haves)
    candidate = refused.candidate.plan()
    whole = plancheck.check(str(repo), dict(os.environ), store.packs_dir, candidate.packs, [a2], haves, {}, True)
    assert (whole.ok, whole.why) == (False, "overlap"), whole
    verdict = plancheck.check(str(repo), dict(os.environ), store.packs_dir, candidate.packs, [a2], haves, {}, True,
                              partial=True)
    assert (verdict.ok, verdict.why) == (True, "subset"), verdict
    listing = h.out("rev-list", "--objects", a2, *[f"^{x}" for x in haves], cwd=str(repo)).splitlines()
    assert verdict.only == frozenset(bytes.fromhex(line.split()[0]) for line in listing)
    assert verdict.objects > len(verdict.only)
    splice = planned.prepare(store.packs_dir, replace(candidate, only=verdict.only))
    data = b"".join(splice.chunks())
    assert splice.objects == len(verdict.only)
    client = tmp_path / "client.git"
    h.git("init", "-q", "--bare", str(client))
    h.git("fetch", "-q", str(repo), *[f"{x}:refs/have/{i}" for i, x in enumerate(haves)], cwd=str(client))
    h.git("index-pack", "--stdin", "--fix-thin", "--strict", cwd=str(client), input=data)
    h.git("update-ref", "refs/heads/a", a2, cwd=str(client))
    h.fsck_strict(str(client))


def test_a_subset_whose_delta_needs_a_base_the_client_may_lack_is_refused(tmp_path):
    """A pack of a blob and a delta on it; the listing names the delta's
    object alone. Without an edge commit holding the base: refused; with one
    whose tree holds it: the subset."""
    from aspen_cgi.packs.packfile import OBJ_OFS_DELTA, OBJ_REF_DELTA, Pack, PackIndex
    repo = tmp_path / "r.git"
    h.git("init", "-q", "--bare", str(repo))
    work = tmp_path / "w"
    h.git("clone", "-q", str(repo), str(work))
    text = "".join(f"line {i} of a file long enough to be worth a delta\n" for i in range(300))
    first = pk.commit(work, "first", name="g.txt")       # its tree holds neither blob
    (work / "f.txt").write_text(text)
    edge = pk.commit(work, "f", name="h.txt")
    (work / "f.txt").write_text(text + "one more\n")
    h.git("commit", "-q", "-am", "f again", cwd=str(work))
    blobs = [h.out("rev-parse", f"{c}:f.txt", cwd=str(work)) for c in (edge, "HEAD")]
    pack_dir = tmp_path / "packs"
    pack_dir.mkdir()
    name = h.git("pack-objects", "-q", str(pack_dir / "pack"), cwd=str(work),
                 input=("\n".join(blobs) + "\n").encode()).stdout.decode().strip()
    with Pack(pack_dir / f"pack-{name}.pack") as pack:
        kinds = {e.oid.hex(): e.type for e in pack.entries()}
    delta = next(b for b in blobs if kinds[b] in (OBJ_OFS_DELTA, OBJ_REF_DELTA))
    base = next(b for b in blobs if b != delta)
    h.git("push", "-q", "origin", "HEAD:refs/heads/main", cwd=str(work))
    index = {name: PackIndex.load(pack_dir / f"pack-{name}.idx")}
    only = {bytes.fromhex(delta)}
    lacking = plancheck._subset(str(repo), dict(os.environ), str(pack_dir), [name], dict(index), set(only),
                                [first], [], 2)
    assert (lacking.ok, lacking.why) == (False, "overlap"), lacking
    holding = [edge] if base == blobs[0] else [h.out("rev-parse", "HEAD", cwd=str(work))]
    held = plancheck._subset(str(repo), dict(os.environ), str(pack_dir), [name], dict(index), set(only),
                             holding, [], 2)
    assert (held.ok, held.why, held.only) == (True, "subset", frozenset(only)), held


def test_a_checked_candidate_is_served_end_to_end_and_a_rewrite_goes_to_git(root, server_factory, tmp_path):
    for rewrite in (False, True):
        where = tmp_path / ("rewrite" if rewrite else "fresh")
        r = where / "root"
        r.mkdir(parents=True)
        os.system(f"cp -a {root}/repo.git {r}/repo.git")
        server = server_factory(r, ASPEN_ACCESS_LOG="1", ASPEN_CACHE="off")
        repo, _, a2, _ = _history(r, server, where, rewrite)
        _built(repo)
        client = where / "client.git"
        h.git("clone", "-q", "--bare", "--single-branch", "--branch", "main", "--no-tags",
              server.url + "/repo.git", str(client))
        h.git("fetch", "-q", "origin", "+refs/heads/b:refs/heads/b", cwd=str(client))   # before a2: b1 only
        h.git("-c", "protocol.version=2", "fetch", "-q", "origin", "+refs/heads/a:refs/heads/a", cwd=str(client))
        h.fsck_strict(str(client))
        assert h.out("rev-parse", "refs/heads/a", cwd=str(client)) == a2
        last = h.last_fetch_line(server)
        if rewrite:
            assert "plan=fallback" in last and "checked=overlap" in last, last
        else:
            assert "plan=planned" in last and "checked=ok" in last, last


def test_a_client_behind_the_import_gets_gits_listing_of_the_import_pack(root, server_factory, tmp_path):
    """A client three commits behind the imported main, fetching a later push:
    the proof needs the import version (partial), and git's listing of the
    import and push packs is sent: planned, checked=subset, fsck clean."""
    repo = pk.enable_push(root / "repo.git")
    work = tmp_path / "work"
    h.git("clone", "-q", str(repo), str(work))
    text = "".join(f"line {i} of a long file\n" for i in range(400))
    for i in range(4):
        (work / "big.txt").write_text(text + f"edit {i}\n" * (i + 1))
        pk.commit(work, f"edit {i}", name="small.txt")
    h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    client = tmp_path / "client.git"
    h.git("clone", "-q", "--bare", "--single-branch", "--branch", "main", "--no-tags", str(repo), str(client))
    h.git("update-ref", "refs/heads/main", "main~3", cwd=str(client))
    h.git("reflog", "expire", "--expire=now", "--all", cwd=str(client))
    h.git("gc", "-q", "--prune=now", cwd=str(client))
    server = server_factory(root, ASPEN_ACCESS_LOG="1", ASPEN_CACHE="off")
    _built(repo)
    h.git("remote", "set-url", "origin", server.url + "/repo.git", cwd=str(work))
    pk.commit(work, "after the import", name="after.txt")
    pk.push(work, "origin", "HEAD:main")
    h.wait_packs_built(repo)
    h.git("remote", "add", "aspen", server.url + "/repo.git", cwd=str(client))
    h.git("-c", "protocol.version=2", "fetch", "-q", "aspen", "+refs/heads/main:refs/heads/main", cwd=str(client))
    h.fsck_strict(str(client))
    assert h.out("rev-parse", "refs/heads/main", cwd=str(client)) == pk.rev(repo, "refs/heads/main")
    last = h.last_fetch_line(server)
    assert "plan=planned" in last and "checked=subset" in last, last


def test_an_import_pack_too_large_for_a_subset_is_known_from_its_index_size(tmp_path):
    fixed = 8 + 256 * 4 + 2 * 20
    (tmp_path / "pack-big.idx").write_bytes(b"\0" * (fixed + 28 * (plancheck.SUBSET_MAX + 1)))
    (tmp_path / "pack-small.idx").write_bytes(b"\0" * (fixed + 28 * 100))
    assert plancheck.import_too_large(str(tmp_path), "big")
    assert not plancheck.import_too_large(str(tmp_path), "small")
    assert not plancheck.import_too_large(str(tmp_path), None)
    assert not plancheck.import_too_large(str(tmp_path), "gone")


def test_a_candidate_holding_a_commit_gits_walk_does_not_list_fails_on_the_commits_alone(root, server, tmp_path):
    """The commits a candidate's packs hold are looked for in git's commit
    walk first: all listed, the check goes on (and passes here); one the
    client has (git would not send it), it fails as an overlap."""
    repo, _, a2, haves = _history(root, server, tmp_path, rewrite=False)
    store, refused = _refused(repo, a2, haves)
    candidate = refused.candidate.plan()
    history = StoreHistory(store)
    commits = sorted({c for v in candidate.versions for c in history.introduced_commits(v)})
    assert commits and set(commits) <= set(h.out("rev-list", a2, *[f"^{x}" for x in haves], cwd=str(repo)).split())
    ok = plancheck.check(str(repo), dict(os.environ), store.packs_dir, candidate.packs, [a2], haves, {}, True,
                         commits=commits)
    assert ok.ok, ok
    held = plancheck.check(str(repo), dict(os.environ), store.packs_dir, candidate.packs, [a2], haves, {}, True,
                           commits=commits + [haves[0]])
    assert (held.ok, held.why) == (False, "overlap"), held
