"""A PostgreSQL ref store's connection, shaped like the sqlite3 one db.py uses.

db.py writes its SQL once, with `?` placeholders, and runs it on either
engine: `PgConn.execute()` turns `?` into psycopg's `%s` (once per
statement text) and returns the rows at once, as a small cursor. The SQL
itself, and what differs between the two dialects, stays in db.py.

Every repository's store is one schema of one database (`db_postgres.pg_schema()`),
so a store's statements name its tables as the SQLite file does. A
connection is borrowed from the process's pool (psycopg_pool, one per URL
and process, re-made after a fork) for one statement outside a transaction,
or for the whole of one; it is pointed at the store's schema when it was
last used for another.

psycopg is imported only here, and only when a PostgreSQL store is opened:
the embedded default never loads it. Its errors reach db.py as `StoreError`,
or `Retryable` for what is worth waiting out (a lock wait that timed out, a
serialization failure, a connection lost while the server still answers).

A server that is away is found once per process and then known: a lost or
refused connection, or no pooled connection within the pool's wait, is
checked at once with a connection of its own (`reachable`); if that fails
too the server is *away*, and every statement until a background probe
(one thread per process and server, every PROBE_EVERY seconds) connects
again raises `Unavailable` without trying: nobody waits for a pool or a
timeout meanwhile. A process's first pool is made only after such a check,
so a process started during an outage does not wait either."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import weakref
from typing import Any, Callable, Iterator, Literal, Sequence

_pools: dict[tuple[str, int], Any] = {}
_pools_lock = threading.Lock()
_schema_of: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
_texts: dict[str, str] = {}
GETCONN_WAIT = 1.0     # one wait for a pooled connection; db.py retries it within the caller's patience
RECONNECT_EVERY = 0.25        # while the server is away, the pool's next try (seconds)
RECONNECT_FOREVER = 10 * 365 * 86400.0
PROBE_EVERY = 0.1             # while the server is away, how often the probe tries to connect (seconds)
PROBE_TIMEOUT = 2             # one probe's connection attempt (libpq's least connect_timeout)
_away: dict[str, float] = {}        # server URL -> when this process found it away (monotonic)
_probers: dict[str, int] = {}       # server URL -> pid of the process whose thread probes it
_probers_lock = threading.Lock()


class StoreError(sqlite3.DatabaseError):
    """An error of the PostgreSQL ref store (psycopg's, as its cause). A
    DB-API DatabaseError of sqlite3's kind, so that db.Error (sqlite3.Error),
    which every caller of db.py catches, is either engine's."""


class Retryable(StoreError):
    """A PostgreSQL error that waiting may cure: a lock wait timed out, the
    server went away or refused the connection, a serialization failure."""


class Unavailable(StoreError):
    """The server is known to be away: the statement was not tried."""


def reachable(url: str) -> bool:
    """Whether the server at URL takes a connection now (one of its own, not the pool's)."""
    import psycopg  # startup: only a PostgreSQL store loads the driver
    try:
        psycopg.connect(url, connect_timeout=PROBE_TIMEOUT, autocommit=True).close()
        return True
    except psycopg.Error:
        return False


def _probe(url: str) -> None:
    """The probe thread's life: try URL every PROBE_EVERY seconds until it answers."""
    try:
        while True:
            time.sleep(PROBE_EVERY)
            if reachable(url):
                _away.pop(url, None)
                return
    finally:
        with _probers_lock:
            if _probers.get(url) == os.getpid():
                del _probers[url]


def _found_away(url: str) -> None:
    _away.setdefault(url, time.monotonic())
    _ensure_probe(url)


def _ensure_probe(url: str) -> None:
    """A probe thread of this process for URL (one that forked has none of its parent's)."""
    with _probers_lock:
        if _probers.get(url) == os.getpid():
            return
        _probers[url] = os.getpid()
    threading.Thread(target=_probe, args=(url,), name="aspen-pg-probe", daemon=True).start()


def _check_away(url: str) -> None:
    since = _away.get(url)
    if since is not None:
        _ensure_probe(url)
        raise Unavailable(f"the database server is away (found {time.monotonic() - since:.1f} s ago; "
                          f"tried again every {PROBE_EVERY:g} s)")


def _connection_lost(e: BaseException) -> bool:
    """A lost or refused connection, or no pooled one within the pool's wait:
    what may mean the server is away (lock waits and serialization failures do not)."""
    if "pool" in type(e).__module__:
        return True
    import psycopg  # startup: loaded with the pool already
    if not isinstance(e, psycopg.OperationalError):
        return False
    state = getattr(e, "sqlstate", None)
    return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03")


class Rows:
    """A statement's result, fetched whole: iterable, with fetchone() and rowcount."""
    __slots__ = ("rows", "rowcount", "_next")

    def __init__(self, rows: list, rowcount: int):
        self.rows = rows
        self.rowcount = rowcount
        self._next = 0

    def fetchone(self) -> Any:              # as sqlite3.Cursor's: the caller knows a row is there, or checks
        if self._next >= len(self.rows):
            return None
        self._next += 1
        return self.rows[self._next - 1]

    def fetchall(self) -> list:
        out, self._next = self.rows[self._next:], len(self.rows)
        return out

    def __iter__(self) -> Iterator[tuple]:
        rows, self._next = self.rows[self._next:], len(self.rows)
        return iter(rows)


def _text(sql: str) -> str:
    """SQL written with `?` as psycopg takes it (`%s`, and `%` doubled)."""
    out = _texts.get(sql)
    if out is None:
        out = _texts[sql] = sql.replace("%", "%%").replace("?", "%s")
    return out


def pool(url: str, size: int):
    """The process's connection pool for URL (made on first use, and again in a forked child)."""
    key = (url, os.getpid())
    p = _pools.get(key)
    if p is None:
        _check_away(url)
        with _pools_lock:
            p = _pools.get(key)
            if p is None:
                import logging  # startup: only a PostgreSQL store loads the driver
                try:
                    import psycopg_pool  # startup: only a PostgreSQL store loads the driver
                except ImportError as e:
                    raise StoreError(f"ASPEN_REFSTORE_URL is set but its driver is not installed ({e}): "
                                     "pip install 'aspen-cgi[cluster]'") from None
                # its reconnection attempts while the server is away would log one warning each:
                # db.py's retries (within the caller's patience) and Aspen's own log lines say it
                logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
                # While the server is away the pool tries again after 1 s, 2 s, 4 s, ... and gives up
                # after 5 minutes: a node would then serve its disk's refs (stale) for as long after
                # the server is back. Every RECONNECT_EVERY seconds instead, and never giving up.
                from psycopg_pool import base as pool_base  # startup
                pool_base.AttemptWithBackoff.INITIAL_DELAY = RECONNECT_EVERY
                pool_base.AttemptWithBackoff.DELAY_BACKOFF = 1.0
                if not reachable(url):
                    _found_away(url)
                    _check_away(url)
                p = psycopg_pool.ConnectionPool(url, min_size=1, max_size=max(1, size), open=True,
                                                timeout=GETCONN_WAIT, reconnect_timeout=RECONNECT_FOREVER,
                                                kwargs={"autocommit": True}, name="aspen-refstore")
                _pools[key] = p
    return p


def _wrap(e: Exception, url: str) -> StoreError:
    """E as db.py takes it; a lost connection to a server that is then not
    reachable is Unavailable, and the server known away from now on."""
    if isinstance(e, StoreError):
        return e
    if _connection_lost(e) and not reachable(url):
        _found_away(url)
        out: StoreError = Unavailable(f"the database server is away ({type(e).__name__}: {e})".strip())
        out.__cause__ = e
        return out
    import psycopg  # startup: loaded with the pool already
    from psycopg import errors
    retry = isinstance(e, (errors.LockNotAvailable, errors.SerializationFailure, errors.DeadlockDetected,
                           errors.QueryCanceled, psycopg.OperationalError, errors.AdminShutdown,
                           errors.CannotConnectNow))
    if isinstance(e, errors.UniqueViolation):
        retry = True       # two processes made the same first rows at once: the loser's retry sees them
    if not retry and "pool" in type(e).__module__:
        retry = True       # psycopg_pool.PoolTimeout: no connection within the pool's wait
    out = (Retryable if retry else StoreError)(f"{type(e).__name__}: {e}".strip())
    out.__cause__ = e
    return out


class PgConn:
    """One thread's connection to one repository's store (SCHEMA of the
    database at URL), with sqlite3.Connection's few methods db.py uses."""
    dialect: Literal["postgresql"] = "postgresql"

    def __init__(self, url: str, schema: str, pool_size: int, use_schema: str):
        self.url = url
        self.schema = schema
        self.pool_size = pool_size
        self._use_schema = use_schema        # db.py's statement that points a connection at a schema
        self._held = None                    # the connection of the transaction under way
        self.store_schema = 0                # the schema its store is at, as db.py last read it (0: not yet)

    @property
    def in_transaction(self) -> bool:
        return self._held is not None

    def _point(self, c) -> None:
        if _schema_of.get(c) != self.schema:
            c.execute(self._use_schema, (self.schema,))
            _schema_of[c] = self.schema

    def _run(self, fn: Callable[[Any], Any]) -> Any:
        try:
            if self._held is not None:
                return fn(self._held)
            _check_away(self.url)
            with pool(self.url, self.pool_size).connection() as c:
                self._point(c)
                return fn(c)
        except Exception as e:
            if _is_driver_error(e):
                raise _wrap(e, self.url) from e
            raise

    def execute(self, sql: str, params: Sequence = ()) -> Rows:
        def run(c) -> Rows:
            cur = c.execute(_text(sql), tuple(params) if params else None)
            rows = cur.fetchall() if cur.description is not None else []
            return Rows(rows, cur.rowcount)
        return self._run(run)

    def executemany(self, sql: str, seq: Sequence[Sequence]) -> Rows:
        seq = [tuple(p) for p in seq]

        def run(c) -> Rows:
            if not seq:
                return Rows([], 0)
            with c.cursor() as cur:
                cur.executemany(_text(sql), seq)
                return Rows([], cur.rowcount)
        return self._run(run)

    def begin(self, statement: str, setup: Sequence[tuple[str, Sequence]] = ()) -> None:
        """Start a transaction with STATEMENT on a connection held until
        commit() or rollback(), then run SETUP's (sql, params) in it."""
        if self._held is not None:
            raise StoreError("a transaction is under way on this connection")
        _check_away(self.url)
        p = pool(self.url, self.pool_size)
        import psycopg  # startup: loaded with the pool already
        try:
            c = p.getconn()
        except Exception as e:
            raise _wrap(e, self.url) from e
        try:
            self._point(c)
            c.execute(statement)
            self._held = c
            for sql, params in setup:
                c.execute(_text(sql), tuple(params) or None)
        except BaseException as e:
            self._held = None
            try:
                c.rollback()
            except psycopg.Error:
                pass
            p.putconn(c)
            if isinstance(e, psycopg.Error):
                raise _wrap(e, self.url) from e
            raise

    def _end(self, statement: str) -> None:
        c, self._held = self._held, None
        if c is None:
            return
        import psycopg  # startup: loaded with the pool already
        try:
            c.execute(statement)
        except psycopg.Error as e:
            try:
                c.rollback()
            except psycopg.Error:
                pass
            raise _wrap(e, self.url) from e
        finally:
            pool(self.url, self.pool_size).putconn(c)

    def commit(self) -> None:
        self._end("COMMIT")

    def rollback(self) -> None:
        self._end("ROLLBACK")

    def close(self) -> None:
        if self._held is not None:
            try:
                self.rollback()
            except StoreError:
                pass


def _is_driver_error(e: BaseException) -> bool:
    mod = type(e).__module__
    return mod.startswith("psycopg")


def close_pools() -> None:
    """Close this process's pools (tests, and a CLI command at its end)."""
    with _pools_lock:
        for key in [k for k in _pools if k[1] == os.getpid()]:
            try:
                _pools.pop(key).close()
            except Exception:
                pass
