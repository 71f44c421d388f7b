"""Splicing stored packs (aspen_cgi.packs): real git packs, judged by git.

One history is built per module: a file growing commit by commit with older
lines edited too (delta chains, not a star), a config file reverted back and
forth (the same blob introduced twice), a directory of 30 files with one
changing (its tree versions form a second delta chain interleaved with the
first), and a large incompressible blob that never changes (it sits between
delta bases and their deltas, so dropping it changes OFS varint lengths). From it: consecutive thin version packs (`pack-objects
--revs --thin`, stored completed by `index-pack --fix-thin` and spliced with
their own objects as `include`), a full pack of the tip, and a full pack of
the first commit. Every spliced result is handed to `git index-pack --strict`
and `git verify-pack` / `git fsck --strict`.
"""

from __future__ import annotations

import hashlib
import io
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from aspen_cgi.packs.packfile import (
    OBJ_BLOB,
    OBJ_COMMIT,
    OBJ_OFS_DELTA,
    OBJ_REF_DELTA,
    OBJ_TAG,
    OBJ_TREE,
    TYPE_NAMES,
    Entry,
    Pack,
    PackError,
    PackIndex,
    decode_ofs_distance,
    decode_type_size,
    encode_entry_header,
    encode_ofs_distance,
    encode_type_size,
    read_entry_header,
)
from aspen_cgi.packs.splice import CHUNK, Extent, iter_splice, plan_splice, splice

from .harness import git, out

TIPS = 7  # commits v0 .. v6
BIG = 24 * 1024  # the unchanging random blob: more than the 2-byte OFS range (16511)


@dataclass
class Stored:
    """A stored pack (its .idx beside it) and the objects it stands for."""
    pack: Path
    own: frozenset[bytes]  # the thin pack's own objects (all, for a full pack)

    def extent(self) -> Extent:
        return Extent(self.pack, include=self.own)

    def whole(self) -> Extent:
        return Extent(self.pack)


@dataclass
class World:
    tmp: Path
    src: Path                 # the server's repository (non-bare work tree)
    tips: list[str]           # commit ids of v0 .. v6
    thin: dict[int, Stored]   # k -> Q_k, `pack-objects --revs --thin` of v_k ^v_{k-1}, k >= 1
    thin_raw: dict[int, bytes]
    full: Stored              # every object of v6
    base0: Stored             # every object of v0

    def objects_of(self, k: int, not_k: Optional[int] = None) -> set[bytes]:
        """`rev-list --objects v_k [^v_not_k]`: like pack-objects, it excludes
        only what the excluded commits' own trees hold, so a reverted blob
        from older history is listed again."""
        args = [self.tips[k]] + ([f"^{self.tips[not_k]}"] if not_k is not None else [])
        lines = out("rev-list", "--objects", *args, cwd=str(self.src)).splitlines()
        return {bytes.fromhex(line.split()[0]) for line in lines if line}


def _oids_before(index: PackIndex, limit: int) -> frozenset[bytes]:
    return frozenset(index.oid(i) for i in range(index.count) if index.offset(i) < limit)


def _write_pack(dest: Path, pack_bytes: bytes, cwd: Path, fix_thin: bool = False) -> Path:
    """Store `pack_bytes` at dest (+ .idx) the way git would index it."""
    if fix_thin:
        git("index-pack", "--stdin", "--fix-thin", str(dest), cwd=str(cwd), input=pack_bytes)
    else:
        dest.write_bytes(pack_bytes)
        git("index-pack", str(dest), cwd=str(cwd))
    assert dest.with_suffix(".idx").exists()
    return dest


