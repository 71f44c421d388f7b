"""The ref store's schema: the numbered migrations of a SQLite file
(sqlite-utils, recorded in PRAGMA user_version), the schema they end in
(SCHEMA, made at once in an empty file; tests hold the two equal), and the
same in PostgreSQL's dialect (_pg_ddl, PG_MIGRATIONS). db.py runs them on a
SQLite file, db_postgres.py on a store in PostgreSQL."""

from __future__ import annotations

from typing import Callable

SCHEMA_VERSION = 11
READS_FROM = 10          # the oldest schema whose Aspen reads a store at SCHEMA_VERSION (recorded with each store)


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


def pg_ddl(statement: str) -> str:
    """A statement of SCHEMA in PostgreSQL's types (db_postgres.py)."""
    import re  # startup: only when a PostgreSQL store is made
    statement = re.sub(r"\bTEXT\b", 'TEXT COLLATE "C"', statement)
    statement = re.sub(r"\bINTEGER\b", "BIGINT", statement)
    statement = re.sub(r"\bREAL\b", "DOUBLE PRECISION", statement)
    return re.sub(r"\bBLOB\b", "BYTEA", statement)


PG_TABLES = ("versions", "updates", "tips", "introduced", "refs", "segments", "segment_refs", "state",
             "version_packs", "boundaries", "segment_packs", "commit_parents", "push_certs", "chain",
             "replica_packs")


# Statements moving a store's schema from N to N + 1 (their SQLite twins are MIGRATIONS[N]); a store
# older than the first is refused.
PG_MIGRATIONS: dict[int, tuple[str, ...]] = {
    10: ("ALTER TABLE versions ADD COLUMN IF NOT EXISTS node TEXT",),
}
OLDEST_STORE = min(PG_MIGRATIONS)


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
