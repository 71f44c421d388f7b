"""docs/install.md as an operator types it: every `sh install-*` block run
verbatim, as root, in order, with the page's variables set to a scratch
prefix and a second Apache instance (Debian's multiple-instance layout,
/etc/apache2-<name>, copied from this machine's /etc/apache2, listening on a
loopback port). After each web server block: an anonymous clone, an
authenticated push, a refused anonymous push, and a clone equal to the
server's refs that `git fsck --strict` accepts."""

from __future__ import annotations

import grp
import os
import pwd
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from . import harness as h
from .deploy_apache import world_dir
from .test_runas import need_root

pytestmark = pytest.mark.timeout(900)

PROJECT = Path(__file__).resolve().parent.parent
PAGE = PROJECT / "docs" / "install.md"
BLOCK = re.compile(r"^```sh install-([\w-]+)\n(.*?)^```", re.M | re.S)
ORDER = ["venv", "apache-cgi", "apache-wsgi", "back-to-stock", "nginx", "nginx-start", "nginx-check",
         "cluster-db", "cluster-init", "cluster-node", "cluster-check", "cluster-nginx", "cluster-repo"]
NOT_RUN = {"nginx-start"}       # systemctl: started below as systemd would (Unit), the one block not run verbatim


def blocks() -> dict[str, str]:
    return {m.group(1): m.group(2) for m in BLOCK.finditer(PAGE.read_text())}


def test_the_page_has_its_blocks_in_order():
    assert list(blocks()) == ORDER


