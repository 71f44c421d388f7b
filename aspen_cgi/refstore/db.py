"""Every query of the ref store, on SQLite and PostgreSQL alike, and its
transactions; with db_schema.py (the schema and its migrations) and
db_postgres.py (the database of stores in PostgreSQL), every line of SQL
Aspen runs. Nothing else imports sqlite3.

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
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Literal, Mapping, Optional, Sequence, TypeVar, Union

from .. import settings
from ..model.versions import ZERO, PushCert, StoredRef, Update, Version, is_null
from ..runtime import flocks
from . import pgconn
from .db_schema import MIGRATIONS, PG_TABLES, SCHEMA, SCHEMA_VERSION, schema_tools

BUSY_MS = 1000           # one statement's wait inside SQLite's busy handler
RETRY_SECONDS = 120.0    # total patience, unless the caller set its own
READ_WAIT = 2.0          # a request that only reads refs: then they come from the disk
STORE_WAIT = settings.default("ASPEN_STORE_WAIT")   # a push's default patience for a locked store

T = TypeVar("T")
if TYPE_CHECKING:
    Conn = Union["_Connection", pgconn.PgConn]   # the same few methods
else:
    Conn = sqlite3.Connection       # or a pgconn.PgConn: the same few methods
Error = sqlite3.Error           # either engine's (pgconn.StoreError is one)


class Unstorable(sqlite3.DataError):
    """Refs the store cannot hold: a ref name that is not UTF-8, which git
    itself made (update-ref, another server). Their readers serve the disk."""


class Busy(Exception):
    """The database stayed locked past RETRY_SECONDS."""


class _Connection(sqlite3.Connection):
    """A connection that holds the file its writers queue on."""
    dialect: Literal["sqlite"] = "sqlite"
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


PG_USE_SCHEMA = "SELECT set_config('search_path', %s, false)"   # points a PostgreSQL connection at a store


def pg_lock_key(schema: str) -> int:
    """The advisory lock a store's writers take turns on (64 bits of its schema's name)."""
    import hashlib  # startup: only for a PostgreSQL store
    return int.from_bytes(hashlib.sha1(schema.encode()).digest()[:8], "big", signed=True)


def store_schema(conn: Conn) -> int:
    """The schema of the store CONN is open on, as last read (a SQLite file is always at SCHEMA_VERSION)."""
    return getattr(conn, "store_schema", 0) or SCHEMA_VERSION


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
                         ("SELECT pg_advisory_xact_lock(?)", (pg_lock_key(conn.schema),))])
    try:
        out = fn(conn)
        conn.commit()
        return out
    except UnicodeEncodeError as e:
        conn.rollback()
        raise _unstorable(e) from None
    except BaseException:
        conn.rollback()
        raise


def _bound_wait(conn: _Connection, deadline: float) -> None:
    """SQLite's own wait for the lock: BUSY_MS, or what is left of the patience."""
    ms = int(min(BUSY_MS, max(0.0, deadline - time.monotonic()) * 1000))
    if getattr(conn, "busy_ms", BUSY_MS) != ms:
        conn.execute(f"PRAGMA busy_timeout={ms}")
        conn.busy_ms = ms


def _write_once(conn: _Connection, fn: Callable[[Conn], T], deadline: float) -> T:
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
    return None if row is None else PushCert(row[0], row[1], row[2], row[3], row[4], row[5], row[6], bytes(row[7]))


UpdateRow = tuple[str, Optional[str], Optional[str], bool, Optional[str], Optional[str]]   # insert_updates()'s


def insert_updates(conn: Conn, version: int, rows: Iterable[UpdateRow]) -> None:
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


def _rows_in(conn: Conn, query: str, keys: Sequence[Union[str, int]]) -> Iterator[tuple]:
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
        chunk = nodes[i:i + 250]
        pairs = ",".join("(?, ?)" for _ in chunk)
        for level, idx, ff in conn.execute(f"SELECT level, idx, all_ff FROM segment_refs WHERE ref = ? AND"
                                           f" (level, idx) IN (VALUES {pairs})",
                                           [ref, *(x for node in chunk for x in node)]):
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


UNBUILT = "SELECT count(*) FROM versions WHERE state = 'done' AND id NOT IN (SELECT version FROM version_packs)"


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
        return conn.execute(UNBUILT).fetchone()[0]
    except sqlite3.Error:
        return None
    finally:
        conn.close()


def refs_before(conn: Conn, version: int) -> dict[str, str]:
    """S_{v-1}: every ref's value after the done versions before VERSION (one pass over history)."""
    return {name: r.oid for name, r in _replay(conn, version - 1).items() if r.oid is not None}   # new: NOT NULL


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


def push_built(conn: Conn, push_id: str) -> bool:
    """Whether the push PUSH_ID made versions and each has its pack row."""
    made, built = conn.execute("SELECT count(*), count(p.version) FROM versions v"
                               " LEFT JOIN version_packs p ON p.version = v.id WHERE v.push_id = ?",
                               (push_id,)).fetchone()
    return bool(made) and made == built


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
    out: dict[int, tuple[str, list[str], list[str], list[str], list[str]]] = {v: (name, [], [], [], []) for v, name in
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
