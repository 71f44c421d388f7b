"""Every line of SQL Aspen runs. Nothing else imports sqlite3.

The file is in WAL mode; writers take the write lock up front (BEGIN
IMMEDIATE) and wait for it within a bound, retrying the whole transaction
when SQLite still reports the database busy, so contention is a wait and
never an error a client sees. Writers of one database first take turns
on an flock of `<file>-writer` (looked at again every few milliseconds, up
to the caller's patience), so many concurrent pushes do not poll SQLite's
busy handler, which sleeps up to 100 ms between tries. Schema changes are
numbered migrations made with sqlite-utils and recorded in PRAGMA
user_version; a new, empty file gets the schema they end in (SCHEMA) in
one transaction, without sqlite-utils (tests hold the two equal).

How long a busy database is waited for is the caller's patience
(`patience()`): a request that only reads refs gives up after READ_WAIT
and is served from the disk; a push waits up to ASPEN_STORE_WAIT seconds
(`store_wait()`); the command line and background builders wait
RETRY_SECONDS. No single statement waits longer than BUSY_MS, so another
process holding the file locked (even with PRAGMA locking_mode=EXCLUSIVE,
which blocks readers too) costs a request at most its patience.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, Mapping, Optional, Sequence, TypeVar

from .. import settings
from ..model.versions import ZERO, PushCert, StoredRef, Update, Version, is_null
from ..runtime import flocks
from . import pgconn

SCHEMA_VERSION = 11
READS_FROM = 10          # the oldest schema whose Aspen reads a store at SCHEMA_VERSION (recorded with each store)
BUSY_MS = 1000           # one statement's wait inside SQLite's busy handler
RETRY_SECONDS = 120.0    # total patience, unless the caller set its own
READ_WAIT = 2.0          # a request that only reads refs: then they come from the disk
STORE_WAIT = settings.default("ASPEN_STORE_WAIT")   # a push's default patience for a locked store

T = TypeVar("T")
Conn = sqlite3.Connection       # or a pgconn.PgConn: the same few methods
Error = sqlite3.Error           # either engine's (pgconn.StoreError is one)


class Unstorable(sqlite3.DataError):
    """Refs the store cannot hold: a ref name that is not UTF-8, which git
    itself made (update-ref, another server). Their readers serve the disk."""


class Busy(Exception):
    """The database stayed locked past RETRY_SECONDS."""


class _Connection(sqlite3.Connection):
    """A connection that holds the file its writers queue on."""
    dialect = "sqlite"
    writer_fd: Optional[int] = None
    busy_ms: int = BUSY_MS

    def close(self) -> None:
        fd, self.writer_fd = self.writer_fd, None
        if fd is not None:
            os.close(fd)
        super().close()

    def __del__(self) -> None:
        fd, self.writer_fd = self.writer_fd, None
        if fd is not None:
            os.close(fd)


def connect(path: str) -> Conn:
    conn = sqlite3.connect(path, timeout=BUSY_MS / 1000, isolation_level=None, check_same_thread=False,
                           factory=_Connection)
    try:
        try:
            conn.writer_fd = os.open(path + "-writer", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:
            pass                                    # no turn-taking: SQLite's own wait still applies
        conn.execute(f"PRAGMA busy_timeout={BUSY_MS}")
        conn.execute("PRAGMA synchronous=NORMAL")   # WAL: a commit survives kill -9 of the process
        if conn.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
            _migrate(conn)
    except BaseException:
        conn.close()                                # busy (locked elsewhere) or broken: not kept half-open
        raise
    return conn


# -- migrations ---------------------------------------------------------------------

def _m1(db) -> None:
    db.conn.execute("PRAGMA journal_mode=WAL")
    db["versions"].create({"id": int, "kind": str, "who": str, "at": float, "push_id": str,
                           "state": str, "owner": str}, pk="id", not_null={"kind", "at", "state"})
    db["versions"].create_index(["state"])
    db["updates"].create({"version": int, "ref": str, "old": str, "new": str, "ff": int,
                          "type": str, "peeled": str}, pk=("ref", "version"),
                         not_null={"version", "ref", "old", "new", "ff"})
    db["updates"].create_index(["version"])
    db["tips"].create({"commit_oid": str, "version": int, "ref": str}, pk=("commit_oid", "version", "ref"))
    db["introduced"].create({"version": int, "commit_oid": str}, pk=("version", "commit_oid"))
    db["introduced"].create_index(["commit_oid"])
    db["refs"].create({"name": str, "oid": str, "symref": str, "type": str, "peeled": str, "version": int},
                      pk="name")
    db["segments"].create({"level": int, "idx": int, "lo": int, "hi": int, "refs": int}, pk=("level", "idx"))
    db["segment_refs"].create({"level": int, "idx": int, "ref": str, "first_old": str, "last_new": str,
                               "all_ff": int}, pk=("level", "idx", "ref"))
    db["state"].create({"key": str, "value": str}, pk="key")


def _m2(db) -> None:
    """Version packs (issue 5): the stored thin pack of each version, and its boundary."""
    db["version_packs"].create({"version": int, "name": str, "objects": int, "size": int, "built_at": float,
                                "window": int, "depth": int, "compression": int}, pk="version")
    db["boundaries"].create({"version": int, "commit_oid": str}, pk=("version", "commit_oid"))


def _m3(db) -> None:
    """Segment packs (issue 5): one pack per compacted run of versions LO … HI."""
    db["segment_packs"].create({"lo": int, "hi": int, "name": str, "objects": int, "size": int, "built_at": float,
                                "window": int, "depth": int, "compression": int}, pk=("lo", "hi"))


def _m4(db) -> None:
    """Commit parents: the planner's walk from a client's haves (the
    commits each built version introduced, with their parents)."""
    db["commit_parents"].create({"commit_oid": str, "parents": str}, pk="commit_oid", not_null={"parents"})


def _m5(db) -> None:
    """Committer times beside the parents: whether stock would end an open
    negotiation round is settled from the store (plancheck.store_ready).
    Rows recorded before have none (git is asked about those)."""
    db["commit_parents"].add_column("ctime", int)


def _m6(db) -> None:
    """Push certificates: a signed push's certificate with its version, and
    what its hooks were told of it (GIT_PUSH_CERT*)."""
    db["push_certs"].create({"version": int, "blob": str, "signer": str, "key": str, "status": str,
                             "nonce": str, "nonce_status": str, "nonce_slop": int, "cert": bytes},
                            pk="version", not_null={"blob", "signer", "key", "status", "nonce_status", "cert"},
                            if_not_exists=True)   # tests make "older" stores by dropping only their own table


def _m7(db) -> None:
    """The hash chain (model/chain.py): each done version's hash and the
    previous one's. It starts at the first version after this migration
    (version 1 of a new store); versions before it are not chained."""
    db["chain"].create({"version": int, "prev": str, "hash": str, "start": int, "text": str}, pk="version",
                       not_null={"prev", "hash", "start", "text"},
                       if_not_exists=True)   # tests make "older" stores by setting user_version back
    latest = db.conn.execute("SELECT coalesce(max(id), 0) FROM versions").fetchone()[0]
    db.conn.execute("INSERT INTO state(key, value) VALUES ('chain_from', ?) ON CONFLICT DO NOTHING", (str(latest + 1),))


def _m8(db) -> None:
    """The versions whose boundary holds a commit (the planner's rule 4 asks
    about one commit, not every version a client's haves name)."""
    db["boundaries"].create_index(["commit_oid"], if_not_exists=True)


def _m9(db) -> None:
    """Each ref's updates that were no fast-forward (its creation, a
    deletion, a forced move), by version: the planner's rule 2 asks for a
    ref's latest one up to a version (last_rewind), one row."""
    db.conn.execute("CREATE INDEX IF NOT EXISTS idx_updates_rewinds ON updates (ref, version) WHERE ff = 0")


def _m10(db) -> None:
    """The packs a replica applies for each version (docs/cluster.md): the
    pack store's names of the objects a version introduced."""
    db["replica_packs"].create({"version": int, "name": str}, pk=("version", "name"), if_not_exists=True)


def _m11(db) -> None:
    """Which node took each version (ASPEN_NODE_URL, else the host's name): `aspen log` shows it."""
    if "node" not in db["versions"].columns_dict:     # tests make "older" stores by setting user_version back
        db["versions"].add_column("node", str)


MIGRATIONS: list[Callable] = [_m1, _m2, _m3, _m4, _m5, _m6, _m7, _m8, _m9, _m10, _m11]

SCHEMA = (     # what MIGRATIONS make of an empty file (tests/test_refstore_schema.py)
    "CREATE TABLE versions (id INTEGER PRIMARY KEY, kind TEXT NOT NULL, who TEXT, at REAL NOT NULL,"
    " push_id TEXT, state TEXT NOT NULL, owner TEXT, node TEXT)",
    "CREATE INDEX idx_versions_state ON versions (state)",
    "CREATE TABLE updates (version INTEGER NOT NULL, ref TEXT NOT NULL, old TEXT NOT NULL, new TEXT NOT NULL,"
    " ff INTEGER NOT NULL, type TEXT, peeled TEXT, PRIMARY KEY (ref, version))",
    "CREATE INDEX idx_updates_version ON updates (version)",
    "CREATE TABLE tips (commit_oid TEXT, version INTEGER, ref TEXT, PRIMARY KEY (commit_oid, version, ref))",
    "CREATE TABLE introduced (version INTEGER, commit_oid TEXT, PRIMARY KEY (version, commit_oid))",
    "CREATE INDEX idx_introduced_commit_oid ON introduced (commit_oid)",
    "CREATE TABLE refs (name TEXT PRIMARY KEY, oid TEXT, symref TEXT, type TEXT, peeled TEXT, version INTEGER)",
    "CREATE TABLE segments (level INTEGER, idx INTEGER, lo INTEGER, hi INTEGER, refs INTEGER,"
    " PRIMARY KEY (level, idx))",
    "CREATE TABLE segment_refs (level INTEGER, idx INTEGER, ref TEXT, first_old TEXT, last_new TEXT,"
    " all_ff INTEGER, PRIMARY KEY (level, idx, ref))",
    "CREATE TABLE state (key TEXT PRIMARY KEY, value TEXT)",
    'CREATE TABLE version_packs (version INTEGER PRIMARY KEY, name TEXT, objects INTEGER, size INTEGER,'
    ' built_at REAL, "window" INTEGER, depth INTEGER, compression INTEGER)',
    "CREATE TABLE boundaries (version INTEGER, commit_oid TEXT, PRIMARY KEY (version, commit_oid))",
    'CREATE TABLE segment_packs (lo INTEGER, hi INTEGER, name TEXT, objects INTEGER, size INTEGER,'
    ' built_at REAL, "window" INTEGER, depth INTEGER, compression INTEGER, PRIMARY KEY (lo, hi))',
    "CREATE TABLE commit_parents (commit_oid TEXT PRIMARY KEY, parents TEXT NOT NULL, ctime INTEGER)",
    "CREATE TABLE push_certs (version INTEGER PRIMARY KEY, blob TEXT NOT NULL, signer TEXT NOT NULL,"
    " key TEXT NOT NULL, status TEXT NOT NULL, nonce TEXT, nonce_status TEXT NOT NULL, nonce_slop INTEGER,"
    " cert BLOB NOT NULL)",
    "CREATE TABLE chain (version INTEGER PRIMARY KEY, prev TEXT NOT NULL, hash TEXT NOT NULL,"
    " start INTEGER NOT NULL, text TEXT NOT NULL)",
    "CREATE INDEX idx_boundaries_commit_oid ON boundaries (commit_oid)",
    "CREATE INDEX idx_updates_rewinds ON updates (ref, version) WHERE ff = 0",
    "CREATE TABLE replica_packs (version INTEGER, name TEXT, PRIMARY KEY (version, name))",
    "INSERT INTO state(key, value) VALUES ('chain_from', '1')",
)


# -- PostgreSQL -------------------------------------------------------------------------
# One database holds every repository's store, each in a schema of its own
# (pg_schema(): the same tables as a SQLite file, so every query above and
# below runs on both), listed in public.aspen_stores. Its types differ:
# integers are 64-bit as SQLite's, text compares bytewise as SQLite's (the
# "C" collation), times are double precision. A schema is made at
# SCHEMA_VERSION, and the list records with it the oldest Aspen that reads it
# (READS_FROM). Nodes of two releases run side by side while a cluster is
# upgraded (docs/cluster.md, "Upgrading"): this Aspen reads and writes a store
# one migration behind in that store's own shape (store_schema(conn)), moves
# it on (pg_migrate) once every node can read the result, reads a newer store
# whose READS_FROM it meets, and writes nothing to a store it cannot read.

def _pg_ddl(statement: str) -> str:
    import re  # startup: only when a PostgreSQL store is made
    statement = re.sub(r"\bTEXT\b", 'TEXT COLLATE "C"', statement)
    statement = re.sub(r"\bINTEGER\b", "BIGINT", statement)
    statement = re.sub(r"\bREAL\b", "DOUBLE PRECISION", statement)
    return re.sub(r"\bBLOB\b", "BYTEA", statement)


PG_TABLES = ("versions", "updates", "tips", "introduced", "refs", "segments", "segment_refs", "state",
             "version_packs", "boundaries", "segment_packs", "commit_parents", "push_certs", "chain",
             "replica_packs")
PG_REGISTRY = ('CREATE TABLE IF NOT EXISTS public.aspen_stores (repo TEXT COLLATE "C" PRIMARY KEY,'
               ' schema_name TEXT NOT NULL UNIQUE, schema_version INTEGER NOT NULL, made TEXT NOT NULL,'
               ' created_at DOUBLE PRECISION, reads_from INTEGER)')
PG_REGISTRY_READS_FROM = "ALTER TABLE public.aspen_stores ADD COLUMN IF NOT EXISTS reads_from INTEGER"
# Statements moving a store's schema from N to N + 1 (their SQLite twins are MIGRATIONS[N]); a store
# older than the first is refused.
PG_MIGRATIONS: dict[int, tuple[str, ...]] = {
    10: ("ALTER TABLE versions ADD COLUMN IF NOT EXISTS node TEXT",),
}
OLDEST_STORE = min(PG_MIGRATIONS)
PG_USE_SCHEMA = "SELECT set_config('search_path', %s, false)"
PG_LOCK_REGISTRY = 7_041_729_385_113   # the advisory lock taken while a store's schema is made


def pg_schema(repo: str) -> str:
    """The schema of the store of the repository known as REPO (its path under the project root)."""
    import hashlib  # startup: only for a PostgreSQL store
    return "r_" + hashlib.sha1(repo.encode("utf-8", "surrogateescape")).hexdigest()[:24]


def _pg_lock_key(schema: str) -> int:
    """The advisory lock a store's writers take turns on (64 bits of its schema's name)."""
    import hashlib  # startup: only for a PostgreSQL store
    return int.from_bytes(hashlib.sha1(schema.encode()).digest()[:8], "big", signed=True)


def connect_pg(url: str, repo: str, pool_size: int, create: bool, known: Callable[[], Optional[str]],
               keep: Callable[[str], None], adopt: bool = False,
               may_migrate: Callable[[], bool] = lambda: True) -> Optional[pgconn.PgConn]:
    """The store of the repository known as REPO in the database at URL.
    KNOWN() is the token of its making that the repository's state records
    (None: none); KEEP(token) records one. A store the repository's state
    does not record was made for an earlier repository of that name: with
    CREATE it is dropped and made anew, as a missing one is made; without,
    None (see _pg_create). ADOPT (a replica, docs/cluster.md): a store the
    state does not record is the cluster's, and this node's copy follows it.
    An older store is migrated when MAY_MIGRATE() (every node reads the
    result), else used in its own shape; see the section's note."""
    conn = pgconn.PgConn(url, pg_schema(repo), pool_size, PG_USE_SCHEMA)
    row = _registered(conn, repo)
    if row is None or row[1] != known():
        if not create and not (adopt and row is not None):
            return None
        _retry(lambda: _pg_create(conn, repo, known, keep, adopt))
        row = _registered(conn, repo)
        if row is None:
            return None
    at = row[0]
    if OLDEST_STORE <= at < SCHEMA_VERSION and may_migrate():
        at = _retry(lambda: pg_migrate(conn, repo))
    conn.store_schema = at
    if at < OLDEST_STORE or (at > SCHEMA_VERSION and not (_reads_from(conn, repo) or at) <= SCHEMA_VERSION):
        raise pgconn.StoreError(f"the store of {repo} is at schema {at}, this Aspen reads {SCHEMA_VERSION}")
    return conn


def store_schema(conn: Conn) -> int:
    """The schema of the store CONN is open on, as last read (a SQLite file is always at SCHEMA_VERSION)."""
    return getattr(conn, "store_schema", 0) or SCHEMA_VERSION


def writable_schema(conn: Conn, repo: str) -> Optional[str]:
    """Inside a write transaction: None when this Aspen may write the store of
    REPO (its schema read again, and kept for this transaction's statements),
    else git's error text. A newer Aspen's store is not written: this one
    may not know what its rows must hold."""
    if getattr(conn, "dialect", "sqlite") != "postgresql":
        return None
    at = pg_store_schema(conn, repo)    # type: ignore[arg-type]
    if at is None or not OLDEST_STORE <= at <= SCHEMA_VERSION:
        return f"failed to update ref (the ref log is at schema {at}, this server writes {SCHEMA_VERSION})"
    conn.store_schema = at      # type: ignore[union-attr]
    return None


def _reads_from(conn: pgconn.PgConn, repo: str) -> Optional[int]:
    try:
        row = conn.execute("SELECT reads_from FROM public.aspen_stores WHERE repo = ?", (repo,)).fetchone()
    except pgconn.StoreError as e:
        if "UndefinedColumn" not in str(e):     # a list no Aspen that records it has touched
            raise
        return None
    return None if row is None else row[0]


def pg_migrate(conn: pgconn.PgConn, repo: str) -> int:
    """Move the store of REPO to SCHEMA_VERSION, between its writers'
    transactions (their lock held): the schema it is at now. The writers of
    an older Aspen read the new schema in their transaction and refuse."""
    conn.begin("BEGIN", [("SELECT pg_advisory_xact_lock(?)", (PG_LOCK_REGISTRY,)),
                         ("SELECT pg_advisory_xact_lock(?)", (_pg_lock_key(conn.schema),))])
    try:
        conn.execute(PG_REGISTRY_READS_FROM)
        row = conn.execute("SELECT schema_version FROM public.aspen_stores WHERE repo = ?", (repo,)).fetchone()
        if row is None or not OLDEST_STORE <= row[0] < SCHEMA_VERSION:
            conn.commit()
            return SCHEMA_VERSION if row is None else row[0]
        for n in range(row[0], SCHEMA_VERSION):
            for statement in PG_MIGRATIONS[n]:
                conn.execute(_pg_ddl(statement))
        conn.execute("UPDATE public.aspen_stores SET schema_version = ?, reads_from = ? WHERE repo = ?",
                     (SCHEMA_VERSION, READS_FROM, repo))
        conn.commit()
        return SCHEMA_VERSION
    except BaseException:
        conn.rollback()
        raise


def _registered(conn: pgconn.PgConn, repo: str) -> Optional[tuple]:
    def ask() -> Optional[tuple]:
        try:
            return conn.execute("SELECT schema_version, made FROM public.aspen_stores WHERE repo = ?",
                                (repo,)).fetchone()
        except pgconn.StoreError as e:
            if "UndefinedTable" not in str(e):
                raise
            pg_init(conn)
            return None
    return _retry(ask)


def pg_init(conn: pgconn.PgConn) -> None:
    """The database's list of stores (`aspen db init`; made by a first store too)."""
    conn.begin("BEGIN", [("SELECT pg_advisory_xact_lock(?)", (PG_LOCK_REGISTRY,))])
    try:
        conn.execute(PG_REGISTRY)
        conn.commit()
    except BaseException:
        conn.rollback()
        raise


def _pg_create(conn: pgconn.PgConn, repo: str, known: Callable[[], Optional[str]],
               keep: Callable[[str], None], adopt: bool = False) -> None:
    """Under the registry's lock, as the repository's state records it then
    (KNOWN()): a store it records is kept; one it records no token for was
    an earlier repository's and is dropped; one it records another token
    for is adopted (its history is mended by the next sync); a missing one is
    made. The token is recorded (KEEP) before the commit, so that another
    process deciding next under the lock sees it."""
    import uuid  # startup: only when a PostgreSQL store is made
    conn.begin("BEGIN", [("SELECT pg_advisory_xact_lock(?)", (PG_LOCK_REGISTRY,))])
    try:
        row = conn.execute("SELECT made FROM public.aspen_stores WHERE repo = ?", (repo,)).fetchone()
        mine = known()
        if row is not None and mine is None and not adopt:
            conn.execute("DELETE FROM public.aspen_stores WHERE repo = ?", (repo,))
            row = None
        if row is None:
            token = uuid.uuid4().hex
            conn.execute(f"DROP SCHEMA IF EXISTS {conn.schema} CASCADE")   # a replaced or half-made one
            conn.execute(f"CREATE SCHEMA {conn.schema}")
            conn.execute(f"SET LOCAL search_path TO {conn.schema}")
            for statement in SCHEMA:
                conn.execute(_pg_ddl(statement))
            conn.execute(PG_REGISTRY_READS_FROM)
            conn.execute("INSERT INTO public.aspen_stores(repo, schema_name, schema_version, made, created_at,"
                         " reads_from) VALUES (?, ?, ?, ?, extract(epoch from now()), ?)",
                         (repo, conn.schema, SCHEMA_VERSION, token, READS_FROM))
            keep(token)
        elif row[0] != mine:
            keep(row[0])
        conn.commit()
    except BaseException:
        conn.rollback()
        raise


def pg_store_schema(conn: pgconn.PgConn, repo: str) -> Optional[int]:
    """The schema version the database's list records for REPO's store (None: no store)."""
    row = conn.execute("SELECT schema_version FROM public.aspen_stores WHERE repo = ?", (repo,)).fetchone()
    return None if row is None else row[0]


def pg_stores(conn: pgconn.PgConn) -> list[tuple[str, str, int]]:
    """(repository, schema, schema version) of every store in the database."""
    return list(conn.execute("SELECT repo, schema_name, schema_version FROM public.aspen_stores ORDER BY repo"))


# The cluster's nodes and who holds which pack (refstore/peers.py: packs between nodes, ASPEN_NODE_URL).
# Tables of the whole database, made when first needed, outside every store's schema version.
PG_PEERS = ('CREATE TABLE IF NOT EXISTS public.aspen_nodes (node TEXT COLLATE "C" PRIMARY KEY,'
            ' seen DOUBLE PRECISION NOT NULL)',
            'CREATE TABLE IF NOT EXISTS public.aspen_pack_holders (store TEXT COLLATE "C", name TEXT COLLATE "C",'
            ' node TEXT COLLATE "C", at DOUBLE PRECISION NOT NULL, PRIMARY KEY (store, name, node))',
            # the store schema each node's Aspen writes, as of schema_at: a later `seen` is an older Aspen's
            # beat (one from before this was recorded, which writes `seen` alone: a node taken back)
            "ALTER TABLE public.aspen_nodes ADD COLUMN IF NOT EXISTS schema INTEGER",
            "ALTER TABLE public.aspen_nodes ADD COLUMN IF NOT EXISTS schema_at DOUBLE PRECISION")


def pg_peers_init(conn: pgconn.PgConn) -> None:
    conn.begin("BEGIN", [("SELECT pg_advisory_xact_lock(?)", (PG_LOCK_REGISTRY,))])
    try:
        for statement in PG_PEERS:
            conn.execute(statement)
        conn.commit()
    except BaseException:
        conn.rollback()
        raise


def pg_node_seen(conn: pgconn.PgConn, node: str, at: float) -> None:
    conn.execute("INSERT INTO public.aspen_nodes (node, seen, schema, schema_at) VALUES (?, ?, ?, ?)"
                 " ON CONFLICT (node) DO UPDATE SET seen = excluded.seen, schema = excluded.schema,"
                 " schema_at = excluded.schema_at", (node, at, SCHEMA_VERSION, at))


def pg_nodes(conn: pgconn.PgConn) -> list[tuple[str, float, int]]:
    """(node, last seen, the schema its Aspen writes: 0 when its last beat did not say) of every node."""
    return list(conn.execute("SELECT node, seen, CASE WHEN schema_at >= seen THEN coalesce(schema, 0) ELSE 0 END"
                             " FROM public.aspen_nodes ORDER BY node"))


def pg_pack_holders(conn: pgconn.PgConn, store: str, name: str) -> list[str]:
    return [r[0] for r in conn.execute("SELECT node FROM public.aspen_pack_holders WHERE store = ? AND name = ?"
                                       " ORDER BY at DESC", (store, name))]


def pg_pack_holders_of(conn: pgconn.PgConn, store: str, names: Sequence[str]) -> dict[str, list[str]]:
    """pg_pack_holders() of each of NAMES, in one query."""
    out: dict[str, list[str]] = {}
    for name, node in conn.execute("SELECT name, node FROM public.aspen_pack_holders WHERE store = ?"
                                   " AND name = ANY(?) ORDER BY at DESC", (store, list(names))):
        out.setdefault(name, []).append(node)
    return out


def pg_hold(conn: pgconn.PgConn, store: str, name: str, node: str, at: float) -> None:
    conn.execute("INSERT INTO public.aspen_pack_holders (store, name, node, at) VALUES (?, ?, ?, ?)"
                 " ON CONFLICT (store, name, node) DO UPDATE SET at = excluded.at", (store, name, node, at))


def pg_unhold(conn: pgconn.PgConn, store: str, name: str, node: str) -> None:
    conn.execute("DELETE FROM public.aspen_pack_holders WHERE store = ? AND name = ? AND node = ?",
                 (store, name, node))


def pg_drop(conn: pgconn.PgConn, repo: str) -> bool:
    """Remove the store of the repository known as REPO (False: there was none)."""
    conn.begin("BEGIN", [("SELECT pg_advisory_xact_lock(?)", (PG_LOCK_REGISTRY,))])
    try:
        gone = conn.execute("DELETE FROM public.aspen_stores WHERE repo = ? RETURNING schema_name",
                            (repo,)).fetchone()
        if gone:
            conn.execute(f"DROP SCHEMA IF EXISTS {gone[0]} CASCADE")
        conn.commit()
        return gone is not None
    except BaseException:
        conn.rollback()
        raise


def schema_tools():
    """sqlite_utils, imported without numpy: it imports numpy when present
    (matplotlib brings it) for types Aspen never stores, and that doubled its
    import (50 ms against 80 to 130 ms here), paid by the first request to a
    repository without a store. Long-lived processes call this as they
    start (wsgi.py, resident.py)."""
    import sys
    blocked = "numpy" not in sys.modules
    if blocked:
        sys.modules["numpy"] = None       # type: ignore[assignment]  # `import numpy` raises ImportError
    try:
        import sqlite_utils  # startup: only when a schema is created or moved
    finally:
        if blocked and sys.modules.get("numpy", 0) is None:
            del sys.modules["numpy"]
    return sqlite_utils


def _create(conn: Conn) -> bool:
    """SCHEMA into an empty file, in one transaction; False when the file
    holds a schema already (made by another process meanwhile, or older)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        empty = (conn.execute("PRAGMA user_version").fetchone()[0] == 0
                 and conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone() is None)
        if empty:
            for statement in SCHEMA:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        conn.execute("COMMIT")
        return empty
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _migrate(conn: Conn, fresh: bool = True) -> None:
    """Bring the file to SCHEMA_VERSION: SCHEMA at once when it is empty
    (FRESH; False runs every migration, as tests do), else the migrations
    it lacks."""
    conn.execute("PRAGMA journal_mode=WAL")
    if fresh and _retry(lambda: _create(conn)):
        return
    sqlite_utils = schema_tools()

    def run() -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            current = conn.execute("PRAGMA user_version").fetchone()[0]
            db = sqlite_utils.Database(conn)
            for n in range(current, SCHEMA_VERSION):
                MIGRATIONS[n](db)
                conn.execute(f"PRAGMA user_version={n + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    _retry(run)


# -- transactions ---------------------------------------------------------------------

_patience = threading.local()


def store_wait(s: settings.Settings) -> float:
    """ASPEN_STORE_WAIT (settings.py): seconds a push waits for a ref store another process holds locked."""
    return s.store_wait


@contextmanager
def patience(seconds: float, keep_outer: bool = False) -> Iterator[None]:
    """Within the block, a busy database is retried for at most SECONDS in all
    (from the start of each retried call). KEEP_OUTER: an enclosing block's
    patience wins (a push opening the store waits as long as the push may)."""
    outer = getattr(_patience, "seconds", None)
    if keep_outer and outer is not None:
        yield
        return
    _patience.seconds = seconds
    try:
        yield
    finally:
        _patience.seconds = outer


def retry(fn: Callable[[], T]) -> T:
    """FN(), run again while the database is busy, within the caller's patience."""
    return _retry(fn)


def _busy(e: sqlite3.OperationalError) -> bool:
    return "locked" in str(e) or "busy" in str(e)


def _deadline() -> float:
    seconds = getattr(_patience, "seconds", None)
    return time.monotonic() + (RETRY_SECONDS if seconds is None else seconds)


def _retry(fn: Callable[[], T], deadline: Optional[float] = None) -> T:
    deadline = _deadline() if deadline is None else deadline
    delay = 0.005
    while True:
        try:
            return fn()
        except (sqlite3.OperationalError, pgconn.Retryable) as e:
            if isinstance(e, sqlite3.OperationalError) and not _busy(e):
                raise
            if time.monotonic() + delay > deadline:
                raise Busy(str(e)) from e
            time.sleep(delay)
            delay = min(delay * 2, 0.2)


TURN_POLL = 0.005         # the longest sleep between two looks at the writers' turn


@contextmanager
def _writer_turn(conn: Conn, deadline: float) -> Iterator[None]:
    """This database's writers one at a time, each waiting at most until
    DEADLINE (Busy after): the turn is looked at again within TURN_POLL of
    its release, where SQLite's busy handler sleeps up to 100 ms."""
    fd = getattr(conn, "writer_fd", None)
    if fd is not None:
        try:
            if not flocks.take(fd, deadline, 0.0005, TURN_POLL):
                raise Busy("another writer of this ref store held its turn past the wait")
        except OSError:
            fd = None
    try:
        yield
    finally:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)