def _pack_objects(repo: Path, stdin: str, *args: str) -> bytes:
    return git("pack-objects", "--stdout", "--delta-base-offset", *args, cwd=str(repo),
               input=stdin.encode()).stdout


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    tmp = tmp_path_factory.mktemp("splice")
    src = tmp / "src"
    git("init", "-q", "-b", "main", str(src))
    rng = random.Random(1234)
    (src / "z.bin").write_bytes(rng.randbytes(BIG))
    (src / "lib").mkdir()
    for i in range(30):  # a tree big enough for git to deltify its versions
        (src / "lib" / f"static{i:02}.txt").write_text(f"static file {i}\n")
    conf = ["alpha", "alpha", "beta", "alpha", "beta", "gamma", "gamma"]
    grow: list[str] = []
    tips = []
    for k in range(TIPS):
        # Grows, and older lines are edited too: each version is closest to
        # its neighbours, so git builds delta chains, not a star.
        for _ in range(3 if grow else 0):
            i = rng.randrange(len(grow))
            grow[i] = f"{rng.getrandbits(128):032x} edited at {k}\n"
        grow += [f"{rng.getrandbits(128):032x} line {k}.{j}\n" for j in range(40 if k else 120)]
        (src / "grow.txt").write_text("".join(grow))
        (src / "conf.txt").write_text(f"setting = {conf[k]}\n" * 20)
        (src / "lib" / f"m{k % 2}.txt").write_text(f"module {k % 2} at {k}\n" * (5 + k))
        git("add", "-A", cwd=str(src))
        git("commit", "-q", "-m", f"commit {k}", cwd=str(src))
        tips.append(out("rev-parse", "HEAD", cwd=str(src)))
        git("branch", f"v{k}", cwd=str(src))
    store = tmp / "store"
    store.mkdir()
    thin, thin_raw = {}, {}
    for k in range(1, TIPS):
        raw = _pack_objects(src, f"{tips[k]}\n^{tips[k - 1]}\n", "--revs", "--thin")
        path = _write_pack(store / f"q{k}.pack", raw, src, fix_thin=True)
        own = _oids_before(PackIndex.load(path.with_suffix(".idx")), len(raw) - 20)
        thin[k], thin_raw[k] = Stored(path, own), raw
    full_raw = _pack_objects(src, tips[-1] + "\n", "--revs", "--window=50", "--depth=50")
    full = _write_pack(store / "full.pack", full_raw, src)
    base_raw = _pack_objects(src, tips[0] + "\n", "--revs")
    base0 = _write_pack(store / "base0.pack", base_raw, src)
    w = World(tmp, src, tips, thin, thin_raw,
              Stored(full, frozenset(PackIndex.load(full.with_suffix(".idx")).oids)),
              Stored(base0, frozenset(PackIndex.load(base0.with_suffix(".idx")).oids)))
    # The history is what the tests need: thin packs really are thin, and own
    # objects are exactly what rev-list says each version introduced.
    # (v1's growth is too large a delta for git: git stores it whole.)
    for k in range(1, TIPS):
        if k >= 2:
            assert len(w.thin[k].own) < PackIndex.load(w.thin[k].pack.with_suffix(".idx")).count
        assert w.thin[k].own == w.objects_of(k, k - 1)
        assert w.thin[k].own >= w.objects_of(k) - w.objects_of(k - 1)
    assert w.full.own == w.objects_of(TIPS - 1)
    return w


# --------------------------------------------------------------------------
# helpers: judge a spliced pack with git and with our own reader


def _splice_bytes(extents: list[Extent]):
    buf = io.BytesIO()
    result = splice(extents, buf)
    return buf.getvalue(), result


def _empty_repo(tmp: Path, name: str) -> Path:
    repo = tmp / name
    if repo.exists():
        shutil.rmtree(repo)
    git("init", "-q", "--bare", str(repo))
    return repo


def _index_standalone(world: World, data: bytes, name: str) -> Pack:
    """`git index-pack --strict` on a self-contained pack, outside any object
    store that could supply bases; returns the pack opened with git's index."""
    repo = _empty_repo(world.tmp, name + ".git")
    path = world.tmp / f"{name}.pack"
    path.write_bytes(data)
    git("index-pack", "--strict", str(path), cwd=str(repo))
    return Pack(path)


def _verify_pack(idx: Path, cwd: Path) -> dict[bytes, list[str]]:
    """oid -> the other columns of `git verify-pack -v`."""
    listing = out("verify-pack", "-v", str(idx), cwd=str(cwd))
    rows = {}
    for line in listing.splitlines():
        m = re.match(r"^([0-9a-f]{40}) (.*)$", line)
        if m:
            rows[bytes.fromhex(m.group(1))] = m.group(2).split()
    return rows


