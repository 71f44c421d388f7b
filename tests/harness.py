"""Shared test machinery: repositories with history, the stock and Aspen CGI
programs run side by side, the WSGI app called in process, and gunicorn
serving Aspen on loopback for real git clients."""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from aspen_cgi import settings
from aspen_cgi.runtime.repository import Repository

if TYPE_CHECKING:
    from . import netns

STOCK = "/usr/lib/git-core/git-http-backend"
ASPEN_CGI = str(Path(sys.executable).parent / "aspen-cgi")
GUNICORN = str(Path(sys.executable).parent / "gunicorn")

# Threads the WSGI application starts for later answers when a test serves it in this process.
BACKGROUND_THREADS = frozenset({"aspen-packs", "aspen-prewarm", "aspen-bundlekeep", "aspen-depth1-wide",
                                "aspen-cache-producer", "aspen-import"})

BASE_ENV = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "HOME": os.environ.get("HOME", "/root"),
    "GIT_CONFIG_NOSYSTEM": "1",
    "ASPEN_ACCESS_LOG": "0",
}


def need_system(package: str, path: str) -> None:
    """Skip the calling test when the Debian package PACKAGE (which installs
    PATH) is missing; `./run test` installs it when it can. In CI (CI=true)
    a missing package fails the test instead: CI never skips."""
    if os.path.exists(path):
        return
    import pytest
    why = f"{path} missing: apt-get install {package}"
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


def git(*args: str, cwd: Optional[str] = None, env: Optional[dict] = None, check: bool = True,
        input: Optional[bytes] = None) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.update(env or {})
    proc = subprocess.run(["git", *args], cwd=cwd, env=e, input=input, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr.decode(errors='replace')}")
    return proc


def out(*args: str, cwd: Optional[str] = None, env: Optional[dict] = None) -> str:
    return git(*args, cwd=cwd, env=env).stdout.decode().strip()


def make_history(bare: Path, commits: int = 5, branches: tuple[str, ...] = ("topic",), tags: bool = True) -> Path:
    """A bare repository with `commits` commits on main (files in nested dirs,
    a rename), extra branches, an annotated and a lightweight tag, a merge."""
    work = bare.parent / (bare.name + ".work")
    git("init", "-q", "-b", "main", str(work))
    for i in range(commits):
        d = work / "src" / f"d{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"file{i}.txt").write_text("".join(f"line {j} of commit {i}\n" for j in range(20 + i)))
        (work / "README").write_text(f"readme version {i}\n" * (i + 1))
        if i == 2:
            git("mv", "src/d0/file0.txt", "src/renamed.txt", cwd=str(work))
        git("add", "-A", cwd=str(work))
        git("commit", "-q", "-m", f"commit {i}", cwd=str(work))
    for b in branches:
        git("checkout", "-q", "-b", b, cwd=str(work))
        (work / f"{b}.txt").write_text(f"on {b}\n")
        git("add", "-A", cwd=str(work))
        git("commit", "-q", "-m", f"work on {b}", cwd=str(work))
        git("checkout", "-q", "main", cwd=str(work))
    if branches:
        git("merge", "-q", "--no-ff", "-m", f"merge {branches[0]}", branches[0], cwd=str(work))
    if tags:
        git("tag", "-a", "v1.0", "-m", "release 1.0", "HEAD~1", cwd=str(work))
        git("tag", "light", "HEAD", cwd=str(work))
    git("clone", "-q", "--bare", str(work), str(bare))
    git("remote", "remove", "origin", cwd=str(bare), check=False)
    shutil.rmtree(work)
    return bare


@dataclass
class CgiResult:
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    stderr: bytes
    raw_head: bytes = b""

    def header(self, name: str) -> Optional[str]:
        vals = [v for k, v in self.headers if k.lower() == name.lower()]
        return vals[-1] if vals else None

    def header_names(self) -> list[str]:
        return [k for k, _ in self.headers]


def parse_cgi(raw: bytes, stderr: bytes = b"") -> CgiResult:
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        raise AssertionError(f"no header block in CGI output: {raw[:200]!r}")
    headers = []
    status = 200
    for line in head.split(b"\r\n"):
        if not line:
            continue
        k, _, v = line.decode("latin-1").partition(": ")
        headers.append((k, v))
        if k == "Status":
            status = int(v.split()[0])
    return CgiResult(status, headers, body, stderr, head)


