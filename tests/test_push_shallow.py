"""Pushes from and to shallow repositories beside stock: git's t5538-push-shallow
and t5542-push-http-shallow (git 2.39.5) ported as differential tests, and
receive.shallowUpdate. Each push is a real `git push` over HTTP, once to
stock `git http-backend` (a CGI) and once to Aspen (gunicorn), each over its
own copy of the server repository; the client's output, the refs, the
server's `shallow` file, the pushed history and `git fsck` must agree, and
be what t5538 expects. Where stock misbehaves (it crashes, or makes a
complete repository shallow with an empty `shallow` file), the test says
what stock does and asserts what Aspen does instead (docs/differences.md)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Optional

import pytest

from . import harness as h
from . import pushkit as pk
from .pushkit import ZERO

pytestmark = pytest.mark.timeout(120)

HOOKS = {
    # what a hook sees of the pushed history: only with the temporary shallow file can it walk it
    "pre-receive": 'echo "pre ${GIT_SHALLOW_FILE:+shallow-file}"\nwhile read o n r; do echo "$r: $(git log --format=%s $n 2>&1 | tr "\\n" " ")"; done\n',
    "update": 'echo "update $1 ${GIT_SHALLOW_FILE:+shallow-file}"\n',
    "post-receive": 'echo "post ${GIT_SHALLOW_FILE:+shallow-file}"\n',
}


def commit(work: Path, msg: str) -> str:
    """t5538's commit(): `tracked` holds the message."""
    (work / "tracked").write_text(msg + "\n")
    h.git("add", "tracked", cwd=str(work))
    h.git("commit", "-q", "-m", msg, cwd=str(work))
    return pk.rev(work, "HEAD")


@pytest.fixture(scope="module")
def repos(tmp_path_factory) -> dict[str, Path]:
    """t5538's setup: full (1 2 3 4), full-abc (a b c), shallow (depth 2 of
    full: 4 3), shallow2 (depth 2 of full-abc: c b)."""
    base = tmp_path_factory.mktemp("t5538")
    full, abc = base / "full", base / "full-abc"
    for path, msgs in ((full, "1234"), (abc, "abc")):
        h.git("init", "-q", "-b", "main", str(path))
        for m in msgs:
            commit(path, m)
    out = {"full": full, "full-abc": abc}
    for name, src in (("shallow", full), ("shallow2", abc)):
        h.git("clone", "-q", "--no-local", "--depth=2", str(src), str(base / name))
        out[name] = base / name
    assert h.out("log", "--format=%s", cwd=str(out["shallow"])).split() == ["4", "3"]
    assert h.out("log", "--format=%s", cwd=str(out["shallow2"])).split() == ["c", "b"]
    return out


def server_copy(src: Path, dest: Path, config: dict[str, str]) -> Path:
    """A bare server repository cloned from SRC (its shallowness kept), pushes allowed, t5538's hooks."""
    h.git("clone", "-q", "--bare", "--no-local", str(src), str(dest))
    pk.enable_push(dest)
    h.git("remote", "remove", "origin", cwd=str(dest), check=False)
    for k, v in config.items():
        h.git("config", k, v, cwd=str(dest))
    for name, script in HOOKS.items():
        pk.write_hook(dest, name, script)
    return dest


def shallow_file(repo: Path) -> Optional[str]:
    p = repo / "shallow"
    return p.read_text() if p.exists() else None


def history(repo: Path, ref: str) -> Optional[list[str]]:
    p = h.git("log", "--format=%s", ref, cwd=str(repo), check=False)
    return p.stdout.decode().split() if p.returncode == 0 else None


def push_both(tmp_path: Path, cgi_server_factory, server_factory, server_src: Path, client: Path,
              args: list[str], config: Optional[dict] = None, prepare=None) -> dict:
    """The same push (from copies of CLIENT) to stock and to Aspen, each over its
    own server repository cloned from SERVER_SRC (PREPARE(repo) runs on it first):
    {side: (exit status, output lines, refs, shallow file, repo, work)}."""
    seen = {}
    for side in ("stock", "aspen"):
        root = tmp_path / side
        root.mkdir()
        repo = server_copy(server_src, root / "repo.git", config or {})
        if prepare is not None:
            prepare(repo)
        srv = cgi_server_factory(root) if side == "stock" else server_factory(root)
        work = tmp_path / f"{side}-client"
        shutil.copytree(client, work, symlinks=True)
        url = f"{srv.url}/repo.git"
        p = subprocess.run(["git", "push", "--porcelain", url, *args], cwd=str(work), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=90)
        out = [line.rstrip() for line in p.stdout.decode("utf-8", "replace").replace(url, "<URL>").splitlines()]
        seen[side] = (p.returncode, out, h.refs_of(str(repo)), shallow_file(repo), repo, work)
    return seen


