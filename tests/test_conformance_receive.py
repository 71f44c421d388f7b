"""The checklist (docs/http-backend-checklist.md), the push side seen over HTTP: committer identity,
the environment hooks get, hook output on side-band 2, receive.* config,
non-bare repositories. Each implementation pushes into its own copy of the
same repository; responses, resulting refs and reflogs are compared."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from . import differential as d
from . import harness as h
from .differential import compare_mutating, pkt, post_env

ZERO = "0" * 40


def _work(root: Path) -> Path:
    work = root.parent / "pushwork"
    if not work.exists():
        h.git("clone", "-q", str(root / "repo.git"), str(work))
    return work


def push_parts(root: Path, size: int = 100, parent: str = "main") -> tuple[str, str, bytes]:
    """(old, new, pack): one new commit with a SIZE-byte random blob on top of PARENT."""
    work = _work(root)
    old = h.out("rev-parse", parent, cwd=str(root / "repo.git"))
    h.git("checkout", "-q", "--detach", old, cwd=str(work))
    (work / "blob.bin").write_bytes(os.urandom(size))
    h.git("add", "blob.bin", cwd=str(work))
    h.git("commit", "-q", "-m", f"push {size}", cwd=str(work))
    new = h.out("rev-parse", "HEAD", cwd=str(work))
    pack = h.git("pack-objects", "--revs", "--stdout", "-q", cwd=str(work), input=f"{new}\n^{old}\n".encode()).stdout
    return old, new, pack


def push_body(root: Path, size: int = 100, ref: str = "refs/heads/main", caps: str = "report-status side-band-64k",
              parent: str = "main") -> tuple[bytes, str, str]:
    """A receive-pack request pushing one new commit (with a SIZE-byte random blob) on top of PARENT to REF."""
    old, new, pack = push_parts(root, size, parent)
    target_old = h.refs_of(str(root / "repo.git")).get(ref, ZERO)
    body = pkt(f"{target_old} {new} {ref}\0{caps}\n") + d.FLUSH + pack
    return body, ref, new


def _run_push(root, body, extra=None, **kw):
    extra = dict(extra or {})

    def make(r):
        e = post_env(r, "repo.git", "receive-pack", body, **extra)
        return {k: v for k, v in e.items() if v is not None}
    return compare_mutating(root, make, body, **kw)


def _report(body: bytes) -> list[bytes]:
    inner = d.demux(body)[1] if any(t[0] == "band" for t in d.tokens(body)) else body
    return [t[1] for t in d.tokens(inner) if t[0] == "pkt"]


def _reflog_identity(repo: Path, ref: str = "refs/heads/main") -> str:
    text = (repo / "logs" / ref).read_text().splitlines()[-1]
    return re.match(r"^[0-9a-f]{40} [0-9a-f]{40} (.*) \d+ [+-]\d{4}\t", text).group(1)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("extra,identity", [
    ({"REMOTE_USER": "alice", "REMOTE_ADDR": "10.1.2.3"}, "alice <alice@http.10.1.2.3>"),
    ({"REMOTE_USER": "alice"}, "alice <alice@http.(none)>"),
    ({"REMOTE_ADDR": "10.1.2.3"}, "anonymous <anonymous@http.10.1.2.3>"),
    ({}, "anonymous <anonymous@http.(none)>"),
    ({"REMOTE_USER": "alice", "GIT_COMMITTER_NAME": "Custom User", "GIT_COMMITTER_EMAIL": "custom@example.com"},
     "Custom User <custom@example.com>"),
])
def test_committer_identity_defaults_to_remote_user_or_anonymous_and_preset_values_win(root, extra, identity):
    repo = root / "repo.git"
    h.git("config", "core.logAllRefUpdates", "true", cwd=str(repo))
    h.git("config", "http.receivepack", "true", cwd=str(repo))
    body, ref, new = push_body(root)
    t, roots = _run_push(root, body, extra, status=200, mode="sideband")
    for r in roots:
        assert h.refs_of(str(r / "repo.git"))[ref] == new
        assert _reflog_identity(r / "repo.git") == identity


HOOK_ENV = """#!/bin/sh
env | sort > "$GIT_DIR/../hook-env.txt" 2>/dev/null || env | sort > hook-env.txt
pwd > "$(pwd)/hook-pwd.txt"
cat > /dev/null
"""

VOLATILE = ("GIT_QUARANTINE_PATH", "GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_PUSH_CERT",
            "GIT_PUSH_CERT_NONCE", "GIT_PUSH_CERT_NONCE_STATUS", "_", "SHLVL", "OLDPWD", "PWD",
            "GIT_PUSH_CERT_NONCE_SLOP")


def _hook_env(repo: Path) -> dict[str, str]:
    for p in (repo.parent / "hook-env.txt", repo / "hook-env.txt"):
        if p.exists():
            lines = p.read_text().splitlines()
            return dict(line.split("=", 1) for line in lines if "=" in line)
    raise AssertionError("the hook did not run")


@pytest.mark.timeout(120)
def test_full_cgi_environment_passed_to_children_and_hooks_run_in_git_dir(root):
    repo = root / "repo.git"
    h.git("config", "http.receivepack", "true", cwd=str(repo))
    hook = repo / "hooks" / "pre-receive"
    hook.write_text(HOOK_ENV)
    hook.chmod(0o755)
    body, ref, new = push_body(root)
    extra = {"REMOTE_USER": "alice", "REMOTE_ADDR": "127.0.0.9", "HTTP_X_CUSTOM": "custom value",
             "HTTP_USER_AGENT": "git/2.39.5", "SERVER_SOFTWARE": "test", "ASPEN_TEST_MARKER": "m",
             "HTTP_GIT_PROTOCOL": "version=2"}
    t, roots = _run_push(root, body, extra, status=200, mode="sideband", with_wsgi=False)
    envs = [_hook_env(r / "repo.git") for r in roots[:2]]
    for e in envs:
        for k, v in extra.items():
            assert e.get(k) == v, (k, e.get(k))
        assert e.get("CONTENT_LENGTH") == str(len(body))
        assert e.get("GIT_PROTOCOL") == "version=2"
        assert e.get("GIT_COMMITTER_NAME") == "alice"
    s_env, a_env = envs

    def norm(e, r):
        e = dict(e)
        # GIT_DIR=. (stock) and the absolute git dir are the same directory for a hook run in the git dir
        if e.get("GIT_DIR") == str(r / "repo.git"):
            e["GIT_DIR"] = "."
        # git prepends its exec path once per process level; compare PATH without repeated entries
        seen, parts = set(), []
        for p in e.get("PATH", "").split(":"):
            if p not in seen:
                seen.add(p)
                parts.append(p)
        e["PATH"] = ":".join(parts)
        return {k: v.replace(str(r), "<root>") for k, v in e.items() if k not in VOLATILE}
    sn, an = norm(s_env, roots[0]), norm(a_env, roots[1])
    missing = {k: v for k, v in sn.items() if k not in an}
    assert not missing, f"variables stock gives hooks that Aspen does not: {missing}"
    differ = {k: (sn[k], an[k]) for k in sn if k in an and sn[k] != an[k]}
    assert not differ, f"hook environment differs: {differ}"
    assert (roots[1] / "repo.git" / "hook-pwd.txt").read_text().strip() == str(roots[1] / "repo.git")


@pytest.mark.timeout(120)
def test_hook_output_reaches_client_as_sideband_2_remote_lines(root):
    repo = root / "repo.git"
    h.git("config", "http.receivepack", "true", cwd=str(repo))
    for name, script in (("pre-receive", "echo pre-receive says hi\necho pre-receive on stderr >&2\ncat >/dev/null\n"),
                         ("update", "echo update $1\n"),
                         ("post-receive", "echo post-receive done\ncat >/dev/null\n"),
                         ("post-update", "echo post-update $1\n")):
        p = repo / "hooks" / name
        p.write_text("#!/bin/sh\n" + script)
        p.chmod(0o755)
    body, ref, new = push_body(root)
    t, roots = _run_push(root, body, {"REMOTE_USER": "u"}, status=200, mode="sideband")
    band2 = [d.demux(r.body)[2] for r in (t.stock, t.cgi, t.wsgi)]
    for b in band2:
        for line in (b"pre-receive says hi\n", b"pre-receive on stderr\n", b"update refs/heads/main\n",
                     b"post-receive done\n", b"post-update refs/heads/main\n"):
            assert line in b, (line, b)
    assert band2[1] == band2[0] and band2[2] == band2[0]


@pytest.mark.timeout(120)
def test_rejecting_pre_receive_hook_reports_ng_and_keeps_refs(root):
    repo = root / "repo.git"
    h.git("config", "http.receivepack", "true", cwd=str(repo))
    p = repo / "hooks" / "pre-receive"
    p.write_text("#!/bin/sh\necho no way\nexit 1\n")
    p.chmod(0o755)
    before = h.refs_of(str(repo))
    body, ref, new = push_body(root)
    t, roots = _run_push(root, body, {"REMOTE_USER": "u"}, status=200, mode="sideband")
    assert b"ng refs/heads/main pre-receive hook declined\n" in _report(t.cgi.body)
    for r in roots:
        assert h.refs_of(str(r / "repo.git")) == before


@pytest.mark.timeout(180)
def test_receive_pack_repo_config_takes_effect_deny_and_fsck(root):
    repo = root / "repo.git"
    h.git("config", "http.receivepack", "true", cwd=str(repo))
    main = h.out("rev-parse", "main", cwd=str(repo))
    topic = h.out("rev-parse", "topic", cwd=str(repo))
    # denyDeletes
    h.git("config", "receive.denyDeletes", "true", cwd=str(repo))
    body = pkt(f"{topic} {ZERO} refs/heads/topic\0report-status\n") + d.FLUSH
    t, roots = _run_push(root, body, {"REMOTE_USER": "u"}, status=200)
    assert _report(t.cgi.body) == [b"unpack ok\n", b"ng refs/heads/topic deletion prohibited\n"]
    # denyNonFastForwards: main -> topic's parent is not a fast-forward
    h.git("config", "receive.denyNonFastForwards", "true", cwd=str(repo))
    body = pkt(f"{main} {topic} refs/heads/main\0report-status side-band-64k\n") + d.FLUSH
    t, roots = _run_push(root, body, {"REMOTE_USER": "u"}, status=200, mode="sideband")
    assert any(b"ng refs/heads/main" in line for line in _report(t.cgi.body))
    # fsckObjects: a commit with a bad author line
    h.git("config", "receive.fsckObjects", "true", cwd=str(repo))
    tree = h.out("rev-parse", "main^{tree}", cwd=str(repo))
    raw = f"tree {tree}\nparent {main}\nauthor broken <no-closing 1 +0000\ncommitter A <a@b> 1 +0000\n\nbad\n"
    bad = h.git("hash-object", "-t", "commit", "-w", "--literally", "--stdin", cwd=str(_work(root)),
                input=raw.encode()).stdout.decode().strip()
    pack = h.git("pack-objects", "--stdout", "-q", cwd=str(_work(root)), input=f"{bad}\n".encode()).stdout
    body = pkt(f"{main} {bad} refs/heads/main\0report-status\n") + d.FLUSH + pack
    t, roots = _run_push(root, body, {"REMOTE_USER": "u"}, status=200)
    report = _report(t.cgi.body)
    assert report[0].startswith(b"unpack ") and report[0] != b"unpack ok\n"
    for r in roots:
        assert h.refs_of(str(r / "repo.git"))["refs/heads/main"] == main


@pytest.mark.timeout(120)
def test_receive_pack_advertisement_config_hiderefs_push_options_atomic(root):
    repo = root / "repo.git"
    h.git("config", "http.receivepack", "true", cwd=str(repo))
    h.git("config", "receive.hideRefs", "refs/tags", cwd=str(repo))
    h.git("config", "receive.advertisePushOptions", "true", cwd=str(repo))
    h.git("config", "receive.advertiseAtomic", "false", cwd=str(repo))
    t = d.compare(d.env_for(root, "/repo.git/info/refs", "GET", "service=git-receive-pack"), status=200,
                  mode="advert")
    assert b"refs/tags" not in t.cgi.body and b"push-options" in t.cgi.body and b" atomic" not in t.cgi.body


@pytest.mark.timeout(120)
def test_non_bare_repository_served_and_deny_current_branch_applied(root):
    work = root / "work"
    h.git("clone", "-q", str(root / "repo.git"), str(work))
    h.git("config", "http.receivepack", "true", cwd=str(work))
    t = d.compare(d.env_for(root, "/work/info/refs", "GET", "service=git-upload-pack"), status=200, mode="advert")
    assert b"refs/heads/main" in t.cgi.body
    main = h.out("rev-parse", "main", cwd=str(work))
    old, new, pack = push_parts(root)
    body = pkt(f"{main} {new} refs/heads/main\0report-status side-band-64k\n") + d.FLUSH + pack

    def make(r):
        return post_env(r, "work", "receive-pack", body, REMOTE_USER="u")
    t, roots = compare_mutating(root, make, body, status=200, mode="sideband")
    assert b"ng refs/heads/main branch is currently checked out\n" in _report(t.cgi.body)
    for r in roots:
        assert h.out("rev-parse", "main", cwd=str(r / "work")) == main
    # another branch of the non-bare repository accepts the push
    body2 = pkt(f"{ZERO} {new} refs/heads/other\0report-status side-band-64k\n") + d.FLUSH + pack

    def make2(r):
        return post_env(r, "work", "receive-pack", body2, REMOTE_USER="u")
    t, roots = compare_mutating(root, make2, body2, status=200, mode="sideband")
    assert b"ok refs/heads/other\n" in _report(t.cgi.body)
    # receive.denyCurrentBranch=updateInstead updates the work tree
    h.git("config", "receive.denyCurrentBranch", "updateInstead", cwd=str(work))
    t, roots = compare_mutating(root, make, body, status=200, mode="sideband")
    assert b"ok refs/heads/main\n" in _report(t.cgi.body)
    for r in roots:
        assert (r / "work" / "blob.bin").exists()
