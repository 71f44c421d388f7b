"""The ref store in PostgreSQL (ASPEN_REFSTORE_URL), against a real server
started by the tests (tests/pgserver.py), in every pass of the suite: the
same tables as a SQLite file, pushes from two server processes at once
decided by the store's compare-and-swap, a replaced repository's store made
anew, and the SQLite pass's store semantics (the whole suite runs again with
ASPEN_TEST_REFSTORE=postgresql)."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from aspen_cgi.refstore import db, db_postgres, db_schema, pgconn
from aspen_cgi.refstore.registry import forget_pg_stores
from aspen_cgi.refstore.store import RefStore
from aspen_cgi.runtime.repository import Repository

from . import harness as h
from . import pgserver

pytestmark = pytest.mark.timeout(180)

_databases = itertools.count()


@pytest.fixture
def pg_url():
    """A new database of this process's PostgreSQL."""
    name = f"t{os.getpid()}_{next(_databases)}"
    url = pgserver.server().create_database(name)
    yield url
    forget_pg_stores()
    pgconn.close_pools()


def _env(url: str, gitdir: Path, **more: str) -> dict:
    return dict(os.environ, ASPEN_REFSTORE_URL=url, GIT_DIR=str(gitdir), **more)


def _columns_sqlite(conn) -> dict[str, list[str]]:
    tables = [n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    return {t: [r[1] for r in conn.execute(f"PRAGMA table_info({t})")] for t in tables}


def test_a_postgresql_store_has_the_sqlite_files_tables_columns_and_indexes(tmp_path, pg_url):
    repo = h.make_history(tmp_path / "repo.git")
    store = RefStore.open(Repository.of(str(repo), _env(pg_url, repo)))
    assert store is not None and store.conn.dialect == "postgresql"
    assert store.sync() == 1
    lite = db.connect(str(tmp_path / "fresh.sqlite3"))
    want = _columns_sqlite(lite)
    side = pgconn.PgConn(pg_url, store.conn.schema, 1, db.PG_USE_SCHEMA)
    got: dict[str, list[str]] = {}
    for table, column in side.execute("SELECT table_name, column_name FROM information_schema.columns"
                                      " WHERE table_schema = ? ORDER BY table_name, ordinal_position",
                                      (store.conn.schema,)):
        got.setdefault(table, []).append(column)
    assert got == want and set(got) == set(db_schema.PG_TABLES)
    lite_indexes = {n for (n,) in lite.execute("SELECT name FROM sqlite_master WHERE type = 'index'"
                                               " AND name NOT LIKE 'sqlite_autoindex%'")}
    pg_indexes = {n for (n,) in side.execute("SELECT indexname FROM pg_indexes WHERE schemaname = ?",
                                             (store.conn.schema,))}
    assert lite_indexes and lite_indexes <= pg_indexes
    assert db.integrity(store.conn) == []
    side.execute("DROP TABLE chain")
    assert db.integrity(store.conn) == ["table chain is missing"]
    # the registry names it by the repository's absolute path (no ASPEN_CLUSTER)
    assert [(r, s) for r, s, _ in db_postgres.pg_stores(side)] == [(os.path.realpath(repo), store.conn.schema)]
    assert (repo / "aspen" / "aspen.pg").read_text().split("\n")[0] == os.path.realpath(repo)
    assert not (repo / "aspen" / "aspen.sqlite3").exists()


def test_ref_names_sort_bytewise_and_a_non_utf8_name_is_unstorable(tmp_path, pg_url):
    """The "C" collation: PostgreSQL orders refs as git and SQLite do
    (`refs/heads/B` < `refs/heads/a` < `refs/heads/é`)."""
    repo = h.make_history(tmp_path / "repo.git")
    main = h.out("rev-parse", "main", cwd=str(repo))
    for name in ("a", "B", "é", "a-b", "a.b", "a_b"):
        h.git("update-ref", f"refs/heads/{name}", main, cwd=str(repo))
    store = RefStore.open(Repository.of(str(repo), _env(pg_url, repo)))
    store.sync()
    names = [r.name for r in db.all_refs(store.conn)]
    assert names == sorted(names, key=lambda n: n.encode()) and "refs/heads/é" in names
    from aspen_cgi.model.versions import RefChange, VersionMeta
    bad = "refs/heads/\udcff"
    with pytest.raises(db.Unstorable):
        store.commit([RefChange(bad, "0" * 40, main)], VersionMeta("push", "w", None, ()))
    assert [v.kind for v in store.log()] == ["import"]


def _serve(root: Path, url: str) -> h.Server:
    return h.Server(root, {"ASPEN_REFSTORE_URL": url, "ASPEN_ACCESS_LOG": "1"}, threads=8).start()


def test_two_server_processes_pushing_one_ref_at_once_one_wins_and_the_rest_get_stocks_rejection(tmp_path, pg_url):
    """Two gunicorn servers (separate processes, separate pools) over one
    root and one database: 12 pushes of 12 different commits onto the
    same old value of main, all at once. Exactly one lands, in the store
    and on disk; every other client is told as stock tells it."""
    root = tmp_path / "root"
    repo = h.make_history(root / "repo.git")
    h.git("config", "http.receivepack", "true", cwd=str(repo))
    servers = [_serve(root, pg_url), _serve(root, pg_url)]
    try:
        base = h.out("rev-parse", "main", cwd=str(repo))
        works = []
        for i in range(12):
            w = tmp_path / f"w{i}"
            h.git("clone", "-q", str(repo), str(w))
            h.git("commit", "-q", "--allow-empty", "-m", f"writer {i}", cwd=str(w))
            works.append(w)
        results: list = [None] * len(works)
        gate = threading.Barrier(len(works))

        def push(i: int) -> None:
            gate.wait(timeout=30)
            url = f"{servers[i % 2].url}/repo.git"
            results[i] = subprocess.run(["git", "push", url, "HEAD:main"], cwd=works[i], capture_output=True,
                                        text=True, timeout=120)
        threads = [threading.Thread(target=push, args=(i,)) for i in range(len(works))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=150)
        won = [i for i, r in enumerate(results) if r.returncode == 0]
        assert len(won) == 1, [r.stderr for r in results]
        for i, r in enumerate(results):
            if i in won:
                continue
            assert re.search(r"\[rejected\]|\[remote rejected\]|failed to push", r.stderr), r.stderr
            assert not re.search(r"HTTP 5\d\d|Traceback|internal error", r.stderr), r.stderr
        winner = h.out("rev-parse", "HEAD", cwd=str(works[won[0]]))
        assert h.out("rev-parse", "main", cwd=str(repo)) == winner
        store = RefStore.open(Repository.of(str(repo), _env(pg_url, repo, GIT_PROJECT_ROOT=str(root))))
        store.sync()
        log = list(store.log())
        assert [v.kind for v in log] == ["push", "import"]
        assert [(u.ref, u.old, u.new) for u in log[0].updates] == [("refs/heads/main", base, winner)]
        assert store.verify().problems == []
        for s in servers:
            assert "Traceback" not in s.log_text()
    finally:
        for s in servers:
            s.stop()


def test_a_repository_replaced_at_the_same_path_gets_a_new_store(tmp_path, pg_url):
    """The store outlives `rm -rf repo.git` in the database; the next
    repository made at that path does not inherit it: its state records no
    store, so the old one is dropped and the new repository imported."""
    repo = h.make_history(tmp_path / "repo.git")
    store = RefStore.open(Repository.of(str(repo), _env(pg_url, repo)))
    store.sync()
    topic = h.out("rev-parse", "topic", cwd=str(repo))
    from aspen_cgi.model.versions import RefChange, VersionMeta
    store.commit([RefChange("refs/heads/extra", "0" * 40, topic)], VersionMeta("push", "w", None, ()))
    assert [v.kind for v in store.log()] == ["push", "import"]
    old_token = (repo / "aspen" / "aspen.pg").read_text().split("\n")[1]
    import shutil
    shutil.rmtree(repo)
    h.make_history(repo, commits=2, branches=())
    again = RefStore.open(Repository.of(str(repo), _env(pg_url, repo)))
    assert again.sync() == 1
    assert [v.kind for v in again.log()] == ["import"]
    assert {r.name for r in db.all_refs(again.conn)} == set(h.refs_of(str(repo)))
    assert (repo / "aspen" / "aspen.pg").read_text().split("\n")[1] != old_token
    side = pgconn.PgConn(pg_url, "public", 1, db.PG_USE_SCHEMA)
    assert len(db_postgres.pg_stores(side)) == 1


def test_without_create_a_missing_store_is_not_made(tmp_path, pg_url):
    repo = h.make_history(tmp_path / "repo.git")
    assert RefStore.open(Repository.of(str(repo), _env(pg_url, repo)), create=False) is None
    side = pgconn.PgConn(pg_url, "public", 1, db.PG_USE_SCHEMA)
    db_postgres.pg_init(side)
    assert db_postgres.pg_stores(side) == []


def test_a_store_dropped_while_open_is_made_anew_only_by_a_request(tmp_path, pg_url):
    """`aspen db drop` while stores are open: background work's store (opened
    without making one) fails its next sync and the database stays without
    it; a request's store is made anew with a new import."""
    from aspen_cgi.refstore.registry import drop_database_store
    repo = h.make_history(tmp_path / "repo.git")
    env = _env(pg_url, repo)
    RefStore.open(Repository.of(str(repo), env)).sync()
    background = RefStore.open(Repository.of(str(repo), env), create=False)
    background.sync()
    request = RefStore.open(Repository.of(str(repo), env))
    request.sync()
    assert drop_database_store(pg_url, os.path.realpath(repo))
    side = pgconn.PgConn(pg_url, "public", 1, db.PG_USE_SCHEMA)
    with pytest.raises(pgconn.StoreError, match="dropped"):
        background.sync()
    assert db_postgres.pg_stores(side) == []
    assert request.sync() == 1 and [v.kind for v in request.log()] == ["import"]
    assert len(db_postgres.pg_stores(side)) == 1


def _token(repo: Path) -> str:
    return (repo / "aspen" / "aspen.pg").read_text().split("\n")[1]


def test_a_store_a_newer_aspen_moved_beyond_this_ones_reading_is_refused(tmp_path, pg_url):
    repo = h.make_history(tmp_path / "repo.git")
    RefStore.open(Repository.of(str(repo), _env(pg_url, repo))).sync()
    side = pgconn.PgConn(pg_url, "public", 1, db.PG_USE_SCHEMA)
    side.execute("UPDATE aspen_stores SET schema_version = schema_version + 1, reads_from = schema_version + 1")
    forget_pg_stores()
    with pytest.raises(pgconn.StoreError, match="schema"):
        db_postgres.connect_pg(pg_url, os.path.realpath(repo), 1, create=False, known=lambda: _token(repo),
                      keep=lambda t: None)


def test_a_newer_store_this_aspen_can_read_is_read_and_never_written(tmp_path, pg_url):
    """A store a newer Aspen moved on, recording that this one reads it: its
    refs are served from the log, and a write is refused before any row."""
    repo = h.make_history(tmp_path / "repo.git")
    env = _env(pg_url, repo)
    store = RefStore.open(Repository.of(str(repo), env))
    store.sync()
    side = pgconn.PgConn(pg_url, "public", 1, db.PG_USE_SCHEMA)
    side.execute("UPDATE aspen_stores SET schema_version = schema_version + 1, reads_from = ?",
                 (db.SCHEMA_VERSION,))
    forget_pg_stores()
    conn = db_postgres.connect_pg(pg_url, os.path.realpath(repo), 1, create=False, known=lambda: _token(repo),
                         keep=lambda t: None)
    assert conn is not None and db.store_schema(conn) == db.SCHEMA_VERSION + 1
    assert [v.kind for v in db.versions_desc(conn, None)] == ["import"]
    refused = db.write(conn, lambda c: db_postgres.writable_schema(c, os.path.realpath(repo)))
    assert refused and f"schema {db.SCHEMA_VERSION + 1}" in refused
    with pytest.raises(pgconn.StoreError, match="schema"):
        db.write(conn, lambda c: db.insert_version(c, "push", None, time.time(), None, "done", None))
    assert db.count_versions(conn) == 1


def _set_back_to_10(side: pgconn.PgConn, schema: str) -> None:
    """The store as the Aspen of schema 10 made it (no `node` column, nothing recorded of its readers)."""
    side.execute(f"ALTER TABLE {schema}.versions DROP COLUMN node")
    side.execute("UPDATE aspen_stores SET schema_version = 10, reads_from = NULL")


def test_a_store_one_schema_behind_is_migrated_when_opened_by_a_single_node(tmp_path, pg_url):
    repo = h.make_history(tmp_path / "repo.git")
    env = _env(pg_url, repo)
    RefStore.open(Repository.of(str(repo), env)).sync()
    side = pgconn.PgConn(pg_url, "public", 1, db.PG_USE_SCHEMA)
    schema = db_postgres.pg_schema(os.path.realpath(repo))
    _set_back_to_10(side, schema)
    forget_pg_stores()
    store = RefStore.open(Repository.of(str(repo), env))
    assert side.execute("SELECT schema_version, reads_from FROM aspen_stores").fetchone() == (11, db_schema.READS_FROM)
    store.sync()
    v = db.write(store.conn, lambda c: db.insert_version(c, "push", "me", time.time(), None, "done", None, "n1"))
    assert [x.node for x in store.log() if x.id == v] == ["n1"]


def test_a_store_one_schema_behind_is_read_and_written_in_its_own_shape_until_it_may_move(tmp_path, pg_url):
    """Nodes of the older Aspen still run (may_migrate False): this Aspen
    writes the store as they do; `aspen db migrate` moves it on, once."""
    from aspen_cgi.refstore.registry import migrate_database_stores
    repo = h.make_history(tmp_path / "repo.git")
    RefStore.open(Repository.of(str(repo), _env(pg_url, repo))).sync()
    side = pgconn.PgConn(pg_url, "public", 1, db.PG_USE_SCHEMA)
    schema = db_postgres.pg_schema(os.path.realpath(repo))
    _set_back_to_10(side, schema)
    forget_pg_stores()
    conn = db_postgres.connect_pg(pg_url, os.path.realpath(repo), 1, create=False, known=lambda: _token(repo),
                         keep=lambda t: None, may_migrate=lambda: False)
    assert conn is not None and db.store_schema(conn) == 10
    v = db.write(conn, lambda c: db_postgres.writable_schema(c, os.path.realpath(repo))
                 or db.insert_version(c, "push", "me", time.time(), None, "done", None, "n1"))
    assert v == 2 and [x.node for x in db.versions_desc(conn, None)] == [None, None]
    cli = subprocess.run([sys.executable, "-m", "aspen_cgi.cli", "db", "migrate", pg_url, "--json"],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout) == [{"repo": os.path.realpath(repo), "before": 10, "after": 11}]
    assert migrate_database_stores(pg_url) == [(os.path.realpath(repo), 11, 11)]
    assert db.write(conn, lambda c: db_postgres.writable_schema(c, os.path.realpath(repo))) is None
    assert db.store_schema(conn) == 11


@pytest.mark.aspen_store_unchecked(reason="its database is removed at its end: the test verifies the store itself")
def test_postgresql_away_fetches_are_served_from_the_disk_and_a_push_is_recorded_once_it_is_back(tmp_path):
    """The database stopped under a running server (a PostgreSQL of this
    test's own): the first request to find it away checks it with a
    connection of its own and says so; from then on no request tries it
    (no pool wait, no retries): fetches are answered from the refs on disk
    and a push's refs are written by git alone, as with a SQLite file locked
    elsewhere (docs/cluster.md), without waiting ASPEN_STORE_WAIT. Once the
    database is back (a probe connects every PROBE_EVERY s) the next request
    records that push as an external version, pushes land as versions again,
    and the store verifies."""
    pg = pgserver.private()
    try:
        url = pg.create_database("outage")
        root = tmp_path / "root"
        repo = h.make_history(root / "repo.git")
        h.git("config", "http.receivepack", "true", cwd=str(repo))
        server = h.Server(root, {"ASPEN_REFSTORE_URL": url, "ASPEN_ACCESS_LOG": "1"}).start()
        try:
            work = tmp_path / "work"
            h.git("clone", "-q", f"{server.url}/repo.git", str(work))
            pg.stop()
            for _ in range(3):
                advertised = h.out("ls-remote", f"{server.url}/repo.git")
                assert {name: oid for oid, name in (line.split("\t") for line in advertised.splitlines())
                        if name.startswith("refs/") and not name.endswith("^{}")} == h.refs_of(str(repo))
            h.git("commit", "-q", "--allow-empty", "-m", "while away", cwd=str(work))
            h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
            away = h.out("rev-parse", "HEAD", cwd=str(work))
            assert h.out("rev-parse", "main", cwd=str(repo)) == away
            h.git("clone", "-q", "--bare", f"{server.url}/repo.git", str(tmp_path / "during"))
            assert h.refs_of(str(tmp_path / "during")) == h.refs_of(str(repo))
            during = server.log_text()
            assert "serving refs from disk" in during
            assert "service=receive-pack method=POST" in during and "push=ok=1,ng=0" in during
            # every request found it known away at once: none waited for the pool or retried
            assert "PoolTimeout" not in during and "couldn't get a connection" not in during, during
            assert during.count("the database server is away (found") >= 4, during
            pg.up()
            deadline = time.monotonic() + 30
            while pgconn.reachable(url) is False and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(2 * pgconn.PROBE_EVERY + 0.5)     # the server's probe sees it back
            h.git("commit", "-q", "--allow-empty", "-m", "back", cwd=str(work))
            h.git("push", "-q", "origin", "HEAD:main", cwd=str(work))
            back = h.out("rev-parse", "HEAD", cwd=str(work))
        finally:
            server.stop()
        assert "Traceback" not in server.log_text()
        store = RefStore.open(Repository.of(str(repo), _env(url, repo)))
        store.sync()
        log = list(store.log())
        assert [v.kind for v in log] == ["push", "external", "import"]
        assert [(u.ref, u.new) for u in log[1].updates] == [("refs/heads/main", away)]
        assert [(u.ref, u.new) for u in log[0].updates] == [("refs/heads/main", back)]
        assert store.verify().problems == []
        h.fsck_strict(str(work))
    finally:
        forget_pg_stores()
        pgconn.close_pools()
        pgserver.remove(pg)