def run_cgi(program: str, env: dict, body: bytes = b"", timeout: float = 60) -> CgiResult:
    full = dict(BASE_ENV)
    full.update(env)
    argv = [program] if program != "aspen" else [ASPEN_CGI]
    proc = subprocess.run(argv, env=full, input=body, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    return parse_cgi(proc.stdout, proc.stderr)


def stock(env: dict, body: bytes = b"", timeout: float = 60) -> CgiResult:
    return run_cgi(STOCK, env, body, timeout)


def aspen(env: dict, body: bytes = b"", timeout: float = 60) -> CgiResult:
    return run_cgi("aspen", env, body, timeout)


# The request's own CGI variables: a WSGI environ has each exactly as the test gives it, and lacks
# it when the test leaves it out (stock is run under the same variables, also ones no web server
# leaves out: no REQUEST_METHOD, no PATH_INFO, a CONTENT_LENGTH that is not the body's length).
REQUEST_VARS = ("REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "CONTENT_TYPE", "CONTENT_LENGTH")


def _latin1(value: str) -> str:
    """PEP 3333: a CGI variable's bytes (surrogate-escaped in a str, as os.environ holds
    them) as the latin-1 str a WSGI server passes."""
    return value.encode("utf-8", "surrogateescape").decode("latin-1")


def _utf8(value: str) -> bool:
    """Whether VALUE's bytes are UTF-8 (os.fsdecode leaves other bytes as lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _request_target(path: str) -> str:
    """PATH_INFO's bytes as the percent-encoded path of a request line, which EnvironBuilder decodes."""
    target = urllib.parse.quote(path.encode("utf-8", "surrogateescape"), safe="/")
    return "/%2F" + target[2:] if target.startswith("//") else target   # `//x` is no authority


def wsgi_environ(env: dict, body: bytes = b"", errors: Optional[io.StringIO] = None) -> dict:
    """The environ a WSGI server passes for the request whose CGI variables
    are ENV (with BASE_ENV under them) and whose body is BODY.

    werkzeug's EnvironBuilder makes it: wsgi.input, wsgi.errors and the other
    wsgi.* keys, SERVER_NAME/PORT/PROTOCOL, SCRIPT_NAME, HTTP_HOST,
    REQUEST_URI, ENV's HTTP_* variables sent as headers, PATH_INFO and
    QUERY_STRING decoded as latin-1 (PEP 3333). wsgi.input_terminated is set
    as gunicorn sets it, so a body without CONTENT_LENGTH (chunked) is read to
    its end. Other variables (GIT_PROJECT_ROOT, REMOTE_USER, ...) are in the
    environ as mod_wsgi's SetEnv puts them there."""
    from werkzeug.test import EnvironBuilder
    cgi = {**BASE_ENV, **env}
    query = cgi.get("QUERY_STRING", "")
    builder = EnvironBuilder(
        path=_request_target(cgi.get("PATH_INFO", "")),
        query_string=query if _utf8(query) else "",
        method=cgi.get("REQUEST_METHOD", "GET"),
        headers=[(k[len("HTTP_"):].replace("_", "-"), v) for k, v in cgi.items() if k.startswith("HTTP_")],
        content_type=cgi.get("CONTENT_TYPE"),
        input_stream=io.BytesIO(body),
        errors_stream=errors if errors is not None else io.StringIO(),
        environ_overrides={"wsgi.input_terminated": True,
                           **{k: v for k, v in cgi.items() if k not in REQUEST_VARS and not k.startswith("HTTP_")}})
    environ = builder.get_environ()
    for key in REQUEST_VARS:
        if key not in cgi:
            environ.pop(key, None)
    if "CONTENT_LENGTH" in cgi:           # EnvironBuilder counts the body's bytes instead
        environ["CONTENT_LENGTH"] = cgi["CONTENT_LENGTH"]
    # werkzeug decodes the path's %-escapes as UTF-8, replacing bytes that are not UTF-8, and takes
    # the query string as UTF-8; PATH_TRANSLATED is no part of a URL: such values are put in here.
    for key in ("PATH_INFO", "QUERY_STRING", "PATH_TRANSLATED"):
        if key in cgi and (key == "PATH_TRANSLATED" or not _utf8(cgi[key])):
            environ[key] = _latin1(cgi[key])
    return environ


def wsgi(env: dict, body: bytes = b"") -> CgiResult:
    """Call aspen_cgi.wsgi.application in process with the environ a WSGI
    server passes for ENV's request (wsgi_environ); the process environment
    is reduced to BASE_ENV meanwhile, so settings come from the environ only."""
    from werkzeug.test import run_wsgi_app

    from aspen_cgi import wsgi as app
    errors = io.StringIO()
    environ = wsgi_environ(env, body, errors)
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(BASE_ENV)
    try:
        data, status, headers = run_wsgi_app(app.application, environ, buffered=True)   # closes the answer
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return CgiResult(int(status.split()[0]), headers.to_wsgi_list(), b"".join(data), errors.getvalue().encode())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """gunicorn serving aspen_cgi.wsgi:application over ROOT on loopback."""
    root: Path
    env: dict = field(default_factory=dict)
    port: int = 0
    proc: Optional[subprocess.Popen] = None
    log: Optional[Path] = None
    threads: int = 8               # gunicorn threads per worker
    workers: int = 2
    timeout: int = 120             # gunicorn's worker timeout, seconds
    host: Optional["netns.Host"] = None    # a test host (tests/netns.py) to run on, else this machine
    code: Optional[Path] = None     # another Aspen's checkout to serve (an older release), else this one

    def __post_init__(self) -> None:
        _servers.append(self)   # its repositories' ref stores are verified once it has stopped

    @property
    def address(self) -> str:
        return self.host.address if self.host is not None else "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    def start(self) -> "Server":
        """Bind port 0 and read the port gunicorn got from its own log line, so
        that no other test's server can take the port in between (or bind
        PORT, when the test needs to know it first: free_port())."""
        env = dict(os.environ)
        env.update({"GIT_PROJECT_ROOT": str(self.root), "GIT_HTTP_EXPORT_ALL": "1"})
        env.update(self.env)
        if self.code is not None:   # gunicorn puts its directory first on sys.path; its processes inherit PYTHONPATH
            env["PYTHONPATH"] = str(self.code)
        self.log = self.root.parent / f"gunicorn-{uuid.uuid4().hex[:12]}.log"
        argv = [GUNICORN, "--bind", f"{self.address}:{self.port}", "--worker-class", "gthread", "--threads",
                str(self.threads), "--workers", str(self.workers), "--timeout", str(self.timeout),
                "aspen_cgi.wsgi:application"]
        self.proc = subprocess.Popen(
            self.host.argv(argv) if self.host is not None else argv,
            env=env, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT,
            cwd=str(self.code or Path(__file__).resolve().parent.parent))
        pattern = re.compile(r"Listening at: http://%s:(\d+) \(%d\)" % (re.escape(self.address), self.proc.pid))
        deadline = time.time() + 30
        while time.time() < deadline:
            m = pattern.search(self.log_text())
            if m:
                self.port = int(m.group(1))
                return self
            if self.proc.poll() is not None:
                raise AssertionError(f"gunicorn exited: {self.log_text()}")
            time.sleep(0.05)
        raise AssertionError("gunicorn did not start")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log else ""


def send_and_answer(port: int, head: bytes, body_parts, timeout: float = 60) -> bytes:
    """Send an HTTP request (HEAD, then each of BODY_PARTS) on a new
    connection while a thread reads the answer, and return all it read. A
    server that refuses a body answers and closes before the body ends; the
    answer is read as it comes, not after the last byte is sent (by then the
    server's reset may have thrown it away), and the rest of the body is
    not sent once the server has closed."""
    import threading
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    got = bytearray()
    ended = threading.Event()

    def read() -> None:
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got.extend(chunk)
        except OSError:
            pass
        finally:
            ended.set()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        s.sendall(head)
        for part in body_parts:
            if ended.is_set():
                break
            s.sendall(part)
        s.shutdown(socket.SHUT_WR)
    except OSError:
        pass                        # closed by the server: what it answered is being read
    reader.join(timeout)
    alive = reader.is_alive()
    s.close()
    assert not alive, "no end of the answer within the timeout"
    return bytes(got)


def processes() -> list[tuple[int, int, bytes]]:
    """(pid, owner's uid, command line with NULs between arguments) of every process on the machine."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            found.append((int(pid), os.stat(f"/proc/{pid}").st_uid, Path(f"/proc/{pid}/cmdline").read_bytes()))
        except OSError:
            continue        # gone meanwhile
    return found


def rm_rf(path) -> list[OSError]:
    """shutil.rmtree as `rm -rf`: what is already gone is no error (-f); the
    other errors (ENOTEMPTY: something made a file meanwhile) are returned."""
    errors: list[OSError] = []

    def onerror(func, p, exc_info):
        e = exc_info[1]
        if isinstance(e, FileNotFoundError):
            return
        errors.append(e)
    shutil.rmtree(path, onerror=onerror)
    return errors


def working_on(path) -> list[int]:
    """Processes but this one working in PATH, or naming it on their command
    line or in their environment: Aspen's detached builders, pre-warmers
    (ASPEN_PREWARM_GITDIR) and wide depth-1 builds (ASPEN_DEPTH1_GITDIR), and
    their git children."""
    p = str(path).encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_bytes()
            cwd = os.readlink(f"/proc/{pid}/cwd").encode()
            named = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            named += [v.partition(b"=")[2] for v in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")]
        except OSError:
            continue        # gone meanwhile
        if int(pid) != os.getpid() and stat[stat.rindex(b")") + 2:][:1] not in (b"Z", b"X") \
                and (cwd.startswith(p) or any(p in a for a in named)):
            found.append(int(pid))
    return found


def refs_of(repo: str) -> dict[str, str]:
    text = out("for-each-ref", "--format=%(objectname) %(refname)", cwd=repo)
    return dict(reversed(line.split(" ", 1)) for line in text.splitlines() if line)


def fsck_strict(repo: str) -> None:
    git("fsck", "--strict", "--no-progress", cwd=repo)


# -- the ref store must be consistent after every end-to-end test -------------------------------

_servers: list[Server] = []    # every Server made in this process, until its repositories are verified


def track(server) -> None:
    """Verify SERVER's repositories once it stops (any server with .root, .env
    and either .proc or .done)."""
    _servers.append(server)


def _stopped(s) -> bool:
    if hasattr(s, "proc"):
        return s.proc is None or s.proc.poll() is not None
    return bool(getattr(s, "done", False))


def git_dirs(root: Path) -> list[Path]:
    """The repositories under ROOT (bare ones and work trees' .git), not looking inside them."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        if "HEAD" in filenames and "objects" in dirnames and "refs" in dirnames:
            found.append(Path(dirpath))
            dirnames[:] = []
    return sorted(found)


def _verify_one(gitdir: Path, env: dict) -> list[str]:
    from aspen_cgi.refstore.store import RefStore
    store = RefStore.open(Repository.of(str(gitdir), env), create=False)
    if store is None:
        return []
    try:
        store.sync()      # what the next request would do: changes made with git since then are recorded
        return store.verify().problems
    except Exception as e:  # noqa: BLE001  (a store that cannot even be read is a problem to report)
        return [f"verify raised {type(e).__name__}: {e}"]


def verify_refstores(root: Path, server_env: Optional[dict] = None) -> dict[str, list[str]]:
    """`aspen verify`, in process, for every repository under ROOT that has a ref
    store (where the server with SERVER_ENV keeps it): {gitdir: problems} for
    the inconsistent ones."""
    from concurrent.futures import ThreadPoolExecutor

    from aspen_cgi.refstore.registry import DISABLE_ENV
    from aspen_cgi.refstore.store import state_dir
    env = dict(os.environ)
    env.update(server_env or {})
    env.pop("GIT_NAMESPACE", None)
    if env.get(DISABLE_ENV) == "0":
        return {}
    dirs = git_dirs(root)
    record = "aspen.pg" if dirs and settings.of(env).refstore_url else "aspen.sqlite3"
    todo = [g for g in dirs if os.path.isfile(os.path.join(state_dir(str(g), settings.of(env)), record))]
    # one short-lived thread per repository: the store's connections are per thread and go with it
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda g: _verify_one(g, dict(env, GIT_DIR=str(g))), todo))
    return {str(g): p for g, p in zip(todo, results) if p}


