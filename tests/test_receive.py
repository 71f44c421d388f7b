"""Aspen's receive-pack end to end: real git clients pushing over gunicorn,
hand-made requests for what a client will not send, and the same request
bytes sent to stock `git http-backend` (as a CGI) and to Aspen."""

from __future__ import annotations

import shutil
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from . import harness as h
from . import pushkit as pk
from .pushkit import ZERO

pytestmark = pytest.mark.timeout(120)

FSCK = pytest.mark.parametrize("fsck", [False, True], ids=["nofsck", "fsck"])


def own_server(server_factory, root: Path, **env: str):
    """A gunicorn on loopback (the harness binds port 0 and reads back its port)."""
    return server_factory(root, **env)


@pytest.fixture
def server(root: Path, server_factory):
    return own_server(server_factory, root)


@pytest.fixture
def repo(root: Path) -> Path:
    return pk.enable_push(root / "repo.git")


@pytest.fixture
def url(server, repo) -> str:
    return f"{server.url}/repo.git"


def assert_clean(repo: Path, *clients: Path) -> None:
    h.fsck_strict(str(repo))
    for c in clients:
        h.fsck_strict(str(c))
    leftovers = [p.name for p in (repo / "objects").iterdir() if p.name.startswith(("incoming-", "tmp_objdir"))]
    assert leftovers == [], f"quarantine left behind: {leftovers}"
    keeps = [p.name for p in (repo / "objects" / "pack").glob("*.keep")]
    assert keeps == [], f"receive-pack .keep files left behind: {keeps}"


def server_branches(repo: Path) -> dict[str, str]:
    return h.refs_of(str(repo))


# --- ordinary pushes ------------------------------------------------------------

@FSCK
@pytest.mark.timeout(60)
def test_push_create_ff_force_delete(url, repo, tmp_path, fsck):
    work = pk.clone(url, tmp_path / "work", fsck)
    c1 = pk.commit(work, "one")
    p = pk.push(work, "origin", "HEAD:refs/heads/feature")
    assert "[new branch]" in p.stdout.decode()
    assert server_branches(repo)["refs/heads/feature"] == c1
    c2 = pk.commit(work, "two")
    pk.push(work, "origin", "HEAD:refs/heads/feature")
    assert server_branches(repo)["refs/heads/feature"] == c2
    assert_clean(repo, work)

    h.git("reset", "-q", "--hard", "HEAD~2", cwd=str(work))
    c3 = pk.commit(work, "three")
    rejected = pk.push(work, "origin", "HEAD:refs/heads/feature", check=False)
    assert rejected.returncode != 0 and server_branches(repo)["refs/heads/feature"] == c2
    p = pk.push(work, "origin", "+HEAD:refs/heads/feature")
    assert "forced update" in p.stdout.decode()
    assert server_branches(repo)["refs/heads/feature"] == c3

    pk.push(work, "origin", ":refs/heads/feature")
    assert "refs/heads/feature" not in server_branches(repo)
    assert_clean(repo, work)
    # what the server now has is what a fresh clone gets
    again = pk.clone(url, tmp_path / "again", fsck)
    assert pk.rev(again, "origin/main") == pk.rev(repo, "main")


@FSCK
def test_tags_and_many_objects(url, repo, tmp_path, fsck):
    """A push over the unpack limit (index-pack with progress) and tags."""
    work = pk.clone(url, tmp_path / "work", fsck)
    for i in range(40):
        (work / f"bulk{i}.txt").write_text(f"bulk file {i}\n" * (50 + i))
    h.git("add", "-A", cwd=str(work))
    h.git("commit", "-q", "-m", "bulk", cwd=str(work))
    for i in range(30):
        pk.commit(work, f"c{i}")
    h.git("tag", "-a", "v2", "-m", "two", cwd=str(work))
    p = pk.push(work, "--progress", "origin", "main", "v2")
    assert "remote: Resolving deltas" in p.stderr.decode(), p.stderr.decode()   # the server's index-pack, relayed
    refs = server_branches(repo)
    assert refs["refs/heads/main"] == pk.rev(work, "main")
    assert refs["refs/tags/v2"] == pk.rev(work, "v2")
    assert_clean(repo, work)


@pytest.mark.timeout(60)
def test_chunked_push_after_probe(url, repo, tmp_path):
    """A push bigger than http.postBuffer: probe POST `0000`, then a chunked body."""
    import os
    work = pk.clone(url, tmp_path / "work")
    (work / "blob.bin").write_bytes(os.urandom(600 * 1024))
    tip = pk.commit(work, "big blob")
    p = h.git("-c", "http.postBuffer=65536", "push", "origin", "main", cwd=str(work), check=False,
              env={"GIT_TRACE_CURL": "1", "GIT_TRACE_CURL_NO_DATA": "1"})
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    trace = p.stderr.decode(errors="replace")
    assert "Transfer-Encoding: chunked" in trace
    assert pk.rev(repo, "main") == tip
    assert_clean(repo, work)