def _check_structure(data: bytes, result) -> None:
    assert data[:4] == b"PACK"
    assert int.from_bytes(data[4:8], "big") == 2
    assert int.from_bytes(data[8:12], "big") == result.objects
    assert len(data) == result.bytes
    assert data[-20:] == hashlib.sha1(data[:-20]).digest() == result.checksum


def _kept_source(extents: list[Extent], packs: list[Pack]) -> dict[bytes, tuple[Pack, Entry]]:
    """For every object the splice must have written: the stored entry it was
    copied from (the first extent that includes it)."""
    chosen: dict[bytes, tuple[Pack, Entry]] = {}
    for ext in extents:
        pack = ext.open()
        packs.append(pack)
        for e in pack.entries():
            if (ext.include is None or e.oid in ext.include) and e.oid not in chosen:
                chosen[e.oid] = (pack, e)
    return chosen


def _compare_payloads(spliced: Pack, extents: list[Extent]) -> dict[str, int]:
    """Every output entry's compressed bytes equal its source entry's; headers
    differ only for source OFS_DELTAs. Returns counts of what differed."""
    packs: list[Pack] = []
    counts = {"rewritten": 0, "to_ref": 0, "shorter": 0, "longer": 0}
    try:
        sources = _kept_source(extents, packs)
        out_entries = list(spliced.entries())
        assert {e.oid for e in out_entries} == set(sources)
        for e in out_entries:
            src_pack, s = sources[e.oid]
            assert spliced.data[e.data_offset:e.end] == src_pack.data[s.data_offset:s.end], \
                f"payload of {e.oid.hex()} differs from the stored bytes"
            assert e.size == s.size
            same_header = spliced.data[e.offset:e.data_offset] == src_pack.data[s.offset:s.data_offset]
            if s.type != OBJ_OFS_DELTA:
                assert same_header, f"non-OFS entry {e.oid.hex()} had its header changed"
                continue
            if not same_header:
                counts["rewritten"] += 1
                if e.type == OBJ_REF_DELTA:
                    counts["to_ref"] += 1
                elif e.header_length < s.header_length:
                    counts["shorter"] += 1
                elif e.header_length > s.header_length:
                    counts["longer"] += 1
    finally:
        for p in packs:
            p.close()
    return counts


# --------------------------------------------------------------------------
# (a) consecutive thin packs, a client some pushes behind, strict


@pytest.mark.parametrize("have", [0, 1, 3])
def test_consecutive_thin_packs_accepted_by_strict_client(world: World, have: int) -> None:
    client = _empty_repo(world.tmp, f"client{have}.git")
    git("fetch", "-q", "--no-tags", str(world.src), f"refs/heads/v{have}:refs/heads/main",
        cwd=str(client))
    extents = [world.thin[k].extent() for k in range(have + 1, TIPS)]
    data, result = _splice_bytes(extents)
    _check_structure(data, result)
    owns = [world.thin[k].own for k in range(have + 1, TIPS)]
    expected = frozenset().union(*owns)
    assert expected >= world.objects_of(TIPS - 1) - world.objects_of(have)
    assert result.objects == len(expected)
    own_total = sum(map(len, owns))
    assert result.duplicates == own_total - len(expected)
    assert result.excluded > 0  # the appended bases of the completed packs
    # fix-thin appends those bases after the pack's own entries, so an extent
    # without duplicates is copied with no entry header read at all.
    clean = sum(1 for i, o in enumerate(owns) if not o & frozenset().union(*owns[:i]))
    assert result.verbatim_extents == clean >= 1
    git("index-pack", "--stdin", "--fix-thin", "--strict", cwd=str(client), input=data)
    git("update-ref", "refs/heads/main", world.tips[-1], cwd=str(client))
    fsck = git("fsck", "--strict", "--no-dangling", cwd=str(client), check=False)
    assert fsck.returncode == 0 and not fsck.stdout.strip() and b"error" not in fsck.stderr, fsck
    want = "\n".join(o.hex() for o in world.objects_of(TIPS - 1)) + "\n"
    batch = git("cat-file", "--batch-check", cwd=str(client), input=want.encode()).stdout.decode()
    assert "missing" not in batch and len(batch.splitlines()) == len(world.objects_of(TIPS - 1))
    git("rev-list", "--objects", "main", cwd=str(client))


