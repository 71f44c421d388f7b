"""Helpers for tests/test_deploy_apache.py: a world-readable install of Aspen,
the shipped apache/*.conf files with their placeholders filled in, and a real
Apache (prefork) started in the foreground on a random loopback port.

The configs are made FROM THE SHIPPED FILES by placeholder substitution only;
the one thing written here is a test-only wrapper (ServerRoot, Listen, PidFile,
LoadModule, User lines) that Includes the substituted file."""

from __future__ import annotations

import base64
import hashlib
import os
import random
import shutil
import signal
import stat
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from bench.targets import answers  # does anything speak HTTP there (any status)?

PROJECT = Path(__file__).resolve().parent.parent
SHIPPED = PROJECT / "apache"
APACHE = "/usr/sbin/apache2"
MODULE_DIR = Path("/usr/lib/apache2/modules")
STOCK = "/usr/lib/git-core/git-http-backend"
MODULES = ("mpm_prefork", "unixd", "authz_core", "authn_core", "authn_file", "authz_user", "auth_basic",
           "alias", "cgi", "env", "setenvif")
USER, PASSWORD = "alice", "s3cret-pw"


def world_dir(path: Path) -> Path:
    """PATH (created) and every parent traversable by Apache's user (www-data)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for d in [path, *path.parents]:
        mode = d.stat().st_mode
        if not mode & stat.S_IXOTH:
            os.chmod(d, stat.S_IMODE(mode) | 0o055)
    os.chmod(path, 0o755)
    return path


def open_up(path: Path) -> None:
    """chmod -R a+rwX PATH: the repositories are written by www-data and by the tests (root)."""
    subprocess.run(["chmod", "-R", "a+rwX", str(path)], check=True)


def install_aspen(dest: Path) -> Path:
    """A fresh venv at DEST/venv (from Debian's python3, the one mod_wsgi is built
    for) with the project installed non-editable; every directory readable by others."""
    world_dir(dest)
    venv = dest / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True)
    # build from a snapshot: pip builds in the source tree, which other runs may be building at the same time
    src = dest / "src"
    shutil.copytree(PROJECT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "results", "*.egg-info", "__pycache__", ".pytest_cache", "tests"))
    what = f"{src}[cluster]" if os.environ.get("ASPEN_REFSTORE_URL") else str(src)    # the PostgreSQL pass
    p = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", what],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"pip install {PROJECT} failed:\n{p.stdout.decode(errors='replace')[-4000:]}")
    # as the README's install line does: aspen-cgi starts Python directly (aspen_cgi/cgilauncher.py)
    subprocess.run([str(venv / "bin" / "aspen"), "install-cgi", "-q"], check=True, timeout=120)
    assert (venv / "bin" / "aspen-cgi").read_bytes().startswith(f"#!{venv}/bin/python3 -IS\n".encode())
    subprocess.run(["chmod", "-R", "a+rX", str(dest)], check=True)
    return venv


def htpasswd(path: Path, user: str = USER, password: str = PASSWORD) -> Path:
    """An Apache password file ({SHA} entry: no htpasswd binary needed)."""
    digest = base64.b64encode(hashlib.sha1(password.encode()).digest()).decode()
    path.write_text(f"{user}:{{SHA}}{digest}\n")
    os.chmod(path, 0o644)
    return path


def substitute(shipped: str, values: dict[str, str]) -> str:
    """The shipped file SHIPPED (apache/<name>) with @KEY@ replaced; every placeholder must be filled."""
    text = (SHIPPED / shipped).read_text()
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    left = [w for w in text.split("@")[1::2] if w.isupper() and " " not in w]
    if left:
        raise ValueError(f"{shipped}: placeholders left unfilled: {left}")
    return text


def _socket_dir(workdir: Path, make: bool = True) -> Path:
    """A short directory for mod_wsgi's daemon sockets, one per WORKDIR: a
    socket's path holds at most 107 bytes, and a test's own directory can be
    longer than that leaves (mod_wsgi then truncates it and every request
    gets a 503). Removed when its Apache stops."""
    d = Path("/tmp") / f"aspen-wsgi-{hashlib.sha1(str(workdir).encode()).hexdigest()[:12]}"
    if make:
        d.mkdir(exist_ok=True)
        os.chmod(d, 0o755)
    return d


def _wrapper(workdir: Path, port: int, include: Path, wsgi: bool, extra: tuple[str, ...] = ()) -> str:
    """The test-only part: what a distribution's apache2.conf would hold (and EXTRA lines)."""
    user = group = "www-data"
    if os.geteuid() != 0:
        import grp
        import pwd
        user, group = pwd.getpwuid(os.geteuid()).pw_name, grp.getgrgid(os.getegid()).gr_name
    mods = MODULES + (("wsgi",) if wsgi else ())
    loads = [f"LoadModule {m}_module {MODULE_DIR / f'mod_{m}.so'}" for m in mods
             if (MODULE_DIR / f"mod_{m}.so").exists()]
    return "\n".join([
        f'ServerRoot "{workdir}"',
        "ServerName 127.0.0.1",
        f"Listen 127.0.0.1:{port}",
        f'PidFile "{workdir}/apache.pid"',
        f'ErrorLog "{workdir}/error.log"',
        "LogLevel warn",
        *loads,
        f"User {user}",
        f"Group {group}",
        "StartServers 2",
        "MinSpareServers 2",
        "MaxSpareServers 8",
        "MaxRequestWorkers 32",
        "Timeout 600",
        f'WSGISocketPrefix "{_socket_dir(workdir)}/s"' if wsgi else "",
        # the repositories are owned by root, the children run as www-data: trust them (like the bench)
        "SetEnv GIT_CONFIG_COUNT 1",
        "SetEnv GIT_CONFIG_KEY_0 safe.directory",
        "SetEnv GIT_CONFIG_VALUE_0 *",
        # the deny-by-default a distribution's apache2.conf has, so the shipped files must grant access
        "<Directory />",
        "    Require all denied",
        "</Directory>",
        *extra,
        f'Include "{include}"',
        "",
    ])


