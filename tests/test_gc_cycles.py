"""A long-lived server's requests leave no garbage only the cycle collector
frees: such garbage makes collections, which pause every thread of the
worker wherever they land (measured in random-fetch, tiny preset: 1-1.6 ms
a young collection, 2.6-10 ms a full one, inside a fetch's planning). A
request's deadline watch held its guard in a cycle, and a builder thread's
SQLite connection (its statement cache holds it) was dropped unclosed."""

from __future__ import annotations

import gc
import os
import socket
import sqlite3
import threading
from pathlib import Path

import pytest

from aspen_cgi.runtime.repository import Repository

from . import harness as h


def _call(env: dict, body: bytes = b"") -> tuple[str, bytes]:
    """The WSGI application in process, as gunicorn calls it (its client socket in the environ)."""
    from werkzeug.test import run_wsgi_app

    from aspen_cgi import wsgi as app
    mine, theirs = socket.socketpair()
    environ = h.wsgi_environ(env, body)
    environ["gunicorn.socket"] = mine
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(h.BASE_ENV)
    try:
        data, status, _ = run_wsgi_app(app.application, environ, buffered=True)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        mine.close()
        theirs.close()
    return status, b"".join(data)


def _garbage_of(requests) -> int:
    """The objects the collector frees after REQUESTS ran (each run once before: imports, caches)."""
    for run in requests:
        run()
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        for _ in range(3):
            for run in requests:
                run()
        return gc.collect()
    finally:
        if was:
            gc.enable()


@pytest.fixture
def served(root: Path, tmp_path: Path) -> dict:
    return {"GIT_PROJECT_ROOT": str(root), "GIT_HTTP_EXPORT_ALL": "1", "ASPEN_RUN_DIR": str(tmp_path / "run"),
            "ASPEN_REQUEST_TIMEOUT": "600", "HTTP_GIT_PROTOCOL": "version=2"}


def test_requests_leave_no_cyclic_garbage(served, root):
    head = h.out("rev-parse", "HEAD", cwd=str(root / "repo.git"))
    post = dict(served, REQUEST_METHOD="POST", PATH_INFO="/repo.git/git-upload-pack",
                CONTENT_TYPE="application/x-git-upload-pack-request")
    ls_refs = b"0014command=ls-refs\n0001" + b"0000"
    fetch = (b"0012command=fetch\n0001" + b"000eofs-delta\n" + f"0032want {head}\n".encode()
             + b"0009done\n0000")

    def advert():
        status, body = _call(dict(served, REQUEST_METHOD="GET", PATH_INFO="/repo.git/info/refs",
                                  QUERY_STRING="service=git-upload-pack"))
        assert status == "200 OK" and b"version 2" in body

    def refs():
        status, body = _call(dict(post, CONTENT_LENGTH=str(len(ls_refs))), ls_refs)
        assert status == "200 OK" and head.encode() in body

    def clone():
        status, body = _call(dict(post, CONTENT_LENGTH=str(len(fetch))), fetch)
        assert status == "200 OK" and b"PACK" in body

    assert _garbage_of([advert, refs, clone]) == 0


def _store_in_a_thread(root: Path, before_release=lambda store: None) -> sqlite3.Connection:
    """A builder thread's store: opened and synced, BEFORE_RELEASE(store), then
    release_thread() as the thread ends; its connection."""
    from aspen_cgi.refstore import registry
    from aspen_cgi.refstore import store as refstore
    seen = {}

    def builder():
        s = refstore.RefStore.open(Repository.of(str(root / "repo.git"), h.BASE_ENV))
        s.sync()
        seen["conn"] = s.conn
        before_release(s)
        registry.release_thread()

    t = threading.Thread(target=builder)
    t.start()
    t.join()
    return seen["conn"]


@pytest.mark.sqlite_store("SQLite connections closed as their thread ends")
def test_a_threads_store_connections_are_closed_as_it_ends(root):
    conn = _store_in_a_thread(root)
    with pytest.raises(sqlite3.ProgrammingError):       # closed: its statement cache let go of it
        conn.execute("SELECT 1")


def test_a_replaced_stores_connection_is_left_open(root):
    """Closing deletes the write-ahead log by name: another repository's, once replaced."""
    def replace(store):
        os.rename(store.path, store.path + ".old")
        Path(store.path).write_bytes(b"")

    conn = _store_in_a_thread(root, replace)
    assert conn.execute("SELECT 1").fetchone() == (1,)
