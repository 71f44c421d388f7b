"""A real PostgreSQL for the tests: initdb into a temporary directory and
`pg_ctl start` on loopback and a unix socket, as a non-root user (root runs
it as `postgres`, the user Debian's package makes). One server per pytest
process (each xdist worker its own), stopped at its end."""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from .harness import free_port, need_system

if TYPE_CHECKING:
    from .netns import Host


def bindir() -> Optional[str]:
    """The newest installed PostgreSQL's programs (Debian: /usr/lib/postgresql/N/bin)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


@dataclass
class PgServer:
    workdir: str
    port: int
    user: Optional[str]          # the user it runs as (None: this process's)
    bindir: str
    proc_log: str
    host: Optional["Host"] = None    # a test host (tests/netns.py) it runs on, else this machine's loopback
    clients: str = ""                # with HOST: the network its clients connect from (pg_hba.conf)

    @property
    def address(self) -> str:
        return self.host.address if self.host is not None else "127.0.0.1"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://aspen@{self.address}:{self.port}/{database}"

    def _as_owner(self, *args: str) -> list[str]:
        argv = (["runuser", "-u", self.user, "--"] if self.user else []) + list(args)
        return self.host.argv(argv) if self.host is not None else argv

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(self._as_owner(*args), capture_output=True, text=True, check=check,
                              cwd=self.workdir, timeout=120)

    def start(self) -> "PgServer":
        data = os.path.join(self.workdir, "data")
        self.run(os.path.join(self.bindir, "initdb"), "-D", data, "-A", "trust", "-U", "aspen",
                 "-E", "UTF8", "--locale=C", "--no-sync")
        if self.clients:
            self.run("sh", "-c", f"echo 'host all all {self.clients} trust' >> {data}/pg_hba.conf")
        return self.up()

    def up(self) -> "PgServer":
        """pg_ctl start (again, after stop())."""
        data = os.path.join(self.workdir, "data")
        opts = (f"-c listen_addresses={self.address} -p {self.port} -k {self.workdir} -c fsync=off"
                " -c max_connections=200 -c shared_buffers=32MB")
        self.run(os.path.join(self.bindir, "pg_ctl"), "-D", data, "-o", opts, "-l", self.proc_log, "-w",
                 "-t", "60", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        self.run(os.path.join(self.bindir, "pg_ctl"), "-D", os.path.join(self.workdir, "data"), "-m", mode,
                 "-w", "stop", check=False)


    def psql(self, sql: str, database: str = "postgres") -> str:
        return subprocess.run([os.path.join(self.bindir, "psql"), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1",
                               self.url(database), "-c", sql], capture_output=True, text=True, check=True,
                              timeout=60).stdout

    def create_database(self, name: str) -> str:
        self.psql(f"CREATE DATABASE {name}")
        return self.url(name)


_server: Optional[PgServer] = None


def server() -> PgServer:
    """This process's PostgreSQL, started on first use."""
    global _server
    if _server is None:
        _server = private()
        atexit.register(_stop, _server)
    return _server


def private(host: Optional["Host"] = None, clients: str = "") -> PgServer:
    """A PostgreSQL of the caller's own (one it may stop and start), on the
    test host HOST (tests/netns.py) letting in CLIENTS (a network), else on
    loopback; the caller removes it (remove())."""
    need_system("postgresql", "/usr/lib/postgresql")
    bd = bindir()
    if bd is None:
        need_system("postgresql", "/usr/lib/postgresql/N/bin/initdb")
    user = None
    if os.getuid() == 0:
        try:
            user = pwd.getpwnam("postgres").pw_name
        except KeyError:
            user = "nobody"
    workdir = tempfile.mkdtemp(prefix="aspen-pg-")
    os.chmod(workdir, 0o755)
    if user:
        shutil.chown(workdir, user)
    s = PgServer(workdir, free_port(), user, bd, os.path.join(workdir, "server.log"), host, clients)
    try:
        s.start()
    except subprocess.CalledProcessError as e:
        log = open(s.proc_log).read() if os.path.exists(s.proc_log) else ""
        raise RuntimeError(f"PostgreSQL did not start: {e.stderr}\n{log[-3000:]}") from None
    return s


def remove(s: PgServer) -> None:
    """Stop S at once and remove its files."""
    s.stop("immediate")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.path.exists(os.path.join(s.workdir, "data", "postmaster.pid")):
        time.sleep(0.05)
    shutil.rmtree(s.workdir, ignore_errors=True)


def _stop(s: PgServer) -> None:
    remove(s)
