"""Polls answered by nginx alone (docs/polls.md): the shipped nginx/aspen.conf
and aspen-gunicorn.service (placeholders filled in, as test_deploy_nginx.py
runs them), real git clients.

What is checked: the answers nginx serves from poll files are byte for byte
Aspen's own (asked of gunicorn directly) and stock's (agent masked), with
Aspen's headers; `git ls-remote` (v0, v2) and a clone through them are
correct; after a push is acknowledged the repository has no poll file left
and the next poll shows the push; a repository Aspen refuses gets Aspen's
and stock's status through nginx; a config change is served at the latest
ASPEN_POLL_WINDOW seconds after; every poll is counted once, by Aspen's
access line or by nginx's poll log (aspen_polls_from_files_total). The
writer's rules (racy inputs, an invalidation meanwhile, which requests) are
checked in process."""

from __future__ import annotations

import http.client as httpclient
import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path

import pytest

from aspen_cgi import settings
from aspen_cgi.runtime import pollfiles

from . import harness
from .differential import norm_advertisement
from .harness import fsck_strict, git, make_history, out, refs_of
from .test_deploy_nginx import NGINX, Stack, http

V2 = {"Git-Protocol": "version=2"}
KINDS = {"v0": ("upload-pack.v0", {}), "v2": ("upload-pack.v2", V2)}
SAME_HEADERS = ("Content-Type", "Expires", "Pragma", "Cache-Control")


class _Unix(httpclient.HTTPConnection):
    def __init__(self, path: str):
        super().__init__("localhost", timeout=30)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def aspen_direct(stack: Stack, path: str, headers: dict) -> tuple[int, dict, bytes]:
    """Aspen's own answer: gunicorn asked on its socket, nginx and the poll files left out."""
    c = _Unix(stack.sock)
    try:
        c.request("GET", path, headers=headers)
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        c.close()


def served(stack: Stack) -> int:
    """nginx's count of polls it answered from files, once every earlier request is logged: nginx
    (one worker) logs a request before it takes the next one, and this asks it one more."""
    http(stack, "GET", "/sync/info/refs")
    try:
        return os.stat(stack.poll_log).st_size // 2
    except FileNotFoundError:
        return 0


def from_file(stack: Stack, path: str, headers: dict, tries: int = 200) -> tuple[int, dict, bytes]:
    """Poll until nginx answers from a poll file (Aspen writes one once the repository's inputs
    are older than the racy window); that answer."""
    for _ in range(tries):
        before = served(stack)
        got = http(stack, "GET", path, headers)
        if served(stack) > before:
            return got
        time.sleep(0.02)
    raise AssertionError(f"nginx never answered {path} from a poll file")


def poll_files(stack: Stack, gitdir: Path) -> list[str]:
    d = pollfiles.repo_dir(stack.poll_dir, str(gitdir))
    try:
        return sorted(n for n in os.listdir(d) if not n.startswith("."))
    except FileNotFoundError:
        return []


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    harness.need_system("nginx", NGINX)
    base = Path(tempfile.mkdtemp(prefix="aspen-polls-"))
    base.chmod(0o755)
    root = tmp_path_factory.mktemp("polls") / "root"
    root.mkdir()
    make_history(root / "polls.git")
    make_history(root / "closed.git", commits=2, branches=())
    git("config", "http.uploadpack", "false", cwd=str(root / "closed.git"))
    make_history(root / "config.git", commits=2, branches=())
    s = Stack(base, root)
    try:
        s.start_gunicorn()
        s.start_nginx()
        yield s
    finally:
        s.stop()
        shutil.rmtree(base, ignore_errors=True)


# -- through nginx ------------------------------------------------------------------------------

@pytest.mark.parametrize("version", ["v0", "v2"])
def test_answers_from_files_are_aspens_and_stocks(stack, version):
    kind, headers = KINDS[version]
    path = "/polls.git/info/refs?service=git-upload-pack"
    status, hdrs, body = from_file(stack, path, headers)
    assert status == 200
    assert f"{kind}." in " ".join(poll_files(stack, stack.root / "polls.git"))
    a_status, a_hdrs, a_body = aspen_direct(stack, path, headers)
    assert (status, body) == (a_status, a_body)
    for name in SAME_HEADERS:
        assert hdrs.get(name) == a_hdrs.get(name), name
    for name in ("Last-Modified", "ETag", "Accept-Ranges"):
        assert name not in hdrs, f"the file route sends {name}: Aspen does not"
    env = {"GIT_PROJECT_ROOT": str(stack.root), "GIT_HTTP_EXPORT_ALL": "1", "REQUEST_METHOD": "GET",
           "PATH_INFO": "/polls.git/info/refs", "QUERY_STRING": "service=git-upload-pack"}
    if version == "v2":
        env["GIT_PROTOCOL"] = "version=2"
    stock = harness.stock(env)
    assert stock.status == 200 and norm_advertisement(stock.body) == norm_advertisement(body)
    head = http(stack, "HEAD", path, headers)
    assert head[0] == 200 and head[2] == b"" and head[1].get("Content-Type") == a_hdrs.get("Content-Type")