class Machine:
    """The scratch places the page's variables name, and the Apache instance."""

    def __init__(self, tmp: Path):
        self.name = "aspen" + secrets.token_hex(4)
        self.confdir = Path(f"/etc/apache2-{self.name}")
        subprocess.run(["cp", "-a", "/etc/apache2", str(self.confdir)], check=True)
        self.port = h.free_port()
        (self.confdir / "ports.conf").write_text(f"Listen 127.0.0.1:{self.port}\n")
        for base in ("/var/log/apache2", "/var/run/apache2", "/var/lock/apache2"):
            os.makedirs(f"{base}-{self.name}", exist_ok=True)
        # outside /tmp, as /opt/aspen is: Debian's apache2.service has PrivateTmp=true, and the doctor says so
        world = world_dir(Path(f"/srv/{self.name}"))
        self.src = world / "src"            # a copy of the checkout: the page's build writes dist/ and build/ in it
        shutil.copytree(PROJECT, self.src, symlinks=True, ignore=shutil.ignore_patterns(
            ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", "results"))
        self.prefix = world / "opt-aspen"
        self.git_root = world / "git"
        self.password = "pw-" + secrets.token_hex(6)
        self.site = f"http://127.0.0.1:{self.port}"
        self.nginx_port = h.free_port()
        self.nginx_conf = Path(f"/srv/{self.name}/nginx")
        self.systemd = Path(f"/srv/{self.name}/systemd")
        self.unit: Unit | None = None
        self.nginx: subprocess.Popen | None = None
        self.nodes: list[Unit] = []
        self.pg_cluster = ""
        self.pg_version = ""
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("ASPEN_", "GIT_", "APACHE_"))}
        self.env.update({"ASPEN_SRC": str(self.src), "PREFIX": str(self.prefix), "GIT_ROOT": str(self.git_root),
                         "APACHE_CONFDIR": str(self.confdir), "SITE": self.site,
                         "PUSH_PASSWORD": self.password, "DEBIAN_FRONTEND": "noninteractive",
                         "NGINX_CONFDIR": str(self.nginx_conf), "NGINX_LISTEN": f"127.0.0.1:{self.nginx_port}",
                         "NGINX_SITE": f"http://127.0.0.1:{self.nginx_port}", "SYSTEMD_DIR": str(self.systemd)})
        self.work = tmp

    def run(self, name: str) -> str:
        block = blocks()[name]
        res = subprocess.run(["bash", "-euo", "pipefail", "-c", block], env=self.env, cwd=str(self.work),
                             capture_output=True, text=True, timeout=800)
        assert res.returncode == 0, (f"docs/install.md block install-{name} failed ({res.returncode}):\n"
                                     f"{res.stdout[-3000:]}\n{res.stderr[-5000:]}\n{self.error_log()}")
        return res.stdout + res.stderr

    def error_log(self) -> str:
        log = Path(f"/var/log/apache2-{self.name}/error.log")
        return log.read_text(errors="replace")[-3000:] if log.exists() else ""

    def prepare_nginx(self) -> None:
        """A copy of this machine's /etc/nginx whose own paths (includes, pid, logs) point into the copy."""
        subprocess.run(["cp", "-a", "/etc/nginx", str(self.nginx_conf)], check=True)
        conf = self.nginx_conf / "nginx.conf"
        text = conf.read_text().replace("/etc/nginx/", f"{self.nginx_conf}/")
        text = re.sub(r"^pid .*;", f"pid {self.nginx_conf}/nginx.pid;", text, flags=re.M)
        text = re.sub(r"/var/log/nginx/", f"{self.nginx_conf}/", text)
        text = text.replace("http {", f"http {{\n\tclient_body_temp_path {self.nginx_conf}/body;\n"
                                      f"\tproxy_temp_path {self.nginx_conf}/proxy;", 1)
        conf.write_text(text)
        self.systemd.mkdir()

    def start_nginx(self, unit: bool = True) -> None:
        """What install-nginx-start does: the unit as systemd runs it, nginx -t, nginx."""
        if unit:
            self.unit = Unit(self.systemd / "aspen-gunicorn.service")
            self.unit.start()
        conf = str(self.nginx_conf / "nginx.conf")
        test = subprocess.run(["nginx", "-t", "-c", conf], capture_output=True, text=True, timeout=60)
        assert test.returncode == 0, test.stderr
        self.nginx = subprocess.Popen(["nginx", "-c", conf, "-g", "daemon off;"], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
        wait_port(self.nginx_port)

    def stop_nginx(self) -> None:
        if self.nginx is not None:
            self.nginx.terminate()
            self.nginx.wait(timeout=30)
            self.nginx = None

    def stop(self) -> None:
        self.stop_nginx()
        for unit in [self.unit, *self.nodes]:
            if unit is not None:
                unit.stop()
        if self.pg_cluster:
            subprocess.run(["pg_dropcluster", "--stop", self.pg_version, self.pg_cluster], capture_output=True,
                           timeout=120)
        env = dict(self.env)
        subprocess.run(["apache2ctl", "stop"], env=env, capture_output=True, timeout=60)
        pid = Path(f"/var/run/apache2-{self.name}/apache2.pid")
        for _ in range(100):
            if not pid.exists():
                break
            subprocess.run(["sleep", "0.1"])
        for path in (self.confdir, Path(f"/srv/{self.name}"), *(Path(f"{b}-{self.name}") for b in
                                     ("/var/log/apache2", "/var/run/apache2", "/var/lock/apache2"))):
            shutil.rmtree(path, ignore_errors=True)

    def url(self, auth: bool = False) -> str:
        cred = f"alice:{self.password}@" if auth else ""
        if self.nginx is not None:
            return f"http://{cred}127.0.0.1:{self.nginx_port}/repo.git"
        return f"http://{cred}127.0.0.1:{self.port}/git/repo.git"


def wait_port(port: int, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class Unit:
    """A systemd service unit run as systemd runs it (systemd is not PID 1
    here): User= with its groups, Group=, RuntimeDirectory= made with
    RuntimeDirectoryMode= and owned by them, Environment=, ExecStart= from /
    with HOME, USER, LOGNAME and PATH set, umask 0022."""

    def __init__(self, path: Path):
        self.keys: dict[str, list[str]] = {}
        for line in path.read_text().splitlines():
            if "=" in line and not line.lstrip().startswith(("#", "[")):
                k, _, v = line.partition("=")
                self.keys.setdefault(k.strip(), []).append(v.strip())
        self.proc: subprocess.Popen | None = None
        self.runtime: Path | None = None

    def one(self, key: str, default: str = "") -> str:
        return self.keys.get(key, [default])[-1]

    def start(self) -> None:
        pw = pwd.getpwnam(self.one("User", "root"))
        gid = grp.getgrnam(self.one("Group")).gr_gid if self.one("Group") else pw.pw_gid
        if self.one("RuntimeDirectory"):
            self.runtime = Path("/run") / self.one("RuntimeDirectory")
            self.runtime.mkdir(mode=int(self.one("RuntimeDirectoryMode", "0755"), 8), exist_ok=True)
            os.chmod(self.runtime, int(self.one("RuntimeDirectoryMode", "0755"), 8))
            os.chown(self.runtime, pw.pw_uid, gid)
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": pw.pw_dir,
               "USER": pw.pw_name, "LOGNAME": pw.pw_name, "LANG": "C.UTF-8"}
        for item in self.keys.get("Environment", []):
            for assignment in shlex.split(item):
                k, _, v = assignment.partition("=")
                env[k] = v

        def become() -> None:
            os.setgid(gid)
            os.initgroups(pw.pw_name, gid)
            os.setuid(pw.pw_uid)
            os.umask(0o022)
        self.proc = subprocess.Popen(shlex.split(self.one("ExecStart")), env=env, cwd="/", preexec_fn=become,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        sock = re.search(r"--bind unix:(\S+)", self.one("ExecStart"))
        tcp = re.search(r"--bind [\d.]+:(\d+)", self.one("ExecStart"))
        deadline = time.monotonic() + 60
        while sock and not os.path.exists(sock.group(1)):
            assert self.proc.poll() is None, "the unit's ExecStart exited"
            assert time.monotonic() < deadline, "the unit's socket did not appear"
            time.sleep(0.05)
        if tcp:
            wait_port(int(tcp.group(1)), 60)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=60)
        if self.runtime is not None:
            shutil.rmtree(self.runtime, ignore_errors=True)


def served(m: Machine, clone: Path, message: str) -> None:
    """A push of one commit as alice lands; without a password it is refused (401);
    a fresh clone has the server's refs and passes git fsck --strict."""
    if not clone.exists():
        h.git("clone", "-q", m.url(), str(clone))
    (clone / "f").write_text(message)
    h.git("add", "f", cwd=str(clone))
    h.git("-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", message, cwd=str(clone))
    try:
        urllib.request.urlopen(m.url() + "/info/refs?service=git-receive-pack", timeout=60)
        raise AssertionError("an anonymous push was not refused")
    except urllib.error.HTTPError as e:
        assert e.code == 401
    h.git("push", "-q", m.url(auth=True), "HEAD:refs/heads/main", cwd=str(clone))
    fresh = clone.parent / (clone.name + "-check")
    shutil.rmtree(fresh, ignore_errors=True)
    h.git("clone", "-q", "--mirror", m.url(), str(fresh))
    h.fsck_strict(str(fresh))
    server = m.git_root / "repo.git"
    trust = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*"}
    theirs = h.out("for-each-ref", "--format=%(objectname) %(refname)", cwd=str(server), env=trust)
    assert h.out("for-each-ref", "--format=%(objectname) %(refname)", cwd=str(fresh)) == theirs
    assert h.out("log", "-1", "--format=%s", "refs/heads/main", cwd=str(fresh)) == message


def wsgi_daemons() -> list[int]:
    return [pid for pid, _, cmd in h.processes() if cmd.startswith(b"(wsgi:aspen)")]


def cluster(m: Machine, tmp: Path) -> None:
    """The cluster's blocks: a PostgreSQL cluster made the Debian way
    (pg_createcluster, running), the database block, the init block, three
    nodes on loopback ports (each its own root and unit), nginx in front;
    then a push through nginx is in every node's copy."""
    h.need_system("postgresql", "/usr/bin/pg_createcluster")
    m.stop_nginx()
    m.unit.stop()
    m.pg_version = sorted(os.listdir("/usr/lib/postgresql"), key=int)[-1]
    m.pg_cluster = m.name
    pg_port = h.free_port()
    subprocess.run(["pg_createcluster", m.pg_version, m.pg_cluster, "-p", str(pg_port)], check=True,
                   capture_output=True, timeout=120)
    subprocess.run(["pg_ctlcluster", m.pg_version, m.pg_cluster, "start"], check=True, capture_output=True,
                   timeout=120)
    base = Path(f"/srv/{m.name}")
    ports = [h.free_port() for _ in range(3)]
    m.env.update({"PG_VERSION": m.pg_version, "PG_CLUSTER": m.pg_cluster, "DB_HOST": "127.0.0.1",
                  "DB_PORT": str(pg_port), "DB_PASSWORD": "db-" + secrets.token_hex(6), "NODES": "127.0.0.1/32",
                  "CLUSTER_SECRET": "secret-" + secrets.token_hex(8), "NODE_ROOT": str(base / "node0"),
                  "CLUSTER_NODES": " ".join(f"127.0.0.1:{p}" for p in ports)})
    m.run("cluster-db")
    m.run("cluster-init")
    for i, port in enumerate(ports):
        systemd = base / f"systemd-node{i}"
        systemd.mkdir()
        m.env.update({"NODE_ROOT": str(base / f"node{i}"), "NODE_LISTEN": f"127.0.0.1:{port}",
                      "SYSTEMD_DIR": str(systemd)})
        m.run("cluster-node")
        unit = Unit(systemd / "aspen-gunicorn.service")
        m.nodes.append(unit)
        unit.start()
        out = m.run("cluster-check")
        assert "no problem found" in out and "ok    postgresql: reachable" in out, out
        assert f"ok    node-url: http://127.0.0.1:{port} answers" in out, out
    m.env.update({"NODE_ROOT": str(base / "node0")})
    m.run("cluster-nginx")
    m.run("cluster-repo")
    m.start_nginx(unit=False)

    work = tmp / "cluster-client"
    h.git("clone", "-q", f"http://127.0.0.1:{m.nginx_port}/shared.git", str(work))
    (work / "f").write_text("through the cluster")
    h.git("add", "f", cwd=str(work))
    h.git("-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "through the cluster", cwd=str(work))
    h.git("push", "-q", f"http://alice:{m.password}@127.0.0.1:{m.nginx_port}/shared.git", "HEAD:refs/heads/main",
          cwd=str(work))
    want = h.out("rev-parse", "HEAD", cwd=str(work))
    for i, port in enumerate(ports):          # every node, asked directly: the push is in its copy
        copy = tmp / f"node{i}-clone"
        h.git("clone", "-q", "--mirror", f"http://127.0.0.1:{port}/shared.git", str(copy))
        h.fsck_strict(str(copy))
        assert h.out("rev-parse", "refs/heads/main", cwd=str(copy)) == want, i
    # no shared directory: the push's pack is on two nodes' own disks
    held = [i for i in range(3) if any((base / f"node{i}" / ".aspen-packs").rglob("*.pack"))]
    assert len(held) >= 2, held


def test_the_install_page_as_typed(tmp_path):
    need_root()
    h.need_system("apache2", "/usr/sbin/apache2")
    h.need_system("libapache2-mod-wsgi-py3", "/usr/lib/apache2/modules/mod_wsgi.so")
    m = Machine(tmp_path)
    try:
        out = m.run("venv")
        assert re.search(r"aspen \d+\.\d+\.\d+\S*\+g[0-9a-f]{7}", out), out
        clone = tmp_path / "client"

        out = m.run("apache-cgi")
        assert "no problem found" in out, out
        served(m, clone, "through aspen-cgi")
        assert (m.git_root / "repo.git" / "aspen").is_dir()          # Aspen's, not stock's
        assert any(p.name.startswith("resident-") for p in (m.prefix / "run").iterdir())

        out = m.run("apache-wsgi")
        assert "no problem found" in out, out
        served(m, clone, "through mod_wsgi")
        assert wsgi_daemons(), "mod_wsgi's daemon processes answered"

        m.run("back-to-stock")
        served(m, clone, "through stock")
        owners = {p.stat().st_uid for p in (m.git_root / "repo.git").rglob("*")}
        assert owners == {(m.git_root / "repo.git").stat().st_uid}, "everything the server's user's"

        m.prepare_nginx()
        m.run("nginx")
        m.start_nginx()
        sock = Path("/run/aspen/gunicorn.sock")
        assert oct(sock.stat().st_mode & 0o777) == oct(0o770) and grp.getgrgid(sock.stat().st_gid).gr_name == "www-data"
        out = m.run("nginx-check")
        assert "no problem found" in out, out
        served(m, clone, "through nginx and gunicorn")
        git_uid = pwd.getpwnam("git").pw_uid
        assert {p.stat().st_uid for p in (m.git_root / "repo.git" / "aspen").rglob("*")} == {git_uid}

        cluster(m, tmp_path)
    finally:
        m.stop()
