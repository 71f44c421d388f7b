"""include-tag on planned fetches, end to end, beside stock: a client that
follows tags (a plain `git fetch`, which asks include-tag and sends commits
as haves, never tag objects) and one with --no-tags fetch after each step of
a history -- an annotated tag pushed with its commit, one pushed in its own
version, a tag chain (a tag of a tag, with and without the inner tag as a
ref), a lightweight tag, a tag on a commit the client already has. Every
fetch is planned (the access log says so), the annotated tags whose commits
arrive come in the same response (no second request), and the client's refs
equal the server's and those of a twin that fetched from stock, its strict
fsck clean."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from . import harness as h
from . import pushkit as pk


def _import(repo: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "aspen_cgi.cli", "import", "-q", str(repo)],
                         capture_output=True, text=True, cwd=h.REPO_DIR)
    assert res.returncode == 0, res.stderr


def _plan_lines(server) -> list[str]:
    return [line for line in re.findall(r"service=upload-pack method=POST .*", server.log_text()) if "plan=" in line]


def _fetch(client: Path, version: int, no_tags: bool) -> None:
    h.git("-c", f"protocol.version={version}", "-c", "transfer.fsckObjects=true", "fetch", "-q",
          *(["--no-tags"] if no_tags else []), "origin", cwd=str(client))
    h.fsck_strict(str(client))


def _all_objects(repo: Path) -> set[str]:
    out = h.out("cat-file", "--batch-all-objects", "--batch-check=%(objectname)", cwd=str(repo))
    return set(out.split())


def _tags(refs: dict[str, str]) -> dict[str, str]:
    return {r: v for r, v in refs.items() if r.startswith("refs/tags/")}


def _steps(work: Path):
    """Each step changes the server (pushes through Aspen) and says whether it
    brings new commits to a client following main."""
    def with_commit():
        pk.commit(work, "tagged with its commit")
        h.git("tag", "-a", "-m", "with", "t-with", cwd=str(work))
        h.git("push", "-q", "--atomic", "origin", "HEAD:main", "t-with", cwd=str(work))   # one version
        return True

    def own_version():
        pk.commit(work, "tagged later")
        h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
        h.git("tag", "-a", "-m", "own", "t-own", cwd=str(work))
        h.git("push", "-q", "origin", "t-own", cwd=str(work))
        return True

    def chain_both():
        pk.commit(work, "chain")
        h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
        h.git("tag", "-a", "-m", "inner", "t-inner", cwd=str(work))
        h.git("tag", "-a", "-m", "outer", "t-outer", "t-inner", cwd=str(work))
        h.git("push", "-q", "origin", "t-inner", "t-outer", cwd=str(work))
        return True

    def chain_outer_only():
        pk.commit(work, "chain, outer only")
        h.git("tag", "-a", "-m", "inner2", "t-inner2", cwd=str(work))
        h.git("tag", "-a", "-m", "outer2", "t-outer2", "t-inner2", cwd=str(work))
        h.git("push", "-q", "origin", "HEAD:main", "refs/tags/t-outer2", cwd=str(work))
        return True

    def lightweight():
        pk.commit(work, "lightweight")
        h.git("tag", "t-light", cwd=str(work))
        h.git("push", "-q", "origin", "HEAD:main", "t-light", cwd=str(work))
        return True

    def on_an_old_commit():
        h.git("tag", "-a", "-m", "old", "t-old", "HEAD~3", cwd=str(work))
        h.git("push", "-q", "origin", "t-old", cwd=str(work))
        return False

    return [with_commit, own_version, chain_both, chain_outer_only, lightweight, on_an_old_commit]


@pytest.mark.parametrize("no_tags", [False, True], ids=["follow-tags", "no-tags"])
@pytest.mark.parametrize("version", [0, 2])
def test_tags_arrive_with_their_commits_like_stock(version, no_tags, root, server_factory, cgi_server_factory,
                                                   tmp_path):
    server = server_factory(root, ASPEN_ACCESS_LOG="1")
    stock = cgi_server_factory(root, "stock")
    repo = pk.enable_push(root / "repo.git")
    url = server.url + "/repo.git"
    work, client, twin = tmp_path / "work", tmp_path / "client", tmp_path / "twin"
    h.git("clone", "-q", url, str(work))
    _import(repo)
    h.git("clone", "-q", url, str(client))
    for step in _steps(work):
        commits = step()
        _import(repo)
        shutil.rmtree(twin, ignore_errors=True)
        shutil.copytree(client, twin)
        h.git("remote", "set-url", "origin", stock.url + "/repo.git", cwd=str(twin))
        before = len(_plan_lines(server))
        _fetch(client, version, no_tags)
        _fetch(twin, version, no_tags)
        lines = _plan_lines(server)[before:]
        if no_tags and step.__name__ == "with_commit":
            # its version's pack holds the tag, which a --no-tags fetch from stock does not get
            assert all("plan=fallback why=extra-objects" in line for line in lines), (step.__name__, lines)
        else:
            assert all("plan=planned" in line for line in lines), (step.__name__, lines)
        assert _all_objects(client) == _all_objects(twin), step.__name__
        if commits:
            assert len(lines) == 1, (step.__name__, lines)       # the tags came along: no second request
        server_refs, client_refs = h.refs_of(str(repo)), h.refs_of(str(client))
        assert client_refs == h.refs_of(str(twin)), step.__name__
        assert client_refs["refs/remotes/origin/main"] == server_refs["refs/heads/main"]
        if not no_tags:
            assert _tags(client_refs) == _tags(server_refs), step.__name__
    if no_tags:
        assert not any("t-" in r for r in _tags(h.refs_of(str(client))))