def test_git_clients_through_the_files(stack, tmp_path):
    server = stack.root / "polls.git"
    for version, (_, headers) in KINDS.items():
        from_file(stack, "/polls.git/info/refs?service=git-upload-pack", headers)
        listed = out("-c", f"protocol.version={version[1]}", "ls-remote", stack.url("polls.git"))
        got = {name: oid for oid, name in (line.split("\t") for line in listed.splitlines())}
        want = {name: oid for name, oid in refs_of(str(server)).items()}
        assert {k: v for k, v in got.items() if not k.endswith("^{}") and k != "HEAD"} == want
    dest = tmp_path / "clone.git"
    git("-c", "protocol.version=2", "clone", "-q", "--mirror", stack.url("polls.git"), str(dest))
    fsck_strict(str(dest))
    assert refs_of(str(dest)) == refs_of(str(server))


def test_no_stale_advertisement_after_a_push(stack, tmp_path):
    server = stack.root / "polls.git"
    work = tmp_path / "work"
    git("clone", "-q", stack.url("polls.git"), str(work))
    for i in range(4):
        for _, headers in KINDS.values():
            from_file(stack, "/polls.git/info/refs?service=git-upload-pack", headers)
        assert poll_files(stack, server), "no poll file before the push"
        (work / f"round{i}.txt").write_text(f"round {i}\n")
        git("add", "-A", cwd=str(work))
        git("commit", "-q", "-m", f"round {i}", cwd=str(work))
        git("push", "-q", stack.url("polls.git", auth=True), "HEAD:main", cwd=str(work))
        # the push is acknowledged: its repository's poll files went before the acknowledgement
        assert poll_files(stack, server) == []
        tip = out("rev-parse", "HEAD", cwd=str(work))
        for version in ("0", "2"):
            listed = out("-c", f"protocol.version={version}", "ls-remote", stack.url("polls.git"), "refs/heads/main")
            assert listed.split("\t")[0] == tip, f"round {i}, v{version}: a stale advertisement after the push"
        # and once files are written again, they carry the push
        status, _, body = from_file(stack, "/polls.git/info/refs?service=git-upload-pack", {})
        assert status == 200 and f"{tip} refs/heads/main".encode() in body


def test_refused_repository_gets_aspens_and_stocks_status(stack):
    path = "/closed.git/info/refs?service=git-upload-pack"
    for _, headers in KINDS.values():
        for _ in range(3):
            status, _, body = http(stack, "GET", path, headers)
            assert status == 403 and body == b""
        assert aspen_direct(stack, path, headers)[0] == 403
    env = {"GIT_PROJECT_ROOT": str(stack.root), "GIT_HTTP_EXPORT_ALL": "1", "REQUEST_METHOD": "GET",
           "PATH_INFO": "/closed.git/info/refs", "QUERY_STRING": "service=git-upload-pack"}
    assert harness.stock(env).status == 403
    assert poll_files(stack, stack.root / "closed.git") == []


def test_a_config_change_is_served_within_the_window(stack):
    """http.uploadpack=false set on the server's disk (not through Aspen): nginx may serve the file
    named for the seconds Aspen last checked, never after them."""
    path = "/config.git/info/refs?service=git-upload-pack"
    window = settings.of(stack.env).poll_window
    assert window == 1
    from_file(stack, path, {})
    git("config", "http.uploadpack", "false", cwd=str(stack.root / "config.git"))
    changed = time.time()
    time.sleep(max(0.0, int(changed) + window - time.time()) + 0.05)    # past the last second a file names
    for _, headers in KINDS.values():
        assert http(stack, "GET", path, headers)[0] == 403
    git("config", "--unset", "http.uploadpack", cwd=str(stack.root / "config.git"))


