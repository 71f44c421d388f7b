"""A push's version pack is the pack its client sent, when that pack holds
exactly the version's objects with thin bases in the boundary's trees
(versionpack.adopt); otherwise it is built by pack-objects as before.

- thinindex computes the index `git index-pack --fix-thin` computes;
- pushes through the server leave adopted version packs (recorded with
  window 0), the kept client packs are gone once built, and a client one
  push behind completes from them;
- a client pack with objects beyond the version's (the client did not know
  a ref the server had) is not adopted: the version pack is built;
- a pack whose delta base lies outside the boundary's trees is not adopted."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
import zlib
from pathlib import Path

import pytest
from dulwich.object_store import DiskObjectStore
from dulwich.pack import create_delta

from aspen_cgi.packs import background, thinindex, versionpack
from aspen_cgi.packs.packfile import PackError, encode_entry_header
from aspen_cgi.refstore.store import RefStore
from aspen_cgi.runtime.repository import Repository

from . import harness as h
from . import pushkit as pk


def _commit(work: Path, name: str, text: str) -> str:
    (work / name).write_text(text)
    h.git("add", "-A", cwd=str(work))
    h.git("commit", "-q", "-m", name, cwd=str(work))
    return h.out("rev-parse", "HEAD", cwd=str(work))


def _git_index(repo: Path, pack: bytes) -> list[tuple[str, int]]:
    """(id, offset) of the pack's own entries, as index-pack --fix-thin lists them."""
    scratch = repo / "scratch"
    scratch.mkdir(exist_ok=True)
    h.git("index-pack", "--stdin", "--fix-thin", "-o", str(scratch / "x.idx"), str(scratch / "x.pack"),
          cwd=str(repo), input=pack)
    out = subprocess.run(["git", "show-index"], stdin=open(scratch / "x.idx", "rb"), capture_output=True,
                         check=True).stdout.decode().split()
    end = len(pack) - 20
    return sorted((out[i + 1], int(out[i])) for i in range(0, len(out), 3) if int(out[i]) < end)


def test_thinindex_agrees_with_index_pack(tmp_path):
    repo = h.make_history(tmp_path / "repo.git", commits=6)
    work = tmp_path / "work"
    h.git("clone", "-q", str(repo), str(work))
    base = _commit(work, "grow.txt", "".join(f"line {j}\n" for j in range(200)))
    for i in range(4):
        _commit(work, "grow.txt", "".join(f"line {j}\n" for j in range(200 + i)) + f"grown {i}\n")
    tip = h.out("rev-parse", "HEAD", cwd=str(work))
    h.git("push", "-q", "origin", "HEAD:refs/heads/grow", cwd=str(work))
    pack = h.git("pack-objects", "--revs", "--thin", "--stdout", "-q", "--delta-base-offset", cwd=str(repo),
                 input=f"{tip}\n^{base}\n".encode()).stdout
    index = thinindex.index_thin(pack, versionpack.RepoObjects(Repository.of(str(repo))).raw)
    assert [(oid.hex(), off) for oid, off, _ in sorted(index.entries)] == _git_index(repo, pack)
    assert index.thin_bases                                   # the file's version at the base is a thin base
    with pytest.raises(PackError):
        thinindex.index_thin(pack[:-1] + bytes([pack[-1] ^ 1]), versionpack.RepoObjects(Repository.of(str(repo))).raw)