@dataclass
class Apache:
    proc: subprocess.Popen
    port: int
    workdir: Path
    prefix: str                     # URL path prefix, e.g. "/git"
    rss: dict = field(default_factory=dict)  # comm -> max VmRSS (kB), while sampling

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.prefix}"

    def url(self, repo: str, auth: bool = False, prefix: Optional[str] = None) -> str:
        cred = f"{USER}:{PASSWORD}@" if auth else ""
        return f"http://{cred}127.0.0.1:{self.port}{prefix if prefix is not None else self.prefix}/{repo}"

    def log(self) -> str:
        parts = []
        for name in ("apache.out", "error.log"):
            p = self.workdir / name
            if p.exists():
                parts.append(p.read_text(errors="replace"))
        return "".join(parts)

    def pids(self) -> list[int]:
        """Every process in Apache's session: the parent, its children, mod_wsgi daemons, CGI programs."""
        found = []
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                stat_line = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            fields = stat_line[stat_line.rindex(")") + 2:].split()
            if int(fields[3]) == self.proc.pid:   # session id
                found.append(int(d))
        return found

    def sample_rss(self, stop: threading.Event, interval: float = 0.05) -> None:
        """Until STOP: record each process name's largest VmRSS (kB) in self.rss."""
        while not stop.is_set():
            for pid in self.pids():
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                info = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
                rss = int(info.get("VmRSS", "0 kB").split()[0])
                name = info.get("Name", "?").strip()
                if cmd and cmd[0].startswith(b"(wsgi:"):
                    name = cmd[0].decode(errors="replace").strip()     # mod_wsgi's display-name
                elif name.startswith("python") and len(cmd) > 1:
                    script = next((a for a in cmd[1:] if a and not a.startswith(b"-")), cmd[1])  # past -I -S
                    name = os.path.basename(script.decode(errors="replace"))   # aspen-cgi
                self.rss[name] = max(self.rss.get(name, 0), rss)
            stop.wait(interval)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait()
        shutil.rmtree(_socket_dir(self.workdir, make=False), ignore_errors=True)


STARTED: list["Apache"] = []      # every Apache a test started: its logs go into the report of a failure


def start_apache(workdir: Path, shipped: str, values: dict[str, str], prefix: str, *, wsgi: bool = False,
                 timeout: float = 30.0, extra: tuple[str, ...] = ()) -> Apache:
    """Fill in SHIPPED (a file in apache/) with VALUES, wrap it (with the EXTRA lines of
    server configuration, e.g. a SetEnv), and start Apache in the foreground on a free
    random loopback port (Apache cannot bind port 0: a clash makes it exit)."""
    world_dir(workdir)
    include = workdir / shipped
    include.write_text(substitute(shipped, values))
    conf = workdir / "httpd.conf"
    env = dict(os.environ, APACHE_RUN_DIR=str(workdir), APACHE_LOCK_DIR=str(workdir),
               APACHE_PID_FILE=str(workdir / "apache.pid"))
    env.pop("GIT_PROTOCOL", None)
    for _ in range(20):
        port = random.randint(20000, 59999)
        conf.write_text(_wrapper(workdir, port, include, wsgi, extra))
        check = subprocess.run([APACHE, "-f", str(conf), "-t"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
        if check.returncode != 0:
            raise RuntimeError(f"apache2 -t rejects {shipped}:\n{check.stdout.decode(errors='replace')}")
        for name in ("error.log", "apache.pid"):
            if (workdir / name).exists():
                (workdir / name).unlink()
        with open(workdir / "apache.out", "wb") as out:
            proc = subprocess.Popen([APACHE, "-f", str(conf), "-DFOREGROUND"], env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, cwd=str(workdir), start_new_session=True)
        server = Apache(proc, port, workdir, prefix)
        STARTED.append(server)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if answers(f"http://127.0.0.1:{port}/"):
                return server
            time.sleep(0.05)
        text = server.log()
        server.stop()
        if "Address already in use" not in text and "could not bind" not in text:
            raise RuntimeError(f"apache2 did not start with {shipped}:\n{text}")
    raise RuntimeError("apache2: no free port found in 20 tries")


def http_status(url: str, method: str = "GET", body: Optional[bytes] = None, headers: Optional[dict] = None) -> int:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code