def test_revert_makes_duplicates_that_strict_rejects_unless_dropped(world: World) -> None:
    """The same blob introduced twice (a revert) is in two version packs; a
    naive concatenation is rejected by --strict, the splice is not."""
    ks = range(1, TIPS)
    owns = [world.thin[k].own for k in ks]
    assert sum(map(len, owns)) > len(frozenset().union(*owns)), "history must overlap"
    body = b"".join(world.thin_raw[k][12:-20] for k in ks)
    naive = b"PACK" + (2).to_bytes(4, "big") + sum(len(o) for o in owns).to_bytes(4, "big") + body
    naive += hashlib.sha1(naive).digest()
    client = _empty_repo(world.tmp, "naive.git")
    git("fetch", "-q", "--no-tags", str(world.src), "refs/heads/v0:refs/heads/main", cwd=str(client))
    rejected = git("index-pack", "--stdin", "--fix-thin", "--strict", cwd=str(client), input=naive,
                   check=False)
    assert rejected.returncode != 0 and b"twice" in rejected.stderr
    data, result = _splice_bytes([world.thin[k].extent() for k in ks])
    assert result.duplicates == sum(map(len, owns)) - len(frozenset().union(*owns))
    git("index-pack", "--stdin", "--fix-thin", "--strict", cwd=str(client), input=data)


# --------------------------------------------------------------------------
# (b) header count, trailer, exact object set, our reader agrees with git


def test_self_contained_splice_structure_and_object_set(world: World) -> None:
    extents = [world.base0.whole()] + [world.thin[k].extent() for k in range(1, TIPS)]
    data, result = _splice_bytes(extents)
    _check_structure(data, result)
    with _index_standalone(world, data, "selfcontained") as spliced:
        rows = _verify_pack(spliced.path.with_suffix(".idx"), world.tmp)
        expected = world.objects_of(TIPS - 1)
        assert set(rows) == expected and len(rows) == result.objects == spliced.count
        _reader_agrees_with_verify_pack(spliced, rows)
    # iter_splice yields the same bytes in fixed-size chunks
    chunks = list(iter_splice(extents, chunk_size=4096))
    assert b"".join(chunks) == data
    assert all(len(c) == 4096 for c in chunks[:-1]) and 0 < len(chunks[-1]) <= 4096 + 20
    default = list(iter_splice(extents))
    assert b"".join(default) == data and all(len(c) == CHUNK for c in default[:-1])
    # count and size are known before the first byte (a Content-Length)
    plan = plan_splice(extents)
    assert (plan.size, plan.objects, plan.result) == (len(data), result.objects, None)
    assert b"".join(plan.chunks()) == data and plan.result == result
    with pytest.raises(RuntimeError):
        plan.chunks()


def _reader_agrees_with_verify_pack(pack: Pack, rows: dict[bytes, list[str]]) -> None:
    """verify-pack -v: type size size-in-pack offset [depth base]."""
    by_offset = {e.offset: e for e in pack.entries()}
    for e in by_offset.values():
        row = rows[e.oid]
        assert int(row[1]) == e.size
        assert int(row[2]) == e.length
        assert int(row[3]) == e.offset
        if e.type == OBJ_OFS_DELTA:
            assert bytes.fromhex(row[5]) == by_offset[e.base_offset].oid
        elif e.type == OBJ_REF_DELTA:
            assert bytes.fromhex(row[5]) == e.base_oid
        else:
            assert row[0] == TYPE_NAMES[e.type] and len(row) == 4


