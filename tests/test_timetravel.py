"""Time-travel fetch (model/pin.py): a client reads a repository as it was
at version V, by URL (`repo.git@V`, `repo.git@<time>`, protocol v0 and v2)
or by protocol v2 server option (`aspen-version=V`, `aspen-at=T`). The
refs it sees are the ones `git ls-remote` showed right after version V;
its clone passes `fsck --strict`; a full clone is planned from the stored
packs; objects no current ref reaches, pruned by `git gc`, are served
(put back from the version packs where git must answer). A push to a view
is refused with a message, and bad pins get an ERR line, never a
traceback."""

from __future__ import annotations

import math
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import pytest

from aspen_cgi.runtime.repository import Repository

from . import harness as h
from . import pushkit as pk
from .cgiserver import cgi_server_factory  # noqa: F401


def _ls_remote(url: str, *opts: str, protocol: int = 2) -> dict[str, str]:
    out = h.out("-c", f"protocol.version={protocol}", "ls-remote", *opts, url)
    return {name: oid for oid, name in (line.split("\t") for line in out.splitlines())}


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _latest(repo: Path) -> int:
    return h.versions(repo)[-1]["id"]


@pytest.fixture
def past(root, server_factory, tmp_path):
    """Pushes through Aspen (version packs on, as by default): main grows, a
    branch `gone` is pushed (version GONE), a tag; then `gone` is deleted,
    main force-pushed back to an earlier commit, and `git gc --prune=now`
    prunes what only those reached. Returns (server, repo, work, views):
    views maps a version to `ls-remote` as seen right after it."""
    server = server_factory(root, ASPEN_ACCESS_LOG="1")
    repo = pk.enable_push(root / "repo.git")
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    url = server.url + "/repo.git"
    views: dict[int, dict[str, str]] = {}
    for i in range(3):
        pk.commit(work, f"main {i}")
        h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
        views[_latest(repo)] = _ls_remote(url)
    base = h.out("rev-parse", "HEAD", cwd=str(work)).strip()
    h.git("checkout", "-q", "-b", "gone", cwd=str(work))
    gone = pk.commit(work, "only on gone")
    (work / "big.txt").write_text("".join(f"gone line {n}\n" for n in range(2000)))
    gone = pk.commit(work, "more on gone", name="big.txt")
    h.git("push", "-q", "origin", "gone", cwd=str(work))
    views[_latest(repo)] = _ls_remote(url)
    h.git("tag", "-a", "-m", "t", "t1", "gone", cwd=str(work))
    h.git("push", "-q", "origin", "t1", cwd=str(work))
    views[_latest(repo)] = _ls_remote(url)
    h.git("checkout", "-q", "main", cwd=str(work))
    h.git("push", "-q", "origin", ":gone", ":t1", cwd=str(work))
    h.git("reset", "-q", "--hard", "HEAD~2", cwd=str(work))
    h.git("push", "-q", "-f", "origin", "HEAD:main", cwd=str(work))
    h.wait_packs_built(repo)        # a version whose objects gc pruned before its build has no pack
    h.git("-c", "gc.reflogExpire=now", "-c", "gc.reflogExpireUnreachable=now", "gc", "-q", "--prune=now",
          cwd=str(repo))
    assert h.git("cat-file", "-e", gone, cwd=str(repo), check=False).returncode != 0, "gc left the commit"
    return server, repo, work, views, gone, base


def _tagged(views) -> int:
    return max(v for v, refs in views.items() if "refs/tags/t1" in refs)


def _access(server) -> list[str]:
    return [line for line in server.log_text().splitlines() if "service=upload-pack" in line]


@pytest.mark.parametrize("protocol", [0, 2])
def test_clone_by_url_sees_the_refs_of_then_and_objects_gc_pruned(past, tmp_path, protocol):
    server, repo, _, views, gone, _ = past
    v = _tagged(views)
    url = f"{server.url}/repo.git@{v}"
    assert _ls_remote(url, protocol=protocol) == views[v]
    client = tmp_path / "client.git"
    h.git("-c", f"protocol.version={protocol}", "-c", "transfer.fsckObjects=true", "clone", "-q", "--mirror",
          url, str(client))
    h.fsck_strict(str(client))
    assert h.refs_of(str(client)) == {k: o for k, o in views[v].items() if k.startswith("refs/") and "^{}" not in k}
    assert h.git("cat-file", "-e", gone, cwd=str(client), check=False).returncode == 0
    last = _access(server)[-1]
    assert f"pin={v}" in last and "plan=planned" in last, last
    # the repository itself still shows today's refs
    assert "refs/heads/gone" not in _ls_remote(f"{server.url}/repo.git", protocol=protocol)


