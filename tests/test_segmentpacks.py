"""Segment packs end to end: a history of ~50 versions pushed through Aspen
over HTTP (branches made, annotated tags, an out-of-band `git update-ref`),
compacted by `aspen import` half-way and at the end. The segment packs recorded follow the binary schedule and hold
what their versions' refs reach beyond the refs before them; a protocol v2
mirror clone (strict client) is planned from O(log N) stored extents and
equals stock's clone; runs a larger one replaced are gone from disk; a
segment pack gone missing sends the clone to git, still correct. Once a
branch is deleted or main rewound, runs hold objects no ref reaches now: the
clone is no longer the cover, and the client still ends with exactly
stock's objects."""

from __future__ import annotations

import json
import math
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aspen_cgi.packs import background, builder, segmentpack
from aspen_cgi.packs.versionpack import scratch_owner
from aspen_cgi.refstore import db
from aspen_cgi.refstore.store import RefStore
from aspen_cgi.runtime.repository import Repository

from . import harness as h
from . import pushkit as pk

STEPS = 46          # pushes (some of two commits); with the import and the out-of-band changes, ~50 versions
HALF = 20           # `aspen import` after this many steps as well


def _store(repo: Path) -> RefStore:
    s = RefStore.open(Repository.of(str(repo), dict(os.environ, GIT_DIR=str(repo))))
    s.sync()
    return s


def _import(repo: Path) -> str:
    res = subprocess.run([sys.executable, "-m", "aspen_cgi.cli", "import", "-q", str(repo)],
                         capture_output=True, text=True, cwd=h.REPO_DIR)
    assert res.returncode == 0, res.stderr
    return res.stdout


def _objects(repo: Path, *revs: str) -> set[str]:
    res = subprocess.run(["git", "rev-list", "--objects", "--stdin"], cwd=str(repo), capture_output=True, check=True,
                         input="".join(f"{r}\n" for r in revs).encode())
    return {line.split()[0] for line in res.stdout.decode().splitlines() if line.strip()}


def _all_objects(repo: Path) -> set[str]:
    """Every object in REPO, reachable or not."""
    out = h.out("cat-file", "--batch-all-objects", "--batch-check=%(objectname)", cwd=str(repo))
    return set(out.split())


def _pack_objects(idx: Path) -> set[str]:
    from dulwich.object_format import SHA1
    from dulwich.pack import load_pack_index
    i = load_pack_index(str(idx), SHA1)
    try:
        return {sha.hex() for sha, _, _ in i.iterentries()}
    finally:
        i.close()


def _clone(url: str, dest: Path) -> None:
    h.git("-c", "protocol.version=2", "-c", "transfer.fsckObjects=true", "clone", "-q", "--mirror", url, str(dest))


def _pack_bytes(repo: Path) -> int:
    return sum(p.stat().st_size for p in (repo / "objects" / "pack").glob("*.pack"))


def _edit(rng: random.Random, work: Path, tag: str) -> None:
    """Edit a few of a handful of growing text files (so deltas matter)."""
    for _ in range(rng.randint(1, 3)):
        f = work / f"src{rng.randrange(4)}.txt"
        lines = f.read_text().splitlines() if f.exists() else []
        for _ in range(rng.randint(5, 40)):
            at = rng.randrange(len(lines) + 1)
            if lines and rng.random() < 0.3:
                del lines[min(at, len(lines) - 1)]
            else:
                lines.insert(at, f"{tag} {rng.random():.12f} " + "word " * rng.randint(1, 12))
        f.write_text("\n".join(lines) + "\n")
    h.git("add", "-A", cwd=str(work))
    h.git("commit", "-q", "-m", tag, cwd=str(work))