def test_an_outside_ref_change_is_served_within_the_window(stack):
    """A ref moved on the server's disk by git itself (not through Aspen): the next poll after the
    seconds the last file names shows it, through nginx and through git."""
    server = stack.root / "polls.git"
    path = "/polls.git/info/refs?service=git-upload-pack"
    from_file(stack, path, {})
    old = out("rev-parse", "refs/heads/main", cwd=str(server))
    git("update-ref", "refs/heads/outside", old, cwd=str(server))
    changed = time.time()
    time.sleep(max(0.0, int(changed) + settings.of(stack.env).poll_window - time.time()) + 0.05)
    status, _, body = http(stack, "GET", path, {})
    assert status == 200 and f"{old} refs/heads/outside".encode() in body
    assert "refs/heads/outside" in out("ls-remote", stack.url("polls.git"))
    git("update-ref", "-d", "refs/heads/outside", cwd=str(server))


def test_every_poll_is_counted_once(stack):
    """Polls nginx answered from files (its log, aspen_polls_from_files_total) plus the ones Aspen
    answered (its access lines) are all the polls sent."""
    path = "/polls.git/info/refs?service=git-upload-pack"

    def aspen_lines() -> int:
        text = stack.glog.read_text(errors="replace")
        return len(re.findall(r"aspen: repo=\S*polls\.git service=upload-pack method=GET path=/polls\.git/info/refs ",
                              text))
    from_file(stack, path, {})
    files0, lines0 = served(stack), aspen_lines()
    sent = 60
    for i in range(sent):
        http(stack, "GET", path, V2 if i % 2 else {})
    deadline = time.monotonic() + 30
    while True:                     # Aspen writes its access line as the response closes
        files, lines = served(stack) - files0, aspen_lines() - lines0
        if files + lines == sent or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert files + lines == sent and files > 0, (files, lines)
    from aspen_cgi.http import metricspage
    env = dict(stack.env, ASPEN_RUN_DIR=str(stack.base / "metrics-run"))
    assert metricspage.snapshot(env)["aspen_polls_from_files_total"] == served(stack)


# -- the writer's rules, in process -----------------------------------------------------------

def _env(root: Path, polls: Path, **extra) -> dict:
    env = {"GIT_PROJECT_ROOT": str(root), "GIT_HTTP_EXPORT_ALL": "1", "REQUEST_METHOD": "GET",
           "PATH_INFO": "/repo.git/info/refs", "QUERY_STRING": "service=git-upload-pack",
           "ASPEN_POLL_DIR": str(polls)}
    env.update(extra)
    return env


@pytest.fixture
def quiet_repo(tmp_path):
    """A repository Aspen has seen (its state made: the first request changes the git directory)
    whose files are older than the racy window (their times set back)."""
    root = tmp_path / "root"
    root.mkdir()
    make_history(root / "repo.git", commits=2, branches=())
    assert harness.wsgi(_env(root, tmp_path / "warm-up", ASPEN_POLL_WINDOW="0")).status == 200
    past = time.time() - 10
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            os.utime(os.path.join(d, n), (past, past), follow_symlinks=False)
    os.utime(root, (past, past))
    return root