def verify_stopped_servers() -> dict[str, list[str]]:
    """Verify the stores under the roots of every stopped Server (each root and
    state location once) and forget those servers; running ones wait for
    their own stop."""
    stopped, running = [], []
    for s in _servers:
        (stopped if _stopped(s) else running).append(s)
    _servers[:] = running
    seen: set = set()
    problems: dict[str, list[str]] = {}
    for s in stopped:
        key = (str(s.root), s.env.get("ASPEN_STATE_DIR"), s.env.get("ASPEN_REFSTORE"))
        if key in seen or not s.root.is_dir():
            continue
        seen.add(key)
        problems.update(verify_refstores(s.root, s.env))
    return problems


def forget_stopped_servers() -> int:
    """Drop the stopped servers without verifying (tests marked aspen_store_unchecked)."""
    n = len(_servers)
    _servers[:] = [s for s in _servers if not _stopped(s)]
    return n - len(_servers)


# -- the aspen command line, for tests that check a repository's ref store ----------------------

REPO_DIR = str(Path(__file__).resolve().parent.parent)


def aspen_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aspen_cgi.cli", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=120, cwd=REPO_DIR)


def verify_ok(repo: Path) -> None:
    p = aspen_cli("verify", "-q", str(repo))
    assert p.returncode == 0, f"aspen verify failed:\n{p.stdout.decode()}{p.stderr.decode()}"