@pytest.mark.timeout(60)
def test_atomic_push_all_or_nothing(url, repo, tmp_path):
    work = pk.clone(url, tmp_path / "work")
    c1 = pk.commit(work, "one")
    pk.push(work, "--atomic", "origin", "HEAD:refs/heads/a1", "HEAD:refs/heads/a2")
    refs = server_branches(repo)
    assert refs["refs/heads/a1"] == refs["refs/heads/a2"] == c1

    pk.write_hook(repo, "update", 'echo "checking $1"\n[ "$1" != refs/heads/bad ] || { echo "no bad refs" >&2; exit 1; }\n')
    before = server_branches(repo)
    c2 = pk.commit(work, "two")
    p = pk.push(work, "--atomic", "origin", "HEAD:refs/heads/a1", "HEAD:refs/heads/bad", "HEAD:refs/heads/a3",
                check=False)
    err = p.stderr.decode()
    assert p.returncode != 0
    assert "remote: no bad refs" in err and "remote: error: hook declined to update refs/heads/bad" in err
    out = p.stdout.decode()
    assert "refs/heads/bad\t[remote rejected] (hook declined)" in out
    assert "[remote rejected] (atomic push failure)" in out
    assert server_branches(repo) == before
    assert c2 not in h.out("rev-list", "--all", cwd=str(repo))
    assert_clean(repo, work)


@pytest.mark.timeout(60)
def test_push_options_reach_hooks(root, repo, server, tmp_path):
    pk.set_config(repo, "receive.advertisePushOptions", "true")
    script = 'echo "count=$GIT_PUSH_OPTION_COUNT 0=$GIT_PUSH_OPTION_0 1=$GIT_PUSH_OPTION_1"\n'
    pk.write_hook(repo, "pre-receive", script)
    pk.write_hook(repo, "post-receive", script.replace("count", "post"))
    work = pk.clone(f"{server.url}/repo.git", tmp_path / "work")
    pk.commit(work, "one")
    p = pk.push(work, "-o", "ci.skip", "-o", "reviewer=alice bob", "origin", "main")
    err = p.stderr.decode()
    assert "remote: count=2 0=ci.skip 1=reviewer=alice bob" in err
    assert "remote: post=2 0=ci.skip 1=reviewer=alice bob" in err
    pk.commit(work, "two")
    p = pk.push(work, "origin", "main")
    assert "remote: count=0 0= 1=" in p.stderr.decode()


def test_push_options_refused_when_not_advertised(url, repo, tmp_path):
    work = pk.clone(url, tmp_path / "work")
    pk.commit(work, "one")
    before = server_branches(repo)
    p = pk.push(work, "-o", "x", "origin", "main", check=False)
    assert p.returncode != 0 and "does not support push options" in p.stderr.decode()
    assert server_branches(repo) == before


# --- receive.* rules -------------------------------------------------------------

@FSCK
def test_deny_non_fast_forwards(url, repo, tmp_path, fsck):
    pk.set_config(repo, "receive.denyNonFastForwards", "true")
    work = pk.clone(url, tmp_path / "work", fsck)
    h.git("reset", "-q", "--hard", "HEAD~1", cwd=str(work))
    pk.commit(work, "diverge")
    before = server_branches(repo)
    p = pk.push(work, "origin", "+main", check=False)
    assert p.returncode != 0
    assert "remote: error: denying non-fast-forward refs/heads/main (you should pull first)" in p.stderr.decode()
    assert "[remote rejected] (non-fast-forward)" in p.stdout.decode()
    assert server_branches(repo) == before
    pk.push(work, "origin", "HEAD:refs/heads/elsewhere")   # a new ref is still fine
    assert_clean(repo, work)


def test_deny_deletes_and_current(url, repo, tmp_path):
    work = pk.clone(url, tmp_path / "work")
    pk.set_config(repo, "receive.denyDeletes", "true")
    before = server_branches(repo)
    p = pk.push(work, "origin", ":refs/heads/topic", check=False)
    assert "[remote rejected] (deletion prohibited)" in p.stdout.decode()
    assert "remote: error: denying ref deletion for refs/heads/topic" in p.stderr.decode()
    assert server_branches(repo) == before
    pk.set_config(repo, "receive.denyDeletes", "false")
    p = pk.push(work, "origin", ":refs/heads/main", check=False)
    assert "[remote rejected] (deletion of the current branch prohibited)" in p.stdout.decode()
    assert "remote: error: By default, deleting the current branch is denied" in p.stderr.decode()
    assert server_branches(repo) == before
    pk.push(work, "origin", ":refs/heads/topic")
    assert "refs/heads/topic" not in server_branches(repo)


def test_deny_current_branch_on_non_bare_repo(root, server, tmp_path):
    nb = root / "checkout"
    h.git("clone", "-q", str(root / "repo.git"), str(nb))
    h.git("config", "http.receivepack", "true", cwd=str(nb))
    url = f"{server.url}/checkout"       # served through the /.git DWIM
    work = pk.clone(url, tmp_path / "work")
    c1 = pk.commit(work, "one")
    before = h.refs_of(str(nb))
    p = pk.push(work, "origin", "main", check=False)
    assert p.returncode != 0
    assert "[remote rejected] (branch is currently checked out)" in p.stdout.decode()
    err = p.stderr.decode()
    assert "remote: error: refusing to update checked out branch: refs/heads/main" in err
    assert "remote: error: By default, updating the current branch in a non-bare repository" in err
    assert h.refs_of(str(nb)) == before
    pk.push(work, "origin", "main:refs/heads/other")      # other branches are fine

    h.git("config", "receive.denyCurrentBranch", "updateInstead", cwd=str(nb))
    pk.push(work, "origin", "main")
    assert pk.rev(nb, "HEAD") == c1
    assert (nb / "f-one.txt").read_text() == "one\n" * 10    # work tree updated
    h.fsck_strict(str(nb))