def push_repo(tmp_path: Path, side: str) -> Path:
    return tmp_path / side / "repo.git"


def same(seen: dict) -> tuple:
    """What stock and Aspen must agree on (all but the paths)."""
    s, a = seen["stock"][:4], seen["aspen"][:4]
    assert a == s, f"stock and Aspen differ:\n stock={s}\n aspen={a}"
    for side in seen:
        fsck = h.git("fsck", "--no-progress", cwd=str(seen[side][4]), check=False)
        assert fsck.returncode == 0, f"{side}: {fsck.stderr.decode()}"
    return a


# --- t5538-push-shallow.sh -------------------------------------------------------------------

def test_push_from_shallow_clone(repos, tmp_path, cgi_server_factory, server_factory):
    client = tmp_path / "client"
    shutil.copytree(repos["shallow"], client, symlinks=True)
    commit(client, "5")
    status, out, refs, shallow = same(push_both(tmp_path, cgi_server_factory, server_factory, repos["full"], client,
                                                ["+main:refs/remotes/shallow/main"]))
    assert status == 0 and shallow is None
    assert "remote: refs/remotes/shallow/main: 5 4 3 2 1" in out
    assert history(push_repo(tmp_path, "aspen"), "refs/remotes/shallow/main") == ["5", "4", "3", "2", "1"]


def test_push_with_grafted_roots_is_refused(repos, tmp_path, cgi_server_factory, server_factory):
    status, out, refs, shallow = same(push_both(tmp_path, cgi_server_factory, server_factory, repos["full"],
                                                repos["shallow2"], ["+main:refs/remotes/shallow2/main"]))
    assert status != 0 and shallow is None
    assert "!\trefs/heads/main:refs/remotes/shallow2/main\t[remote rejected] (shallow update not allowed)" in out
    assert "refs/remotes/shallow2/main" not in refs
    # the pushed objects did not stay: the quarantine went with the refusal
    assert h.git("cat-file", "-e", pk.rev(repos["shallow2"], "main"), cwd=str(push_repo(tmp_path, "aspen")),
                 check=False).returncode != 0


def test_new_shallow_root_with_shallow_update(repos, tmp_path, cgi_server_factory, server_factory):
    status, out, refs, shallow = same(push_both(tmp_path, cgi_server_factory, server_factory, repos["full"],
                                                repos["shallow2"], ["+main:refs/remotes/shallow2/main"],
                                                {"receive.shallowUpdate": "true"}))
    b = pk.rev(repos["shallow2"], "main~1")
    assert status == 0 and shallow == b + "\n"
    assert refs["refs/remotes/shallow2/main"] == pk.rev(repos["shallow2"], "main")
    # hooks saw the temporary shallow file, so could walk the new history down to its root
    assert "remote: pre shallow-file" in out and "remote: refs/remotes/shallow2/main: c b" in out
    assert "remote: update refs/remotes/shallow2/main shallow-file" in out
    assert history(push_repo(tmp_path, "aspen"), "refs/remotes/shallow2/main") == ["c", "b"]
    # Aspen's ref store recorded the push; a clone now gets the shallow history, as from stock
    assert [v["kind"] for v in h.versions(push_repo(tmp_path, "aspen"))][-1] == "push"
    h.verify_ok(push_repo(tmp_path, "aspen"))