def test_reader_agrees_with_git_on_stored_packs(world: World) -> None:
    for stored in [world.full, world.base0, *world.thin.values()]:
        with Pack(stored.pack) as pack:
            rows = _verify_pack(stored.pack.with_suffix(".idx"), world.tmp)
            assert len(rows) == pack.count
            _reader_agrees_with_verify_pack(pack, rows)
            pack.verify_checksum()
            shown = git("show-index", cwd=str(world.src),
                        input=stored.pack.with_suffix(".idx").read_bytes()).stdout
            for line in shown.decode().splitlines():
                off, oid, crc = line.split()
                pos = pack.index.position(bytes.fromhex(oid))
                assert pack.index.offset(pos) == int(off)
                assert f"({pack.index.crc32(pos):08x})" == crc
    with Pack(world.full.pack) as pack:
        kinds = {e.type for e in pack.entries()}
    assert OBJ_OFS_DELTA in kinds and {OBJ_COMMIT, OBJ_TREE, OBJ_BLOB} <= kinds


# --------------------------------------------------------------------------
# (c) duplicates


def test_same_pack_twice_is_the_pack(world: World) -> None:
    data, result = _splice_bytes([world.full.whole(), world.full.whole()])
    n = len(world.full.own)
    assert (result.objects, result.duplicates, result.rewritten) == (n, n, 0)
    assert (result.verbatim_extents, result.headers_parsed) == (2, 0)
    assert data == world.full.pack.read_bytes()
    _index_standalone(world, data, "twice").close()


def _full_entries(world: World) -> list[Entry]:
    with Pack(world.full.pack) as pack:
        return list(pack.entries())


def _pack_of(world: World, oids: list[bytes], name: str) -> Path:
    raw = _pack_objects(world.src, "".join(o.hex() + "\n" for o in oids))
    return _write_pack(world.tmp / f"{name}.pack", raw, world.src)


def test_dropped_ofs_base_becomes_ref_delta(world: World) -> None:
    entries = _full_entries(world)
    by_offset = {e.offset: e for e in entries}
    bases = {}
    for e in entries:
        if e.type == OBJ_OFS_DELTA:
            bases.setdefault(e.base_offset, []).append(e)
    # A base in the middle of a chain: itself a delta, with dependents.
    mid_chain = [o for o in bases if by_offset[o].type == OBJ_OFS_DELTA]
    assert mid_chain, "the full pack must hold delta chains deeper than 1"
    base_off = mid_chain[0]
    base = by_offset[base_off]
    dependents = bases[base_off]
    first = _pack_of(world, [base.oid], "onlybase")
    extents = [Extent(first), world.full.whole()]
    data, result = _splice_bytes(extents)
    _check_structure(data, result)
    assert result.duplicates == 1 and result.objects == len(entries)
    assert result.ofs_to_ref == len(dependents) >= 1
    with _index_standalone(world, data, "refrewrite") as spliced:
        rows = _verify_pack(spliced.path.with_suffix(".idx"), world.tmp)
        assert set(rows) == {e.oid for e in entries}
        for d in dependents:
            e = spliced.entry(d.oid)
            assert e.type == OBJ_REF_DELTA and e.base_oid == base.oid
            assert bytes.fromhex(rows[d.oid][5]) == base.oid
        counts = _compare_payloads(spliced, extents)
    assert counts["to_ref"] == result.ofs_to_ref
    assert counts["rewritten"] == result.rewritten


def test_ofs_distance_reencoded_when_its_varint_shrinks(world: World) -> None:
    """Drop an entry lying between an OFS_DELTA and its base so the distance
    falls below a varint boundary: the header gets shorter, everything after
    moves, and git still resolves every delta."""
    entries = _full_entries(world)
    is_base = {e.base_offset for e in entries if e.type == OBJ_OFS_DELTA}
    pick: Optional[tuple[Entry, Entry]] = None
    for y in entries:
        if y.type != OBJ_OFS_DELTA:
            continue
        d = y.offset - y.base_offset
        for mid in entries:
            if (y.base_offset < mid.offset < y.offset and mid.offset not in is_base
                    and len(encode_ofs_distance(d - mid.length)) < len(encode_ofs_distance(d))):
                pick = (y, mid)
                break
        if pick:
            break
    assert pick, "the history must put a large blob between a delta and its base"
    y, mid = pick
    extents = [Extent(_pack_of(world, [mid.oid], "onlymid")), world.full.whole()]
    data, result = _splice_bytes(extents)
    _check_structure(data, result)
    with _index_standalone(world, data, "shrink") as spliced:
        assert result.duplicates == 1 and result.ofs_to_ref == 0 and result.rewritten >= 1
        e = spliced.entry(y.oid)
        assert e.type == OBJ_OFS_DELTA and e.header_length < y.header_length
        base_oid = next(x.oid for x in entries if x.offset == y.base_offset)
        assert e.base_offset == spliced.entry(base_oid).offset
        counts = _compare_payloads(spliced, extents)
    assert counts["shorter"] >= 1 and counts["rewritten"] == result.rewritten