def write(conn: Conn, fn: Callable[[Conn], T]) -> T:
    """Run FN(conn) inside one write transaction, retried as a whole while
    busy, after this database's other writers (see the module's note). The
    patience counts from the call, the turn included: a request waits no
    longer than its patience behind writers held up by a lock taken elsewhere."""
    deadline = _deadline()
    if conn.dialect != "sqlite":
        return _retry(lambda: _pg_write_once(conn, fn, deadline), deadline)
    with _writer_turn(conn, deadline):
        return _retry(lambda: _write_once(conn, fn, deadline), deadline)


def _pg_write_once(conn: pgconn.PgConn, fn: Callable[[Conn], T], deadline: float) -> T:
    """One write transaction of a PostgreSQL store: its writers take turns
    on an advisory lock of the store's, waited for until DEADLINE (a lock
    wait past it is Retryable, and then Busy)."""
    ms = max(1, int((deadline - time.monotonic()) * 1000))
    conn.begin("BEGIN", [("SELECT set_config('lock_timeout', ?, true)", (f"{ms}ms",)),
                         ("SELECT pg_advisory_xact_lock(?)", (_pg_lock_key(conn.schema),))])
    try:
        out = fn(conn)        # type: ignore[arg-type]
        conn.commit()
        return out
    except UnicodeEncodeError as e:
        conn.rollback()
        raise _unstorable(e) from None
    except BaseException:
        conn.rollback()
        raise