def _push_history(rng: random.Random, work: Path, repo: Path, steps: range, features: list[str],
                  rewrites: bool = False) -> None:
    """REWRITES: also delete branches and rewind main (then a full clone is
    no longer the segment cover: runs hold objects no ref reaches now)."""
    def git(*args: str) -> None:
        h.git(*args, cwd=str(work))
    for step in steps:
        git("checkout", "-q", "main")
        if step % 10 == 3:                                  # a feature branch from main
            name = f"feature{step}"
            git("checkout", "-q", "-b", name)
            _edit(rng, work, name)
            git("push", "-q", "origin", name)
            features.append(name)
        elif step % 10 == 6 and features and rewrites:      # a branch deleted
            git("push", "-q", "origin", f":refs/heads/{features.pop(0)}")
        elif step % 10 == 8 and rewrites:                   # main rewound and rewritten
            git("reset", "-q", "--hard", "HEAD~1")
            _edit(rng, work, f"rewrite{step}")
            git("push", "-q", "--force", "origin", "HEAD:main")
        elif step % 10 == 9:                                # an annotated tag
            git("tag", "-a", "-m", f"release {step}", f"v{step}")
            git("push", "-q", "origin", f"v{step}")
        elif step in (14, 33):                              # out of band, then seen by the next request
            main = h.out("rev-parse", "main", cwd=str(repo))
            if step == 14:
                h.git("update-ref", "refs/heads/outside", f"{main}~1", cwd=str(repo))
            elif rewrites:
                h.git("update-ref", "-d", "refs/heads/outside", cwd=str(repo))
            _edit(rng, work, f"s{step}")
            git("push", "-q", "origin", "HEAD:main")
        else:
            _edit(rng, work, f"s{step}")
            if step % 4 == 1:
                _edit(rng, work, f"s{step}b")
            git("push", "-q", "origin", "HEAD:main")


@pytest.fixture(scope="module")
def compacted(tmp_path_factory):
    """(server, repo, segment packs recorded at the half-way import)."""
    base = tmp_path_factory.mktemp("segments")
    root = base / "root"
    root.mkdir()
    repo = pk.enable_push(h.make_history(root / "repo.git"))
    server = h.Server(root, {"ASPEN_ACCESS_LOG": "1", "ASPEN_CACHE": "off"}).start()   # each fetch planned anew
    try:
        work = base / "work"
        h.git("clone", "-q", server.url + "/repo.git", str(work))
        rng = random.Random(5)
        features: list[str] = []
        _push_history(rng, work, repo, range(HALF), features)
        _import(repo)
        early = _store(repo).segment_packs()
        half = base / "half.git"                    # a clone from the half-way runs
        _clone(server.url + "/repo.git", half)
        h.fsck_strict(str(half))
        assert h.refs_of(str(half)) == h.refs_of(str(repo))
        assert "plan=planned" in h.last_fetch_line(server)
        _push_history(rng, work, repo, range(HALF, STEPS), features)
        _store(repo)                        # the last out-of-band change is recorded
        out = _import(repo)
        assert "segment packs built now" in out, out
        yield server, repo, early
    finally:
        server.stop()


def test_segment_packs_follow_the_schedule_and_hold_what_their_runs_reach(compacted):
    _, repo, early = compacted
    store = _store(repo)
    n = store.latest()
    assert 40 <= n <= 70, n
    kinds = {v.kind for v in store.log()}
    assert kinds == {"import", "push", "external"}
    runs = [(s.lo, s.hi) for s in store.segment_packs()]
    assert runs == segmentpack.schedule(n)
    assert [(s.lo, s.hi) for s in early] == segmentpack.schedule(early[-1].hi if early else 0)[:len(early)]
    for s in store.segment_packs():
        after = db.refs_before(store.conn, s.hi + 1).values()
        before = db.refs_before(store.conn, s.lo).values()
        expected = _objects(repo, *after, *(f"^{b}" for b in before))
        assert s.objects == len(expected), (s.lo, s.hi)
        assert _pack_objects(Path(store.packs_dir) / f"pack-{s.name}.idx") == expected, (s.lo, s.hi)