def test_push_from_shallow_to_shallow(repos, tmp_path, cgi_server_factory, server_factory):
    client = tmp_path / "client"
    shutil.copytree(repos["shallow"], client, symlinks=True)
    commit(client, "5")
    status, out, refs, shallow = same(push_both(tmp_path, cgi_server_factory, server_factory, repos["shallow2"],
                                                client, ["+main:refs/remotes/shallow/main"],
                                                {"receive.shallowUpdate": "true"}))
    assert status == 0
    roots = sorted(shallow.split())
    assert roots == sorted([pk.rev(repos["shallow2"], "main~1"), pk.rev(repos["shallow"], "main~1")])
    assert history(push_repo(tmp_path, "aspen"), "refs/remotes/shallow/main") == ["5", "4", "3"]


def test_push_from_full_to_shallow(repos, tmp_path, cgi_server_factory, server_factory):
    client = tmp_path / "client"
    shutil.copytree(repos["full"], client, symlinks=True)
    commit(client, "1")
    status, out, refs, shallow = same(push_both(tmp_path, cgi_server_factory, server_factory, repos["shallow"],
                                                client, ["+main:refs/remotes/top/main"]))
    assert status == 0 and shallow == pk.rev(repos["shallow"], "main~1") + "\n"
    assert history(push_repo(tmp_path, "aspen"), "refs/remotes/top/main") == ["1", "4", "3"]
    blob = h.git("hash-object", "--stdin", input=b"1\n").stdout.decode().strip()
    assert h.git("cat-file", "-e", blob, cwd=str(push_repo(tmp_path, "aspen")), check=False).returncode == 0


# --- t5542-push-http-shallow.sh -------------------------------------------------------------------

def test_push_from_full_repo_over_http(repos, tmp_path, cgi_server_factory, server_factory):
    client = tmp_path / "client"
    shutil.copytree(repos["full"], client, symlinks=True)
    commit(client, "10")
    status, out, refs, shallow = same(push_both(tmp_path, cgi_server_factory, server_factory, repos["full"],
                                                client, ["+main:refs/remotes/top/main"]))
    assert status == 0 and shallow is None
    assert history(push_repo(tmp_path, "aspen"), "refs/remotes/top/main") == ["10", "4", "3", "2", "1"]


# --- where stock misbehaves ------------------------------------------------------------------

def test_several_refs_needing_new_roots(repos, tmp_path, cgi_server_factory, server_factory):
    """Stock stops at the first ref that took new shallow roots: the commands
    after it are neither updated nor reported (the client says `remote failed
    to report status`). Aspen updates each, the new root written once."""
    client = tmp_path / "client"
    shutil.copytree(repos["shallow2"], client, symlinks=True)
    commit(client, "d")
    seen = push_both(tmp_path, cgi_server_factory, server_factory, repos["full"], client,
                     ["+main:refs/heads/x1", "main~1:refs/heads/x2", "main~2:refs/heads/x3"],
                     {"receive.shallowUpdate": "true"})
    s_status, s_out, s_refs, _, _, _ = seen["stock"]
    assert s_status != 0 and "(remote failed to report status)" in "\n".join(s_out)
    assert "refs/heads/x2" not in s_refs
    status, out, refs, shallow, repo, _ = seen["aspen"]
    assert status == 0, out
    assert [line.split("\t")[2] for line in out if line.startswith("*\t")] == ["[new branch]"] * 3
    assert (refs["refs/heads/x1"], refs["refs/heads/x2"], refs["refs/heads/x3"]) == (
        pk.rev(client, "main"), pk.rev(client, "main~1"), pk.rev(client, "main~2"))
    assert shallow == pk.rev(client, "main~2") + "\n"
    h.fsck_strict(str(repo))


def test_stale_base_leaves_no_empty_shallow_file(repos, tmp_path, cgi_server_factory, server_factory):
    """A CI job's depth-1 clone pushes a branch made on a commit the server's main
    has since moved past. Its shallow root is reachable from main, so no new
    root is needed; stock (with receive.shallowUpdate) still rewrites `shallow`
    with no roots at all, an empty file that makes the whole repository
    shallow to git. Aspen leaves it absent."""
    ci = tmp_path / "ci"
    h.git("clone", "-q", "--depth=1", f"file://{repos['full']}", str(ci))
    commit(ci, "ci")

    def main_moves_on(repo: Path) -> None:
        work = repo.parent / "mover"
        h.git("clone", "-q", str(repo), str(work))
        commit(work, "m2")
        commit(work, "m3")
        h.git("push", "-q", "origin", "main", cwd=str(work))

    seen = push_both(tmp_path, cgi_server_factory, server_factory, repos["full"], ci, ["HEAD:refs/heads/ci"],
                     {"receive.shallowUpdate": "true"}, prepare=main_moves_on)
    assert seen["stock"][0] == seen["aspen"][0] == 0
    assert seen["stock"][3] == ""                   # stock: an empty `shallow` file
    assert seen["aspen"][3] is None
    assert seen["aspen"][2]["refs/heads/ci"] == pk.rev(ci, "HEAD")
    assert history(push_repo(tmp_path, "aspen"), "refs/heads/ci") == ["ci", "4", "3", "2", "1"]


