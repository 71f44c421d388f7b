"""Fixtures: an isolated git identity, repositories with history, and an Aspen server on loopback."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from . import harness
from .cgiserver import cgi_server_factory  # noqa: F401  (a fixture, shared by every test module)
from .harness import Server, make_history

os.environ.setdefault("GIT_AUTHOR_NAME", "Aspen Test")
os.environ.setdefault("GIT_AUTHOR_EMAIL", "test@aspen.invalid")
os.environ.setdefault("GIT_COMMITTER_NAME", "Aspen Test")
os.environ.setdefault("GIT_COMMITTER_EMAIL", "test@aspen.invalid")
os.environ["GIT_CONFIG_NOSYSTEM"] = "1"
os.environ["GIT_TERMINAL_PROMPT"] = "0"
os.environ.pop("GIT_PROTOCOL", None)


@pytest.fixture(autouse=True)
def dev_null_left_as_found():
    """/dev/null keeps its mode: a CGI child of Apache (www-data) cannot run
    git without writing it. A clean-clone run once found it 0644 after the
    suite, and every Apache test of the next run failed: this names the test."""
    before = os.stat("/dev/null").st_mode
    yield
    after = os.stat("/dev/null").st_mode
    if after != before:
        os.chmod("/dev/null", before & 0o7777)
        pytest.fail(f"/dev/null's mode changed during this test: {oct(before)} -> {oct(after)} (restored)")


# -- the ref store in PostgreSQL: ASPEN_TEST_REFSTORE=postgresql ---------------------------------
# Each pytest process starts its own PostgreSQL (tests/pgserver.py) and keeps every store of its
# tests in one database of it (ASPEN_REFSTORE_URL, inherited by the servers the tests start);
# after each test every store in it is dropped.

PG_MODE = os.environ.get("ASPEN_TEST_REFSTORE") == "postgresql"


def _pg_database() -> str:
    from . import pgserver
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    return pgserver.server().create_database(f"aspen_{worker}")


def _background_threads_ended(timeout: float = 60) -> None:
    """The in-process server's background threads have ended: they read the test's store until then."""
    deadline = time.monotonic() + timeout
    for t in threading.enumerate():
        if t.name in harness.BACKGROUND_THREADS:
            t.join(max(0.0, deadline - time.monotonic()))
            assert not t.is_alive(), f"the background thread {t.name} ran on for {timeout} s after the test"


@pytest.fixture(autouse=PG_MODE)
def refstore_in_postgresql(tmp_path: Path):
    """Stores are known by their repositories' absolute paths (no
    ASPEN_CLUSTER): those under this test's directory are dropped after it."""
    yield
    _background_threads_ended()
    from aspen_cgi.refstore import db, db_postgres, pgconn, registry
    conn = pgconn.PgConn(os.environ["ASPEN_REFSTORE_URL"], "public", 2, db.PG_USE_SCHEMA)
    db_postgres.pg_init(conn)
    mine = os.path.realpath(tmp_path) + "/"
    for repo, _, _ in db_postgres.pg_stores(conn):
        if repo.startswith(mine):
            # a background build of the test's repository may still read the store: a deadlock
            # between its reads and the DROP is retried, as every store write is
            with db.patience(30):
                db.retry(lambda: db_postgres.pg_drop(conn, repo))
    registry.forget_pg_stores()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A project root holding `repo.git` with a small history."""
    r = tmp_path / "root"
    r.mkdir()
    make_history(r / "repo.git")
    return r


@pytest.fixture
def server_factory(tmp_path: Path):
    servers: list[Server] = []

    def start(root: Path, **env: str) -> Server:
        s = Server(root, env).start()
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


@pytest.fixture
def server(root: Path, server_factory) -> Server:
    return server_factory(root)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    from . import deploy_apache
    item.stash[_APACHE_BEFORE] = len(deploy_apache.STARTED)
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report carries the logs of the Apache servers it used:
    those it started and those still running (a module's), as a 500 or 403
    from a CGI program says why only there."""
    from . import deploy_apache
    report = yield
    if report.failed and call.when == "call":
        since = item.stash.get(_APACHE_BEFORE, 0)
        for i, server in enumerate(deploy_apache.STARTED):
            if i >= since or server.proc.poll() is None:
                report.sections.append((f"apache logs ({server.workdir})", server.log()[-20000:]))
    return report


_APACHE_BEFORE = pytest.StashKey[int]()