def _bound_wait(conn: Conn, deadline: float) -> None:
    """SQLite's own wait for the lock: BUSY_MS, or what is left of the patience."""
    ms = int(min(BUSY_MS, max(0.0, deadline - time.monotonic()) * 1000))
    if getattr(conn, "busy_ms", BUSY_MS) != ms:
        conn.execute(f"PRAGMA busy_timeout={ms}")
        conn.busy_ms = ms


def _write_once(conn: Conn, fn: Callable[[Conn], T], deadline: float) -> T:
    def run() -> T:
        _bound_wait(conn, deadline)
        conn.execute("BEGIN IMMEDIATE")
        try:
            out = fn(conn)
            conn.execute("COMMIT")
            return out
        except UnicodeEncodeError as e:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise _unstorable(e) from None
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    return run()


def _unstorable(e: UnicodeEncodeError) -> Unstorable:
    bad = e.object[e.start:e.end].encode("utf-8", "surrogateescape") if isinstance(e.object, str) else b""
    return Unstorable(f"a ref name is not valid UTF-8 ({bad!r})")


@contextmanager
def reading(conn: Conn) -> Iterator[Conn]:
    """One consistent read snapshot."""
    if conn.dialect != "sqlite":
        _retry(lambda: conn.begin("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY"))
        try:
            yield conn
        finally:
            if conn.in_transaction:
                conn.commit()
        return
    _retry(lambda: conn.execute("BEGIN"))
    try:
        yield conn
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")


