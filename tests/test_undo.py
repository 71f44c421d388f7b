"""Undo and restore (push/undo.py): `aspen undo REPO V` makes one version
that puts every ref V changed back (refused, naming the refs, when one moved
since, unless --force); `aspen restore REPO REF --at V|T` brings one ref
back, a deleted branch included, with the objects `git gc` pruned put back
from the version packs. Each is a version in `aspen log`, chained, and the
repository's post-receive and post-update hooks run as for a push; clients
fetch the result with `fsck --strict` clean."""

from __future__ import annotations

import json
import math
import stat
from datetime import datetime, timezone
from pathlib import Path

import pytest

from aspen_cgi.runtime.repository import Repository

from . import harness as h
from . import pushkit as pk


def _hook(repo: Path, name: str, body: str) -> None:
    p = repo / "hooks" / name
    p.write_text(body)
    p.chmod(p.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _latest(repo: Path) -> int:
    return h.versions(repo)[-1]["id"]


def _cli(*args: str) -> tuple[int, str, str]:
    p = h.aspen_cli(*args)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


@pytest.fixture
def pushed(root, server_factory, tmp_path):
    """main pushed twice (versions A, B), a branch `feat` pushed (F) and deleted (D), through Aspen
    with version packs on; hooks that record what they are given."""
    server = server_factory(root)
    repo = pk.enable_push(root / "repo.git")
    out = tmp_path / "hooks-out"
    out.mkdir()
    _hook(repo, "post-receive", f"#!/bin/sh\ncat >> '{out}/post-receive.txt'\n")
    _hook(repo, "post-update", f"#!/bin/sh\necho \"$@\" >> '{out}/post-update.txt'\n")
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    marks: dict[str, object] = {}
    marks["main0"] = h.out("rev-parse", "HEAD", cwd=str(work)).strip()
    marks["main1"] = pk.commit(work, "one")
    h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    marks["A"] = _latest(repo)
    marks["main2"] = pk.commit(work, "two")
    h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    marks["B"] = _latest(repo)
    h.git("checkout", "-q", "-b", "feat", cwd=str(work))
    (work / "feat.txt").write_text("".join(f"feature line {n}\n" for n in range(500)))
    marks["feat"] = pk.commit(work, "feature", name="feat.txt")
    h.git("push", "-q", "origin", "feat", cwd=str(work))
    marks["F"] = _latest(repo)
    h.git("checkout", "-q", "main", cwd=str(work))
    h.git("push", "-q", "origin", ":feat", cwd=str(work))
    marks["D"] = _latest(repo)
    h.wait_packs_built(repo)
    for f in ("post-receive.txt", "post-update.txt"):
        (out / f).unlink(missing_ok=True)
    return server, repo, work, out, marks


def _clone_checks(server, repo: Path, dest: Path) -> None:
    h.git("-c", "transfer.fsckObjects=true", "clone", "-q", "--mirror", f"{server.url}/repo.git", str(dest))
    h.fsck_strict(str(dest))
    assert h.refs_of(str(dest)) == h.refs_of(str(repo))


def test_undo_puts_back_what_a_push_changed_as_a_new_version(pushed, tmp_path):
    server, repo, _, out, m = pushed
    rc, stdout, stderr = _cli("undo", str(repo), str(m["B"]))
    assert rc == 0, stderr
    assert f"undo (undo-{m['B']}), 1 ref(s)" in stdout
    assert h.refs_of(str(repo))["refs/heads/main"] == m["main1"]
    last = h.versions(repo)[-1]
    assert last["kind"] == "undo" and last["push_id"] == f"undo-{m['B']}"
    assert last["updates"] == [{"ref": "refs/heads/main", "old": m["main2"], "new": m["main1"],
                                "fast_forward": False}]
    assert (out / "post-receive.txt").read_text() == f"{m['main2']} {m['main1']} refs/heads/main\n"
    assert (out / "post-update.txt").read_text() == "refs/heads/main\n"
    _clone_checks(server, repo, tmp_path / "c")
    rc, stdout, _ = _cli("log", str(repo))
    assert f"version {last['id']}  undo  " in stdout and f"(undo-{m['B']})" in stdout
    rc, stdout, _ = _cli("verify", "--chain", str(repo))
    assert rc == 0, stdout


def test_undo_is_refused_where_a_ref_moved_since_unless_forced(pushed):
    server, repo, work, out, m = pushed
    before = h.refs_of(str(repo))
    rc, _, stderr = _cli("undo", str(repo), str(m["A"]))
    assert rc == 1
    assert f"aspen undo: refused: moved since version {m['A']}: refs/heads/main; --force puts them back anyway" \
        in stderr
    assert h.refs_of(str(repo)) == before and not (out / "post-receive.txt").exists()
    rc, stdout, stderr = _cli("undo", "--json", "--force", str(repo), str(m["A"]))
    assert rc == 0, stderr
    got = json.loads(stdout)
    assert got["ok"] and got["updates"] == [{"ref": "refs/heads/main", "old": m["main2"], "new": m["main0"]}]
    assert h.refs_of(str(repo))["refs/heads/main"] == m["main0"]


def test_undo_of_a_deletion_brings_the_branch_back_after_gc_pruned_it(pushed, tmp_path):
    server, repo, _, out, m = pushed
    h.git("-c", "gc.reflogExpire=now", "-c", "gc.reflogExpireUnreachable=now", "gc", "-q", "--prune=now",
          cwd=str(repo))
    assert h.git("cat-file", "-e", m["feat"], cwd=str(repo), check=False).returncode != 0
    rc, stdout, stderr = _cli("undo", "--json", str(repo), str(m["D"]))
    assert rc == 0, stderr
    got = json.loads(stdout)
    assert got["reinjected"] == [m["F"]]
    assert h.refs_of(str(repo))["refs/heads/feat"] == m["feat"]
    h.git("fsck", "--strict", "--no-dangling", cwd=str(repo))
    assert "0" * 40 + f" {m['feat']} refs/heads/feat" in (out / "post-receive.txt").read_text()
    _clone_checks(server, repo, tmp_path / "c")


def test_restore_brings_back_a_deleted_branch_by_version_or_time(pushed, tmp_path):
    server, repo, _, out, m = pushed
    h.git("gc", "-q", "--prune=now", cwd=str(repo))
    rc, stdout, stderr = _cli("restore", str(repo), "refs/heads/feat", "--at", str(m["F"]))
    assert rc == 0, stderr
    assert "restore (restore-" in stdout and "objects put back from the packs of versions" in stdout
    assert h.refs_of(str(repo))["refs/heads/feat"] == m["feat"]
    assert h.versions(repo)[-1]["kind"] == "restore"
    _clone_checks(server, repo, tmp_path / "c")
    # by time: main as it was right after version A
    at = next(v["at"] for v in h.versions(repo) if v["id"] == m["A"])
    stamp = datetime.fromtimestamp(math.ceil(at * 1e6) / 1e6, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    rc, stdout, stderr = _cli("restore", str(repo), "refs/heads/main", "--at", stamp)
    assert rc == 0, stderr
    assert h.refs_of(str(repo))["refs/heads/main"] == m["main1"]
    assert f"{m['main2']} {m['main1']} refs/heads/main\n" in (out / "post-receive.txt").read_text()


def test_what_restore_and_undo_refuse(pushed):
    server, repo, _, out, m = pushed
    before = h.refs_of(str(repo))
    latest = _latest(repo)
    cases = [
        (("restore", str(repo), "refs/heads/nope", "--at", str(m["B"])),
         f"aspen restore: refused: refs/heads/nope did not exist at version {m['B']}"),
        (("restore", str(repo), "refs/heads/main", "--at", str(m["B"])),
         f"aspen restore: refused: refs/heads/main is already at its value of version {m['B']}"),
        (("restore", str(repo), "refs/heads/main", "--at", str(latest + 5)),
         f"aspen restore: refused: no version {latest + 5}: the latest is {latest}"),
        (("restore", str(repo), "refs/heads/main", "--at", "yesterday"),
         "aspen restore: refused: not a time: 'yesterday'"),
        (("restore", str(repo), "refs/heads/main", "--at", "2000-01-01"),
         "aspen restore: refused: no version at or before 2000-01-01"),
        (("undo", str(repo), "1"), "aspen undo: refused: version 1 is the import: there is nothing before it"),
        (("undo", str(repo), str(latest + 5)), f"aspen undo: refused: no version {latest + 5}: the latest is {latest}"),
    ]
    for args, message in cases:
        rc, _, stderr = _cli(*args)
        assert rc == 1 and message in stderr, (args, stderr)
        assert "Traceback" not in stderr
    assert h.refs_of(str(repo)) == before
    assert _latest(repo) == latest
    assert not (out / "post-receive.txt").exists()


def test_an_undo_of_an_undo_is_a_redo(pushed, tmp_path):
    server, repo, _, _, m = pushed
    assert _cli("undo", str(repo), str(m["B"]))[0] == 0
    undo = _latest(repo)
    rc, _, stderr = _cli("undo", str(repo), str(undo))
    assert rc == 0, stderr
    assert h.refs_of(str(repo))["refs/heads/main"] == m["main2"]
    _clone_checks(server, repo, tmp_path / "c")


def test_a_push_landing_between_reading_and_writing_makes_the_undo_fail_with_nothing_written(pushed):
    """The undo's ref changes are computed, then a push moves main, then they are applied:
    the compare-and-swap on main's old value fails, no version, no hook."""
    import os as _os

    from aspen_cgi.model.versions import VersionMeta
    from aspen_cgi.push import undo
    from aspen_cgi.refstore.store import RefStore
    from aspen_cgi.service import child_env
    server, repo, work, out, m = pushed
    env = child_env(dict(_os.environ), str(repo))
    store = RefStore.open(Repository.of(str(repo), env))
    store.sync()
    changes = undo.undo_changes(store, m["B"])
    moved = pk.commit(work, "meanwhile")
    h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
    latest = _latest(repo)
    with pytest.raises(undo.Refused, match="a ref moved meanwhile; nothing was changed"):
        undo.apply(store, Repository.of(str(repo), env), changes, VersionMeta(kind="undo", who="t", push_id=f"undo-{m['B']}"),
                   m["B"] - 1)
    assert h.refs_of(str(repo))["refs/heads/main"] == moved
    assert _latest(repo) == latest
    assert (out / "post-receive.txt").read_text() == f"{m['main2']} {moved} refs/heads/main\n"   # the push's only