def versions(repo: Path) -> list[dict]:
    """`aspen log --json`, oldest first."""
    import json
    p = aspen_cli("log", "--json", str(repo))
    assert p.returncode == 0, p.stderr.decode()
    return sorted((json.loads(line) for line in p.stdout.decode().splitlines() if line.strip()),
                  key=lambda v: v["id"])


def wait_packs_built(repo: Path, timeout: float = 120) -> None:
    """Wait until every version of REPO has its pack. A fetch right after a
    push waits for its build only ASPEN_BUILD_WAIT_MS (then git answers,
    why=not-built), and under load another build may hold the machine's
    build slot longer: a test that expects a plan waits for this first."""
    from aspen_cgi.refstore.store import RefStore
    store = RefStore.open(Repository.of(str(repo), dict(os.environ)), create=False)
    deadline = time.monotonic() + timeout
    while not store.all_packs_built():
        assert time.monotonic() < deadline, f"version packs of {repo} not built in {timeout} s"
        time.sleep(0.05)
        store.sync()


def fetch_lines(server, since: int = 0, needle: str = " plan=", timeout: float = 30) -> list[str]:
    """The upload-pack POST access lines after the first SINCE, once the last
    is a fetch's (it names its plan, NEEDLE). The client can have every byte
    before the server writes the line, so until then the last line is an
    earlier one (ls-refs, a negotiation round); waits up to TIMEOUT s."""
    deadline = time.monotonic() + timeout
    while True:
        lines = re.findall(r"service=upload-pack method=POST .*", server.log_text())[since:]
        if lines and needle in lines[-1] or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def last_fetch_line(server) -> str:
    """The access line of the fetch a client just made (fetch_lines)."""
    lines = fetch_lines(server)
    return lines[-1] if lines else ""