def test_v2_mirror_clone_is_planned_from_segment_packs_and_equals_stock(compacted, cgi_server_factory, tmp_path):
    server, repo, _ = compacted
    n = _store(repo).latest()
    client = tmp_path / "client.git"
    _clone(server.url + "/repo.git", client)
    h.fsck_strict(str(client))
    assert h.refs_of(str(client)) == h.refs_of(str(repo))
    last = h.last_fetch_line(server)
    assert "plan=planned" in last, last
    extents = int(re.search(r"extents=(\d+)", last).group(1))
    assert extents <= math.ceil(math.log2(n)) + 2, last
    stock = cgi_server_factory(repo.parent, "stock")
    other = tmp_path / "stock.git"
    _clone(stock.url + "/repo.git", other)
    assert h.refs_of(str(other)) == h.refs_of(str(client))
    assert _all_objects(other) == _all_objects(client)
    ours, theirs = _pack_bytes(client), _pack_bytes(other)
    print(json.dumps({"versions": n, "extents": extents, "aspen_bytes": ours, "stock_bytes": theirs,
                      "ratio": round(ours / theirs, 3)}))
    # Stock packs this repository afresh: its pushes were exploded into loose
    # objects (as stock's receive-pack does), so every delta is searched anew,
    # while the splice cannot delta across its extents. The splice may cost a
    # little over stock's pack here (1.03x measured); never much more.
    assert ours <= 1.10 * theirs, (ours, theirs)


def test_runs_inside_a_larger_one_are_gone_from_disk(compacted):
    _, repo, early = compacted
    store = _store(repo)
    kept = store.segment_packs()
    packs = Path(store.packs_dir)
    for s in kept:
        assert (packs / f"pack-{s.name}.pack").is_file() and (packs / f"pack-{s.name}.idx").is_file()
    replaced = [s for s in early if (s.lo, s.hi) not in {(k.lo, k.hi) for k in kept}]
    assert replaced, "the half-way runs were all kept: nothing to check"
    used = db.pack_names(store.conn)
    for s in replaced:
        assert any(k.lo <= s.lo and s.hi <= k.hi for k in kept), (s.lo, s.hi)
        assert s.name in used or not (packs / f"pack-{s.name}.pack").exists(), (s.lo, s.hi)


def test_a_missing_segment_pack_sends_the_clone_to_git(compacted, tmp_path):
    server, repo, _ = compacted
    store = _store(repo)
    biggest = max(store.segment_packs(), key=lambda s: s.size)
    path = Path(store.packs_dir) / f"pack-{biggest.name}.pack"
    aside = tmp_path / path.name
    path.rename(aside)
    try:
        client = tmp_path / "client.git"
        _clone(server.url + "/repo.git", client)
        h.fsck_strict(str(client))
        assert h.refs_of(str(client)) == h.refs_of(str(repo))
        assert "why=pack-error" in h.last_fetch_line(server)
    finally:
        aside.rename(path)
    again = tmp_path / "again.git"
    _clone(server.url + "/repo.git", again)
    assert "plan=planned" in h.last_fetch_line(server)
    h.verify_ok(repo)


def test_a_single_branch_clone_is_not_sent_every_ref(compacted, cgi_server_factory, tmp_path):
    """A client that wants some refs only gets the version walk (or git), never
    the whole repository's segment packs: it ends with what stock sends it."""
    server, repo, _ = compacted
    stock = cgi_server_factory(repo.parent, "stock")
    clients = []
    for url, name in ((server.url, "one"), (stock.url, "stock")):
        client = tmp_path / name
        h.git("-c", "protocol.version=2", "-c", "transfer.fsckObjects=true", "clone", "-q", "--bare",
              "--single-branch", "--branch", "main", url + "/repo.git", str(client))
        h.fsck_strict(str(client))
        clients.append(client)
    assert h.refs_of(str(clients[0])) == h.refs_of(str(clients[1]))
    assert _all_objects(clients[0]) == _all_objects(clients[1])