@pytest.mark.parametrize("client_fsck", [False, True], ids=["client-nofsck", "client-fsck"])
def test_fsck_objects_rejects_corrupt_commit(url, repo, tmp_path, client_fsck):
    work = pk.clone(url, tmp_path / "work", client_fsck)
    head = pk.rev(work, "HEAD")
    tree = pk.rev(work, "HEAD^{tree}")
    body = f"tree {tree}\nparent {head}\nauthor A <a@b.c 1 +0000\ncommitter A <a@b.c> 1 +0000\n\nbad email\n"
    bad = h.git("hash-object", "-t", "commit", "-w", "--literally", "--stdin", cwd=str(work),
                input=body.encode()).stdout.decode().strip()
    before = server_branches(repo)
    pk.set_config(repo, "receive.fsckObjects", "true")
    p = h.git("-c", "transfer.fsckObjects=false", "push", "--porcelain", "origin", f"{bad}:refs/heads/bad",
              cwd=str(work), check=False)
    assert p.returncode != 0
    err = p.stderr.decode()
    assert "badEmail" in err and "remote: fatal: fsck error in packed object" in err
    assert "unpacker error" in p.stdout.decode()
    assert server_branches(repo) == before
    assert h.git("cat-file", "-e", bad, cwd=str(repo), check=False).returncode != 0
    h.fsck_strict(str(repo))
    # without fsckObjects the same push is accepted, as stock accepts it
    pk.set_config(repo, "receive.fsckObjects", "false")
    p = h.git("-c", "transfer.fsckObjects=false", "push", "origin", f"{bad}:refs/heads/bad", cwd=str(work), check=False)
    assert p.returncode == 0 and server_branches(repo)["refs/heads/bad"] == bad


# --- hooks ---------------------------------------------------------------------------

def test_pre_receive_hook_declines(url, repo, tmp_path):
    pk.write_hook(repo, "pre-receive", 'while read old new ref; do echo "saw $ref"; done\n'
                                       'test -n "$GIT_QUARANTINE_PATH" && echo quarantined\n'
                                       'echo "policy says no" >&2\nexit 1\n')
    work = pk.clone(url, tmp_path / "work")
    c1 = pk.commit(work, "one")
    before = server_branches(repo)
    p = pk.push(work, "origin", "main", "HEAD:refs/heads/x", check=False)
    assert p.returncode != 0
    err = p.stderr.decode()
    for line in ("remote: saw refs/heads/main", "remote: saw refs/heads/x", "remote: quarantined",
                 "remote: policy says no"):
        assert line in err
    assert p.stdout.decode().count("[remote rejected] (pre-receive hook declined)") == 2
    assert server_branches(repo) == before
    assert h.git("cat-file", "-e", c1, cwd=str(repo), check=False).returncode != 0   # quarantine dropped
    assert_clean(repo, work)


def test_update_hook_declines_one_ref_and_post_hooks_run(url, repo, tmp_path):
    pk.write_hook(repo, "update", '[ "$1" = refs/heads/main ] && { echo "main is frozen ($2..$3)"; exit 1; }\nexit 0\n')
    pk.write_hook(repo, "post-receive", 'while read o n r; do echo "post $r"; done\n')
    pk.write_hook(repo, "post-update", 'echo "post-update $*"\n')
    work = pk.clone(url, tmp_path / "work")
    c1 = pk.commit(work, "one")
    old = pk.rev(repo, "main")
    p = pk.push(work, "origin", "main", "HEAD:refs/heads/x", check=False)
    err, out = p.stderr.decode(), p.stdout.decode()
    assert f"remote: main is frozen ({old}..{c1})" in err
    assert "remote: error: hook declined to update refs/heads/main" in err
    assert "refs/heads/main\t[remote rejected] (hook declined)" in out
    assert "remote: post refs/heads/x" in err and "post refs/heads/main" not in err
    assert "remote: post-update refs/heads/x" in err
    refs = server_branches(repo)
    assert refs["refs/heads/main"] == old and refs["refs/heads/x"] == c1
    assert_clean(repo, work)


def test_non_executable_hook_is_skipped(url, repo, tmp_path):
    hook = pk.write_hook(repo, "pre-receive", "exit 1\n")
    hook.chmod(0o644)
    work = pk.clone(url, tmp_path / "work")
    c1 = pk.commit(work, "one")
    pk.push(work, "origin", "main")
    assert pk.rev(repo, "main") == c1


# --- requests no client sends ------------------------------------------------------

def _work_with_unpushed(url: str, tmp_path: Path) -> tuple[Path, str, str, str]:
    work = pk.clone(url, tmp_path / "work")
    base = pk.rev(work, "HEAD")
    a = pk.commit(work, "a")
    b = pk.commit(work, "b")
    return work, base, a, b


