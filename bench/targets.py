"""Targets: starts and stops the servers a benchmark compares, each over its
own copy of the repositories and each behind its own CountingProxy.

Target specs (the names `running()` takes):
- `aspen`         gunicorn (gthread) serving `aspen_cgi.wsgi:application`
                  with the product's defaults (ASPEN_VERSION_PACKS not set,
                  not even inherited: version packs on; no `aspen import`,
                  so the server builds its packs itself in the background,
                  the import's first); the response cache off unless env
                  sets ASPEN_CACHE (the CLI turns it on for the storm
                  workloads);
- `aspen-packs`   the same, pre-imported: `aspen import` over its copy before
                  it starts, otherwise the defaults (each push builds its pack
                  in the background, fetches are planned and spliced from
                  stored packs);
- `aspen-git`     the same with version packs off (ASPEN_VERSION_PACKS=off):
                  every fetch is git's upload-pack;
- `stock`         the same gunicorn serving stock `git http-backend` through
                  `bench.cgibridge:application`;
- `stock-maintained` the same as `stock`, over a copy first repacked as a
                  careful operator keeps it (`git repack -adf --window=250
                  --depth=50 -b`, repack.writeBitmaps on): untimed, before
                  the server starts (its seconds in TargetInfo.setup);
- `stock-apache`  stock `git http-backend` as a CGI under Apache (mod_cgi),
                  served at /stock/ by the shipped apache/side-by-side.conf
                  (pushes with the bench's Basic password, in the URL),
                  only where `apache2` is installed;
- `aspen-apache`  `aspen-cgi` under Apache (mod_cgi), at /aspen/ of the same
                  shipped side-by-side config, in the defaults (a process per
                  request, as operators first swap Aspen in);
- `aspen-modwsgi` Aspen under Apache's mod_wsgi (daemon mode, the shipped
                  apache/aspen-wsgi.conf), in the defaults; only where
                  mod_wsgi is installed;
- `url:NAME=URL`  any other smart-HTTP server (Gitea, Forgejo, GitLab) by base
                  URL, credentials as `user:token@` in the URL; not started
                  or stopped here, and no repository copy (`root=None`).

Every server allows anonymous push (http.receivepack=true) and exports every
repository. This module starts and stops every server process of the bench
(the bridge's CGI children are started by the server that hosts it).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from . import procstats
from .cgibridge import STOCK
from .model import TargetInfo
from .proxy import CountingProxy

PROJECT = Path(__file__).resolve().parent.parent
BUILTIN = ("aspen", "aspen-packs", "aspen-git", "stock", "stock-maintained", "stock-apache", "aspen-apache",
           "aspen-modwsgi", "aspen-cluster1", "aspen-cluster3")
CLUSTER_TARGETS = {"aspen-cluster1": 1, "aspen-cluster3": 3}    # bench/cluster.py: nodes behind nginx
APACHE_TARGETS = ("stock-apache", "aspen-apache", "aspen-modwsgi")
APACHE_PATHS = {"stock-apache": "/stock", "aspen-apache": "/aspen", "aspen-modwsgi": "/git"}
ASPEN_TARGETS = ("aspen", "aspen-packs", "aspen-git")     # gunicorn serving Aspen
PACK_TARGETS = ("aspen", "aspen-packs", "aspen-apache", "aspen-modwsgi")     # ...that build version packs
STOCK_TARGETS = ("stock", "stock-maintained")       # gunicorn serving stock through bench/cgibridge.py
# What a careful operator runs (issue 40): every object in one pack, a wide
# delta search, bitmaps for clones and fetches.
MAINTAIN_REPACK = ("repack", "-adf", "--window=250", "--depth=50", "-b")

_PUSH_ENV = {"GIT_HTTP_EXPORT_ALL": "1", "GIT_CONFIG_COUNT": "1",
             "GIT_CONFIG_KEY_0": "http.receivepack", "GIT_CONFIG_VALUE_0": "true"}


class TargetUnavailable(RuntimeError):
    """A target that cannot run on this machine (e.g. Apache is not installed)."""


@dataclass
class Target:
    """A started target: what workloads see (`info`), and what stop() needs."""
    info: TargetInfo
    proxy: CountingProxy
    proc: Optional[subprocess.Popen] = None
    log: Optional[Path] = None
    scratch: Optional[Path] = None      # a directory of ours outside the workdir, removed on stop

    def stop(self) -> None:
        self.proxy.stop()
        if self.proc is not None:
            _terminate(self.proc)
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log and self.log.exists() else ""


def repositories(root: Path) -> list[str]:
    """Names (relative paths) of the bare repositories directly under ROOT, sorted."""
    if root is None or not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir()
                  if p.is_dir() and (p / "HEAD").is_file() and (p / "objects").is_dir())


def copy_root(src: Path, dst: Path) -> Path:
    """Copy the project root SRC to DST (`cp -a`: object layout, packs and permissions preserved)."""
    src, dst = Path(src), Path(dst)
    if dst.exists():
        shutil.rmtree(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)
    return dst


def apache_binary() -> Optional[str]:
    found = shutil.which("apache2")
    if found:
        return found
    return "/usr/sbin/apache2" if os.path.exists("/usr/sbin/apache2") else None


def parse_spec(spec: str) -> tuple[str, Optional[str]]:
    """'aspen' -> ('aspen', None); 'url:gitea=http://h/org' -> ('gitea', 'http://h/org')."""
    if spec.startswith("url:"):
        name, sep, url = spec[4:].partition("=")
        if not sep or not name or not url:
            raise ValueError(f"bad target {spec!r}: expected url:NAME=URL")
        return name, url
    if spec not in BUILTIN:
        raise ValueError(f"unknown target {spec!r}: expected one of {', '.join(BUILTIN)} or url:NAME=URL")
    return spec, None


def _terminate(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL to the process group after GRACE seconds."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                proc.kill()
            proc.wait()
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # stray children left in the server's own group
    except OSError:
        pass


def _gunicorn(name: str, app: str, root: Path, workdir: Path, env: dict, workers: int, threads: int,
              timeout: float, unset: tuple = (), port: int = 0) -> tuple[subprocess.Popen, int, Path]:
    """Start gunicorn on 127.0.0.1:PORT (0: any) and read its port from its `Listening at:` line.
    Variables in UNSET are not inherited from the bench's environment (ENV may still set them)."""
    log = workdir / f"{name}.log"
    full = {k: v for k, v in os.environ.items() if k not in unset}
    full.update({"GIT_PROJECT_ROOT": str(root), **_PUSH_ENV})
    full.update(env)
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT), full.get("PYTHONPATH")]))
    with open(log, "wb") as logf:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--worker-class", "gthread",
             "--workers", str(workers), "--threads", str(threads), "--timeout", "600",
             "--graceful-timeout", "5", "--backlog", "2048", app],
            env=full, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, cwd=str(PROJECT),
            start_new_session=True)
    pattern = re.compile(r"Listening at: http://127\.0\.0\.1:(\d+) \(%d\)" % proc.pid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = pattern.search(log.read_text(errors="replace"))
        if m:
            return proc, int(m.group(1)), log
        if proc.poll() is not None:
            raise RuntimeError(f"{name}: gunicorn exited ({proc.returncode}):\n{log.read_text(errors='replace')}")
        time.sleep(0.05)
    _terminate(proc)
    raise RuntimeError(f"{name}: gunicorn did not report its port within {timeout:.0f}s")


_APACHE_MODULES = ("mpm_prefork", "authz_core", "authz_user", "authn_core", "authn_file", "auth_basic", "alias",
                   "cgi", "env", "setenvif", "unixd")
_MODULE_DIR = Path("/usr/lib/apache2/modules")
SIDE_BY_SIDE = PROJECT / "apache" / "side-by-side.conf"
WSGI_CONF = PROJECT / "apache" / "aspen-wsgi.conf"
MOD_WSGI = _MODULE_DIR / "mod_wsgi.so"
# stock-apache is served by the shipped side-by-side config, whose pushes ask
# for a password: the bench's user, given in the target's URL.
APACHE_USER, APACHE_PASSWORD = "bench", "bench"


def side_by_side(root: Path, htpasswd: Path) -> str:
    """apache/side-by-side.conf with its placeholders filled (stock at /stock/,
    Aspen at /aspen/ over ROOT); its text is otherwise the operator's."""
    import base64
    import hashlib
    digest = base64.b64encode(hashlib.sha1(APACHE_PASSWORD.encode()).digest()).decode()
    htpasswd.write_text(f"{APACHE_USER}:{{SHA}}{digest}\n")
    htpasswd.chmod(0o644)
    aspen_cgi = Path(sys.executable).parent / "aspen-cgi"
    text = SIDE_BY_SIDE.read_text()
    for key, value in (("GIT_PROJECT_ROOT", str(root)), ("ASPEN_CGI", str(aspen_cgi)), ("HTPASSWD", str(htpasswd))):
        text = text.replace(f"@{key}@", value)
    return text


def aspen_wsgi(root: Path, htpasswd: Path) -> str:
    """apache/aspen-wsgi.conf with its placeholders filled (Aspen at /git/ over
    ROOT, in the bench's own venv); its text is otherwise the operator's."""
    side_by_side(root, htpasswd)        # writes the password file
    text = WSGI_CONF.read_text()
    for key, value in (("GIT_PROJECT_ROOT", str(root)), ("VENV", sys.prefix), ("APACHE_DIR", str(PROJECT / "apache")),
                       ("HTPASSWD", str(htpasswd))):
        text = text.replace(f"@{key}@", value)
    return text


def _apache_conf(name: str, root: Path, workdir: Path, port: int, user: str, group: str,
                 aspen_env: dict) -> str:
    loads = []
    for mod in _APACHE_MODULES + (("wsgi",) if name == "aspen-modwsgi" else ()):
        so = _MODULE_DIR / f"mod_{mod}.so"
        if so.exists():  # some are built in (unixd on some builds)
            loads.append(f"LoadModule {mod}_module {so}")
    # The children run as another user than the repositories' owner: trust them (command-scope config).
    env = {**_PUSH_ENV, "GIT_CONFIG_COUNT": "2", "GIT_CONFIG_KEY_1": "safe.directory", "GIT_CONFIG_VALUE_1": "*",
           **aspen_env}
    htpasswd = Path(root).parent / "htpasswd"       # beside the repositories: www-data reaches it
    site = aspen_wsgi(root, htpasswd) if name == "aspen-modwsgi" else side_by_side(root, htpasswd)
    return "\n".join([
        f'ServerRoot "{workdir}"',
        "ServerName 127.0.0.1",
        f"Listen 127.0.0.1:{port}",
        f'PidFile "{workdir}/apache.pid"',
        f'ErrorLog "{workdir}/{name}.log"',
        # the daemon's socket where Apache's user reaches it (the workdir may not be)
        f'WSGISocketPrefix "{Path(root).parent}/wsgi"' if name == "aspen-modwsgi" else "",
        "LogLevel warn",
        *loads,
        f"User {user}",
        f"Group {group}",
        "StartServers 4",
        "MinSpareServers 4",
        "MaxSpareServers 32",
        "ServerLimit 512",
        "MaxRequestWorkers 512",
        "MaxConnectionsPerChild 0",
        "KeepAlive On",
        "MaxKeepAliveRequests 0",
        "KeepAliveTimeout 5",
        "Timeout 600",
        "LimitRequestBody 0",
        *[f"SetEnv {k} {v}" for k, v in env.items() if k != "GIT_PROJECT_ROOT"],
        site,
        "",
    ])


def _apache(name: str, root: Path, workdir: Path, timeout: float,
            aspen_env: dict) -> tuple[subprocess.Popen, int, Path]:
    """Start Apache (prefork + mod_cgi) in the foreground on a loopback port.

    Apache cannot bind port 0, so a random high port is tried and Apache itself
    reports a clash by exiting; then another port is tried. Apache refuses to
    run its children as root: when started as root they run as www-data; the
    repository copy (ROOT, made world-writable by the caller) stays owned by
    root so that local git commands on it need no safe.directory."""
    binary = apache_binary()
    if binary is None:
        raise TargetUnavailable(f"{name}: apache2 is not installed (apt-get install apache2); skipped")
    user = group = "www-data"
    if os.geteuid() != 0:
        import grp
        import pwd
        user, group = pwd.getpwuid(os.geteuid()).pw_name, grp.getgrgid(os.getegid()).gr_name
    log = workdir / f"{name}.log"
    conf = workdir / "apache.conf"
    env = dict(os.environ)
    env.update({"APACHE_RUN_DIR": str(workdir), "APACHE_LOCK_DIR": str(workdir), "APACHE_PID_FILE":
                str(workdir / "apache.pid")})
    for _ in range(20):
        port = random.randint(20000, 59999)
        conf.write_text(_apache_conf(name, root, workdir, port, user, group, aspen_env))
        if log.exists():
            log.unlink()
        with open(workdir / f"{name}.out", "wb") as out:
            proc = subprocess.Popen([binary, "-f", str(conf), "-DFOREGROUND"], env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, cwd=str(workdir),
                                    start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            if answers(f"http://127.0.0.1:{port}/"):
                return proc, port, log
            time.sleep(0.05)
        text = (workdir / f"{name}.out").read_text(errors="replace") + (
            log.read_text(errors="replace") if log.exists() else "")
        _terminate(proc)
        if "Address already in use" not in text and "could not bind" not in text:
            raise RuntimeError(f"{name}: apache2 did not start:\n{text}")
    raise RuntimeError(f"{name}: no free port found in 20 tries")


def maintain(root: Path) -> dict:
    """Repack every repository under ROOT as a careful operator keeps it
    (MAINTAIN_REPACK, with repack.writeBitmaps and pack.writeBitmapHashCache
    set in its config, so that a later repack keeps bitmaps too). Runs before
    the server starts: no measurement includes it. Returns repack_s (the
    seconds it took) and repacked (repositories)."""
    t0 = time.monotonic()
    gitdirs = sorted(p.parent for p in Path(root).rglob("HEAD") if (p.parent / "objects").is_dir())
    for gitdir in gitdirs:
        for key in ("repack.writeBitmaps", "pack.writeBitmapHashCache"):
            subprocess.run(["git", "config", key, "true"], cwd=str(gitdir), check=True)
        r = subprocess.run(["git", *MAINTAIN_REPACK], cwd=str(gitdir), stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if r.returncode:
            raise RuntimeError(f"stock-maintained: git {' '.join(MAINTAIN_REPACK)} failed in {gitdir}: "
                               f"{r.stderr.decode(errors='replace')[-500:]}")
    return {"repack_s": round(time.monotonic() - t0, 2), "repacked": len(gitdirs)}


def answers(url: str) -> bool:
    """Does anything speak HTTP at URL (any status)?"""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            resp.read()
        return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False


def _opener(url: str) -> tuple[str, urllib.request.OpenerDirector]:
    """URL without credentials, and an opener that sends them (Basic) when the URL has them."""
    parts = urllib.parse.urlsplit(url)
    handlers = []
    if parts.username:
        mgr = urllib.request.HTTPPasswordMgrWithDefaultRealm()
        netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
        bare = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
        mgr.add_password(None, bare, urllib.parse.unquote(parts.username),
                         urllib.parse.unquote(parts.password or ""))
        handlers.append(urllib.request.HTTPBasicAuthHandler(mgr))
        url = bare
    return url, urllib.request.build_opener(*handlers)


def wait_ready(info: TargetInfo, repo: Optional[str], timeout: float = 60.0) -> None:
    """Wait until INFO answers `GET /REPO/info/refs?service=git-upload-pack` with 200
    (any HTTP answer at the base URL when REPO is None)."""
    base = info.url.rstrip("/")
    url = f"{base}/{repo}/info/refs?service=git-upload-pack" if repo else base + "/"
    url, opener = _opener(url)
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            with opener.open(url, timeout=10) as resp:
                resp.read()
                if resp.status == 200:
                    return
                last = f"status {resp.status}"
        except urllib.error.HTTPError as e:
            last = f"status {e.code}"
            if repo is None:
                return
        except (OSError, ValueError) as e:
            last = str(e)
        time.sleep(0.1)
    raise RuntimeError(f"{info.name}: {url} not ready after {timeout:.0f}s ({last})")


def _with_netloc(url: str, host: str, port: int) -> str:
    """URL with its host:port replaced (keeping user:token@ and the path)."""
    parts = urllib.parse.urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    netloc = (auth + "@" if auth else "") + f"{host}:{port}"
    return urllib.parse.urlunsplit(("http", netloc, parts.path.rstrip("/"), "", ""))


def wait_prewarm(mutex: Path, timeout: float) -> None:
    """Until a pre-warmer lets go of MUTEX (its repository's
    `aspen/cache/prewarm.mutex`), at most TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    time.sleep(0.3)                         # a pre-warmer takes the lock as it starts
    while time.monotonic() < deadline:
        try:
            fd = os.open(mutex, os.O_RDONLY)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return
        except OSError:
            time.sleep(0.1)
        finally:
            os.close(fd)


def start_target(spec: str, root: Optional[Path], workdir: Path, *, workers: int = 2, threads: int = 16,
                 env: Optional[dict] = None, timeout: float = 60.0) -> Target:
    """Start one target over its own copy of ROOT (under WORKDIR/NAME) behind a new CountingProxy.
    Raises TargetUnavailable when the target cannot run here."""
    name, url = parse_spec(spec)
    if url is not None:
        parts = urllib.parse.urlsplit(url)
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        proxy = CountingProxy(parts.hostname, port, name, tls=tls, host_header=parts.netloc.rpartition("@")[2])
        proxy.start()
        info = TargetInfo(name=name, url=_with_netloc(url, "127.0.0.1", proxy.port), root=None, pids=[])
        return Target(info, proxy)
    if name in CLUSTER_TARGETS:
        return _cluster_target(name, root, workdir, workers, threads, env, timeout)
    if name in APACHE_TARGETS and apache_binary() is None:
        raise TargetUnavailable(f"{name}: apache2 is not installed (apt-get install apache2); skipped")
    if name == "aspen-modwsgi" and not MOD_WSGI.exists():
        raise TargetUnavailable(f"{name}: mod_wsgi is not installed (apt-get install libapache2-mod-wsgi-py3); skipped")
    tdir = Path(workdir) / name
    tdir.mkdir(parents=True, exist_ok=True)
    scratch: Optional[Path] = None
    setup: dict = {}
    if name in APACHE_TARGETS and os.geteuid() == 0 and not _reachable_by_others(tdir):
        # Apache's children (www-data) must reach the repositories: copy them where they can.
        scratch = Path(tempfile.mkdtemp(prefix="aspen-bench-apache-"))
        scratch.chmod(0o755)
        repos = copy_root(Path(root), scratch / "repos")
    else:
        repos = copy_root(Path(root), tdir / "repos")
    if name in APACHE_TARGETS:
        subprocess.run(["chmod", "-R", "a+rwX", str(repos)], check=True)
    if name in ASPEN_TARGETS:
        extra = {"ASPEN_ACCESS_LOG": "1", "ASPEN_CACHE": "off", "ASPEN_RUN_DIR": str(tdir / "run")}
        if name == "aspen-git":
            extra["ASPEN_VERSION_PACKS"] = "off"
        if name == "aspen-packs":
            served = {k: v for k, v in os.environ.items() if k != "ASPEN_VERSION_PACKS"}
            served.update({**extra, **(env or {})})
            gitdirs = sorted(p.parent for p in Path(repos).rglob("HEAD") if (p.parent / "objects").is_dir())
            for gitdir in gitdirs:
                # the server's environment: with its cache off, the import pre-warms nothing it would read
                subprocess.run([sys.executable, "-m", "aspen_cgi.cli", "import", "-q", str(gitdir)], check=True,
                               cwd=str(PROJECT), stdout=subprocess.DEVNULL, env=served)
            if served.get("ASPEN_CACHE", "on").lower() not in ("0", "off", "no", "false"):
                for gitdir in gitdirs:
                    # the import's detached pre-warmer: its CPU is the import's, not the workload's
                    wait_prewarm(gitdir / "aspen" / "cache" / "prewarm.mutex", 900.0)
        proc, port, log = _gunicorn(name, "aspen_cgi.wsgi:application", repos, tdir,
                                    {**extra, **(env or {})}, workers, threads, timeout,
                                    unset=("ASPEN_VERSION_PACKS",))
    elif name in STOCK_TARGETS:
        if name == "stock-maintained":
            setup.update(maintain(Path(repos)))
        proc, port, log = _gunicorn(name, "bench.cgibridge:application", repos, tdir,
                                    {"ASPEN_BENCH_CGI": STOCK, **(env or {})}, workers, threads, timeout)
    else:
        aspen_env = {}
        if name != "stock-apache":
            run = Path(repos).parent / "run"        # where Apache's user can write
            run.mkdir(exist_ok=True)
            run.chmod(0o777)
            aspen_env = {"ASPEN_ACCESS_LOG": "1", "ASPEN_CACHE": "off", "ASPEN_RUN_DIR": str(run), **(env or {})}
        proc, port, log = _apache(name, repos, tdir, timeout, aspen_env)
    try:
        proxy = CountingProxy("127.0.0.1", port, name).start()
    except BaseException:
        _terminate(proc)
        raise
    url = proxy.url
    if name in APACHE_TARGETS:   # under the shipped config's path, pushes with the bench's password
        url = url.replace("://", f"://{APACHE_USER}:{APACHE_PASSWORD}@", 1) + APACHE_PATHS[name]
    pids: list = [proc.pid]
    if name == "aspen-apache":
        pids.append(ResidentPids(Path(repos).parent / "run"))    # aspen-cgi's resident leaves Apache's tree
    info = TargetInfo(name=name, url=url, root=repos, pids=pids,
                      plan_log=log if name in ASPEN_TARGETS + ("aspen-apache", "aspen-modwsgi") else None,
                      version_packs=name in PACK_TARGETS, setup=setup)
    return Target(info, proxy, proc, log, scratch=scratch)


@dataclass
class ClusterTarget(Target):
    stack: object = None

    def stop(self) -> None:
        self.proxy.stop()
        if self.stack is not None:
            self.stack.stop()      # type: ignore[attr-defined]


def _cluster_target(name: str, root: Optional[Path], workdir: Path, workers: int, threads: int,
                    env: Optional[dict], timeout: float) -> Target:
    """N Aspen nodes (own roots, one PostgreSQL, one pack store) behind nginx/aspen-cluster.conf."""
    from . import cluster
    if not os.path.exists(cluster.NGINX):
        raise TargetUnavailable(f"{name}: nginx is not installed (apt-get install nginx); skipped")
    tdir = Path(workdir) / name
    stack = cluster.ClusterStack(tdir, CLUSTER_TARGETS[name], root, {"ASPEN_CACHE": "off", **(env or {})},
                                 workers=workers, threads=threads, timeout=timeout)
    try:
        proxy = CountingProxy("127.0.0.1", stack.port, name).start()
    except BaseException:
        stack.stop()
        raise
    url = proxy.url.replace("://", f"://{cluster.USER}:{cluster.PASSWORD}@", 1)
    first = stack.nodes[0]
    info = TargetInfo(name=name, url=url, root=first[3], pids=stack.pids, plan_log=first[2], version_packs=False)
    return ClusterTarget(info, proxy, None, first[2], stack=stack)


class ResidentPids:
    """The pids of the residents serving sockets in RUN (aspen_cgi/resident.py):
    each writes its pid into `<socket>.lock`. A ProcTree root asked at each sample."""

    def __init__(self, run: Path):
        self.run = run

    def __call__(self) -> list[int]:
        out = []
        for sock in self.run.glob("resident-*.sock"):
            try:
                pid = int(sock.with_suffix(".lock").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            if os.path.exists(f"/proc/{pid}"):
                out.append(pid)
        return out


def _reachable_by_others(path: Path) -> bool:
    """Can a user other than the owner traverse every directory down to PATH?"""
    p = Path(path).resolve()
    for d in [p, *p.parents]:
        if not d.stat().st_mode & stat.S_IXOTH:
            return False
    return True


@contextlib.contextmanager
def running_targets(specs: list[str], root: Path, workdir: Path, *, workers: int = 2, threads: int = 16,
                    env: Optional[dict] = None, timeout: float = 60.0, repo: Optional[str] = None,
                    skip_unavailable: bool = True, warn=None) -> Iterator[list[Target]]:
    """Like `running`, yielding the Target objects (with their proxies and logs)."""
    warn = warn or (lambda msg: print(msg, file=sys.stderr))
    if repo is None and root is not None:
        repo = next(iter(repositories(Path(root))), None)
    started: list[Target] = []
    try:
        for spec in specs:
            try:
                t = start_target(spec, root, workdir, workers=workers, threads=threads, env=env, timeout=timeout)
            except TargetUnavailable as e:
                if not skip_unavailable:
                    raise
                warn(str(e))
                continue
            started.append(t)
            try:
                wait_ready(t.info, repo if t.info.root is not None else None, timeout)
            except RuntimeError as e:
                raise RuntimeError(f"{e}\n{t.log_text()[-4000:]}") from None
        for t in started:
            procstats.settle(t.info.pids)
        yield started
    finally:
        for t in reversed(started):
            t.stop()


@contextlib.contextmanager
def running(targets: list[str], root: Path, workdir: Path, **opts) -> Iterator[list[TargetInfo]]:
    """Start every target in TARGETS over its own copy of ROOT (copies and logs
    under WORKDIR), wait until each serves `GET /<repo>/info/refs`, yield
    their TargetInfo, and stop them all on exit. Targets that cannot run here
    (stock-apache without Apache) are skipped with a message on stderr.

    opts: workers=2, threads=16 (gunicorn), env={} (extra server environment),
    timeout=60, repo=<probe repository name, default the first under ROOT>,
    skip_unavailable=True, warn=callable(str)."""
    with running_targets(targets, root, workdir, **opts) as started:
        yield [t.info for t in started]