def test_ofs_distance_grows_past_a_ref_rewrite(world: World) -> None:
    """An OFS_DELTA spanning an entry that became a (longer) REF_DELTA gets a
    longer distance; git resolves it to the same base."""
    entries = _full_entries(world)
    by_offset = {e.offset: e for e in entries}
    deps: dict[int, list[Entry]] = {}
    for e in entries:
        if e.type == OBJ_OFS_DELTA:
            deps.setdefault(e.base_offset, []).append(e)
    pick = None
    for b_off, ds in deps.items():
        for y in entries:
            if y.type != OBJ_OFS_DELTA or y.base_offset == b_off:
                continue
            if y.base_offset < b_off < y.offset:  # the drop would shrink it too
                continue
            grown = [d for d in ds if y.base_offset < d.offset < y.offset]
            if grown:
                pick = (by_offset[b_off], y, grown)
                break
        if pick:
            break
    assert pick, "the history must interleave two delta chains"
    base, y, grown = pick
    growth = sum(len(encode_type_size(OBJ_REF_DELTA, d.size)) + 20 - d.header_length
                 for d in grown)
    assert growth > 0
    extents = [Extent(_pack_of(world, [base.oid], "growbase")), world.full.whole()]
    data, result = _splice_bytes(extents)
    with _index_standalone(world, data, "grow") as spliced:
        e = spliced.entry(y.oid)
        y_base = spliced.entry(by_offset[y.base_offset].oid)
        assert e.type == OBJ_OFS_DELTA and e.base_offset == y_base.offset
        assert e.offset - e.base_offset == y.offset - y.base_offset + growth
        for d in grown:
            assert spliced.entry(d.oid).type == OBJ_REF_DELTA
        counts = _compare_payloads(spliced, extents)
    assert result.ofs_to_ref == len(deps[base.offset]) and result.rewritten > result.ofs_to_ref
    assert counts["rewritten"] == result.rewritten


def test_subset_drops_tail_and_middle(world: World) -> None:
    """`include` leaves entries out; bases left out turn their OFS dependents
    into REF_DELTAs, which a client holding those objects resolves."""
    entries = _full_entries(world)
    blobs_with_deps = {e.base_offset for e in entries if e.type == OBJ_OFS_DELTA}
    left_out = {e.oid for e in entries if e.offset in blobs_with_deps}
    keep = frozenset(e.oid for e in entries) - left_out
    extents = [Extent(world.full.pack, include=keep)]
    data, result = _splice_bytes(extents)
    _check_structure(data, result)
    assert result.excluded == len(left_out) and result.objects == len(keep)
    assert result.ofs_to_ref == sum(1 for e in entries if e.type == OBJ_OFS_DELTA
                                    and e.base_offset in blobs_with_deps and e.oid in keep)
    client = _empty_repo(world.tmp, "subset.git")
    git("fetch", "-q", "--no-tags", str(world.src), "refs/heads/v6:refs/heads/main", cwd=str(client))
    git("index-pack", "--stdin", "--fix-thin", "--strict", cwd=str(client), input=data)


# --------------------------------------------------------------------------
# (d) nothing re-deflated


def test_payloads_are_the_stored_bytes(world: World) -> None:
    extents = [world.base0.whole()] + [world.thin[k].extent() for k in range(1, TIPS)] \
        + [world.full.whole()]
    data, result = _splice_bytes(extents)
    assert result.duplicates > 0
    with _index_standalone(world, data, "payloads") as spliced:
        counts = _compare_payloads(spliced, extents)
    assert counts["rewritten"] == result.rewritten


# --------------------------------------------------------------------------
# (e) header varints