def _settled(store: RefStore, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        store.sync()
        if store.all_packs_built() and not any(n.startswith("sent-") for n in os.listdir(store.packs_dir)):
            return
        time.sleep(0.1)
    raise AssertionError("version packs not built")


def _windows(repo: Path) -> dict[int, int]:
    store = RefStore.open(Repository.of(str(repo), dict(os.environ)), create=False)
    return dict(store.conn.execute('SELECT version, "window" FROM version_packs'))


def test_pushes_leave_the_clients_packs_as_version_packs(root, server_factory, tmp_path):
    repo = pk.enable_push(root / "repo.git")
    server = server_factory(root)
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    behind = tmp_path / "behind"
    h.git("clone", "-q", "--bare", server.url + "/repo.git", str(behind))
    for i in range(3):
        _commit(work, f"f{i}.txt", f"push {i}\n" * 50)
        h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    store = RefStore.open(Repository.of(str(repo), dict(os.environ)), create=False)
    _settled(store)
    windows = _windows(repo)
    latest = store.latest()
    assert [windows[v] for v in range(latest - 2, latest + 1)] == [0, 0, 0], windows
    h.git("fetch", "-q", server.url + "/repo.git", "+refs/heads/*:refs/heads/*", cwd=str(behind))
    h.fsck_strict(str(behind))
    assert h.refs_of(str(behind)) == h.refs_of(str(repo))
    assert "plan=planned" in [line for line in server.log_text().splitlines() if "git-upload-pack" in line][-1]


def test_a_pack_with_objects_the_server_had_is_built_instead(root, server_factory, tmp_path):
    """The client holds side's first commit but not side's value on the
    server, so it sends that commit again: more than the version introduced;
    the version pack is built by pack-objects, with git's own search (the
    wide one is the segment packs')."""
    repo = pk.enable_push(root / "repo.git")
    server = server_factory(root)
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    side = _commit(work, "side.txt", "side\n" * 30)
    h.git("push", "-q", "origin", "HEAD:refs/heads/side", cwd=str(work))
    other = tmp_path / "other"
    h.git("clone", "-q", "--single-branch", "-b", "main", server.url + "/repo.git", str(other))
    h.git("fetch", "-q", str(work), f"{side}:refs/heads/mine", cwd=str(other))
    h.git("checkout", "-q", "mine", cwd=str(other))
    _commit(work, "side.txt", "side moved on\n" * 30)
    h.git("push", "-q", "origin", "HEAD:refs/heads/side", cwd=str(work))
    _commit(other, "more.txt", "more\n" * 30)
    h.git("push", "-q", "origin", "HEAD:refs/heads/more", cwd=str(other))
    store = RefStore.open(Repository.of(str(repo), dict(os.environ)), create=False)
    _settled(store)
    assert _windows(repo)[store.latest()] == background.quick_search(versionpack.DeltaSearch()).window == 10
    fresh = tmp_path / "fresh"
    h.git("clone", "-q", "--mirror", server.url + "/repo.git", str(fresh))
    h.fsck_strict(str(fresh))
    assert h.refs_of(str(fresh)) == h.refs_of(str(repo))


def test_a_pack_kept_after_its_version_was_built_is_removed(root, server_factory, tmp_path):
    """A push keeps its client's pack just after its version lands; a build
    already running can look for it before that and build the pack with git.
    The pack kept late is then removed by whichever comes second: the build
    (at the end of its run) or the push (when it looks for packs to adopt).
    Both orders are made here by putting the pack in place by hand."""
    from aspen_cgi.packs import builder
    from aspen_cgi.packs.sentpack import listing_path
    from aspen_cgi.refstore.registry import sent_pack_path
    repo = pk.enable_push(root / "repo.git")
    server = server_factory(root)
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    _commit(work, "late.txt", "late\n" * 30)
    h.git("push", "-q", "origin", "HEAD:refs/heads/late", cwd=str(work))
    store = RefStore.open(Repository.of(str(repo), dict(os.environ)), create=False)
    _settled(store)
    push_id = h.versions(repo)[-1]["push_id"]
    assert push_id and store.push_built(push_id)
    late = Path(sent_pack_path(store.packs_dir, push_id))
    kept_by_another = Path(sent_pack_path(store.packs_dir, "not-a-push-of-this-store"))
    for second in (lambda: builder.build_packs(store), lambda: background.adopt_now(store)):
        late.write_bytes(b"PACK kept after the build")
        Path(listing_path(str(late))).write_bytes(b"its listing")
        kept_by_another.write_bytes(b"PACK of a push not landed")
        second()
        assert not late.exists() and not os.path.exists(listing_path(str(late)))
        assert kept_by_another.exists(), "a pack whose push made no version here is not removed"


def _entry(type_code: int, body: bytes) -> bytes:
    return encode_entry_header(type_code, len(body)) + zlib.compress(body)


def _pack(entries: list[bytes]) -> bytes:
    data = b"PACK" + (2).to_bytes(4, "big") + len(entries).to_bytes(4, "big") + b"".join(entries)
    return data + hashlib.sha1(data).digest()


@pytest.mark.parametrize("base_in_boundary", [True, False])
def test_a_delta_base_outside_the_boundarys_trees_is_not_adopted(base_in_boundary, tmp_path):
    """A client served the version pack holds the boundary's closure only."""
    repo = tmp_path / "repo.git"
    h.git("init", "-q", "--bare", str(repo))
    work = tmp_path / "work"
    h.git("clone", "-q", str(repo), str(work))
    text = "".join(f"line {j}\n" for j in range(300))
    c1 = _commit(work, "f.txt", text)
    h.git("checkout", "-q", "-b", "other", cwd=str(work))
    _commit(work, "g.txt", text + "other\n")
    h.git("checkout", "-q", "-", cwd=str(work))
    c2 = _commit(work, "f.txt", text + "new\n")
    h.git("push", "-q", "origin", "other", f"{c1}:refs/heads/main", cwd=str(work))
    h.git("push", "-q", "origin", f"{c2}:refs/heads/next", cwd=str(work))
    objects = DiskObjectStore(str(repo / "objects"))
    blob_new = h.out("rev-parse", f"{c2}:f.txt", cwd=str(work))
    base = h.out("rev-parse", f"{c1}:f.txt" if base_in_boundary else "other:g.txt", cwd=str(work))
    tree = h.out("rev-parse", f"{c2}^{{tree}}", cwd=str(work))
    raw = {oid: objects.get_raw(oid.encode())[1] for oid in (c2, tree, blob_new, base)}
    delta = b"".join(create_delta(raw[base], raw[blob_new]))
    pack = _pack([_entry(1, raw[c2]), _entry(2, raw[tree]),
                  encode_entry_header(7, len(delta), base_oid=bytes.fromhex(base)) + zlib.compress(delta)])
    sent = tmp_path / "sent.pack"
    sent.write_bytes(pack)
    out = tmp_path / "packs"
    out.mkdir()
    built = versionpack.adopt([c2], versionpack.Boundary((c2,), (c1,)), str(sent), str(out),
                              versionpack.RepoObjects(Repository.of(str(repo))))
    if base_in_boundary:
        assert built is not None and built.objects == 3 and not sent.exists()
        client = tmp_path / "client.git"
        h.git("clone", "-q", "--bare", "--single-branch", "-b", "main", str(repo), str(client))
        h.git("index-pack", "--stdin", "--fix-thin", "--strict", cwd=str(client), input=Path(built.pack).read_bytes())
        h.git("update-ref", "refs/heads/next", c2, cwd=str(client))
        h.fsck_strict(str(client))
    else:
        assert built is None and sent.exists()


def test_a_listing_survives_its_file_and_a_damaged_one_is_none():
    from aspen_cgi.packs.sentpack import Listing
    a, b, c = "a" * 40, "b" * 40, "c" * 40
    odd = b"dir with space/\xff\xfe.bin".decode("utf-8", "surrogateescape")
    listing = Listing((a,), {a: (b, c), b: ()}, {c: "", "d" * 40: odd}, {a: 1700000001, b: 1700000000})
    data = listing.encode()
    assert Listing.decode(data) == listing
    assert Listing.decode(data[:-1]) is None                        # cut short
    assert Listing.decode(data.replace(b"t aaaa", b"t zzzz")) is None
    assert Listing.decode(data.replace(b"c 1700000001 ", b"c 17x0000001 ")) is None
    assert Listing.decode(b"aspen-listing 1\n" + data.split(b"\n", 1)[1]) is None   # an older format


def test_the_push_walks_listing_is_its_versions_boundary_when_it_ends_at_ref_values(tmp_path):
    """boundary_listed gives what boundary_of's rev-list gives when every
    commit outside the listing is a ref value before the version, and None
    otherwise; adopt() then takes the listed paths instead of reading trees."""
    from aspen_cgi.push import intake
    repo = tmp_path / "repo.git"
    h.git("init", "-q", "--bare", str(repo))
    work = tmp_path / "work"
    h.git("clone", "-q", str(repo), str(work))
    text = "".join(f"line {j}\n" for j in range(300))
    (work / "d").mkdir()
    c1 = _commit(work, "d/f.txt", text)
    c2 = _commit(work, "d/f.txt", text + "two\n")
    h.git("push", "-q", "origin", f"{c2}:refs/heads/main", cwd=str(work))
    c3 = _commit(work, "d/f.txt", text + "two\nthree\n")
    c4 = _commit(work, "e.txt", "e\n")
    pack = h.git("pack-objects", "--revs", "--thin", "--stdout", "-q", "--delta-base-offset", cwd=str(work),
                 input=f"{c4}\n^{c2}\n".encode()).stdout
    h.git("index-pack", "--stdin", "--fix-thin", cwd=str(repo), input=pack)
    env = dict(os.environ)
    walk = intake.connected(str(repo), env, [c4], with_commits=True)
    assert walk.ok and set(walk.commits) == {c3, c4} and walk.objects
    from aspen_cgi.packs.sentpack import Listing
    assert set(walk.times) == {c3, c4}
    listing = Listing((c4,), walk.commits, walk.objects, walk.times)
    listed = versionpack.boundary_listed(listing, [c4], [c4], {c2})
    assert listed == versionpack.boundary_of(Repository.of(str(repo), env), [c4], [c4], [c2])
    assert sorted(listed.introduced) == sorted([c3, c4]) and listed.commits == (c2,)
    assert versionpack.boundary_listed(listing, [c4], [c4], {c1}) is None     # c2 is no ref value there
    assert versionpack.boundary_listed(listing, [c3], [c3], {c2}) is None     # another version's tips
    sent = tmp_path / "sent.pack"
    sent.write_bytes(pack)
    out = tmp_path / "packs"
    out.mkdir()
    built = versionpack.adopt([c4], listed, str(sent), str(out), versionpack.RepoObjects(Repository.of(str(repo))),
                              listed=listing.objects)
    assert built is not None and built.objects == len(walk.commits) + len(walk.objects)
    client = tmp_path / "client.git"
    h.git("clone", "-q", "--bare", str(repo), str(client))
    h.git("index-pack", "--stdin", "--fix-thin", "--strict", cwd=str(client), input=Path(built.pack).read_bytes())
    h.git("update-ref", "refs/heads/main", c4, cwd=str(client))
    h.fsck_strict(str(client))