# -- state ------------------------------------------------------------------------------

def latest_version(conn: Conn) -> int:
    return conn.execute("SELECT coalesce(max(id), 0) FROM versions").fetchone()[0]


def version_push_id(conn: Conn, version: int) -> Optional[str]:
    row = conn.execute("SELECT push_id FROM versions WHERE id = ?", (version,)).fetchone()
    return row[0] if row else None


def first_version_at(conn: Conn) -> float:
    """When the store's first version was committed (0 without versions)."""
    row = conn.execute("SELECT at FROM versions ORDER BY id LIMIT 1").fetchone()
    return float(row[0]) if row else 0.0


def latest_version_at(conn: Conn) -> float:
    """When the latest version was committed (0 without versions)."""
    row = conn.execute("SELECT at FROM versions ORDER BY id DESC LIMIT 1").fetchone()
    return float(row[0]) if row else 0.0


def get_state(conn: Conn, key: str) -> Optional[str]:
    row = conn.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
    return row[0] if row else None


def set_state(conn: Conn, key: str, value: Optional[str]) -> None:
    if value is None:
        conn.execute("DELETE FROM state WHERE key = ?", (key,))
    else:
        conn.execute("INSERT INTO state(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                      (key, value))


def head(conn: Conn) -> tuple[int, Optional[str], int]:
    """(latest version, stored fingerprint, pending versions) in one query."""
    row = conn.execute("SELECT (SELECT coalesce(max(id), 0) FROM versions),"
                       " (SELECT value FROM state WHERE key = 'fingerprint'),"
                       " (SELECT count(*) FROM versions WHERE state = 'pending')").fetchone()
    return row[0], row[1], row[2]


# -- refs ---------------------------------------------------------------------------------

def all_refs(conn: Conn) -> list[StoredRef]:
    return [StoredRef(n, o, s, t, p) for n, o, s, t, p in
            conn.execute("SELECT name, oid, symref, type, peeled FROM refs ORDER BY name")]


def refs_named(conn: Conn, names: Sequence[str]) -> dict[str, StoredRef]:
    out = {}
    for i in range(0, len(names), 500):
        part = list(names[i:i + 500])
        q = "SELECT name, oid, symref, type, peeled FROM refs WHERE name IN (%s)" % ",".join("?" * len(part))
        for n, o, s, t, p in conn.execute(q, part):
            out[n] = StoredRef(n, o, s, t, p)
    return out


def put_refs(conn: Conn, rows: Iterable[StoredRef], version: int) -> None:
    conn.executemany("INSERT INTO refs(name, oid, symref, type, peeled, version) VALUES (?, ?, ?, ?, ?, ?)"
                     " ON CONFLICT(name) DO UPDATE SET oid = excluded.oid, symref = excluded.symref,"
                     " type = excluded.type, peeled = excluded.peeled, version = excluded.version",
                     [(r.name, r.oid, r.symref, r.otype, r.peeled, version) for r in rows])


def delete_refs(conn: Conn, names: Iterable[str]) -> None:
    conn.executemany("DELETE FROM refs WHERE name = ?", [(n,) for n in names])


# -- versions ---------------------------------------------------------------------------------

def insert_version(conn: Conn, kind: str, who: Optional[str], at: float, push_id: Optional[str],
                   state: str, owner: Optional[str], node: Optional[str] = None) -> int:
    at_schema = store_schema(conn)
    if at_schema > SCHEMA_VERSION:
        raise pgconn.StoreError(f"the ref log is at schema {at_schema}, this server writes {SCHEMA_VERSION}")
    if at_schema < 11:          # a store one migration behind, in its own shape
        return conn.execute("INSERT INTO versions(id, kind, who, at, push_id, state, owner)"
                            " VALUES ((SELECT coalesce(max(id), 0) + 1 FROM versions), ?, ?, ?, ?, ?, ?)"
                            " RETURNING id", (kind, who, at, push_id, state, owner)).fetchone()[0]
    return conn.execute("INSERT INTO versions(id, kind, who, at, push_id, state, owner, node)"
                        " VALUES ((SELECT coalesce(max(id), 0) + 1 FROM versions), ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                        (kind, who, at, push_id, state, owner, node)).fetchone()[0]


def insert_push_cert(conn: Conn, version: int, cert: PushCert) -> None:
    conn.execute("INSERT INTO push_certs(version, blob, signer, key, status, nonce, nonce_status, nonce_slop, cert) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                 (version, cert.blob, cert.signer, cert.key, cert.status, cert.nonce, cert.nonce_status,
                  cert.nonce_slop, cert.text))


def push_cert(conn: Conn, version: int) -> Optional[PushCert]:
    row = conn.execute("SELECT blob, signer, key, status, nonce_status, nonce, nonce_slop, cert FROM push_certs "
                       "WHERE version = ?", (version,)).fetchone()
    return None if row is None else PushCert(*row[:7], bytes(row[7]))


def insert_updates(conn: Conn, version: int, rows: Iterable[tuple[str, str, str, bool, Optional[str], Optional[str]]]) -> None:
    """ROWS: (ref, old, new, ff, type of new, peeled new). The null id of
    either hash is kept as ZERO (SHA-1's), the one the queries here test."""
    conn.executemany("INSERT INTO updates(version, ref, old, new, ff, type, peeled) VALUES (?, ?, ?, ?, ?, ?, ?)",
                     [(version, r, ZERO if is_null(o) else o, ZERO if is_null(n) else n, int(f), t, p)
                      for r, o, n, f, t, p in rows])


def insert_tips(conn: Conn, version: int, rows: Iterable[tuple[str, str]]) -> None:
    """ROWS: (commit or object id, ref)."""
    conn.executemany("INSERT INTO tips(commit_oid, version, ref) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                     [(c, version, r) for c, r in rows])


def insert_introduced(conn: Conn, version: int, commits: Iterable[str]) -> None:
    conn.executemany("INSERT INTO introduced(version, commit_oid) VALUES (?, ?) ON CONFLICT DO NOTHING",
                     [(version, c) for c in commits])


def insert_parents(conn: Conn, parents: Mapping[str, Sequence[str]], times: Mapping[str, int]) -> None:
    """COMMIT -> its parents and committer time (TIMES: where known). A
    commit's parents and time never change: the first row stays, given the
    time it lacked."""
    conn.executemany("INSERT INTO commit_parents(commit_oid, parents, ctime) VALUES (?, ?, ?)"
                     " ON CONFLICT(commit_oid) DO UPDATE SET ctime = excluded.ctime"
                     " WHERE commit_parents.ctime IS NULL",
                     [(c, " ".join(ps), times.get(c)) for c, ps in parents.items()])


def commit_facts(conn: Conn, commits: Sequence[str]) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    """commit -> (the versions that introduced it, oldest first; its parents),
    for those of COMMITS whose parents a build recorded (per 500 a query)."""
    concat = "group_concat(version)" if conn.dialect == "sqlite" else "string_agg(version::text, ',')"
    rows = _rows_in(conn, "SELECT p.commit_oid, p.parents, (SELECT " + concat + " FROM"
                          " (SELECT version FROM introduced i WHERE i.commit_oid = p.commit_oid ORDER BY version) o)"
                          " FROM commit_parents p WHERE p.commit_oid IN (%s)", list(dict.fromkeys(commits)))
    return {c: (tuple(int(v) for v in vs.split(",")) if vs else (), tuple(ps.split())) for c, ps, vs in rows}


def commit_times(conn: Conn, commits: Sequence[str]) -> dict[str, int]:
    """commit -> its committer time, for those of COMMITS a build recorded it for."""
    rows = _rows_in(conn, "SELECT commit_oid, ctime FROM commit_parents WHERE ctime IS NOT NULL AND"
                          " commit_oid IN (%s)", list(dict.fromkeys(commits)))
    return {c: t for c, t in rows}


def _rows_in(conn: Conn, query: str, keys: Sequence[str]) -> Iterator[tuple]:
    """QUERY's rows with its `IN (%s)` filled with KEYS, one query per 500 of them."""
    for i in range(0, len(keys), 500):
        part = keys[i:i + 500]
        yield from conn.execute(query % ",".join("?" * len(part)), part)


def pending_versions(conn: Conn) -> list[tuple[int, Optional[str], float]]:
    """(id, owner, committed at) of versions whose refs may not be on disk yet."""
    return list(conn.execute("SELECT id, owner, at FROM versions WHERE state = 'pending' ORDER BY id"))


def version_updates(conn: Conn, version: int) -> list[tuple[str, str, str, int, Optional[str], Optional[str]]]:
    return list(conn.execute("SELECT ref, old, new, ff, type, peeled FROM updates WHERE version = ? ORDER BY ref",
                             (version,)))


def insert_replica_packs(conn: Conn, version: int, names: Iterable[str]) -> None:
    conn.executemany("INSERT INTO replica_packs(version, name) VALUES (?, ?) ON CONFLICT DO NOTHING",
                     [(version, n) for n in names])


def replica_plan(conn: Conn, after: int, through: int) -> list[tuple[int, tuple[str, ...], tuple[str, ...]]]:
    """For each version in (AFTER, THROUGH], oldest first: (version, the values
    it wrote, the pack store's names of the objects it introduced)."""
    values: dict[int, list[str]] = {}
    for v, new in conn.execute("SELECT version, new FROM updates WHERE version > ? AND version <= ? AND new != ?",
                               (after, through, ZERO)):
        values.setdefault(v, []).append(new)
    packs: dict[int, list[str]] = {}
    for v, name in conn.execute("SELECT version, name FROM replica_packs WHERE version > ? AND version <= ?",
                                (after, through)):
        packs.setdefault(v, []).append(name)
    return [(v, tuple(values.get(v, ())), tuple(sorted(packs.get(v, ()))))
            for v in sorted(set(values) | set(packs))]


def version_values(conn: Conn, version: int) -> list[str]:
    """The values VERSION wrote (deletions left out)."""
    return [r[0] for r in conn.execute("SELECT DISTINCT new FROM updates WHERE version = ? AND new != ?",
                                       (version, ZERO))]


def rewritten_since(conn: Conn, version: int) -> bool:
    """Did any update from VERSION on delete a ref or move it other than
    forward (external versions record every change of a value as not
    fast-forward; creations are neither)?"""
    return rewritten_between(conn, version, 1 << 62)


def void_update(conn: Conn, version: int, ref: str) -> None:
    """VERSION never moved REF on disk: its update becomes a no-op and REF's tips from it go."""
    conn.execute("UPDATE updates SET new = old, ff = 1 WHERE version = ? AND ref = ?", (version, ref))
    conn.execute("DELETE FROM tips WHERE version = ? AND ref = ?", (version, ref))


def introduced_commits(conn: Conn, version: int) -> list[str]:
    """The commits VERSION introduced."""
    return [c for (c,) in conn.execute("SELECT commit_oid FROM introduced WHERE version = ?", (version,))]


def drop_introduced(conn: Conn, version: int) -> None:
    conn.execute("DELETE FROM introduced WHERE version = ?", (version,))


def claim_pending(conn: Conn, version: int, owner: Optional[str], me: str) -> bool:
    """Take over pending VERSION from its dead OWNER (False when someone else did first)."""
    return conn.execute("UPDATE versions SET owner = ? WHERE id = ? AND state = 'pending'"
                        " AND owner IS NOT DISTINCT FROM ?",
                        (me, version, owner)).rowcount == 1


def latest_done_update(conn: Conn, ref: str) -> Optional[tuple[str, Optional[str], Optional[str], int]]:
    """(new, type, peeled, version) of REF's newest update among done versions."""
    return conn.execute("SELECT u.new, u.type, u.peeled, u.version FROM updates u JOIN versions v ON v.id = u.version"
                        " WHERE u.ref = ? AND v.state = 'done' ORDER BY u.version DESC LIMIT 1", (ref,)).fetchone()


def mark_done(conn: Conn, version: int) -> bool:
    return conn.execute("UPDATE versions SET state = 'done', owner = NULL WHERE id = ? AND state = 'pending'",
                        (version,)).rowcount == 1


def versions_desc(conn: Conn, limit: Optional[int], before: Optional[int] = None) -> list[Version]:
    q = f"SELECT id, kind, who, at, push_id, state, {'node' if store_schema(conn) >= 11 else 'NULL'} FROM versions"
    args: list = []
    if before is not None:
        q += " WHERE id < ?"
        args.append(before)
    q += " ORDER BY id DESC"
    if limit is not None:
        q += " LIMIT ?"
        args.append(limit)
    rows = list(conn.execute(q, args))
    out = []
    for vid, kind, who, at, push_id, state, node in rows:
        ups = tuple(Update(r, o, n, bool(f)) for r, o, n, f, _, _ in version_updates(conn, vid))
        out.append(Version(vid, kind, who, at, push_id, state, ups, push_cert(conn, vid) if kind == "push" else None,
                           node))
    return out


# -- the hash chain (model/chain.py) ------------------------------------------------------------

def chain_tail(conn: Conn) -> Optional[tuple[int, str]]:
    """(version, hash) of the newest chained version, or None."""
    return conn.execute("SELECT version, hash FROM chain ORDER BY version DESC LIMIT 1").fetchone()


def unchained_done(conn: Conn, after: int) -> list[tuple[int, str, Optional[str], float, Optional[str]]]:
    """(id, kind, who, at, push_id) of the versions after AFTER, in order, up
    to the first that is not done (a pending one is chained once done)."""
    out = []
    for vid, kind, who, at, push_id, state in conn.execute(
            "SELECT id, kind, who, at, push_id, state FROM versions WHERE id > ? ORDER BY id", (after,)):
        if state != "done":
            break
        out.append((vid, kind, who, at, push_id))
    return out


def insert_link(conn: Conn, version: int, prev: str, hash_: str, start: bool, text: str) -> None:
    conn.execute("INSERT INTO chain(version, prev, hash, start, text) VALUES (?, ?, ?, ?, ?)",
                 (version, prev, hash_, int(start), text))


def chain_links(conn: Conn, after: int = 0, limit: Optional[int] = None) -> list[tuple[int, str, str, int, str]]:
    """(version, prev, hash, start, text) of the chained versions after AFTER, oldest first."""
    q = "SELECT version, prev, hash, start, text FROM chain WHERE version > ? ORDER BY version"
    if limit is not None:
        q += f" LIMIT {int(limit)}"
    return list(conn.execute(q, (after,)))


def chain_of(conn: Conn, versions: Sequence[int]) -> dict[int, tuple[str, str, int]]:
    """version -> (prev, hash, start) for those of VERSIONS that are chained."""
    return {v: (p, h, st) for v, p, h, st in
            _rows_in(conn, "SELECT version, prev, hash, start FROM chain WHERE version IN (%s)", list(versions))}


def version_row(conn: Conn, version: int) -> Optional[tuple[str, Optional[str], float, Optional[str]]]:
    """(kind, who, at, push_id) of VERSION."""
    return conn.execute("SELECT kind, who, at, push_id FROM versions WHERE id = ?", (version,)).fetchone()


def push_cert_text(conn: Conn, version: int) -> Optional[bytes]:
    row = conn.execute("SELECT cert FROM push_certs WHERE version = ?", (version,)).fetchone()
    return None if row is None else bytes(row[0])


def count_versions(conn: Conn) -> int:
    return conn.execute("SELECT count(*) FROM versions").fetchone()[0]


# -- history queries ---------------------------------------------------------------------------

def value_row_at(conn: Conn, ref: str, version: int) -> tuple[Optional[str], Optional[int]]:
    """The value of REF after VERSION (None if it did not exist) and the
    version of the update row that says so (None when no row did)."""
    row = conn.execute("SELECT new, version FROM updates WHERE ref = ? AND version <= ?"
                       " AND version NOT IN (SELECT id FROM versions WHERE state = 'pending')"
                       " ORDER BY version DESC LIMIT 1", (ref, version)).fetchone()
    if row is None:
        return None, None
    return (None if row[0] == ZERO else row[0]), row[1]


def last_rewind(conn: Conn, ref: str, version: int) -> Optional[tuple[int, Optional[str]]]:
    """REF's latest update up to VERSION that was no fast-forward (its
    creation, a deletion, a forced move, or one not known to be a
    fast-forward): its version and the value it wrote (None for a
    deletion); None when it has none. VERSION is a settled one (no pending
    version below it)."""
    row = conn.execute("SELECT version, new FROM updates WHERE ref = ? AND version <= ? AND ff = 0"
                       " ORDER BY version DESC LIMIT 1", (ref, version)).fetchone()
    if row is None:
        return None
    return row[0], (None if row[1] == ZERO else row[1])


def ff_flags(conn: Conn, ref: str, versions: Sequence[int],
             nodes: Sequence[tuple[int, int]]) -> tuple[dict[int, bool], dict[tuple[int, int], bool]]:
    """The fast-forward flag of REF's update in each of VERSIONS, and its
    all-fast-forward flag in each segment node of NODES (level, idx), in one
    query each; a version or node that left REF alone is absent."""
    updates: dict[int, bool] = {}
    segs: dict[tuple[int, int], bool] = {}
    for i in range(0, len(versions), 500):
        part = list(versions[i:i + 500])
        for v, ff in conn.execute(f"SELECT version, ff FROM updates WHERE ref = ? AND version IN"
                                  f" ({','.join('?' * len(part))})", [ref, *part]):
            updates[v] = bool(ff)
    for i in range(0, len(nodes), 250):
        part = nodes[i:i + 250]
        pairs = ",".join("(?, ?)" for _ in part)
        for level, idx, ff in conn.execute(f"SELECT level, idx, all_ff FROM segment_refs WHERE ref = ? AND"
                                           f" (level, idx) IN (VALUES {pairs})",
                                           [ref, *(x for node in part for x in node)]):
            segs[(level, idx)] = bool(ff)
    return updates, segs


def tips_of(conn: Conn, commit: str) -> list[tuple[int, str]]:
    return list(conn.execute("SELECT version, ref FROM tips WHERE commit_oid = ? ORDER BY version, ref", (commit,)))


def tips_of_many(conn: Conn, commits: Sequence[str]) -> dict[str, list[tuple[int, str]]]:
    """tips_of() for every one of COMMITS, one query per 500 of them."""
    out: dict[str, list[tuple[int, str]]] = {c: [] for c in commits}
    for c, v, r in _rows_in(conn, "SELECT commit_oid, version, ref FROM tips WHERE commit_oid IN (%s)"
                                  " ORDER BY commit_oid, version, ref", list(out)):
        out[c].append((v, r))
    return out


def _versions_naming(conn: Conn, table: str, commits: Sequence[str]) -> dict[str, list[int]]:
    """Each of COMMITS -> the versions of TABLE's rows that name it, oldest
    first; one query per 500 of them."""
    out: dict[str, list[int]] = {c: [] for c in commits}
    for c, v in _rows_in(conn, f"SELECT commit_oid, version FROM {table} WHERE commit_oid IN (%s)"
                               " ORDER BY commit_oid, version", list(out)):
        out[c].append(v)
    return out


def introduced_by_many(conn: Conn, commits: Sequence[str]) -> dict[str, list[int]]:
    """introduced_by() for every one of COMMITS."""
    return _versions_naming(conn, "introduced", commits)


def bounded_by_many(conn: Conn, commits: Sequence[str]) -> dict[str, list[int]]:
    """Each of COMMITS -> the versions whose boundary holds it."""
    return _versions_naming(conn, "boundaries", commits)


def introduced_by(conn: Conn, commit: str) -> list[int]:
    return [v for (v,) in conn.execute("SELECT version FROM introduced WHERE commit_oid = ? ORDER BY version",
                                       (commit,))]


# -- segments -----------------------------------------------------------------------------------

def segment_summary(conn: Conn, level: int, idx: int, lo: int, hi: int) -> dict[str, tuple[str, str, bool]]:
    """ref -> (first old, last new, all fast-forward) over versions LO … HI."""
    if level == 0:
        rows = conn.execute("SELECT ref, old, new, ff FROM updates WHERE version = ?", (lo,))
        return {r: (o, n, bool(f)) for r, o, n, f in rows}
    rows = conn.execute("SELECT ref, first_old, last_new, all_ff FROM segment_refs WHERE level = ? AND idx = ?",
                        (level, idx))
    return {r: (o, n, bool(f)) for r, o, n, f in rows}


def insert_segment(conn: Conn, level: int, idx: int, lo: int, hi: int,
                   summary: dict[str, tuple[str, str, bool]]) -> None:
    conn.execute("INSERT INTO segments(level, idx, lo, hi, refs) VALUES (?, ?, ?, ?, ?) ON CONFLICT (level, idx)"
                 " DO UPDATE SET lo = excluded.lo, hi = excluded.hi, refs = excluded.refs",
                 (level, idx, lo, hi, len(summary)))
    conn.execute("DELETE FROM segment_refs WHERE level = ? AND idx = ?", (level, idx))
    conn.executemany("INSERT INTO segment_refs(level, idx, ref, first_old, last_new, all_ff) VALUES (?, ?, ?, ?, ?, ?)",
                     [(level, idx, r, o, n, int(f)) for r, (o, n, f) in summary.items()])


def segment_counts(conn: Conn) -> tuple[int, int, int]:
    """(segments, segment rows, highest level)."""
    row = conn.execute("SELECT count(*), CAST(coalesce(sum(refs), 0) AS BIGINT), coalesce(max(level), 0) FROM segments").fetchone()
    return row[0], row[1], row[2]


# -- version packs ------------------------------------------------------------------------------

def versions_without_pack(conn: Conn, limit: int) -> list[int]:
    """Done versions, oldest first, that have no version pack yet."""
    return [v for (v,) in conn.execute(
        "SELECT id FROM versions WHERE state = 'done' AND id NOT IN (SELECT version FROM version_packs)"
        " ORDER BY id LIMIT ?", (limit,))]


def pg_unbuilt_count(url: str, repo: str) -> Optional[int]:
    """unbuilt_count() of the store of the repository known as REPO in the
    database at URL, waiting at most 200 ms; None when it cannot be read."""
    conn = pgconn.PgConn(url, pg_schema(repo), 1, PG_USE_SCHEMA)
    try:
        with patience(0.2):
            return _retry(lambda: conn.execute(_UNBUILT).fetchone()[0])
    except (Error, Busy):
        return None


def pg_known(url: str, repo: str) -> bool:
    """Whether the database at URL has a store for the repository known as REPO."""
    conn = pgconn.PgConn(url, "public", 1, PG_USE_SCHEMA)
    with patience(READ_WAIT):
        return _registered(conn, repo) is not None


_UNBUILT = "SELECT count(*) FROM versions WHERE state = 'done' AND id NOT IN (SELECT version FROM version_packs)"


def unbuilt_count(path: str) -> Optional[int]:
    """How many done versions of the store at PATH have no version pack yet,
    read over a brief read-only connection (a metrics scrape: it waits at
    most 200 ms for a locked store, and its close neither checkpoints nor
    removes the write-ahead log; like any reader it makes `-wal` and `-shm`
    beside the file when no connection had); None when it cannot be read."""
    try:
        from urllib.parse import quote  # startup: only the metrics page reads a store this way
        conn = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True, timeout=0.2, isolation_level=None)
    except sqlite3.Error:
        return None
    try:
        return conn.execute(_UNBUILT).fetchone()[0]
    except sqlite3.Error:
        return None
    finally:
        conn.close()


def refs_before(conn: Conn, version: int) -> dict[str, str]:
    """S_{v-1}: every ref's value after the done versions before VERSION (one pass over history)."""
    return {name: r.oid for name, r in _replay(conn, version - 1).items()}


def _replay(conn: Conn, version: int) -> dict[str, StoredRef]:
    """Every direct ref as the done versions up to VERSION left it, in the
    order the updates first set it (one pass over history)."""
    out: dict[str, StoredRef] = {}
    rows = conn.execute("SELECT u.ref, u.new, u.type, u.peeled FROM updates u JOIN versions v ON v.id = u.version"
                        " WHERE v.state = 'done' AND u.version <= ? ORDER BY u.version", (version,))
    for ref, new, otype, peeled in rows:
        if is_null(new):
            out.pop(ref, None)
        else:
            out[ref] = StoredRef(ref, new, None, otype, peeled)
    return out


def refs_at(conn: Conn, version: int) -> list[StoredRef]:
    """Every direct ref as the done versions up to VERSION left it, with its
    type and peeled value (a time-travel view), by name."""
    out = _replay(conn, version)
    return [out[n] for n in sorted(out)]


def symrefs(conn: Conn) -> list[StoredRef]:
    """The symbolic refs under refs/ (the store keeps no history of them)."""
    return [StoredRef(n, None, s) for n, s in
            conn.execute("SELECT name, symref FROM refs WHERE symref IS NOT NULL ORDER BY name")]


def version_at_time(conn: Conn, at: float) -> int:
    """The latest done version committed at or before AT (0: none), to the
    microsecond, the finest a time can be written in: compared as floats, a
    version's own time written to the microsecond and read back fell an ulp
    short of it 0.6% of the time (tests/test_undo.py failed so)."""
    row = conn.execute("SELECT max(id) FROM versions WHERE state = 'done' AND CAST(at * 1000000 AS BIGINT) <= ?",
                       (round(at * 1_000_000),)).fetchone()
    return row[0] or 0


def rewritten_between(conn: Conn, lo: int, hi: int) -> bool:
    """rewritten_since(LO), counting only the versions up to HI."""
    zero = ZERO
    return conn.execute("SELECT EXISTS (SELECT 1 FROM updates WHERE version >= ? AND version <= ? AND old != ?"
                        " AND (new = ? OR ff = 0))", (lo, hi, zero, zero)).fetchone()[0] == 1


def record_pack(conn: Conn, version: int, name: str, objects: int, size: int, at: float,
                window: int, depth: int, compression: int, boundary: Iterable[str]) -> None:
    conn.execute("INSERT INTO version_packs(version, name, objects, size, built_at, \"window\", depth,"
                 " compression) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (version) DO UPDATE SET"
                 " name = excluded.name, objects = excluded.objects, size = excluded.size,"
                 " built_at = excluded.built_at, \"window\" = excluded.\"window\", depth = excluded.depth,"
                 " compression = excluded.compression",
                 (version, name, objects, size, at, window, depth, compression))
    conn.executemany("INSERT INTO boundaries(version, commit_oid) VALUES (?, ?) ON CONFLICT DO NOTHING",
                     [(version, c) for c in boundary])


def version_pack(conn: Conn, version: int) -> Optional[tuple[str, int, int]]:
    """(name, objects, size) of VERSION's pack, if built."""
    return conn.execute("SELECT name, objects, size FROM version_packs WHERE version = ?", (version,)).fetchone()


def version_pack_window(conn: Conn, version: int) -> Optional[tuple[str, int, float]]:
    """(name, delta window, built at) of VERSION's pack, if built."""
    return conn.execute("SELECT name, \"window\", built_at FROM version_packs WHERE version = ?",
                        (version,)).fetchone()


def replace_pack(conn: Conn, version: int, name: str, objects: int, size: int, at: float,
                 window: int, depth: int, compression: int) -> None:
    """VERSION's pack is now NAME (the same objects, searched wider); its other records stay."""
    conn.execute("UPDATE version_packs SET name = ?, objects = ?, size = ?, built_at = ?, \"window\" = ?,"
                 " depth = ?, compression = ? WHERE version = ?",
                 (name, objects, size, at, window, depth, compression, version))


def built_records(conn: Conn, lo: int, hi: int) -> dict[int, tuple[str, list[str], list[str], list[str], list[str]]]:
    """Each version LO … HI that has its pack -> (pack name, boundary, refs
    updated, values written, commits introduced), each list as the
    one-version queries order it."""
    out = {v: (name, [], [], [], []) for v, name in
           conn.execute("SELECT version, name FROM version_packs WHERE version BETWEEN ? AND ?", (lo, hi))}
    for v, c in conn.execute("SELECT version, commit_oid FROM boundaries WHERE version BETWEEN ? AND ?"
                             " ORDER BY version, commit_oid", (lo, hi)):
        if v in out:
            out[v][1].append(c)
    for v, ref, new in conn.execute("SELECT version, ref, new FROM updates WHERE version BETWEEN ? AND ?"
                                    " ORDER BY version, ref", (lo, hi)):
        if v in out:
            out[v][2].append(ref)
            if new != ZERO and new not in out[v][3]:
                out[v][3].append(new)
    for v, c in conn.execute("SELECT version, commit_oid FROM introduced WHERE version BETWEEN ? AND ?", (lo, hi)):
        if v in out:
            out[v][4].append(c)
    return out


def version_boundary(conn: Conn, version: int) -> list[str]:
    return [c for (c,) in conn.execute("SELECT commit_oid FROM boundaries WHERE version = ? ORDER BY commit_oid",
                                       (version,))]


def packed_through(conn: Conn) -> int:
    """The highest version V such that every version up to V is done and has its version pack."""
    row = conn.execute("SELECT min(id) FROM versions WHERE state != 'done'"
                       " OR id NOT IN (SELECT version FROM version_packs)").fetchone()
    return latest_version(conn) if row[0] is None else row[0] - 1


def commits_recorded(conn: Conn, lo: int, hi: int) -> set[str]:
    """Every commit a tips, introduced or boundaries row of versions LO … HI names."""
    return {c for (c,) in conn.execute("SELECT commit_oid FROM tips WHERE version BETWEEN ? AND ?"
                                       " UNION SELECT commit_oid FROM introduced WHERE version BETWEEN ? AND ?"
                                       " UNION SELECT commit_oid FROM boundaries WHERE version BETWEEN ? AND ?",
                                       (lo, hi, lo, hi, lo, hi))}


# -- segment packs ------------------------------------------------------------------------------

def segment_packs(conn: Conn) -> list[tuple[int, int, str, int, int]]:
    """(lo, hi, name, objects, size) of every recorded segment pack, by lo then hi."""
    return list(conn.execute("SELECT lo, hi, name, objects, size FROM segment_packs ORDER BY lo, hi"))


def record_segment_pack(conn: Conn, lo: int, hi: int, name: str, objects: int, size: int, at: float,
                        window: int, depth: int, compression: int) -> None:
    conn.execute("INSERT INTO segment_packs(lo, hi, name, objects, size, built_at, \"window\", depth,"
                 " compression) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (lo, hi) DO UPDATE SET"
                 " name = excluded.name, objects = excluded.objects, size = excluded.size,"
                 " built_at = excluded.built_at, \"window\" = excluded.\"window\", depth = excluded.depth,"
                 " compression = excluded.compression",
                 (lo, hi, name, objects, size, at, window, depth, compression))


def delete_segment_pack(conn: Conn, lo: int, hi: int) -> None:
    conn.execute("DELETE FROM segment_packs WHERE lo = ? AND hi = ?", (lo, hi))


def pack_names(conn: Conn) -> set[str]:
    """Every pack name a version or segment row refers to."""
    return {n for (n,) in conn.execute("SELECT name FROM version_packs UNION SELECT name FROM segment_packs") if n}


def checkpoint(conn: Conn) -> None:
    """SQLite: the write-ahead log folded into the file (PostgreSQL keeps its own)."""
    if conn.dialect == "sqlite":
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("PRAGMA optimize")


def integrity(conn: Conn) -> list[str]:
    """SQLite's quick check of the file; PostgreSQL: that the store's schema is whole."""
    if conn.dialect == "sqlite":
        return [r[0] for r in conn.execute("PRAGMA quick_check") if r[0] != "ok"]
    have = {t for (t,) in conn.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = ?",
                                       (conn.schema,))}
    return [f"table {t} is missing" for t in PG_TABLES if t not in have]


def replay_refs(conn: Conn) -> dict[str, str]:
    """The direct refs as the updates of all done versions leave them."""
    return refs_before(conn, latest_version(conn) + 1)