def test_delete_from_shallow_clone_with_shallow_update(repos, tmp_path, cgi_server_factory, server_factory):
    """A shallow client sends its shallow lines with a delete too; stock with
    receive.shallowUpdate then crashes before deleting (no report). Aspen deletes."""
    ci = tmp_path / "ci"
    h.git("clone", "-q", "--depth=1", f"file://{repos['full']}", str(ci))
    seen = push_both(tmp_path, cgi_server_factory, server_factory, repos["full"], ci, [":refs/heads/topic"],
                     {"receive.shallowUpdate": "true"},
                     prepare=lambda repo: h.git("branch", "topic", "main~1", cwd=str(repo)))
    assert seen["stock"][0] != 0 and "refs/heads/topic" in seen["stock"][2]
    status, out, refs, shallow, _, _ = seen["aspen"]
    assert status == 0 and "refs/heads/topic" not in refs and shallow is None
    assert "-\t:refs/heads/topic\t[deleted]" in out


def test_clone_after_a_shallow_update(repos, tmp_path, cgi_server_factory, server_factory):
    """What the server serves after taking new roots: the same clone from both."""
    seen = push_both(tmp_path, cgi_server_factory, server_factory, repos["full"], repos["shallow2"],
                     ["+main:refs/heads/abc"], {"receive.shallowUpdate": "true"})
    same(seen)
    clones = {}
    for side in ("stock", "aspen"):
        srv = cgi_server_factory(tmp_path / side) if side == "stock" else server_factory(tmp_path / side)
        dest = tmp_path / f"{side}-clone"
        h.git("clone", "-q", "--mirror", f"{srv.url}/repo.git", str(dest))
        h.fsck_strict(str(dest))
        clones[side] = (h.refs_of(str(dest)), shallow_file(dest), history(dest, "refs/heads/abc"))
    assert clones["aspen"] == clones["stock"]
    assert clones["aspen"][2] == ["c", "b"] and clones["aspen"][1]


# --- hand-made requests ----------------------------------------------------------------------

def _pack(repo: Path, revs: list[str], shallow: list[str]) -> bytes:
    """pack-objects over REVS with SHALLOW as the shallow commits (what a client sends)."""
    sf = repo / "shallow-for-pack"
    sf.write_text("".join(o + "\n" for o in shallow))
    return h.git("--shallow-file", str(sf), "pack-objects", "--revs", "--stdout", "-q", cwd=str(repo),
                 input=("\n".join(revs) + "\n").encode()).stdout


def _request(cmds, shallow: list[str], pack: bytes, caps: str = "report-status side-band-64k") -> bytes:
    from . import differential as d
    out = b"".join(d.pkt(f"shallow {o}") for o in shallow)
    return out + pk.request(cmds, caps, pack)


