"""Fixtures: an isolated git identity, repositories with history, and an Aspen server on loopback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .cgiserver import cgi_server_factory  # noqa: F401  (a fixture, shared by every test module)
from .harness import Server, make_history

os.environ.setdefault("GIT_AUTHOR_NAME", "Aspen Test")
os.environ.setdefault("GIT_AUTHOR_EMAIL", "test@aspen.invalid")
os.environ.setdefault("GIT_COMMITTER_NAME", "Aspen Test")
os.environ.setdefault("GIT_COMMITTER_EMAIL", "test@aspen.invalid")
os.environ["GIT_CONFIG_NOSYSTEM"] = "1"
os.environ["GIT_TERMINAL_PROMPT"] = "0"
os.environ.pop("GIT_PROTOCOL", None)


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
