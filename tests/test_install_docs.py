"""docs/install.md as an operator types it: every `sh install-*` block run
verbatim, as root, in order, with the page's variables set to a scratch
prefix and a second Apache instance (Debian's multiple-instance layout,
/etc/apache2-<name>, copied from this machine's /etc/apache2, listening on a
loopback port). After each web server block: an anonymous clone, an
authenticated push, a refused anonymous push, and a clone equal to the
server's refs that `git fsck --strict` accepts."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
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
ORDER = ["venv", "apache-cgi", "apache-wsgi", "back-to-stock"]


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
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("ASPEN_", "GIT_", "APACHE_"))}
        self.env.update({"ASPEN_SRC": str(self.src), "PREFIX": str(self.prefix), "GIT_ROOT": str(self.git_root),
                         "APACHE_CONFDIR": str(self.confdir), "SITE": self.site,
                         "PUSH_PASSWORD": self.password, "DEBIAN_FRONTEND": "noninteractive"})
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

    def stop(self) -> None:
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
        return f"http://{cred}127.0.0.1:{self.port}/git/repo.git"


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


def wsgi_daemons() -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if cmd.startswith(b"(wsgi:aspen)"):
            found.append(pid)
    return found


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
    finally:
        m.stop()
