"""The streaming pack rewriter (packs.recompress) and the depth-1 pack-objects
hook (packhook): rewritten packs hold exactly the same objects, are never
larger, and real shallow clones through the hook are valid and smaller."""

from __future__ import annotations

import hashlib
import io
import shlex
import subprocess
import sys
import zlib
from pathlib import Path

import deflate
import pytest

from aspen_cgi import settings
from aspen_cgi.fetch.packobjectshook import upload_pack_config, wants_wide_pack
from aspen_cgi.packs.packfile import encode_entry_header
from aspen_cgi.packs.recompress import RecompressError, rewrite, rewrite_to
from aspen_cgi.protocol.requests import FetchRequest
from bench.repogen import PRESETS, generate

from .harness import fsck_strict, git, make_history, out, refs_of


@pytest.fixture(scope="module")
def repos(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("recompress")
    return {"history": make_history(base / "history.git", commits=12),
            "small": generate(PRESETS["small"], base / "small.git").path}


def pack_objects(repo: Path, revs: str, *args: str) -> bytes:
    return git("pack-objects", "--revs", "--stdout", "-q", *args, cwd=str(repo), input=revs.encode()).stdout


def rewritten(data: bytes) -> bytes:
    return b"".join(rewrite(io.BytesIO(data)))


def verify(pack: bytes, where: Path, name: str) -> dict[str, tuple]:
    """index-pack PACK (must succeed) and return {oid: (type, size, depth, base)}."""
    path = where / f"{name}.pack"
    path.write_bytes(pack)
    git("index-pack", "--strict", "-o", str(path.with_suffix(".idx")), str(path))
    objects = {}
    for line in out("verify-pack", "-v", str(path)).splitlines():
        f = line.split()
        if len(f) >= 5 and len(f[0]) == 40:
            objects[f[0]] = (f[1], int(f[2]), int(f[5]) if len(f) > 5 else 0, f[6] if len(f) > 6 else None)
    return objects


# -- (a) real packs ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["history", "small"])
def test_full_pack_with_ofs_deltas_keeps_every_object(repos, tmp_path, name):
    original = pack_objects(repos[name], "", "--all", "--delta-base-offset")
    new = rewritten(original)
    before = verify(original, tmp_path, "before")
    after = verify(new, tmp_path, "after")
    assert any(depth for _, _, depth, _ in before.values()), "expected OFS_DELTA entries to rewrite"
    assert after == before                       # same ids, types, sizes, delta chains
    assert len(new) <= len(original)
    if name == "small":
        assert len(new) < len(original) * 0.99   # libdeflate wins on real content (moves every offset)
    # header count and version unchanged
    assert new[:12] == original[:12]


def test_thin_pack_with_ref_deltas(repos, tmp_path):
    repo = repos["small"]
    original = pack_objects(repo, "main\n^main~20\n", "--thin", "--delta-base-offset")
    new = rewritten(original)
    assert len(new) <= len(original)
    (tmp_path / "thin.pack").write_bytes(new)
    unresolved = git("index-pack", "-o", str(tmp_path / "thin.idx"), str(tmp_path / "thin.pack"), check=False)
    assert unresolved.returncode != 0 and b"unresolved delta" in unresolved.stderr  # REF_DELTAs survive
    fixed = []
    for i, pack in enumerate((original, new)):
        scratch = tmp_path / f"scratch{i}.git"
        git("init", "-q", "--bare", str(scratch))
        (scratch / "objects" / "info" / "alternates").write_text(str(repo / "objects") + "\n")
        git("index-pack", "--stdin", "--fix-thin", "--strict", cwd=str(scratch), input=pack)
        idx = next((scratch / "objects" / "pack").glob("*.idx"))
        fixed.append(sorted(line.split()[1] for line in
                            git("show-index", input=idx.read_bytes()).stdout.decode().splitlines()))
    assert fixed[0] == fixed[1] and len(fixed[0]) > 20


def test_chunked_input_gives_the_same_pack(repos, tmp_path):
    original = pack_objects(repos["history"], "", "--all", "--delta-base-offset")
    tiny_chunks = (original[i:i + 7] for i in range(0, len(original), 7))
    whole = rewritten(original)
    assert b"".join(rewrite(tiny_chunks)) == whole
    dst = io.BytesIO()
    assert rewrite_to(io.BytesIO(original), dst) == len(whole) and dst.getvalue() == whole


def test_empty_pack(repos):
    empty = pack_objects(repos["history"], "")
    assert empty[8:12] == b"\0\0\0\0"
    assert rewritten(empty) == empty


def _pack(entries: list[tuple[int, bytes, bytes]]) -> bytes:
    """A pack of (type, content, its zlib stream) entries, no deltas."""
    body = b"PACK" + (2).to_bytes(4, "big") + len(entries).to_bytes(4, "big")
    for type_code, content, stream in entries:
        body += encode_entry_header(type_code, len(content)) + stream
    return body + hashlib.sha1(body).digest()


def test_each_entry_keeps_the_smaller_stream(tmp_path):
    zlib_wins = b"aa\nbab\nbbababbbb"           # zlib -9: 21 bytes, libdeflate 12: 22
    assert len(zlib.compress(zlib_wins, 9)) < len(deflate.zlib_compress(zlib_wins, 12))
    stored = b"x" * 1000
    keep = _pack([(3, zlib_wins, zlib.compress(zlib_wins, 9))])
    assert rewritten(keep) == keep
    loose = _pack([(3, zlib_wins, zlib.compress(zlib_wins, 9)), (3, stored, zlib.compress(stored, 0))])
    new = rewritten(loose)
    assert len(new) == len(loose) - len(zlib.compress(stored, 0)) + len(deflate.zlib_compress(stored, 12))
    assert verify(new, tmp_path, "new") == verify(loose, tmp_path, "loose")


# -- (b) malformed input ----------------------------------------------------------------------

def _corrupt_middle(p: bytes) -> bytes:
    mid = len(p) // 2
    return p[:mid] + bytes([p[mid] ^ 0xFF]) + p[mid + 1:]


@pytest.mark.parametrize("damage", [
    lambda p: p[:len(p) // 2],                       # truncated inside an entry
    lambda p: p[:-7],                                # truncated trailer
    lambda p: p[:-1] + bytes([p[-1] ^ 1]),           # wrong trailer
    lambda p: p + b"x",                              # bytes after the trailer
    _corrupt_middle,                                 # a damaged zlib stream (or, failing that, the checksum)
    lambda p: b"PACX" + p[4:],                       # signature
    lambda p: p[:4] + b"\0\0\0\x05" + p[8:],         # version
    lambda p: p[:8] + (int.from_bytes(p[8:12], "big") + 1).to_bytes(4, "big") + p[12:],  # count too high
    lambda p: p[:10],                                # not even a header
], ids=["truncated", "short-trailer", "bad-trailer", "trailing", "corrupt", "signature", "version",
        "count", "header"])
def test_malformed_input_raises(repos, damage):
    original = pack_objects(repos["history"], "", "--all", "--delta-base-offset")
    produced = bytearray()
    with pytest.raises(RecompressError):
        for chunk in rewrite(io.BytesIO(damage(original))):
            produced += chunk
    assert len(produced) < len(rewritten(original))   # never a complete pack


def test_ofs_delta_pointing_outside_the_pack_raises():
    body = b"PACK" + (2).to_bytes(4, "big") + (1).to_bytes(4, "big")
    body += encode_entry_header(6, 3, ofs_distance=5) + zlib.compress(b"\x01\x01\x90")
    body += hashlib.sha1(body).digest()
    with pytest.raises(RecompressError, match="OFS_DELTA"):
        rewritten(body)


# -- the hook's switches ----------------------------------------------------------------------

def test_wants_wide_pack():
    oid = "a" * 40
    assert wants_wide_pack(FetchRequest(version=2, wants=[oid], deepen=1), settings.of({}))
    assert wants_wide_pack(FetchRequest(version=0, wants=[oid], deepen=1), settings.of({"ASPEN_WIDE_DEPTH1": "1"}))
    assert not wants_wide_pack(FetchRequest(version=2, wants=[oid], deepen=1), settings.of({"ASPEN_WIDE_DEPTH1": "0"}))
    assert not wants_wide_pack(FetchRequest(version=2, wants=[oid], deepen=1, haves=[oid]), settings.of({}))
    assert not wants_wide_pack(FetchRequest(version=2, wants=[oid]), settings.of({}))
    assert not wants_wide_pack(FetchRequest(version=2, wants=[oid], deepen=5), settings.of({}))


def test_upload_pack_config_quotes_the_interpreter():
    args = upload_pack_config("/opt/my python/bin/python3")
    assert args[0] == "-c" and args[1].startswith("uploadpack.packObjectsHook=")
    assert shlex.split(args[1].split("=", 1)[1]) == ["/opt/my python/bin/python3", "-P", "-m", "aspen_cgi.fetch.packobjectshook"]


def test_hook_fails_cleanly(repos):
    run = lambda *a: subprocess.run([sys.executable, "-m", "aspen_cgi.fetch.packobjectshook", *a], cwd=str(repos["history"]),
                                    input=b"", capture_output=True, timeout=60)
    usage = run()
    assert usage.returncode != 0 and b"usage" in usage.stderr and usage.stdout == b""
    bad = run("git", "pack-objects", "--stdout", "--no-such-option")
    assert bad.returncode != 0 and bad.stdout == b""
    ok = subprocess.run([sys.executable, "-m", "aspen_cgi.fetch.packobjectshook", "git", "pack-objects", "--revs", "--stdout", "-q"],
                        cwd=str(repos["history"]), input=b"main\n", capture_output=True, timeout=60)
    assert ok.returncode == 0 and ok.stdout[:4] == b"PACK"


# -- (c) end to end: real shallow clones through upload-pack ----------------------------------

def _received_pack(clone: Path) -> int:
    packs = list((clone / ".git" / "objects" / "pack").glob("*.pack"))
    assert len(packs) == 1
    return packs[0].stat().st_size


@pytest.mark.parametrize("protocol", ["2", "0"])
def test_depth1_clone_through_the_hook(repos, tmp_path, protocol):
    src = repos["small"]
    hooked = shlex.join(["git", *upload_pack_config(), "upload-pack"])
    plain, wide = tmp_path / "plain", tmp_path / "wide"
    common = ["-c", f"protocol.version={protocol}", "clone", "-q", "--depth", "1", "--no-local", "--no-single-branch"]
    git(*common, str(src), str(plain))
    git(*common, "--upload-pack", hooked, str(src), str(wide))
    fsck_strict(str(wide))
    assert refs_of(str(wide)) == refs_of(str(plain))
    assert out("rev-parse", "HEAD", cwd=str(wide)) == out("rev-parse", "main", cwd=str(src))
    assert (wide / ".git" / "shallow").read_text() == (plain / ".git" / "shallow").read_text()
    assert _received_pack(wide) < _received_pack(plain)