def test_server_options_pin_a_version_or_a_time(past, tmp_path):
    server, repo, _, views, gone, _ = past
    v = _tagged(views)
    url = f"{server.url}/repo.git"
    assert _ls_remote(url, "-o", f"aspen-version={v}") == views[v]
    client = tmp_path / "client.git"
    h.git("-c", "protocol.version=2", "clone", "-q", "--mirror", f"--server-option=aspen-version={v}", url,
          str(client))
    h.fsck_strict(str(client))
    assert h.git("cat-file", "-e", gone, cwd=str(client), check=False).returncode == 0
    # by time: the latest version committed at or before it (the version's own time, to the microsecond)
    at = next(x["at"] for x in h.versions(repo) if x["id"] == v)
    stamp = datetime.fromtimestamp(math.ceil(at * 1e6) / 1e6, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert _ls_remote(url, "-o", f"aspen-at={stamp}") == views[v]
    assert _ls_remote(f"{url}@{stamp}", protocol=0) == views[v]
    before = datetime.fromtimestamp(math.floor(at * 1e6) / 1e6 - 0.000001, timezone.utc)
    assert _ls_remote(url, "-o", f"aspen-at={before.strftime('%Y-%m-%dT%H:%M:%S.%fZ')}") == views[v - 1]


def test_fetch_into_an_older_view_gets_only_the_rest(past, tmp_path):
    server, repo, _, views, gone, base = past
    older, newer = min(views), _tagged(views)
    client = tmp_path / "client.git"
    h.git("clone", "-q", "--mirror", f"{server.url}/repo.git@{older}", str(client))
    assert h.refs_of(str(client)) == {k: o for k, o in views[older].items()
                                      if k.startswith("refs/") and "^{}" not in k}
    h.git("remote", "set-url", "origin", f"{server.url}/repo.git@{newer}", cwd=str(client))
    h.git("fetch", "-q", "origin", cwd=str(client))
    assert f"pin={newer}" in _access(server)[-1] and "plan=planned" in _access(server)[-1], _access(server)[-1]
    h.fsck_strict(str(client))
    assert h.refs_of(str(client)) == {k: o for k, o in views[newer].items()
                                      if k.startswith("refs/") and "^{}" not in k}


def test_a_view_git_must_answer_gets_the_pruned_objects_put_back(past, tmp_path):
    """A depth-1 clone is git's to answer; the objects gc pruned are indexed
    back into the repository from the version packs first."""
    server, repo, _, views, gone, _ = past
    v = _tagged(views)
    client = tmp_path / "shallow"
    h.git("clone", "-q", "--depth", "1", "--branch", "gone", f"{server.url}/repo.git@{v}", str(client))
    assert h.out("rev-parse", "HEAD", cwd=str(client)).strip() == gone
    h.git("fsck", "--strict", cwd=str(client))
    last = _access(server)[-1]
    assert f"pin={v}" in last and "plan=fallback" in last and "reinjected=" in last, last
    assert h.git("cat-file", "-e", gone, cwd=str(repo), check=False).returncode == 0


def test_a_push_to_a_view_is_refused_and_changes_nothing(past):
    server, repo, work, views, _, _ = past
    before = h.refs_of(str(repo))
    v = min(views)
    res = h.git("push", f"{server.url}/repo.git@{v}", "HEAD:refs/heads/new", cwd=str(work), check=False)
    assert res.returncode != 0
    assert f"repo.git@{v} is a read-only view" in res.stderr.decode(), res.stderr
    assert h.refs_of(str(repo)) == before


def test_bad_pins_get_a_message(past):
    server, repo, _, views, _, _ = past
    latest = _latest(repo)
    url = f"{server.url}/repo.git"
    for protocol in (0, 2):
        res = h.git("-c", f"protocol.version={protocol}", "ls-remote", f"{url}@{latest + 50}", check=False)
        assert res.returncode != 0
        assert f"remote error: aspen: no version {latest + 50}: the latest is {latest}" in res.stderr.decode()
    res = h.git("-c", "protocol.version=2", "ls-remote", "-o", "aspen-version=abc", url, check=False)
    assert res.returncode != 0 and "aspen-version takes a version number" in res.stderr.decode()
    res = h.git("-c", "protocol.version=2", "ls-remote", "-o", "aspen-at=2000-01-01T00:00Z", url, check=False)
    assert res.returncode != 0 and "no version at or before 2000-01-01T00:00Z" in res.stderr.decode()
    # a suffix that is no version or time is part of the path, as it is for stock: not found
    res = h.git("ls-remote", f"{url}@main", check=False)
    assert res.returncode != 0 and "not found" in res.stderr.decode()
    # the dumb protocol has no view of the past
    status = _status(f"{url}@{min(views)}/info/refs")
    assert status == 404
    status = _status(f"{url}@{min(views)}/HEAD")
    assert status == 404
    assert "Traceback" not in server.log_text()


def test_a_repository_named_with_an_at_sign_is_still_itself(root, server_factory, tmp_path):
    h.make_history(root / "odd.git@5")
    server = server_factory(root)
    assert _ls_remote(f"{server.url}/odd.git@5") == _ls_remote(f"{server.url}/odd.git@5", protocol=0)
    assert "HEAD" in _ls_remote(f"{server.url}/odd.git@5")


def test_without_stored_packs_a_pruned_past_gets_a_message(root, server_factory, tmp_path):
    server = server_factory(root, ASPEN_VERSION_PACKS="off")
    repo = pk.enable_push(root / "repo.git")
    work = tmp_path / "work"
    h.git("clone", "-q", server.url + "/repo.git", str(work))
    h.git("checkout", "-q", "-b", "gone", cwd=str(work))
    gone = pk.commit(work, "only on gone")
    h.git("push", "-q", "origin", "gone", cwd=str(work))
    v = _latest(repo)
    h.git("push", "-q", "origin", ":gone", cwd=str(work))
    h.git("gc", "-q", "--prune=now", cwd=str(repo))
    assert "refs/heads/gone" in _ls_remote(f"{server.url}/repo.git@{v}")
    res = h.git("clone", "-q", "--mirror", f"{server.url}/repo.git@{v}", str(tmp_path / "c"), check=False)
    assert res.returncode != 0
    assert f"version {v}'s objects are no longer in the repository and no stored pack holds them" \
        in res.stderr.decode(), res.stderr
    assert gone and "Traceback" not in server.log_text()


def test_without_a_ref_store_there_is_no_past(root, server_factory):
    server = server_factory(root, ASPEN_REFSTORE="0")
    for protocol in (0, 2):
        res = h.git("-c", f"protocol.version={protocol}", "ls-remote", f"{server.url}/repo.git@1", check=False)
        assert res.returncode != 0
        assert "this repository has no ref store: no earlier version can be read" in res.stderr.decode()


def test_views_through_aspen_cgi_are_never_replayed_as_today(past, cgi_server_factory, tmp_path):
    """Under CGI (resident, recorded answers): the view and today's listing
    alternate, and each stays itself."""
    _, repo, _, views, gone, _ = past
    cgi = cgi_server_factory(repo.parent, program="aspen")
    v = _tagged(views)
    today = _ls_remote(f"{cgi.url}/repo.git")
    assert "refs/heads/gone" not in today
    for _ in range(3):
        for protocol in (0, 2):
            assert _ls_remote(f"{cgi.url}/repo.git@{v}", protocol=protocol) == views[v]
            assert _ls_remote(f"{cgi.url}/repo.git", "-o", f"aspen-version={v}") == views[v]
            assert _ls_remote(f"{cgi.url}/repo.git", protocol=protocol) == today
    client = tmp_path / "client.git"
    h.git("clone", "-q", "--mirror", f"{cgi.url}/repo.git@{v}", str(client))
    h.fsck_strict(str(client))
    assert h.git("cat-file", "-e", gone, cwd=str(client), check=False).returncode == 0


def test_a_time_written_to_the_microsecond_names_the_version_of_that_microsecond(root):
    """A version's time written to the microsecond (as `aspen log --json`'s, rounded up) and read back
    as a float may fall an ulp short of the stored time: it still names that version."""
    from aspen_cgi.model.pin import PinError, parse
    from aspen_cgi.refstore.store import RefStore
    store = RefStore.open(Repository.of(str(root / "repo.git"), h.BASE_ENV))
    assert store.sync() == 1
    at = 1796300939.2884321                          # its microsecond read back: 1796300939.288432
    store.conn.execute("UPDATE versions SET at = ? WHERE id = 1", (at,))
    assert store.resolve_pin(parse("2026-12-03T12:28:59.288432Z")) == 1
    with pytest.raises(PinError):
        store.resolve_pin(parse("2026-12-03T12:28:59.288431Z"))