def test_pushes_compact_in_the_background(root, server_factory, tmp_path):
    """With ASPEN_VERSION_PACKS=auto the builder a push starts also builds the
    segment packs, and removes those a larger one replaced; it packs the
    import again with the wide search (the quick pack's files stay an hour)."""
    server = server_factory(root, ASPEN_ACCESS_LOG="1", ASPEN_VERSION_PACKS="auto")
    repo = pk.enable_push(root / "repo.git")
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    rng = random.Random(3)
    for i in range(8):
        _edit(rng, work, f"b{i}")
        h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    store = _store(repo)
    packs = Path(store.packs_dir)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        store.sync()
        if (store.all_packs_built() and not builder.segments_to_build(store)
                and background.import_final(store)
                and not (packs / ".build.lock").exists() and not (packs / ".segments.lock").exists()):
            break
        time.sleep(0.2)
    n = store.latest()
    assert [(s.lo, s.hi) for s in store.segment_packs()] == segmentpack.schedule(n)
    client = tmp_path / "client.git"
    _clone(server.url + "/repo.git", client)
    h.fsck_strict(str(client))
    assert h.refs_of(str(client)) == h.refs_of(str(repo))
    last = h.last_fetch_line(server)
    assert "plan=planned" in last, last
    assert int(re.search(r"extents=(\d+)", last).group(1)) <= 1 + len(segmentpack.schedule(n)) + 1
    names = {p.stem[5:] for p in packs.glob("pack-*.pack")}
    used = {s.name for s in store.segment_packs()} | {store.version_pack(v)[0][0] for v in range(1, n + 1)}
    assert len(names - used) <= 1          # the import's quick pack, replaced by its wide one
    assert background.import_final(store)


def test_verify_checks_the_runs_and_the_sweep_clears_what_crashed_builders_left(root, tmp_path):
    repo = root / "repo.git"
    store = _store(repo)
    builder.build_packs(store)
    packs = Path(store.packs_dir)
    for lo, hi in ((2, 5), (4, 7)):
        db.write(store.conn, lambda conn, lo=lo, hi=hi: db.record_segment_pack(conn, lo, hi, "", 0, 0, 0.0, 1, 1, 1))
    problems = store.verify().problems
    assert any("outside versions 2-1" in p for p in problems)
    assert any("4-7 overlap" in p or "2-5 and 4-7 overlap" in p for p in problems)
    db.write(store.conn, lambda conn: conn.execute("DELETE FROM segment_packs"))
    assert store.verify().ok
    dead = packs / "build-1.1-xyz"                 # pid 1 did not start at tick 1: a crashed builder's
    dead.mkdir()
    (dead / "thin.pack").write_bytes(b"PACK")
    mine = packs / f"build-{scratch_owner()}-abc"
    mine.mkdir()
    orphans = [packs / ("pack-" + "e" * 40 + ext) for ext in (".pack", ".idx")]
    for o in orphans:
        o.write_bytes(b"x")
    kept = [packs / f"pack-{store.version_pack(1)[0][0]}{ext}" for ext in (".pack", ".idx")]
    assert builder.sweep_packs(store) == [str(dead)]      # pack files no row names are kept for an hour
    assert sorted(builder.sweep_packs(store, min_age=0)) == sorted(str(o) for o in orphans)
    assert mine.exists() and all(k.exists() for k in kept)


def test_after_deletes_and_rewinds_a_clone_holds_exactly_stocks_objects(root, cgi_server_factory, tmp_path):
    repo = pk.enable_push(root / "repo.git")
    server = h.Server(root, {"ASPEN_ACCESS_LOG": "1"}).start()
    try:
        work = tmp_path / "work"
        h.git("clone", "-q", server.url + "/repo.git", str(work))
        _push_history(random.Random(7), work, repo, range(30), [], rewrites=True)
        _store(repo)
        _import(repo)
        client, other = tmp_path / "client.git", tmp_path / "stock.git"
        _clone(server.url + "/repo.git", client)
        last = h.last_fetch_line(server)
        stock = cgi_server_factory(repo.parent, "stock")
        _clone(stock.url + "/repo.git", other)
        h.fsck_strict(str(client))
        assert h.refs_of(str(client)) == h.refs_of(str(repo)) == h.refs_of(str(other))
        assert _all_objects(client) == _all_objects(other)
        assert "plan=fallback why=extra-objects" in last or "plan=planned" in last, last
        assert not re.search(r"extents=[1-7] ", last), last        # not the O(log N) cover
    finally:
        server.stop()
