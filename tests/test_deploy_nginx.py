"""nginx in front of gunicorn, as nginx/ ships them: the server block
(nginx/aspen.conf) with only its placeholders filled in, and gunicorn started
with the options of nginx/aspen-gunicorn.service's ExecStart and Environment
lines. Real git clients: clones (v0, v2, shallow, larger), fetch, pushes with
and without credentials, a 100 MB push streamed through both."""

from __future__ import annotations

import base64
import grp
import hashlib
import os
import pwd
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from . import harness
from .harness import fsck_strict, git, make_history, out, refs_of, versions

REPO_DIR = Path(__file__).resolve().parent.parent
CONF = REPO_DIR / "nginx" / "aspen.conf"
UNIT = REPO_DIR / "nginx" / "aspen-gunicorn.service"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
UNIT_SOCKET = "/run/aspen/gunicorn.sock"
UNIT_POLL_DIR = "/run/aspen/polls"
UNIT_POLL_LOG = "/var/log/nginx/aspen-polls.log"
USER, PASSWORD = "alice", "s3cret-pw"


# -- the shipped files, filled in ---------------------------------------------------------------

def service_command(venv: str, project_root: str, sock: str, poll_dir: str = UNIT_POLL_DIR,
                    poll_log: str = UNIT_POLL_LOG) -> tuple[list[str], dict[str, str]]:
    """ExecStart's argv and the Environment= settings of the shipped unit, placeholders filled
    (and its paths under /run/aspen and /var/log/nginx moved to POLL_DIR and POLL_LOG)."""
    subst = {"@VENV@": venv, "@GIT_PROJECT_ROOT@": project_root, UNIT_SOCKET: sock, UNIT_POLL_DIR: poll_dir,
             UNIT_POLL_LOG: poll_log}
    argv, env = None, {}
    for line in UNIT.read_text().splitlines():
        for k, v in subst.items():
            line = line.replace(k, v)
        if line.startswith("ExecStart="):
            argv = shlex.split(line[len("ExecStart="):])
        elif line.startswith("Environment="):
            k, _, v = line[len("Environment="):].partition("=")
            env[k] = v
    assert argv, "no ExecStart in the unit"
    assert not any("@" in a for a in argv), argv
    return argv, env


def server_block(listen: str, upstream: str, htpasswd: str, poll_dir: str, poll_log: str) -> str:
    text = CONF.read_text()
    for k, v in {"@LISTEN@": listen, "@UPSTREAM@": upstream, "@HTPASSWD@": htpasswd, "@POLL_DIR@": poll_dir,
                 "@POLL_LOG@": poll_log}.items():
        assert k in text, k
        text = text.replace(k, v)
    assert not re.search(r"@[A-Z_]+@", text)
    return text


def htpasswd_line(user: str, password: str) -> str:
    return f"{user}:{{SHA}}{base64.b64encode(hashlib.sha1(password.encode()).digest()).decode()}\n"


def nobody() -> tuple[str, str, int]:
    pw = pwd.getpwnam("nobody")
    return pw.pw_name, grp.getgrgid(pw.pw_gid).gr_name, pw.pw_gid


# -- the stack ----------------------------------------------------------------------------------

