"""The ref stores in PostgreSQL: the database's list of stores, a store's
making, adoption and migration, and the cluster's lists of nodes and of who
holds each pack. Each store's own rows are read and written by db.py's
queries, which run on both engines."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from . import db, pgconn
from .db import PG_USE_SCHEMA, READ_WAIT, UNBUILT, Busy, Conn, Error, patience, pg_lock_key
from .db_schema import OLDEST_STORE, PG_MIGRATIONS, READS_FROM, SCHEMA, SCHEMA_VERSION, pg_ddl

_retry = db.retry


# One database holds every repository's store, each in a schema of its own
# (pg_schema(): the same tables as a SQLite file, so every query of db.py
# runs on both), listed in public.aspen_stores. Its types differ:
# integers are 64-bit as SQLite's, text compares bytewise as SQLite's (the
# "C" collation), times are double precision. A schema is made at
# SCHEMA_VERSION, and the list records with it the oldest Aspen that reads it
# (READS_FROM). Nodes of two releases run side by side while a cluster is
# upgraded (docs/cluster.md, "Upgrading"): this Aspen reads and writes a store
# one migration behind in that store's own shape (store_schema(conn)), moves
# it on (pg_migrate) once every node can read the result, reads a newer store
# whose READS_FROM it meets, and writes nothing to a store it cannot read.

PG_REGISTRY = ('CREATE TABLE IF NOT EXISTS public.aspen_stores (repo TEXT COLLATE "C" PRIMARY KEY,'
               ' schema_name TEXT NOT NULL UNIQUE, schema_version INTEGER NOT NULL, made TEXT NOT NULL,'
               ' created_at DOUBLE PRECISION, reads_from INTEGER)')
PG_REGISTRY_READS_FROM = "ALTER TABLE public.aspen_stores ADD COLUMN IF NOT EXISTS reads_from INTEGER"
PG_LOCK_REGISTRY = 7_041_729_385_113   # the advisory lock taken while a store's schema is made


def pg_schema(repo: str) -> str:
    """The schema of the store of the repository known as REPO (its path under the project root)."""
    import hashlib  # startup: only for a PostgreSQL store
    return "r_" + hashlib.sha1(repo.encode("utf-8", "surrogateescape")).hexdigest()[:24]


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


def writable_schema(conn: Conn, repo: str) -> Optional[str]:
    """Inside a write transaction: None when this Aspen may write the store of
    REPO (its schema read again, and kept for this transaction's statements),
    else git's error text. A newer Aspen's store is not written: this one
    may not know what its rows must hold."""
    if conn.dialect != "postgresql":
        return None
    at = pg_store_schema(conn, repo)
    if at is None or not OLDEST_STORE <= at <= SCHEMA_VERSION:
        return f"failed to update ref (the ref log is at schema {at}, this server writes {SCHEMA_VERSION})"
    conn.store_schema = at
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
                         ("SELECT pg_advisory_xact_lock(?)", (pg_lock_key(conn.schema),))])
    try:
        conn.execute(PG_REGISTRY_READS_FROM)
        row = conn.execute("SELECT schema_version FROM public.aspen_stores WHERE repo = ?", (repo,)).fetchone()
        if row is None or not OLDEST_STORE <= row[0] < SCHEMA_VERSION:
            conn.commit()
            return SCHEMA_VERSION if row is None else row[0]
        for n in range(row[0], SCHEMA_VERSION):
            for statement in PG_MIGRATIONS[n]:
                conn.execute(pg_ddl(statement))
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
                conn.execute(pg_ddl(statement))
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


def pg_unbuilt_count(url: str, repo: str) -> Optional[int]:
    """unbuilt_count() of the store of the repository known as REPO in the
    database at URL, waiting at most 200 ms; None when it cannot be read."""
    conn = pgconn.PgConn(url, pg_schema(repo), 1, PG_USE_SCHEMA)
    try:
        with patience(0.2):
            return _retry(lambda: conn.execute(UNBUILT).fetchone()[0])
    except (Error, Busy):
        return None


def pg_known(url: str, repo: str) -> bool:
    """Whether the database at URL has a store for the repository known as REPO."""
    conn = pgconn.PgConn(url, "public", 1, PG_USE_SCHEMA)
    with patience(READ_WAIT):
        return _registered(conn, repo) is not None