# -- `aspen verify` after every end-to-end test ---------------------------------------------

UNCHECKED = "aspen_store_unchecked"


TEMP_ROOT = Path("/tmp") / f"aspen-t{os.getuid()}"     # short: unix socket paths under it have 107 bytes
TEMP_KEEP = 3                  # runs whose directories stay (the newest), as pytest's own default
TEMP_STALE_S = 6 * 3600        # and none younger than this is removed: another run may be using it


def _own_basetemp(config) -> None:
    """Each run's temporary directories under TEMP_ROOT (mode 0755, r-*), not
    pytest's /tmp/pytest-of-<user>: Apache runs as www-data and must traverse
    to the repositories and the installed aspen-cgi, and every pytest run
    started meanwhile (another suite, a developer's single test) resets
    pytest's shared root to 0700 (then Apache answered 403 and 500 to a
    clean-clone run while other tests ran on the machine)."""
    if config.option.basetemp or hasattr(config, "workerinput"):
        return                  # chosen on the command line, or an xdist worker (its controller chose)
    import tempfile
    import time
    TEMP_ROOT.mkdir(mode=0o755, exist_ok=True)
    os.chmod(TEMP_ROOT, 0o755)
    runs = sorted(TEMP_ROOT.glob("r-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in runs[TEMP_KEEP - 1:]:
        if time.time() - old.stat().st_mtime > TEMP_STALE_S:
            import shutil
            shutil.rmtree(old, ignore_errors=True)
    config.option.basetemp = tempfile.mkdtemp(prefix="r-", dir=TEMP_ROOT)


def pytest_sessionfinish(session, exitstatus):
    """A run that passed leaves nothing under TEMP_ROOT (a full run writes
    gigabytes there); a failed one keeps its directories for a look."""
    config = session.config
    base = Path(config.option.basetemp or "")
    if exitstatus == 0 and not hasattr(config, "workerinput") and base.parent == TEMP_ROOT:
        import shutil
        shutil.rmtree(base, ignore_errors=True)


SQLITE_ONLY = "sqlite_store"


def pytest_configure(config):
    _own_basetemp(config)
    testing = hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None)
    if PG_MODE and testing and "ASPEN_REFSTORE_URL" not in os.environ:
        os.environ["ASPEN_REFSTORE_URL"] = _pg_database()   # before any server of any scope starts
    if PG_MODE and testing:
        harness.BASE_ENV["ASPEN_REFSTORE_URL"] = os.environ["ASPEN_REFSTORE_URL"]   # CGI runs' clean env
    config.addinivalue_line(
        "markers", f"{SQLITE_ONLY}(reason): this test is about the SQLite file itself (say what); the "
                   "PostgreSQL pass (ASPEN_TEST_REFSTORE=postgresql) leaves it to the SQLite pass")
    config.addinivalue_line(
        "markers", f"{UNCHECKED}(reason): this test leaves its repositories' ref stores inconsistent on "
                   "purpose (say why); the check after its gunicorn servers stop is skipped")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Once a test's teardown has stopped gunicorn servers (its own, or a module's
    after its last test), every repository under their roots that has a ref
    store must pass `aspen verify` (run in process, after a sync as the CLI does)."""
    try:
        return (yield)
    finally:
        mark = item.get_closest_marker(UNCHECKED)
        if mark is not None:
            if not (mark.args or mark.kwargs.get("reason")):
                pytest.fail(f"@pytest.mark.{UNCHECKED} needs a reason", pytrace=False)
            harness.forget_stopped_servers()
        else:
            problems = harness.verify_stopped_servers()
            if problems:
                lines = [f"aspen verify: ref store not consistent after {item.nodeid}:"]
                for repo, probs in sorted(problems.items()):
                    lines.append(f"  {repo}:")
                    lines += [f"    {p}" for p in probs]
                pytest.fail("\n".join(lines), pytrace=False)


def pytest_collection_modifyitems(config, items):
    """The PostgreSQL pass runs every test but those about the SQLite file
    itself (deselected: they run in the SQLite pass, never skipped)."""
    if not PG_MODE:
        return
    keep, drop = [], []
    for item in items:
        mark = item.get_closest_marker(SQLITE_ONLY)
        if mark is not None and not (mark.args or mark.kwargs.get("reason")):
            raise pytest.UsageError(f"@pytest.mark.{SQLITE_ONLY} needs a reason: {item.nodeid}")
        (drop if mark is not None else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