class Stack:
    def __init__(self, base: Path, root: Path):
        self.base, self.root = base, root        # base: nginx's files and the socket (world-traversable)
        self.sock = str(base / "gunicorn.sock")
        self.poll_dir, self.poll_log = str(base / "polls"), str(base / "aspen-polls.log")
        self.proc = self.nginx = None
        self.env: dict[str, str] = {}
        self.port = 0

    # harness.track wants .root, .env and .proc (gunicorn): its stores are verified once it stops.

    def start_gunicorn(self) -> None:
        argv, self.env = service_command(str(Path(sys.executable).parent.parent), str(self.root), self.sock,
                                         self.poll_dir, self.poll_log)
        assert self.env.get("ASPEN_REMOTE_USER_HEADER") == "X-Remote-User"
        assert self.env.get("ASPEN_POLL_DIR") == self.poll_dir and self.env.get("ASPEN_POLL_LOG") == self.poll_log
        env = dict(os.environ)
        env.update(self.env)
        env["ASPEN_ACCESS_LOG"] = "1"
        self.glog = self.base / "gunicorn.log"
        preexec = None
        if os.geteuid() == 0:
            gid = nobody()[2]
            preexec = lambda: os.setgid(gid)    # the unit's Group=: nginx's workers' group owns the socket
        self.proc = subprocess.Popen(argv, env=env, cwd=str(REPO_DIR), stdout=open(self.glog, "wb"),
                                     stderr=subprocess.STDOUT, preexec_fn=preexec)
        harness.track(self)
        deadline = time.time() + 30
        while time.time() < deadline:
            if "Listening at: unix:" in self.glog.read_text(errors="replace") and os.path.exists(self.sock):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"gunicorn did not start:\n{self.glog.read_text(errors='replace')}")

    def start_nginx(self) -> None:
        htpasswd = self.base / "htpasswd"
        htpasswd.write_text(htpasswd_line(USER, PASSWORD) + htpasswd_line("bob", "other"))
        htpasswd.chmod(0o644)
        for attempt in range(5):
            self.port = harness.free_port()
            (self.base / "aspen.conf").write_text(
                server_block(f"127.0.0.1:{self.port}", f"unix:{self.sock}", str(htpasswd), self.poll_dir,
                             self.poll_log))
            b = self.base
            user = "user {} {};\n".format(*nobody()[:2]) if os.geteuid() == 0 else ""
            (b / "nginx.conf").write_text(
                f"{user}worker_processes 1;\npid {b}/nginx.pid;\nerror_log {b}/error.log info;\n"
                f"events {{}}\nhttp {{\n    access_log {b}/access.log;\n"
                f"    client_body_temp_path {b}/body;\n    proxy_temp_path {b}/proxy;\n"
                f"    fastcgi_temp_path {b}/fastcgi;\n    uwsgi_temp_path {b}/uwsgi;\n"
                f"    scgi_temp_path {b}/scgi;\n    include {b}/aspen.conf;\n}}\n")
            self.nginx = subprocess.Popen(
                [NGINX, "-p", str(b), "-c", str(b / "nginx.conf"), "-e", str(b / "error.log"), "-g", "daemon off;"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            deadline = time.time() + 15
            while time.time() < deadline and self.nginx.poll() is None:
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                    return
                except OSError:
                    time.sleep(0.05)
            if self.nginx.poll() is None:
                self.nginx.kill()
            output = self.nginx.communicate()[0].decode(errors="replace")
            err = (b / "error.log").read_text(errors="replace") if (b / "error.log").exists() else ""
            if "Address already in use" not in output + err:
                raise AssertionError(f"nginx did not start:\n{output}\n{err}")
        raise AssertionError("nginx: no free port after 5 attempts")

    def stop(self) -> None:
        for p in (self.nginx, self.proc):
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

    def url(self, repo: str, auth: bool = False, password: str = PASSWORD) -> str:
        cred = f"{USER}:{password}@" if auth else ""
        return f"http://{cred}127.0.0.1:{self.port}/{repo}"

    def worker_pids(self, parent: int = 0) -> list[int]:
        parent = parent or self.proc.pid
        pids = []
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                if ppid == parent:
                    pids.append(int(d))
        return pids


def rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    harness.need_system("nginx", NGINX)
    base = Path(tempfile.mkdtemp(prefix="aspen-nginx-"))
    base.chmod(0o755)         # nginx's workers (nobody when started as root) read htpasswd, reach the socket
    root = tmp_path_factory.mktemp("nginx") / "root"
    root.mkdir()
    make_history(root / "repo.git")
    make_history(root / "push.git", commits=3, branches=())
    from bench import repogen
    repogen.generate(repogen.PRESETS["medium"], root / "big.git")   # http.receivepack=true: only nginx guards it
    s = Stack(base, root)
    try:
        s.start_gunicorn()
        s.start_nginx()
        yield s
    finally:
        s.stop()
        shutil.rmtree(base, ignore_errors=True)


def mirror(stack: Stack, repo: str, dest: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    p = git("clone", "--mirror", *args, stack.url(repo), str(dest), env=env)
    fsck_strict(str(dest))
    return p


def same_refs(client: Path, server: Path) -> None:
    assert refs_of(str(client)) == refs_of(str(server))


def http(stack: Stack, method: str, path: str, headers: dict | None = None, body: bytes | None = None):
    req = urllib.request.Request(f"http://127.0.0.1:{stack.port}{path}", data=body, method=method,
                                 headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def auth_header(user: str, password: str) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


# -- the WSGI setting, in process ---------------------------------------------------------------

def test_remote_user_header_mapping(monkeypatch):
    from aspen_cgi.wsgi import cgi_env
    monkeypatch.delenv("ASPEN_REMOTE_USER_HEADER", raising=False)
    monkeypatch.delenv("REMOTE_USER", raising=False)
    # off (the default): the header is an ordinary request header, REMOTE_USER is the server's
    env = cgi_env({"HTTP_X_REMOTE_USER": "mallory", "REQUEST_METHOD": "GET"})
    assert "REMOTE_USER" not in env and env["HTTP_X_REMOTE_USER"] == "mallory"
    assert cgi_env({"REMOTE_USER": "srv"})["REMOTE_USER"] == "srv"
    # on, from the process environment: the header names the user and is not passed on
    monkeypatch.setenv("ASPEN_REMOTE_USER_HEADER", "X-Remote-User")
    env = cgi_env({"HTTP_X_REMOTE_USER": "alice", "REMOTE_USER": "srv"})
    assert env["REMOTE_USER"] == "alice" and "HTTP_X_REMOTE_USER" not in env
    # on, no header: nobody, whatever else claims a user
    monkeypatch.setenv("REMOTE_USER", "leaked")
    assert "REMOTE_USER" not in cgi_env({"REMOTE_USER": "srv", "HTTP_X_OTHER": "x"})
    assert "REMOTE_USER" not in cgi_env({"HTTP_X_REMOTE_USER": ""})
    # on, from the server's environ (mod_wsgi SetEnv style), another header name
    monkeypatch.delenv("ASPEN_REMOTE_USER_HEADER")
    env = cgi_env({"ASPEN_REMOTE_USER_HEADER": "X-Auth-User", "HTTP_X_AUTH_USER": "carol"})
    assert env["REMOTE_USER"] == "carol" and "HTTP_X_AUTH_USER" not in env


def test_remote_user_header_gates_push(root):
    """Through the whole app: receive-pack (stock rule: only with REMOTE_USER) follows the header."""
    base = {"GIT_PROJECT_ROOT": str(root), "GIT_HTTP_EXPORT_ALL": "1", "REQUEST_METHOD": "GET",
            "PATH_INFO": "/repo.git/info/refs", "QUERY_STRING": "service=git-receive-pack",
            "ASPEN_REMOTE_USER_HEADER": "X-Remote-User"}
    assert harness.wsgi(dict(base, HTTP_X_REMOTE_USER="alice")).status == 200
    assert harness.wsgi(dict(base, REMOTE_USER="forged")).status == 403
    assert harness.wsgi(dict(base, ASPEN_REMOTE_USER_HEADER="", REMOTE_USER="srv")).status == 200


# -- end to end through nginx -------------------------------------------------------------------

def test_clone_v0_and_v2(stack, tmp_path):
    server = stack.root / "repo.git"
    for version in ("0", "2"):
        dest = tmp_path / f"v{version}.git"
        p = mirror(stack, "repo.git", dest, env={"GIT_TRACE_PACKET": "1", "GIT_CONFIG_COUNT": "1",
                                                 "GIT_CONFIG_KEY_0": "protocol.version",
                                                 "GIT_CONFIG_VALUE_0": version})
        same_refs(dest, server)
        v2 = "git< version 2" in p.stderr.decode(errors="replace")
        assert v2 == (version == "2"), f"protocol v{version}: Git-Protocol did not get through as expected"


def test_shallow_clone(stack, tmp_path):
    dest = tmp_path / "shallow.git"
    mirror(stack, "repo.git", dest, "--depth", "1", "--no-single-branch")
    same_refs(dest, stack.root / "repo.git")
    assert out("rev-list", "--count", "main", cwd=str(dest)) == "1"
    assert (dest / "shallow").is_file()


def test_admission_counts_the_client_nginx_names(stack, tmp_path):
    """The shipped unit trusts its unix-socket peer (ASPEN_TRUSTED_PROXIES=unix), so
    admission counts a cold fetch to the address nginx puts in X-Forwarded-For
    (loopback here), not to the socket's peer, which has no address; a client's own
    X-Forwarded-For entries are left of nginx's and never read."""
    assert stack.env.get("ASPEN_TRUSTED_PROXIES") == "unix"
    dest = tmp_path / "counted.git"
    forged = dict(os.environ, GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="http.extraHeader",
                  GIT_CONFIG_VALUE_0="X-Forwarded-For: 203.0.113.9")
    mirror(stack, "repo.git", dest, "--depth", "2", "--no-single-branch", env=forged)
    same_refs(dest, stack.root / "repo.git")
    lines = [line for line in stack.glog.read_text(errors="replace").splitlines()
             if " client=" in line]
    assert lines and all(" client=addr:127.0.0.1 " in line for line in lines), lines


def test_fetch_after_server_change(stack, tmp_path):
    server = stack.root / "repo.git"
    dest = tmp_path / "fetch.git"
    mirror(stack, "repo.git", dest)
    work = tmp_path / "work"
    git("clone", "-q", str(server), str(work))
    (work / "new.txt").write_text("changed on the server\n")
    git("add", "-A", cwd=str(work))
    git("commit", "-q", "-m", "server-side change", cwd=str(work))
    git("push", "-q", "origin", "HEAD:main", "HEAD:refs/heads/extra", cwd=str(work))
    new = out("rev-parse", "HEAD", cwd=str(work))
    git("fetch", "-q", "--prune", "origin", cwd=str(dest))
    fsck_strict(str(dest))
    same_refs(dest, server)
    assert refs_of(str(dest))["refs/heads/extra"] == new


def test_anonymous_push_refused(stack, tmp_path):
    for repo in ("push.git", "big.git"):       # big.git has http.receivepack=true: nginx alone refuses
        before = refs_of(str(stack.root / repo))
        for path, method in ((f"/{repo}/info/refs?service=git-receive-pack", "GET"),
                             (f"/{repo}/git-receive-pack", "POST")):
            status, headers, _ = http(stack, method, path, {"X-Remote-User": USER}, b"" if method == "POST" else None)
            assert status == 401 and "Basic" in headers.get("WWW-Authenticate", ""), (path, status)
            status, _, _ = http(stack, method, path, auth_header(USER, "wrong"), b"" if method == "POST" else None)
            assert status == 401
        # reads stay anonymous
        status, _, body = http(stack, "GET", f"/{repo}/info/refs?service=git-upload-pack")
        assert status == 200 and b"# service=git-upload-pack" in body
        work = tmp_path / repo.replace(".git", "")
        git("clone", "-q", stack.url(repo), str(work))
        (work / "anon.txt").write_text("anonymous\n")
        git("add", "-A", cwd=str(work))
        git("commit", "-q", "-m", "anonymous", cwd=str(work))
        p = git("push", "origin", "HEAD:refs/heads/anon", cwd=str(work), check=False,
                env={"GIT_TERMINAL_PROMPT": "0", "GIT_CURL_VERBOSE": "1"})
        assert p.returncode != 0
        assert b"HTTP/1.1 401" in p.stderr
        assert refs_of(str(stack.root / repo)) == before


def test_authenticated_push(stack, tmp_path):
    server = stack.root / "push.git"
    work = tmp_path / "work"
    git("clone", "-q", stack.url("push.git"), str(work))
    (work / "pushed.txt").write_text("pushed through nginx\n")
    git("add", "-A", cwd=str(work))
    git("commit", "-q", "-m", "authenticated push", cwd=str(work))
    # a forged X-Remote-User must not win over the authenticated user
    git("-c", "http.extraHeader=X-Remote-User: mallory", "push", "-q", stack.url("push.git", auth=True),
        "HEAD:main", "HEAD:refs/heads/feature", cwd=str(work))
    head = out("rev-parse", "HEAD", cwd=str(work))
    refs = refs_of(str(server))
    assert refs["refs/heads/main"] == head and refs["refs/heads/feature"] == head
    fsck_strict(str(server))
    pushes = [v for v in versions(server) if v.get("kind") == "push"]
    assert pushes and USER in str(pushes[-1]) and "mallory" not in str(pushes[-1]), pushes[-1]
    dest = tmp_path / "after.git"
    mirror(stack, "push.git", dest)
    same_refs(dest, server)


def test_push_100mb_streams(stack, tmp_path):
    server = stack.root / "push.git"
    work = tmp_path / "big"
    git("clone", "-q", stack.url("push.git"), str(work))
    with open(work / "blob.bin", "wb") as f:
        for _ in range(100):
            f.write(os.urandom(1 << 20))
    git("add", "-A", cwd=str(work))
    git("commit", "-q", "-m", "100 MB of noise", cwd=str(work))
    baseline = max(rss_kb(p) for p in stack.worker_pids())
    peak, spooled, stop = [0], set(), threading.Event()

    def sample():
        while not stop.is_set():
            for pid in stack.worker_pids():
                peak[0] = max(peak[0], rss_kb(pid))
            for pid in stack.worker_pids(stack.nginx.pid):   # body temp files are unlinked at once: look at fds
                try:
                    fds = os.listdir(f"/proc/{pid}/fd")
                except OSError:
                    continue
                for fd in fds:
                    try:
                        target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    except OSError:
                        continue
                    if target.startswith(str(stack.base / "body")):
                        spooled.add(target)
            time.sleep(0.02)

    t = threading.Thread(target=sample)
    t.start()
    try:
        p = git("push", stack.url("push.git", auth=True), "HEAD:refs/heads/big", cwd=str(work),
                env={"GIT_CURL_VERBOSE": "1", "GIT_TRACE_CURL_NO_DATA": "1"})
    finally:
        stop.set()
        t.join()
    assert b"Transfer-Encoding: chunked" in p.stderr      # git's chunked POST went through nginx
    assert not spooled, f"nginx buffered the request body to disk: {spooled}"
    assert peak[0] - baseline < 40 * 1024, f"gunicorn worker RSS grew {peak[0] - baseline} kB (peak {peak[0]} kB)"
    assert peak[0] < 100 * 1024, f"gunicorn worker peak RSS {peak[0]} kB"
    head = out("rev-parse", "HEAD", cwd=str(work))
    assert refs_of(str(server))["refs/heads/big"] == head
    fsck_strict(str(server))
    dest = tmp_path / "after.git"
    mirror(stack, "push.git", dest)
    same_refs(dest, server)


def test_larger_clone(stack, tmp_path):
    server = stack.root / "big.git"
    dest = tmp_path / "big.git"
    mirror(stack, "big.git", dest)
    same_refs(dest, server)
    assert out("rev-list", "--all", "--count", cwd=str(dest)) == out("rev-list", "--all", "--count", cwd=str(server))
    work = tmp_path / "big-work"
    git("clone", "-q", "--depth", "1", stack.url("big.git"), str(work))
    fsck_strict(str(work))
    assert out("rev-parse", "HEAD", cwd=str(work)) == refs_of(str(server))["refs/heads/main"]