OFS_BOUNDARIES = [  # (distance, encoded length)
    (1, 1), (127, 1), (128, 2), (16511, 2), (16512, 3), (2113663, 3), (2113664, 4),
    (270549119, 4), (270549120, 5), (34630287487, 5), (34630287488, 6),
]


@pytest.mark.parametrize("distance,length", OFS_BOUNDARIES)
def test_ofs_distance_round_trip(distance: int, length: int) -> None:
    enc = encode_ofs_distance(distance)
    assert len(enc) == length
    buf = b"\x99" + enc + b"\x42"
    assert decode_ofs_distance(buf, 1) == (distance, 1 + length)


def test_ofs_distance_known_encodings() -> None:
    # git's "+1" bias: 128 is 80 00, not 81 00; 16512 is 80 80 00.
    assert encode_ofs_distance(1) == b"\x01"
    assert encode_ofs_distance(127) == b"\x7f"
    assert encode_ofs_distance(128) == b"\x80\x00"
    assert encode_ofs_distance(255) == b"\x80\x7f"
    assert encode_ofs_distance(16511) == b"\xff\x7f"
    assert encode_ofs_distance(16512) == b"\x80\x80\x00"
    for bad in (0, -5):
        with pytest.raises(PackError):
            encode_ofs_distance(bad)


@pytest.mark.parametrize("type_code", [OBJ_COMMIT, OBJ_TREE, OBJ_BLOB, OBJ_TAG, OBJ_OFS_DELTA,
                                       OBJ_REF_DELTA])