def wait_builder_done(repo: Path, timeout: float = 120) -> None:
    """wait_packs_built, then until the background builder has finished all it
    will do without a new push: compaction's segment packs and the import's
    pack built again with the wide search (which renames it). A test that
    names the stored packs waits for this first."""
    from aspen_cgi.packs import background, builder
    from aspen_cgi.refstore.store import RefStore
    wait_packs_built(repo, timeout)
    store = RefStore.open(Repository.of(str(repo), dict(os.environ)), create=False)
    deadline = time.monotonic() + timeout
    while (background.running(store.packs_dir) or builder.segments_to_build(store)
           or not background.import_final(store) or not store.all_packs_built()):
        assert time.monotonic() < deadline, f"the builder of {repo} did not finish in {timeout} s"
        time.sleep(0.05)
        store.sync()


# -- a store's tables read and written beside Aspen (either engine) ----------------------------------

def store_file(gitdir) -> str:
    """The file in a repository's state that says it has a ref store: the
    SQLite file, or with ASPEN_REFSTORE_URL the record of its PostgreSQL store."""
    return "aspen.pg" if os.environ.get("ASPEN_REFSTORE_URL") else "aspen.sqlite3"


def side_connection(store):
    if isinstance(store, (str, Path)):          # a repository: its store as the server keeps it
        url = os.environ.get("ASPEN_REFSTORE_URL")
        state = Path(store) / "aspen"
        if not url:
            import sqlite3
            return sqlite3.connect(str(state / "aspen.sqlite3"))
        from aspen_cgi.refstore import db, db_postgres, pgconn
        from aspen_cgi.refstore.registry import PG_RECORD, read_record
        return pgconn.PgConn(url, db_postgres.pg_schema(read_record(str(state / PG_RECORD))[0]), 1, db.PG_USE_SCHEMA)
    if getattr(store.conn, "dialect", "sqlite") == "sqlite":
        import sqlite3
        return sqlite3.connect(store.path)
    from aspen_cgi.refstore import db, pgconn
    return pgconn.PgConn(store.conn.url, store.conn.schema, 1, db.PG_USE_SCHEMA)


def store_rows(store, query: str, args=()) -> list[tuple]:
    """QUERY's rows from STORE's tables (a RefStore, or a repository's path)
    over a connection of its own (either engine)."""
    conn = side_connection(store)
    try:
        return [tuple(r) for r in conn.execute(query, args)]
    finally:
        conn.close()


def store_write(store, *statements: str) -> None:
    """Run STATEMENTS on STORE's tables in one transaction of a connection of its own."""
    conn = side_connection(store)
    try:
        if getattr(conn, "dialect", None) == "postgresql":
            conn.begin("BEGIN")             # sqlite3's module opens one itself
        for s in statements:
            conn.execute(s)
        conn.commit()
    finally:
        conn.close()
