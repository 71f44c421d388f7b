"""SHA-256 repositories (`git init --object-format=sha256`), served as
stock serves them: adverts that say `object-format=sha256` (and the 64-digit
null id of an empty repository's `capabilities^{}` line), pushes, clones,
fetches and shallow clones over real HTTP, beside stock's CGI on a twin
repository; version packs with SHA-256 ids and trailers, spliced into the
planned answers the clients check."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aspen_cgi.packs.packfile import Pack

from . import harness as h
from .cgiserver import cgi_server_factory  # noqa: F401
from .differential import compare, env_for, pkt

NULL256 = "0" * 64


def _repo(path: Path) -> Path:
    h.git("init", "-q", "--bare", "--object-format=sha256", str(path))
    h.git("config", "http.receivepack", "true", cwd=str(path))
    h.git("symbolic-ref", "HEAD", "refs/heads/main", cwd=str(path))
    return path


def _work(path: Path) -> Path:
    h.git("init", "-q", "--object-format=sha256", "-b", "main", str(path))
    for i in range(4):
        (path / f"f{i}.txt").write_text("".join(f"line {j} of {i}\n" for j in range(200)))
        h.git("add", "-A", cwd=str(path))
        h.git("commit", "-q", "-m", f"c{i}", cwd=str(path))
    return path


def _commit(work: Path, name: str) -> str:
    (work / f"{name}.txt").write_text(f"{name}\n" * 50)
    h.git("add", "-A", cwd=str(work))
    h.git("commit", "-q", "-m", name, cwd=str(work))
    return h.out("rev-parse", "HEAD", cwd=str(work))


def _refs(repo: Path) -> dict[str, str]:
    out = h.out("for-each-ref", "--format=%(refname) %(objectname)", cwd=str(repo))
    return dict(line.split() for line in out.splitlines())


def _fsck(repo: Path) -> None:
    h.git("fsck", "--strict", cwd=str(repo))


def test_adverts_say_sha256_and_an_empty_repository_has_the_64_digit_null_id(root):
    _repo(root / "empty256.git")
    for svc, user in (("upload-pack", None), ("receive-pack", "u")):
        t = compare(env_for(root, "/empty256.git/info/refs", "GET", f"service=git-{svc}", REMOTE_USER=user),
                    status=200, mode="advert")
        assert t.cgi.body.startswith(pkt(f"# service=git-{svc}\n") + b"0000")
        if svc == "receive-pack":
            assert f"{NULL256} capabilities^{{}}\0".encode() in t.cgi.body
            assert b"object-format=sha256" in t.cgi.body
    t = compare(env_for(root, "/empty256.git/info/refs", "GET", "service=git-upload-pack",
                        HTTP_GIT_PROTOCOL="version=2"), status=200, mode="advert")
    assert pkt("object-format=sha256\n") in t.cgi.body


@pytest.mark.timeout(300)
@pytest.mark.parametrize("packs_setting", ["auto", "off"])
def test_push_clone_fetch_and_shallow_beside_stock(tmp_path, cgi_server_factory, packs_setting):  # noqa: F811
    """With version packs (the default) and without (ASPEN_VERSION_PACKS=off)."""
    work = _work(tmp_path / "work")
    servers = {}
    for name in ("stock", "aspen"):
        root = tmp_path / name
        root.mkdir()
        _repo(root / "r.git")
        servers[name] = (root / "r.git", cgi_server_factory(root, program=name, ASPEN_ACCESS_LOG="1",
                                                             ASPEN_VERSION_PACKS=packs_setting))
    results = {}
    for name, (repo, server) in servers.items():
        url = f"{server.url}/r.git"
        out = []
        # create, then fast-forward, a tag, a second branch, then a delete and a forced update
        out.append(h.git("push", url, "main", cwd=str(work)).stderr.decode())
        out.append(h.git("push", url, "main:side", "HEAD~1:refs/tags/t1", cwd=str(work)).stderr.decode())
        if name == "aspen" and packs_setting != "off":
            h.wait_packs_built(repo)    # the import's and a push of several refs: built in the background
        clones = {}
        for v in (0, 2):
            dest = tmp_path / f"{name}-clone-v{v}"
            h.git("-c", f"protocol.version={v}", "clone", "-q", url, str(dest))
            _fsck(dest)
            assert h.out("rev-parse", "--show-object-format", cwd=str(dest)) == "sha256"
            remote = {r.replace("refs/remotes/origin/", "refs/heads/"): o for r, o in _refs(dest).items()
                      if r.startswith(("refs/remotes/origin/", "refs/tags/")) and not r.endswith("/HEAD")}
            assert remote == _refs(repo), (name, v)
            clones[v] = dest
        new = _commit(work, f"next-{name}")
        h.git("push", url, "main", cwd=str(work))
        if name == "aspen" and packs_setting != "off":
            h.wait_packs_built(repo)    # the push's pack: the fetches below are planned from it, not raced
        for v, dest in clones.items():
            h.git("-c", f"protocol.version={v}", "fetch", "-q", "origin", cwd=str(dest))
            _fsck(dest)
            assert h.out("rev-parse", "origin/main", cwd=str(dest)) == new
        out.append(h.git("push", url, ":side", cwd=str(work)).stderr.decode())
        h.git("reset", "-q", "--hard", "HEAD~1", cwd=str(work))
        forced = _commit(work, f"forced-{name}")
        out.append(h.git("push", "--force", url, "main", cwd=str(work)).stderr.decode())
        assert _refs(repo)["refs/heads/main"] == forced and "refs/heads/side" not in _refs(repo)
        shallow = tmp_path / f"{name}-shallow"
        h.git("clone", "-q", "--depth", "1", url, str(shallow))
        assert len(h.out("rev-list", "--all", cwd=str(shallow)).split()) == 1
        h.git("fetch", "-q", "--deepen", "2", cwd=str(shallow))
        assert len(h.out("rev-list", "HEAD", cwd=str(shallow)).split()) == 3
        _fsck(shallow)
        if name == "aspen" and packs_setting != "off":
            _wide_depth1_clone(url, tmp_path / "wide", server)
        h.git("fsck", "--strict", cwd=str(repo))
        results[name] = [re.sub(r"http://127\.0\.0\.1:\d+/|[0-9a-f]{7,}\.\.+[0-9a-f]{7,}", "X", o) for o in out]
        h.git("reset", "-q", "--hard", "HEAD~1", cwd=str(work))
    assert results["aspen"] == results["stock"]
    repo = servers["aspen"][0]
    res = subprocess.run([str(Path(sys.executable).parent / "aspen"), "verify", str(repo)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr                # the store's refs are the disk's
    plans = [f for f in re.findall(r"service=upload-pack method=POST .*", servers["aspen"][1].log_text())
             if "plan=" in f]
    packs = sorted((repo / "aspen" / "packs").glob("pack-*.idx")) if (repo / "aspen" / "packs").exists() else []
    if packs_setting == "off":
        assert plans and all("plan=fallback" in f for f in plans) and not packs, plans
        return
    assert sum("plan=planned" in f for f in plans) >= 3, plans     # clones and fetches from SHA-256 packs
    adopted = h.store_rows(repo, "SELECT count(*) FROM version_packs WHERE name != '' AND \"window\" = 0")[0][0]
    assert adopted >= 1                                             # a client's SHA-256 pack kept as its version's
    assert packs
    for idx in packs:
        assert len(idx.stem) == len("pack-") + 64                   # named by their SHA-256 trailers
        with Pack(idx.with_suffix(".pack")) as pack:                # trailer = the index's SHA-256 record
            assert pack.index.oid_len == pack.trailer_len == 32
            pack.verify_checksum()


def _wide_depth1_clone(url: str, dest: Path, server) -> None:
    """Depth-1 clones until one is answered with the wide pack built beside the
    first (its SHA-256 trailer rewritten by packs/recompress); it must check out."""
    deadline = time.monotonic() + 60
    for n in itertools.count():
        clone = dest.with_name(f"{dest.name}-{n}")
        h.git("clone", "-q", "--depth", "1", url, str(clone))
        _fsck(clone)
        lines = re.findall(r"service=upload-pack method=POST .*depth1=\S+", server.log_text())
        if lines and "depth1=wide" in lines[-1]:
            return
        assert time.monotonic() < deadline, lines
        time.sleep(0.2)


def test_a_push_whose_object_format_is_not_the_repositorys_is_refused_as_stock(root):
    """A SHA-1 client's commands to a SHA-256 repository: stock dies with
    `unsupported object format 'sha1'`; Aspen refuses too and writes no ref."""
    repo = _repo(root / "r256.git")
    body = pkt(f"{'0' * 40} {'1' * 40} refs/heads/x\0report-status object-format=sha1\n") + b"0000"
    env = env_for(root, "/r256.git/git-receive-pack", "POST", "", REMOTE_USER="u",
                  CONTENT_TYPE="application/x-git-receive-pack-request", CONTENT_LENGTH=str(len(body)))
    s, a = h.stock(env, body), h.aspen(env, body)
    assert b"unsupported object format 'sha1'" in s.stderr
    assert b"unsupported object format 'sha1'" in a.stderr and b"Traceback" not in a.stderr
    assert a.body == b"" and _refs(repo) == {}


def test_the_disk_refs_of_a_sha256_repository_are_read_loose_and_packed(tmp_path):
    """The store compares its refs with the disk's (refstore/diskrefs.py): 64-digit
    values, loose and packed, are refs like 40-digit ones."""
    from aspen_cgi.refstore import diskrefs
    work = _work(tmp_path / "work")
    repo = _repo(tmp_path / "r.git")
    h.git("push", "-q", str(repo), "main", "main~1:refs/heads/old", "main~2:refs/tags/t", cwd=str(work))
    h.git("pack-refs", "--all", cwd=str(repo))
    h.git("update-ref", "refs/heads/loose", h.out("rev-parse", "main~3", cwd=str(work)), cwd=str(repo))
    got = {name: ref.oid for name, ref in diskrefs.read_all(str(repo)).items()}
    assert got == _refs(repo) and len(got) == 4 and all(len(v) == 64 for v in got.values())


def test_push_cert_nonce_of_a_sha256_repository_is_stocks(root):
    """git hashes the nonce with the repository's hash (HMAC-SHA256 here): the
    same nonce as stock in the same second, 64 digits after the time."""
    from .differential import norm_advertisement
    repo = _repo(root / "r256.git")
    h.git("config", "receive.certNonceSeed", "sekrit", cwd=str(repo))
    env = env_for(root, "/r256.git/info/refs", "GET", "service=git-receive-pack", REMOTE_USER="u")
    for _ in range(20):
        before, aspen, after = h.stock(env), h.aspen(env), h.stock(env)
        if before.body == after.body:
            break
    else:
        pytest.fail("the clock kept ticking between requests")
    assert aspen.status == before.status == 200
    assert norm_advertisement(aspen.body) == norm_advertisement(before.body)
    found = re.findall(rb"push-cert=([0-9]+)-([0-9a-f]+)", aspen.body)
    assert len(found) == 1 and len(found[0][1]) == 64
