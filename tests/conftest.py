"""Fixtures: an isolated git identity, repositories with history, and an Aspen server on loopback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .cgiserver import cgi_server_factory  # noqa: F401  (a fixture, shared by every test module)
from . import harness
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
def pytest_runtest_makereport(item, call):
    """A failed test's report carries the logs of the Apache servers it started
    (a 500 from a CGI program says why only there)."""
    from . import deploy_apache
    report = yield
    if call.when == "setup":
        item.stash[_APACHE_BEFORE] = len(deploy_apache.STARTED)
    if report.failed and call.when == "call":
        for server in deploy_apache.STARTED[item.stash.get(_APACHE_BEFORE, 0):]:
            report.sections.append((f"apache logs ({server.workdir})", server.log()[-20000:]))
    return report


_APACHE_BEFORE = pytest.StashKey[int]()


# -- `aspen verify` after every end-to-end test ---------------------------------------------

UNCHECKED = "aspen_store_unchecked"


def pytest_configure(config):
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