@pytest.mark.parametrize("update", [False, True], ids=["refused", "shallow-update"])
def test_requests_with_shallow_lines_match_stock(repos, tmp_path, update):
    """Requests no client sends as such, to both CGIs: a new root with a ref that
    does not need it, a claimed root the pack does not bring, an atomic push."""
    abc = repos["shallow2"]
    c, b = pk.rev(abc, "main"), pk.rev(abc, "main~1")
    full_main = pk.rev(repos["full"], "main")
    p_cb = _pack(abc, [c], [b])
    cases = {
        "one-needs-one-not": ([(ZERO, full_main, "refs/heads/again"), (ZERO, c, "refs/heads/abc")], [b], p_cb, ""),
        "atomic": ([(ZERO, full_main, "refs/heads/again"), (ZERO, c, "refs/heads/abc")], [b], p_cb, " atomic"),
        "root-not-sent": ([(ZERO, full_main, "refs/heads/again")], ["1" * 40], b"", ""),
        "quiet-no-sideband": ([(ZERO, c, "refs/heads/abc")], [b], p_cb, "-"),
    }
    for name, (cmds, shallow, pack, extra) in cases.items():
        caps = "report-status" if extra == "-" else "report-status side-band-64k" + extra
        if not pack:
            pack = h.git("pack-objects", "--stdout", "-q", input=b"").stdout
        body = _request(cmds, shallow, pack, caps)
        seen = {}
        for side in ("stock", "aspen"):
            root = tmp_path / name / side
            root.mkdir(parents=True)
            repo = server_copy(repos["full"], root / "repo.git", {"receive.shallowUpdate": str(update).lower()})
            r = pk.post(root, "repo.git", body, program=side)
            text = re.sub(r"shallow_[A-Za-z0-9]{6}", "shallow_XXXXXX", pk.messages(r.body))
            seen[side] = (r.status, pk.report_lines(r.body), text, h.refs_of(str(repo)), shallow_file(repo),
                          r.body if extra == "-" else None)
            assert b"Traceback" not in r.stderr
        assert seen["aspen"] == seen["stock"], name


@pytest.mark.parametrize("atomic", [False, True], ids=["plain", "atomic"])
def test_commands_after_a_new_root_are_not_dropped(repos, tmp_path, atomic):
    """Stock, with receive.shallowUpdate, drops every command after one that took
    new shallow roots: not updated, not even reported. Aspen goes on."""
    abc = repos["shallow2"]
    c, b = pk.rev(abc, "main"), pk.rev(abc, "main~1")
    full_main = pk.rev(repos["full"], "main")
    body = _request([(ZERO, c, "refs/heads/abc"), (ZERO, full_main, "refs/heads/again")], [b], _pack(abc, [c], [b]),
                    "report-status side-band-64k" + (" atomic" if atomic else ""))
    seen = {}
    for side in ("stock", "aspen"):
        root = tmp_path / side
        root.mkdir()
        repo = server_copy(repos["full"], root / "repo.git", {"receive.shallowUpdate": "true"})
        r = pk.post(root, "repo.git", body, program=side)
        seen[side] = (pk.report_lines(r.body), h.refs_of(str(repo)), shallow_file(repo))
    assert seen["stock"][0] == ["unpack ok", "ok refs/heads/abc"] and "refs/heads/again" not in seen["stock"][1]
    assert seen["aspen"][0] == ["unpack ok", "ok refs/heads/abc", "ok refs/heads/again"]
    assert seen["aspen"][1]["refs/heads/again"] == full_main and seen["aspen"][1]["refs/heads/abc"] == c
    assert seen["aspen"][2] == seen["stock"][2] == b + "\n"


@pytest.mark.parametrize("update", [False, True], ids=["refused", "shallow-update"])
def test_shallow_line_naming_a_tree(repos, tmp_path, update):
    """No client sends it: stock's receive-pack crashes (signal 11, no report).
    Aspen leaves the line out and takes the push."""
    full = repos["full"]
    tree = pk.rev(full, "main^{tree}")
    target = pk.rev(full, "main~1")
    body = _request([(ZERO, target, "refs/heads/x")], [tree],
                    h.git("pack-objects", "--stdout", "-q", cwd=str(full), input=b"").stdout)
    seen = {}
    for side in ("stock", "aspen"):
        root = tmp_path / side
        root.mkdir()
        repo = server_copy(full, root / "repo.git", {"receive.shallowUpdate": str(update).lower()})
        r = pk.post(root, "repo.git", body, program=side)
        seen[side] = (r, h.refs_of(str(repo)), shallow_file(repo))
    s, a = seen["stock"][0], seen["aspen"][0]
    assert b"unpack " not in s.body and b"signal 11" in s.stderr
    assert pk.report_lines(a.body) == ["unpack ok", "ok refs/heads/x"] and b"Traceback" not in a.stderr
    assert seen["aspen"][1]["refs/heads/x"] == target and seen["aspen"][2] is None
