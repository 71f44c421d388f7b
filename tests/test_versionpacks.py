"""Version packs: after real pushes through the server, each version's thin
pack holds exactly the objects its new values reach beyond its boundary, and
a client holding the version before it completes the version from that pack
alone (index-pack --fix-thin --strict, then fsck --strict)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from aspen_cgi.model.versions import ZERO
from aspen_cgi.packs import builder
from aspen_cgi.refstore.store import RefStore
from aspen_cgi.runtime.repository import Repository

from . import harness as h
from . import pushkit as pk


@pytest.fixture
def server(root: Path, server_factory):
    """These tests build the packs themselves: the server builds none (version packs are on by default)."""
    return server_factory(root, ASPEN_VERSION_PACKS="off")


def _store(repo: Path) -> RefStore:
    s = RefStore.open(Repository.of(str(repo), dict(os.environ, GIT_DIR=str(repo))))
    s.sync()
    return s


def _objects(repo: Path, tips, boundary) -> set[str]:
    args = ["rev-list", "--objects", "--stdin"]
    stdin = "".join(f"{t}\n" for t in tips) + "".join(f"^{b}\n" for b in boundary)
    res = subprocess.run(["git", *args], cwd=str(repo), input=stdin.encode(), capture_output=True, check=True)
    return {line.split()[0] for line in res.stdout.decode().splitlines() if line.strip()}


def _pack_objects(idx: str) -> set[str]:
    from dulwich.object_format import SHA1
    from dulwich.pack import load_pack_index
    i = load_pack_index(idx, SHA1)
    try:
        return {sha.hex() for sha, _, _ in i.iterentries()}
    finally:
        i.close()


def _history(root: Path, server, tmp_path: Path) -> tuple[Path, Path]:
    repo = pk.enable_push(root / "repo.git")
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    for i in range(4):
        (work / "grow.txt").write_text("".join(f"line {n}\n" for n in range(200 * (i + 1))))
        pk.commit(work, f"grow {i}")
        h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    h.git("checkout", "-q", "-b", "side", "HEAD~2", cwd=str(work))
    (work / "side.txt").write_text("side\n")
    pk.commit(work, "side")
    h.git("tag", "-a", "-m", "v", "vside", cwd=str(work))
    h.git("push", "-q", "origin", "side", "vside", cwd=str(work))
    h.git("push", "-q", "--force", "origin", "side~1:main", cwd=str(work))     # a force-push (rewind)
    h.git("push", "-q", "origin", ":refs/heads/topic", cwd=str(work))          # a delete
    return repo, work


def test_each_version_pack_is_exactly_its_objects_beyond_its_boundary(root, server, tmp_path):
    repo, _ = _history(root, server, tmp_path)
    store = _store(repo)
    built = dict(builder.build_packs(store))
    assert sorted(built) == list(range(1, store.latest() + 1))
    before: dict[str, str] = {}
    for v in range(1, store.latest() + 1):
        ups = [u for ver in store.log() if ver.id == v for u in ver.updates]
        tips = [u.new for u in ups if u.new != ZERO]
        (name, objects, size), boundary = store.version_pack(v)
        expected = _objects(repo, tips, boundary) if tips else set()
        pack = built[v]
        got = _pack_objects(pack.idx) if pack else set()
        assert got == expected, f"version {v}"
        assert objects == len(expected)
        # the boundary was reachable from the refs before the version, and is not in its pack
        if boundary:
            assert set(boundary) <= _objects(repo, list(before.values()), []), f"version {v}"
            assert not set(boundary) & got
        for u in ups:
            before.pop(u.ref, None) if u.new == ZERO else before.__setitem__(u.ref, u.new)
    assert builder.build_packs(store) == []          # built once


def test_client_one_version_behind_completes_from_the_version_pack(root, server, tmp_path):
    repo = pk.enable_push(root / "repo.git")
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    client = tmp_path / "client.git"
    h.git("clone", "-q", "--mirror", server.url + "/repo.git", str(client))
    old_tip = h.out("rev-parse", "main", cwd=str(client))
    for i in range(3):
        (work / "grow.txt").write_text("".join(f"line {n}\n" for n in range(300 * (i + 1))))
        pk.commit(work, f"grow {i}")
    h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    new_tip = h.out("rev-parse", "HEAD", cwd=str(work))
    store = _store(repo)
    built = dict(builder.build_packs(store))
    latest = store.latest()
    pack = built[latest]
    (_, _, _), boundary = store.version_pack(latest)
    assert boundary == [old_tip]
    with open(pack.pack, "rb") as f:
        h.git("index-pack", "--stdin", "--fix-thin", "--strict", cwd=str(client), input=f.read())
    h.git("update-ref", "refs/heads/main", new_tip, cwd=str(client))
    h.fsck_strict(str(client))
    assert h.out("rev-parse", "main", cwd=str(client)) == new_tip


def test_aspen_import_builds_the_whole_repository_as_version_one(tmp_path):
    repo = h.make_history(tmp_path / "repo.git", commits=8)
    res = subprocess.run([os.path.join(os.path.dirname(os.sys.executable), "aspen"), "import", "-q", str(repo)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "1 version packs built now" in res.stdout
    store = _store(repo)
    (name, objects, size), boundary = store.version_pack(1)
    assert boundary == []
    everything = _objects(repo, [r for r in h.refs_of(str(repo)).values()], [])
    assert objects == len(everything)
    assert _pack_objects(os.path.join(store.packs_dir, f"pack-{name}.idx")) == everything
    again = subprocess.run([os.path.join(os.path.dirname(os.sys.executable), "aspen"), "import", "-q", str(repo)],
                           capture_output=True, text=True)
    assert "0 version packs built now" in again.stdout
