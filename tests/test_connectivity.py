"""The push's connectivity walk from the ref store's peeled values
(intake.connected with exclude=) against git's own `--not --all
--alternate-refs`: the same commits, objects and times, except the one case
the push walks again (a tag object a ref holds), and a failure when an
excluded object is missing; end to end, the versions a push records."""

from __future__ import annotations

import os
from pathlib import Path

from aspen_cgi.push import intake
from aspen_cgi.runtime.repository import Repository

from . import harness as h
from . import pushkit as pk


def _peeled(repo: Path) -> list[str]:
    lines = h.out("for-each-ref", "--format=%(objectname) %(*objectname)", cwd=str(repo)).splitlines()
    return sorted({(line.split() + [""])[1] or line.split()[0] for line in lines})


def _walks(repo: Path, tips: list[str]):
    env = dict(os.environ)
    full = intake.connected(str(repo), env, tips, with_commits=True)
    peeled = intake.connected(str(repo), env, tips, with_commits=True, exclude=_peeled(repo))
    return full, peeled


def _setup(tmp_path: Path) -> tuple[Path, Path]:
    repo = tmp_path / "repo.git"
    h.make_history(repo, commits=6, branches=("topic", "old"), tags=True)
    work = tmp_path / "work"
    h.git("clone", "-q", str(repo), str(work))
    h.git("config", "user.name", "t", cwd=str(work))
    h.git("config", "user.email", "t@example.com", cwd=str(work))
    return repo, work


def _land(repo: Path, work: Path, tip: str) -> None:
    """The client's objects into the repository, no ref moved (as a quarantine holds them)."""
    pack = h.git("pack-objects", "--revs", "--stdout", "-q", cwd=str(work),
                 input=f"{tip}\n".encode() + b"".join(f"^{o}\n".encode() for o in _peeled(repo))).stdout
    h.git("index-pack", "--stdin", "--fix-thin", cwd=str(repo), input=pack)


def test_a_trunk_commit_a_merge_and_a_branch_off_a_tag_walk_as_with_all(tmp_path):
    repo, work = _setup(tmp_path)
    head = pk.commit(work, "trunk")
    h.git("merge", "-q", "--no-ff", "-m", "merge topic", "origin/topic", cwd=str(work))
    merge = h.out("rev-parse", "HEAD", cwd=str(work))
    h.git("checkout", "-q", "-b", "fix", "v1.0", cwd=str(work))
    fix = pk.commit(work, "fix")
    for tip in (head, merge, fix):
        _land(repo, work, tip)
    for tips in ([head], [merge], [fix], [merge, fix]):
        full, peeled = _walks(repo, tips)
        assert full.ok and peeled.ok
        assert (peeled.commits, peeled.objects, peeled.times) == (full.commits, full.objects, full.times)
        assert set(tips) <= set(full.commits)
    assert set(_walks(repo, [merge])[1].commits) == {head, merge}     # topic's commits are the server's


def test_a_tag_object_a_ref_holds_is_listed_by_the_peeled_walk_only(tmp_path):
    """Pushing an existing tag object to a new name: --all keeps it out of the
    listing, the peeled values do not, and the push then walks with --all."""
    repo, _ = _setup(tmp_path)
    tag_obj = pk.rev(repo, "refs/tags/v1.0")
    assert h.out("cat-file", "-t", tag_obj, cwd=str(repo)) == "tag"
    full, peeled = _walks(repo, [tag_obj])
    assert full.ok and peeled.ok
    assert tag_obj not in (full.objects or {}) and tag_obj in (peeled.objects or {})


def test_an_excluded_object_that_is_missing_fails_the_walk(tmp_path):
    repo, work = _setup(tmp_path)
    tip = pk.commit(work, "one")
    _land(repo, work, tip)
    res = intake.connected(str(repo), dict(os.environ), [tip], with_commits=True,
                           exclude=_peeled(repo) + ["e" * 40])
    assert not res.ok


def test_pushes_record_what_git_would_have_listed(root, server_factory, tmp_path):
    """Over HTTP: a merge of a branch the server holds introduces the new
    commits alone; a tag copied to a new name introduces nothing and lands."""
    from aspen_cgi.refstore.store import RefStore
    repo = pk.enable_push(root / "repo.git")
    server = server_factory(root)
    work = pk.clone(server.url + "/repo.git", tmp_path / "work")
    h.git("checkout", "-q", "-b", "side", cwd=str(work))
    pk.commit(work, "on side")
    pk.push(work, "origin", "side")
    h.git("checkout", "-q", "main", cwd=str(work))
    trunk = pk.commit(work, "on main")
    h.git("merge", "-q", "--no-ff", "-m", "merge side", "side", cwd=str(work))
    merge = pk.rev(work, "HEAD")
    pk.push(work, "origin", "main")
    tag = "v1.0"
    assert h.out("cat-file", "-t", tag, cwd=str(repo)) == "tag"
    pk.push(work, "origin", f"refs/tags/{tag}:refs/tags/{tag}-copy")
    store = RefStore.open(Repository.of(str(repo), dict(os.environ)), create=False)
    latest = store.latest()
    assert sorted(store.introduced_commits(latest - 1)) == sorted([trunk, merge])
    assert store.introduced_commits(latest) == []
    assert pk.rev(repo, f"refs/tags/{tag}-copy") == pk.rev(repo, f"refs/tags/{tag}")
    fresh = tmp_path / "fresh"
    h.git("clone", "-q", "--mirror", server.url + "/repo.git", str(fresh))
    h.fsck_strict(str(fresh))
    assert h.refs_of(str(fresh)) == h.refs_of(str(repo))
    h.verify_ok(repo)