@pytest.mark.parametrize("size", [0, 1, 15, 16, 2047, 2048, 262143, 262144, 2**32 + 7, 2**60])
def test_type_size_round_trip(type_code: int, size: int) -> None:
    enc = encode_type_size(type_code, size)
    assert len(enc) == 1 + max(0, (size.bit_length() - 4 + 6) // 7)
    assert decode_type_size(b"\x00" + enc, 1) == (type_code, size, 1 + len(enc))


def test_entry_header_round_trips() -> None:
    assert encode_type_size(OBJ_BLOB, 15) == b"\x3f"
    assert encode_type_size(OBJ_BLOB, 16) == b"\xb0\x01"
    pad = bytes(300)
    h = read_entry_header(pad + encode_entry_header(OBJ_OFS_DELTA, 1000, ofs_distance=288), 300)
    assert (h.type, h.size, h.base_offset, h.base_oid) == (OBJ_OFS_DELTA, 1000, 12, None)
    assert h.length == 2 + 2
    oid = bytes(range(20))
    h = read_entry_header(pad + encode_entry_header(OBJ_REF_DELTA, 5, base_oid=oid) + b"x", 300)
    assert (h.type, h.size, h.base_oid, h.length) == (OBJ_REF_DELTA, 5, oid, 21)
    h = read_entry_header(encode_entry_header(OBJ_TREE, 70000), 0)
    assert (h.type, h.size, h.length) == (OBJ_TREE, 70000, 3)


@pytest.mark.parametrize("buf,offset", [
    (b"\xb0", 0),                    # size varint cut off
    (b"\x00\x00", 0),                # type 0
    (b"\x50", 0),                    # type 5 (reserved)
    (b"\x60\x80", 0),                # OFS distance cut off
    (bytes(12) + b"\x60\x0d", 12),   # OFS base before the pack header
    (b"\x70" + bytes(19), 0),        # REF base id cut off
    (b"\xb0" + b"\x80" * 20, 0),     # absurdly long varint
])
def test_bad_entry_headers(buf: bytes, offset: int) -> None:
    with pytest.raises(PackError):
        read_entry_header(buf, offset)


# --------------------------------------------------------------------------
# (f) bad input: typed errors, no output


def _copy_pack(world: World, stored: Stored, name: str, data: Optional[bytes] = None,
               idx: Optional[bytes] = None) -> Path:
    dest = world.tmp / f"{name}.pack"
    dest.write_bytes(stored.pack.read_bytes() if data is None else data)
    dest.with_suffix(".idx").write_bytes(stored.pack.with_suffix(".idx").read_bytes()
                                         if idx is None else idx)
    return dest


def _assert_refused(extents: list[Extent], match: str) -> None:
    buf = io.BytesIO()
    with pytest.raises(PackError, match=match):
        splice(extents, buf)
    assert buf.getvalue() == b""
    with pytest.raises(PackError, match=match):
        iter_splice(extents)  # raised by the call itself, before any chunk
    with pytest.raises(PackError, match=match):
        plan_splice(extents)


def test_truncated_pack_is_refused(world: World) -> None:
    raw = world.full.pack.read_bytes()
    cut = _copy_pack(world, world.full, "cut", data=raw[:-100])
    _assert_refused([world.thin[1].extent(), Extent(cut)], "trailer")
    tiny = _copy_pack(world, world.full, "tiny", data=raw[:25])
    _assert_refused([Extent(tiny)], "truncated")
    headless = _copy_pack(world, world.full, "headless", data=b"JUNK" + raw[4:])
    _assert_refused([Extent(headless)], "signature")


def test_mismatched_index_is_refused(world: World) -> None:
    other_idx = world.thin[3].pack.with_suffix(".idx").read_bytes()
    wrong = _copy_pack(world, world.thin[2], "wrongidx", idx=other_idx)
    _assert_refused([Extent(wrong)], "index")
    # Same objects (same count), packed differently: only the trailer tells.
    with Pack(world.full.pack) as pack:
        oids = pack.index.oids
    raw = _pack_objects(world.src, "".join(o.hex() + "\n" for o in oids), "--window=0")
    other = _write_pack(world.tmp / "nodelta.pack", raw, world.src)
    assert PackIndex.load(other.with_suffix(".idx")).count == len(oids)
    _assert_refused([Extent(world.full.pack, index=PackIndex.load(other.with_suffix(".idx")))],
                    "trailer")


def test_corrupt_or_truncated_index_is_refused(world: World) -> None:
    idx = bytearray(world.full.pack.with_suffix(".idx").read_bytes())
    idx[2000] ^= 0x01
    flipped = _copy_pack(world, world.full, "flipped", idx=bytes(idx))
    _assert_refused([Extent(flipped)], "checksum")
    short = _copy_pack(world, world.full, "shortidx", idx=bytes(idx[:500]))
    _assert_refused([Extent(short)], "truncated")
    missing = world.tmp / "noidx.pack"
    missing.write_bytes(world.full.pack.read_bytes())
    _assert_refused([Extent(missing)], "cannot read")


def test_include_outside_the_pack_is_refused(world: World) -> None:
    stranger = next(iter(world.thin[6].own - world.thin[1].own))
    _assert_refused([Extent(world.thin[1].pack, include=world.thin[1].own | {stranger})],
                    "not in the pack")
    with pytest.raises(PackError):
        Extent(world.thin[1].pack, include=frozenset({b"short"}))


def test_corrupt_ofs_header_after_a_drop_is_refused(world: World) -> None:
    """Headers parsed on the rewrite path are checked: an OFS_DELTA pointing
    between entries is an error, not a garbled output. (The verbatim path
    does not parse entries; `Pack.verify_checksum` is the cold-path check.)"""
    entries = _full_entries(world)
    first = entries[0]
    victim = next(e for e in entries if e.type == OBJ_OFS_DELTA and e.offset > first.offset
                  and e.header_length >= 2 and e.base_offset + 1 not in {x.offset for x in entries})
    raw = bytearray(world.full.pack.read_bytes())
    # Point the base one byte further on (still inside the pack, not an entry).
    h = read_entry_header(raw, victim.offset)
    _, _, pos = decode_type_size(raw, victim.offset)
    dist = victim.offset - h.base_offset - 1
    enc = encode_ofs_distance(dist)
    assert len(enc) == victim.header_length - (pos - victim.offset), "same varint length"
    raw[pos:pos + len(enc)] = enc
    bad = _copy_pack(world, world.full, "badofs", data=bytes(raw))
    with Pack(bad) as p, pytest.raises(PackError, match="checksum"):
        p.verify_checksum()
    drop_first = Extent(_pack_of(world, [first.oid], "onlyfirst"))
    _assert_refused([drop_first, Extent(bad)], "not an entry")