def _post_http(url: str, body: bytes, timeout: float = 30) -> tuple[int, bytes]:
    req = urllib.request.Request(f"{url}/git-receive-pack", data=body, method="POST",
                                 headers={"Content-Type": "application/x-git-receive-pack-request"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@FSCK
@pytest.mark.timeout(60)
def test_pack_missing_a_parent_is_rejected(url, repo, tmp_path, fsck):
    pk.set_config(repo, "receive.fsckObjects", str(fsck).lower())
    work, base, a, b = _work_with_unpushed(url, tmp_path)
    pack = pk.pack_for(work, [b, "^" + a])              # b without its parent a
    before = server_branches(repo)
    status, body = _post_http(url, pk.request([(base, b, "refs/heads/main")], pack=pack))
    assert status == 200
    lines = pk.report_lines(body)
    if fsck:
        assert lines == ["unpack unpack-objects abnormal exit", "ng refs/heads/main unpacker error"]
    else:
        assert lines == ["unpack ok", "ng refs/heads/main missing necessary objects"]
    assert server_branches(repo) == before
    assert h.git("cat-file", "-e", b, cwd=str(repo), check=False).returncode != 0
    assert_clean(repo)


@pytest.mark.timeout(30)
def test_truncated_body_gets_a_status_not_a_hang(url, repo, server, tmp_path):
    work, base, a, b = _work_with_unpushed(url, tmp_path)
    body = pk.request([(base, b, "refs/heads/main")], pack=pk.pack_for(work, [b, "^" + base]))
    before = server_branches(repo)
    for cut in (len(body) // 2, 30):         # inside the pack, inside the commands
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=20)
        head = (f"POST /repo.git/git-receive-pack HTTP/1.1\r\nHost: x\r\n"
                f"Content-Type: application/x-git-receive-pack-request\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n").encode()
        sock.sendall(head + body[:cut])
        sock.shutdown(socket.SHUT_WR)
        reply = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
        sock.close()
        status = int(reply.split(b" ", 2)[1])
        assert status == 400, reply[:300]
    assert server_branches(repo) == before
    assert_clean(repo)


def test_probe_body_is_empty_200(url, repo):
    status, body = _post_http(url, b"0000")
    assert (status, body) == (200, b"")


def test_garbage_commands_are_a_400(url, repo):
    status, _ = _post_http(url, b"0030this is not a command line at all....\n0000")
    assert status == 400


@pytest.mark.timeout(90)
def test_racing_pushes_to_one_ref_exactly_one_wins(root, repo, server, tmp_path):
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    # Hold both pushes until both have passed their checks, then let them race on the CAS.
    pk.write_hook(repo, "update", f'touch "{barrier}/$$"\ni=0\n'
                                  f'while [ "$(ls "{barrier}" | wc -l)" -lt 2 ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done\n')
    url = f"{server.url}/repo.git"
    works = [pk.clone(url, tmp_path / f"w{i}") for i in range(2)]
    tips = [pk.commit(w, f"racer {i}") for i, w in enumerate(works)]
    results: list = [None, None]

    def run(i):
        results[i] = pk.push(works[i], "origin", "main", check=False)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=80)
    codes = [r.returncode for r in results]
    assert sorted(codes) == [0, 1], [r.stderr for r in results]
    winner = codes.index(0)
    loser = 1 - winner
    assert pk.rev(repo, "main") == tips[winner]
    assert "failed to update ref" in results[loser].stdout.decode()
    assert "cannot lock ref 'refs/heads/main'" in results[loser].stderr.decode()
    assert_clean(repo, *works)


def test_namespace_push(root, repo, server_factory, tmp_path):
    srv = own_server(server_factory, root, GIT_NAMESPACE="team")
    work = tmp_path / "work"
    h.git("init", "-q", "-b", "main", str(work))
    c1 = pk.commit(work, "first")
    h.git("remote", "add", "origin", f"{srv.url}/repo.git", cwd=str(work))
    pk.push(work, "origin", "main")
    refs = server_branches(repo)
    assert refs["refs/namespaces/team/refs/heads/main"] == c1
    assert refs["refs/heads/main"] != c1
    assert_clean(repo, work)


def test_update_server_info(url, repo, tmp_path):
    pk.set_config(repo, "receive.updateServerInfo", "true")
    work = pk.clone(url, tmp_path / "work")
    c1 = pk.commit(work, "one")
    pk.push(work, "origin", "main")
    assert f"{c1}\trefs/heads/main" in (repo / "info" / "refs").read_text()


# --- the same bytes to stock and to Aspen ---------------------------------------

def _scenarios(work: Path, src: Path):
    main = pk.rev(src, "main")
    topic = pk.rev(src, "topic")
    a = pk.commit(work, "a")
    b = pk.commit(work, "b")
    h.git("checkout", "-q", "-b", "side", "main~2", cwd=str(work))
    c = pk.commit(work, "c")
    tree = pk.rev(work, b + "^{tree}")
    raw = f"tree {tree}\nparent {b}\nauthor A <a@b.c 1 +0000\ncommitter A <a@b.c> 1 +0000\n\nbad\n"
    bad = h.git("hash-object", "-t", "commit", "-w", "--literally", "--stdin", cwd=str(work),
                input=raw.encode()).stdout.decode().strip()
    p_ab = pk.pack_for(work, [b, "^" + main])
    p_b = pk.pack_for(work, [b, "^" + a])
    p_c = pk.pack_for(work, [c, "^" + main])
    p_bad = h.git("pack-objects", "--stdout", "-q", cwd=str(work), input=(bad + "\n").encode()).stdout
    all_objs = [line.split()[0] for line in h.out("rev-list", "--objects", "--all", cwd=str(work)).splitlines()]
    p_big = h.git("pack-objects", "--stdout", "-q", cwd=str(work), input=("\n".join(all_objs) + "\n").encode()).stdout
    sb = "report-status side-band-64k"
    tag = pk.rev(src, "v1.0")
    return {
        "create": ([(ZERO, b, "refs/heads/new")], p_ab, {}),
        "fast-forward": ([(main, b, "refs/heads/main")], p_ab, {}),
        "deny-non-ff": ([(main, c, "refs/heads/main")], p_c, {"receive.denyNonFastForwards": "true"}),
        "forced": ([(main, c, "refs/heads/main")], p_c, {}),
        "deny-deletes": ([(topic, ZERO, "refs/heads/topic"), (tag, ZERO, "refs/tags/v1.0")], b"",
                         {"receive.denyDeletes": "true"}),
        "delete-current": ([(main, ZERO, "refs/heads/main")], b"", {}),
        "delete-current-warn": ([(main, ZERO, "refs/heads/main")], b"", {"receive.denyDeleteCurrent": "warn"}),
        "delete-missing": ([(a, ZERO, "refs/heads/nope")], b"", {}),
        "funny": ([(ZERO, b, "refs/heads/a..b"), (ZERO, b, "refs/foo"), (ZERO, b, "HEAD"), (ZERO, b, "refs/heads/ok")],
                  p_ab, {}),
        "hidden": ([(ZERO, b, "refs/hidden/x"), (ZERO, b, "refs/heads/vis")], p_ab, {"receive.hideRefs": "refs/hidden"}),
        "hidden-atomic": ([(ZERO, b, "refs/hidden/x"), (ZERO, b, "refs/heads/vis")], p_ab,
                          {"receive.hideRefs": "refs/hidden"}, sb + " atomic"),
        "atomic-non-ff": ([(ZERO, b, "refs/heads/n1"), (main, c, "refs/heads/main"), (ZERO, b, "refs/heads/n2")],
                          p_ab, {"receive.denyNonFastForwards": "true"}, sb + " atomic"),
        "unconnected": ([(main, b, "refs/heads/main"), (ZERO, main, "refs/heads/fine")], p_b, {}),
        "unconnected-fsck": ([(main, b, "refs/heads/main")], p_b, {"receive.fsckObjects": "true"}),
        "corrupt-fsck": ([(ZERO, bad, "refs/heads/bad")], p_bad, {"receive.fsckObjects": "true"}),
        "corrupt-no-fsck": ([(ZERO, bad, "refs/heads/bad")], p_bad, {}),
        "bad-signature": ([(ZERO, b, "refs/heads/x")], b"PACX\0\0\0\2\0\0\0\1", {}),
        "short-header": ([(ZERO, b, "refs/heads/x")], b"PACK", {}),
        "stale-old": ([(topic, b, "refs/heads/main")], p_ab, {}),
        "create-existing": ([(ZERO, b, "refs/heads/main")], p_ab, {}),
        "no-report": ([(ZERO, b, "refs/heads/new")], p_ab, {}, "side-band-64k"),
        "plain": ([(ZERO, b, "refs/heads/new"), (main, c, "refs/heads/main")], p_ab, {}, "report-status"),
        "v2": ([(main, c, "refs/heads/main")], p_c, {"receive.denyNonFastForwards": "true"}, "report-status-v2"),
        "big": ([(ZERO, c, "refs/heads/big")], p_big, {}),
        "big-quiet": ([(ZERO, c, "refs/heads/big")], p_big, {}, sb + " quiet"),
        "max-input-size": ([(ZERO, c, "refs/heads/big")], p_big, {"receive.maxInputSize": "100"}),
        "hooks": ([(ZERO, b, "refs/heads/new"), (main, b, "refs/heads/main")], p_ab, {}, sb,
                  {"update": "echo upd $1; [ $1 != refs/heads/main ]", "pre-receive": "cat; echo pre",
                   "post-receive": "echo post; cat", "post-update": 'echo pu "$@"'}),
        "hook-env": ([(ZERO, b, "refs/heads/new")], p_ab, {}, sb,
                     {"pre-receive": f"echo ${{GIT_QUARANTINE_PATH:+q}} $GIT_PUSH_OPTION_COUNT; git cat-file -t {b}",
                      "update": "echo ${GIT_QUARANTINE_PATH:-none} $GIT_PUSH_OPTION_COUNT",
                      "post-receive": "echo ${GIT_QUARANTINE_PATH:-none} $GIT_PUSH_OPTION_COUNT",
                      "post-update": "echo ${GIT_PUSH_OPTION_COUNT:-unset}"}),
        "push-options": ([(ZERO, b, "refs/heads/new")], p_ab, {"receive.advertisePushOptions": "true"},
                         sb + " push-options", {"pre-receive": "echo $GIT_PUSH_OPTION_COUNT $GIT_PUSH_OPTION_1"},
                         {}, ["a=1", "b 2"]),
        "pre-receive-declines": ([(ZERO, b, "refs/heads/new")], p_ab, {}, "report-status",
                                 {"pre-receive": "echo nope >&2; exit 1"}),
        "namespace": ([(ZERO, b, "refs/heads/new"), (ZERO, b, "refs/heads/main")], p_ab, {}, sb,
                      {"pre-receive": "cat; git for-each-ref"}, {"GIT_NAMESPACE": "ns"}),
    }


# Where Aspen's band-2 text legitimately differs: stock unpacks small pushes with
# unpack-objects, Aspen always with index-pack, whose fatal messages are worded
# differently. The report lines are still the same.
MESSAGE_EXCEPTIONS = {"unconnected-fsck", "max-input-size"}


SCENARIOS = ("create", "fast-forward", "deny-non-ff", "forced", "deny-deletes", "delete-current",
             "delete-current-warn", "delete-missing", "funny", "hidden", "hidden-atomic", "atomic-non-ff",
             "unconnected", "unconnected-fsck", "corrupt-fsck", "corrupt-no-fsck", "bad-signature", "short-header",
             "stale-old", "create-existing", "no-report", "plain", "v2", "big", "big-quiet", "max-input-size",
             "hooks", "hook-env", "push-options", "pre-receive-declines", "namespace")


@pytest.fixture(scope="module")
def scenario_set(tmp_path_factory):
    base = tmp_path_factory.mktemp("scenarios")
    src = h.make_history(base / "src.git")
    work = base / "work"
    h.git("clone", "-q", str(src), str(work))
    scenarios = _scenarios(work, src)
    assert set(scenarios) == set(SCENARIOS)
    return src, scenarios


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", SCENARIOS)
def test_report_status_matches_stock(tmp_path, scenario_set, name):
    """The same request bytes to stock (CGI) and Aspen (CGI), each on its own
    copy of one repository: same status, report lines, band-2 messages, refs."""
    src, scenarios = scenario_set
    sc = scenarios[name]
    cmds, pack, cfg = sc[:3]
    caps = sc[3] if len(sc) > 3 else "report-status side-band-64k"
    hooks = sc[4] if len(sc) > 4 else {}
    extra = sc[5] if len(sc) > 5 else {}
    opts = sc[6] if len(sc) > 6 else ()
    body = pk.request(cmds, caps, pack, opts)
    seen = {}
    for prog in ("stock", "aspen"):
        root = tmp_path / prog
        root.mkdir()
        repo = pk.enable_push(Path(shutil.copytree(src, root / "repo.git", symlinks=True)))
        for k, v in cfg.items():
            pk.set_config(repo, k, v)
        for hook, script in hooks.items():
            pk.write_hook(repo, hook, script + "\n")
        r = pk.post(root, "repo.git", body, program=prog, **extra)
        text = pk.messages(r.body).replace(str(root), "<root>")
        if name in MESSAGE_EXCEPTIONS:
            text = "<not compared>"
        seen[prog] = (r.status, pk.report_lines(r.body), text, h.refs_of(str(repo)), len(r.body) == 0)
        if prog == "aspen":
            assert_clean(repo)
    assert seen["stock"] == seen["aspen"]


def test_real_client_output_matches_stock(tmp_path, cgi_server_factory, server_factory):
    """A real client's view (porcelain status lines, remote: lines) of one
    push with a declining update hook, through stock and through Aspen."""
    outputs = {}
    for prog in ("stock", "aspen"):
        root = tmp_path / prog
        root.mkdir()
        repo = pk.enable_push(h.make_history(root / "repo.git"))
        pk.write_hook(repo, "update", 'echo "update $1"; [ "$1" != refs/heads/main ]\n')
        srv = cgi_server_factory(root) if prog == "stock" else own_server(server_factory, root)
        work = tmp_path / f"{prog}-work"
        h.git("clone", "-q", f"{srv.url}/repo.git", str(work))
        (work / "x.txt").write_text("x\n")
        h.git("add", "-A", cwd=str(work))
        h.git("commit", "-q", "-m", "x", "--date=2000-01-01T00:00:00", cwd=str(work),
              env={"GIT_COMMITTER_DATE": "2000-01-01T00:00:00"})
        p = pk.push(work, "origin", "main", "main:refs/heads/other", check=False)
        remote = [line for line in p.stderr.decode().splitlines() if line.startswith("remote:")]
        status = [line.split("\t", 1)[1] for line in p.stdout.decode().splitlines() if "\t" in line]
        outputs[prog] = (p.returncode, remote, status)
    assert outputs["stock"] == outputs["aspen"]



# --- streaming, keepalive ------------------------------------------------------------

class _Concat:
    """A request body read from a small head in memory and a big file on disk."""

    def __init__(self, head: bytes, path: Path):
        import io
        self.parts = [io.BytesIO(head), open(path, "rb")]

    def read(self, n: int = -1) -> bytes:
        while self.parts:
            data = self.parts[0].read(n)
            if data:
                return data
            self.parts.pop(0).close()
        return b""


@pytest.mark.timeout(120)
def test_big_push_is_streamed_not_buffered(root, repo, tmp_path):
    """A 24 MB pack goes through serve() while Python holds only a few MB."""
    import os
    import tracemalloc

    from aspen_cgi import settings
    from aspen_cgi.git.repoconfig import RepoConfig
    from aspen_cgi.http import paths
    from aspen_cgi.http.body import Body
    from aspen_cgi.push import receive
    from aspen_cgi.service import RequestInfo, ServiceContext, child_env

    work = tmp_path / "work"
    h.git("clone", "-q", str(repo), str(work))
    (work / "big.bin").write_bytes(os.urandom(24 * 1024 * 1024))
    tip = pk.commit(work, "big")
    base = pk.rev(work, "HEAD~1")
    pack_path = tmp_path / "big.pack"
    pack_path.write_bytes(pk.pack_for(work, [tip, "^" + base]))
    head = pk.request([(base, tip, "refs/heads/main")], caps="report-status side-band-64k quiet")
    size = len(head) + pack_path.stat().st_size
    env = child_env({"REMOTE_USER": "u", "REMOTE_ADDR": "127.0.0.1", "PATH": os.environ["PATH"]}, str(repo))
    ctx = ServiceContext(paths.Repo(str(repo), str(repo), True), RepoConfig.load(str(repo), env), env,
                         RequestInfo.of(env, 0), [], settings.of(env))
    ctx.refstore()   # the store's first use (schema creation, module imports) is not the push's memory
    tracemalloc.start()
    try:
        out = b"".join(receive.serve(ctx, Body(_Concat(head, pack_path), size, False)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert pk.report_lines(out) == ["unpack ok", "ok refs/heads/main"]
    assert peak < 8 * 1024 * 1024, f"peak Python allocation {peak} bytes"
    assert pk.rev(repo, "main") == tip
    assert_clean(repo)


def test_keepalive_while_a_hook_is_silent(root, repo, tmp_path):
    pk.set_config(repo, "receive.keepAlive", "1")
    pk.write_hook(repo, "pre-receive", "sleep 2.5\necho done\n")
    work = tmp_path / "work"
    h.git("clone", "-q", str(repo), str(work))
    base = pk.rev(work, "HEAD")
    tip = pk.commit(work, "one")
    body = pk.request([(base, tip, "refs/heads/main")], pack=pk.pack_for(work, [tip, "^" + base]))
    r = pk.post(root, "repo.git", body)
    assert r.body.count(b"0005\x01") >= 2
    assert pk.report_lines(r.body) == ["unpack ok", "ok refs/heads/main"]
    assert pk.messages(r.body) == "done\n"
    # without side-band there is nowhere to put a keepalive
    pk.write_hook(repo, "pre-receive", "sleep 1.5\n")
    tip2 = pk.commit(work, "two")
    body = pk.request([(tip, tip2, "refs/heads/main")], caps="report-status",
                      pack=pk.pack_for(work, [tip2, "^" + tip]))
    r = pk.post(root, "repo.git", body)
    assert r.body == b"".join([b"000eunpack ok\n", b"0017ok refs/heads/main\n", b"0000"])


NON_BARE = {
    "default": ({}, {}, None),
    "refuse": ({"receive.denyCurrentBranch": "refuse"}, {}, None),
    "warn": ({"receive.denyCurrentBranch": "warn"}, {}, None),
    "ignore": ({"receive.denyCurrentBranch": "ignore"}, {}, None),
    "update-instead": ({"receive.denyCurrentBranch": "updateInstead"}, {}, None),
    "update-instead-dirty": ({"receive.denyCurrentBranch": "updateInstead"}, {}, "README"),
    "push-to-checkout": ({"receive.denyCurrentBranch": "updateInstead"},
                         {"push-to-checkout": 'echo "deploy $1 in $(basename "$GIT_WORK_TREE")"; exit 1'}, None),
    "delete-current": ({"receive.denyCurrentBranch": "ignore"}, {}, None),
}


# Where the repository's git directory is: in a work tree; a copy of a work
# tree's `.git` named `checkout.git` (t5545's mk_http_pair: `core.bare` stays
# false, so receive-pack sees a non-bare repository whose work tree is that
# directory itself); a work tree whose `.git` does not set `core.bare` (bare
# to receive-pack).
LAYOUTS = ("work-tree", "git-dir-copy", "core-bare-unset")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", list(NON_BARE))
def test_non_bare_current_branch_matches_stock(tmp_path, case, layout):
    cfg, hooks, dirty = NON_BARE[case]
    src = h.make_history(tmp_path / "src.git")
    work = tmp_path / "work"
    h.git("clone", "-q", str(src), str(work))
    old = pk.rev(work, "main")
    new = pk.commit(work, "pushed")
    cmds = [(old, ZERO, "refs/heads/main")] if case == "delete-current" else [(old, new, "refs/heads/main")]
    pack = b"" if case == "delete-current" else pk.pack_for(work, [new, "^" + old])
    body = pk.request(cmds, pack=pack)
    seen = {}
    for prog in ("stock", "aspen"):
        root = tmp_path / prog
        root.mkdir()
        nb = root / "checkout"
        h.git("clone", "-q", str(src), str(nb))
        gitdir = nb / ".git"
        if layout == "git-dir-copy":
            gitdir = Path(shutil.copytree(gitdir, root / "checkout.git", symlinks=True))
            shutil.rmtree(nb)
            nb = gitdir
        elif layout == "core-bare-unset":
            h.git("config", "--unset", "core.bare", cwd=str(nb))
        pk.enable_push(gitdir)
        for k, v in cfg.items():
            pk.set_config(gitdir, k, v)
        for name, script in hooks.items():
            pk.write_hook(gitdir, name, script + "\n", gitdir=gitdir)
        if dirty:
            (nb / dirty).write_text("local edit\n")
        r = pk.post(root, "checkout", body, program=prog)
        files = sorted(p.name for p in nb.iterdir() if p.name != "aspen")
        status = h.out("status", "--porcelain", cwd=str(nb)) if layout != "git-dir-copy" else None
        seen[prog] = (r.status, pk.report_lines(r.body), pk.messages(r.body).replace(str(root), "<root>"),
                      h.refs_of(str(gitdir)), files, status)
        h.fsck_strict(str(gitdir))
    assert seen["stock"] == seen["aspen"]
    refused = seen["stock"][1][1].startswith("ng ")
    if case == "default":
        assert refused == (layout != "core-bare-unset")   # a repository receive-pack sees as bare takes it


# t5545's hooks: each writes the push options it was given to hooks/<name>.push_options
# (`echo $value`, which folds runs of blanks), and here also exactly, to hooks/<name>.exact
T5545_HOOK = """if test -n "$GIT_PUSH_OPTION_COUNT"; then
	i=0
	>hooks/@NAME@.push_options
	>hooks/@NAME@.exact
	while test "$i" -lt "$GIT_PUSH_OPTION_COUNT"; do
		eval "value=\\$GIT_PUSH_OPTION_$i"
		echo $value >>hooks/@NAME@.push_options
		printf '%s\\n' "$value" >>hooks/@NAME@.exact
		i=$((i + 1))
	done
fi
"""
QUOTED_OPTIONS = ('"embedded quotes"', "a'b", "back\\slash", "two  spaces", "ünïcode")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("deny", ["warn", "ignore", "updateInstead"])
def test_push_options_with_quotes_into_a_non_bare_upstream_as_stock(tmp_path, cgi_server_factory,
                                                                    server_factory, deny):
    """t5545's HTTP part: an upstream made non-bare (`git init`, hooks, then
    its `.git` copied to `upstream.git` under the server's root), served at
    /upstream; a real client pushes options with quotes, backslashes and
    spaces. Its hooks see each option exactly as sent, and the client sees
    what it sees from stock (the warning about the current branch; for
    updateInstead, the pushed files checked out in the work tree, which is
    the git directory itself)."""
    seen = {}
    for prog in ("stock", "aspen-cgi", "aspen-wsgi"):
        root = tmp_path / prog / "docroot"
        root.mkdir(parents=True)
        up = tmp_path / prog / "upstream"
        h.git("init", "-q", "-b", "main", str(up))
        h.git("config", "receive.denyCurrentBranch", deny, cwd=str(up))
        for name in ("pre-receive", "post-receive"):
            pk.write_hook(up, name, T5545_HOOK.replace("@NAME@", name), gitdir=up / ".git")
        h.git("config", "receive.advertisePushOptions", "true", cwd=str(up))
        h.git("config", "http.receivepack", "true", cwd=str(up))
        repo = Path(shutil.copytree(up / ".git", root / "upstream.git", symlinks=True))
        if prog == "stock":
            srv = cgi_server_factory(root)
        elif prog == "aspen-cgi":
            srv = cgi_server_factory(root, program="aspen")
        else:
            srv = own_server(server_factory, root)
        work = tmp_path / prog / "test_http_clone"
        h.git("clone", "-q", f"{srv.url}/upstream", str(work))
        (work / "one.t").write_text("one\n")
        h.git("add", "-A", cwd=str(work))
        h.git("commit", "-q", "-m", "one", cwd=str(work), env={"GIT_COMMITTER_DATE": "2005-04-07T22:13:13Z",
                                                             "GIT_AUTHOR_DATE": "2005-04-07T22:13:13Z"})
        args = [f"--push-option={o}" for o in QUOTED_OPTIONS]
        p = h.git("push", "--porcelain", *args, "origin", "main", cwd=str(work), check=False)
        remote = [line.rstrip() for line in p.stderr.decode().splitlines() if line.startswith("remote:")]
        status = [line for line in p.stdout.decode().splitlines() if "\t" in line]
        recorded = {f"{name}.{kind}": (repo / "hooks" / f"{name}.{kind}").read_text()
                    if (repo / "hooks" / f"{name}.{kind}").exists() else None
                    for name in ("pre-receive", "post-receive") for kind in ("push_options", "exact")}
        files = sorted(f.name for f in repo.iterdir() if f.name != "aspen")
        seen[prog] = (p.returncode, remote, status, recorded, h.refs_of(str(repo)), files)
    assert seen["aspen-cgi"] == seen["stock"]
    assert seen["aspen-wsgi"] == seen["stock"]
    rc, remote, status, recorded, refs, files = seen["stock"]
    assert recorded["pre-receive.exact"] == "".join(o + "\n" for o in QUOTED_OPTIONS)
    assert recorded["pre-receive.push_options"] == "".join(" ".join(o.split()) + "\n" for o in QUOTED_OPTIONS)
    assert rc == 0 and status == ["*\trefs/heads/main:refs/heads/main\t[new branch]"]
    assert recorded["post-receive.exact"] == recorded["pre-receive.exact"]
    assert ("remote: warning: updating the current branch" in remote) == (deny == "warn")
    assert ("one.t" in files) == (deny == "updateInstead")     # the work tree updated is the git directory


def test_push_from_a_shallow_clone(url, repo, tmp_path):
    """CI pushes from depth-1 clones send `shallow` lines; the server has the history."""
    work = tmp_path / "work"
    h.git("clone", "-q", "--depth", "1", url, str(work))
    tip = pk.commit(work, "from shallow")
    pk.push(work, "origin", "main")
    assert pk.rev(repo, "main") == tip
    assert not (repo / "shallow").exists()
    assert_clean(repo)


def test_first_push_into_an_empty_repository(root, server, tmp_path):
    empty = root / "empty.git"
    h.git("init", "-q", "--bare", "-b", "main", str(empty))
    pk.enable_push(empty)
    work = tmp_path / "work"
    h.git("init", "-q", "-b", "main", str(work))
    tip = pk.commit(work, "first")
    h.git("remote", "add", "origin", f"{server.url}/empty.git", cwd=str(work))
    pk.push(work, "origin", "main")
    assert h.refs_of(str(empty)) == {"refs/heads/main": tip}
    assert_clean(empty, work)
    again = pk.clone(f"{server.url}/empty.git", tmp_path / "again", fsck=True)
    assert pk.rev(again, "HEAD") == tip