def test_which_answers_become_files(quiet_repo, tmp_path):
    polls = tmp_path / "polls"
    gitdir = quiet_repo / "repo.git"
    r = harness.wsgi(_env(quiet_repo, polls, ASPEN_ACCESS_LOG="1"))
    assert r.status == 200 and b" pollfile=written" in r.stderr
    again = harness.wsgi(_env(quiet_repo, polls, ASPEN_ACCESS_LOG="1"))   # this second's file is there (current), or the next second's
    assert again.body == r.body and re.search(rb" pollfile=(current|written)\n", again.stderr)
    names = os.listdir(pollfiles.repo_dir(str(polls), str(gitdir)))
    second = [n for n in names if n.startswith("upload-pack.v0.")]
    assert len(second) == 1 and (polls / "urls" / "repo.git" / "info" / "refs" / second[0]).read_bytes() == r.body
    assert os.readlink(polls / "urls" / "repo.git" / "info" / "refs") == pollfiles.repo_dir(str(polls), str(gitdir))
    sec = int(second[0].rsplit(".", 1)[1])
    assert pollfiles.current(str(polls), str(gitdir), "upload-pack.v0", now=sec + 0.5)
    assert not pollfiles.current(str(polls), str(gitdir), "upload-pack.v0", now=sec + 1)
    shutil.rmtree(polls)
    # none of these: a user, another query spelling, protocol v1, a POST, the push service, no files
    for extra in ({"REMOTE_USER": "alice"}, {"QUERY_STRING": "service=git%2Dupload-pack"},
                  {"HTTP_GIT_PROTOCOL": "version=1"}, {"HTTP_GIT_PROTOCOL": "version=2:x"},
                  {"QUERY_STRING": "service=git-receive-pack", "REMOTE_USER": "alice"},
                  {"ASPEN_POLL_WINDOW": "0"}, {"PATH_INFO": "/repo.git//info/refs"}):
        harness.wsgi(_env(quiet_repo, polls, **extra))
        assert not (polls / "repos").exists() or not any(
            n for d in (polls / "repos").iterdir() for n in os.listdir(d) if not n.startswith(".")), extra
    # not exported (no GIT_HTTP_EXPORT_ALL, no git-daemon-export-ok): 404, no file
    env = _env(quiet_repo, polls)
    del env["GIT_HTTP_EXPORT_ALL"]
    assert harness.wsgi(env).status == 404
    assert not (polls / "repos").exists()
    # refused: no file
    git("config", "http.uploadpack", "false", cwd=str(gitdir))
    assert harness.wsgi(_env(quiet_repo, polls)).status == 403
    assert not (polls / "repos").exists()


def test_window_names_the_seconds(quiet_repo, tmp_path):
    polls = tmp_path / "polls"
    before = int(time.time())
    r = harness.wsgi(_env(quiet_repo, polls, ASPEN_POLL_WINDOW="3", HTTP_GIT_PROTOCOL="version=2"))
    after = int(time.time())
    assert r.status == 200 and r.body.startswith(b"000eversion 2\n")
    secs = sorted(int(n.rsplit(".", 1)[1]) for n in os.listdir(pollfiles.repo_dir(str(polls), str(quiet_repo / "repo.git")))
                  if n.startswith("upload-pack.v2."))
    assert len(secs) == 3 and secs == list(range(secs[0], secs[0] + 3)) and before <= secs[0] <= after


def test_racy_inputs_and_invalidation(quiet_repo, tmp_path):
    polls = str(tmp_path / "polls")
    gitdir = str(quiet_repo / "repo.git")
    rdir = pollfiles.repo_dir(polls, gitdir)
    started = time.time_ns()
    # an input changed since the request began: not written
    os.utime(os.path.join(gitdir, "packed-refs"))
    assert pollfiles.publish(polls, gitdir, "/repo.git/info/refs", "upload-pack.v0", b"x", [os.path.join(gitdir, "packed-refs")],
                             started, pollfiles.generation(rdir), 1) == "racy"
    # an invalidation after the generation was read (a push landed meanwhile): not written
    gen = pollfiles.generation(rdir)
    s = settings.of({"ASPEN_POLL_DIR": polls})
    assert pollfiles.invalidate(gitdir, s)
    assert pollfiles.publish(polls, gitdir, "/repo.git/info/refs", "upload-pack.v0", b"x", [], time.time_ns(), gen,
                             1) == "moved"
    # written, then an invalidation removes every file and leaves the lock and generation
    assert pollfiles.publish(polls, gitdir, "/repo.git/info/refs", "upload-pack.v0", b"x", [], time.time_ns(),
                             pollfiles.generation(rdir), 2) == "written"
    assert len([n for n in os.listdir(rdir) if not n.startswith(".")]) == 2
    assert pollfiles.invalidate(gitdir, s)
    assert sorted(os.listdir(rdir)) == [".gen", ".lock"]


def test_poll_files_counter():
    from aspen_cgi.runtime import metrics
    got = dict(metrics.series("GET", 200, 10, {"service": "upload-pack", "pollfile": "racy"}))
    assert got['aspen_poll_files_total{result="racy"}'] == 1
    assert not any(k.startswith("aspen_poll_files_total") for k, _ in metrics.series("GET", 200, 10, {}))


def test_url_spelling():
    assert pollfiles.url_ok("/team/repo.git/info/refs")
    for bad in ("team/repo.git/info/refs", "/team//repo.git/info/refs", "/team/./repo.git/info/refs",
                "/team/../info/refs", "/a/info/refs/b/info/refs", "/repo.git/info/refs/"):
        assert not pollfiles.url_ok(bad), bad
