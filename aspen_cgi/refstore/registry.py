"""Where a repository's ref store is and how this process reaches it:
the file or PostgreSQL schema a repository's state names (its record),
this process's connections to them (one per thread and store), the
database's list of stores (`aspen db`), the stores' read caches, and where a
repository's packs are kept (its state directory, a cluster's pack store
or node directory). store.RefStore is what is opened through it."""

from __future__ import annotations

import os
import threading
from typing import Callable, Optional

from .. import settings
from ..model import refs as refs_mod
from ..model.versions import StoredRef
from ..runtime.repository import Repository
from ..runtime.statedir import state_dir
from . import db, db_postgres, db_schema, replica
from .packstore import PackStore

DISABLE_ENV = "ASPEN_REFSTORE"        # off: serve refs straight from disk, no store (settings.py)
SENT_PREFIX = "sent-"  # packs/sent-<push id>.pack: the pack a push's client sent, until its version is built
_local = threading.local()         # this thread's connections: SQLite files ("conns"), PostgreSQL stores ("pg")
# What stores read, kept for the next request: the rows of a store's refs as of its head, and the
# snapshots made of them (store.RefStore._stored_rows, _view)
cached_rows: dict[str, tuple[tuple, list[StoredRef]]] = {}
cached_views: dict[tuple, tuple[list[StoredRef], refs_mod.RefSnapshot]] = {}
cache_lock = threading.Lock()


def sent_pack_path(packs_dir: str, push_id: str) -> str:
    """Where a push keeps the pack its client sent (SENT_PREFIX + push id), for its version's build."""
    return os.path.join(packs_dir, f"{SENT_PREFIX}{push_id}.pack")


def packs_dir_of(repo: Repository) -> Optional[str]:
    """The packs directory of the repository's store, without opening the store
    (a push must not open it before it may wait for it); None without a store
    (with a PostgreSQL store: without the repository's state directory)."""
    s = repo.settings
    if disabled(s):
        return None
    sdir = state_dir(repo.gitdir, s)
    if s.refstore_url:
        if not os.path.isdir(sdir):
            return None
        return push_pack_store(repo).directory if replica_mode(s) else os.path.join(sdir, "packs")
    return os.path.join(sdir, "packs") if os.path.isfile(os.path.join(sdir, "aspen.sqlite3")) else None


def replica_mode(s: settings.Settings) -> bool:
    """Whether this node is a replica of the log (docs/cluster.md): a
    PostgreSQL store, and a pack store or a node's URL (packs between nodes)."""
    return bool(s.refstore and s.refstore_url and (s.pack_store or s.node_url))


LOCAL_PACKS = ".aspen-packs"     # under GIT_PROJECT_ROOT: a node's own packs, without a shared pack store


def pack_root(s: settings.Settings, project_root: Optional[str]) -> str:
    """Where a replica keeps packs: the shared pack store, or this node's own
    directory under PROJECT_ROOT (ASPEN_NODE_URL: packs between nodes)."""
    if s.pack_store:
        return s.pack_store
    root = project_root
    if not root:
        raise OSError("ASPEN_NODE_URL is set but GIT_PROJECT_ROOT is not")
    return os.path.join(root, LOCAL_PACKS)


def push_pack_store(repo: Repository) -> PackStore:
    """The repository's directory in the pack store, without opening its store."""
    return PackStore(pack_root(repo.settings, repo.project_root), db_postgres.pg_schema(repo_key(repo)))


def materialize(repo_dir: str, served: Repository) -> bool:
    """A replica lacking a repository the log knows (a new node, a lost
    directory): make it empty at REPO_DIR (or REPO_DIR.git, as the log names
    it), for its first request's sync to fill. False when there is nothing
    to make."""
    s = served.settings
    if not replica_mode(s):
        return False
    for cand in (repo_dir,) if repo_dir.endswith(".git") else (repo_dir, repo_dir + ".git"):
        if os.path.isfile(os.path.join(cand, "HEAD")):
            return True                 # made meanwhile, by another request
        if os.path.lexists(cand):
            continue
        try:
            assert s.refstore_url is not None       # replica_mode(s) above
            if not db_postgres.pg_known(s.refstore_url, repo_key(served.at(cand))):
                continue
            os.makedirs(os.path.dirname(cand), exist_ok=True)
        except (OSError, db.Error, db.Busy):
            return False
        return replica.init_bare(served.at(cand))
    return False


def store_file_name(s: settings.Settings) -> str:
    """The file in a repository's state that says it has a store: the SQLite
    file, or the record of its PostgreSQL store."""
    return PG_RECORD if s.refstore_url else "aspen.sqlite3"


def repo_key(repo: Repository) -> str:
    """The name a PostgreSQL store knows the repository by: its absolute
    path; with ASPEN_CLUSTER, that name, a colon and its path under
    GIT_PROJECT_ROOT (the request's, else the process's), the same on every
    node serving that tree."""
    real = os.path.realpath(repo.gitdir)
    cluster = repo.settings.cluster
    if cluster:
        root = repo.project_root
        if not root:
            raise OSError("ASPEN_CLUSTER is set but GIT_PROJECT_ROOT is not")
        top = os.path.realpath(root).rstrip("/")
        if not real.startswith(top + "/"):
            raise OSError(f"{real} is not under GIT_PROJECT_ROOT ({top})")
        return f"{cluster}:{real[len(top) + 1:]}"
    return real


_pg_generation = 0


def forget_pg_stores() -> None:
    """Every thread looks its PostgreSQL stores up again (they were dropped: `aspen db drop`, tests)."""
    global _pg_generation
    _pg_generation += 1
    with cache_lock:
        cached_rows.clear()
        cached_views.clear()


def database_stores(url: str, init: bool = False) -> list[tuple[str, str, int]]:
    """(repository, schema, schema version) of every store in the PostgreSQL
    database at URL; INIT: make its list of stores first (`aspen db init`)."""
    conn = db.pgconn.PgConn(url, "public", 1, db.PG_USE_SCHEMA)
    if init:
        db.retry(lambda: db_postgres.pg_init(conn))
    return db.retry(lambda: db_postgres.pg_stores(conn))


def migrate_database_stores(url: str, progress: Optional[Callable[[int, int], None]] = None
                             ) -> list[tuple[str, int, int]]:
    """Move every store in the database at URL that is behind to this
    Aspen's schema (`aspen db migrate`): (repository, schema before, after)
    of each. PROGRESS(done, total) after each store."""
    listing = db.pgconn.PgConn(url, "public", 1, db.PG_USE_SCHEMA)
    stores = db.retry(lambda: db_postgres.pg_stores(listing))
    out = []
    for i, (repo, schema, before) in enumerate(stores):
        after = before
        if db_schema.OLDEST_STORE <= before < db.SCHEMA_VERSION:
            conn = db.pgconn.PgConn(url, schema, 1, db.PG_USE_SCHEMA)
            after = db.retry(lambda: db_postgres.pg_migrate(conn, repo))
        out.append((repo, before, after))
        if progress is not None:
            progress(i + 1, len(stores))
    forget_pg_stores()
    return out


def drop_database_store(url: str, repo: str) -> bool:
    """Remove the store of the repository known as REPO (`aspen db drop`); False: there was none."""
    conn = db.pgconn.PgConn(url, "public", 1, db.PG_USE_SCHEMA)
    gone = db.retry(lambda: db_postgres.pg_drop(conn, repo))
    forget_pg_stores()
    return gone


PG_RECORD = "aspen.pg"     # in a repository's state: the name and token of its store in PostgreSQL


def read_record(record: str) -> tuple[str, str]:
    """(the name of the store, the token of its making) that a repository's
    record of its PostgreSQL store says; ("", "") when there is none."""
    try:
        with open(record, encoding="utf-8", errors="surrogateescape") as f:
            named, known = (f.read().split("\n") + ["", ""])[:2]
        return named, known
    except FileNotFoundError:
        return "", ""


def unbuilt_count(path: str, url: Optional[str]) -> Optional[int]:
    """db.unbuilt_count() of the store whose file (SQLite's) or record
    (PostgreSQL's, in the database at URL) is PATH."""
    if path.endswith(PG_RECORD):
        named = read_record(path)[0]
        return db_postgres.pg_unbuilt_count(url, named) if url and named else None
    return db.unbuilt_count(path)


def forget_pg_connection(record: str) -> None:
    """This thread looks the PostgreSQL store RECORD names up again (it was dropped)."""
    conns = getattr(_local, "pg", None)
    if conns is not None:
        conns.pop(record, None)


def pg_connection(record: str, repo: Repository, create: bool) -> Optional[db.Conn]:
    """One connection per thread and repository of a PostgreSQL store (it
    borrows the process's pool's for each statement or transaction). RECORD
    (in the repository's state) names the store, as first opened, and the
    token of its making: a store in the database that the repository's
    state does not record was an earlier repository's (db_postgres.connect_pg). A
    record naming another repository came with a copy of that one's files."""
    conns = getattr(_local, "pg", None)
    if conns is None or getattr(_local, "pg_pid", None) != (os.getpid(), _pg_generation):
        conns = _local.pg = {}
        _local.pg_pid = (os.getpid(), _pg_generation)
    ident = file_id(record)
    cached = conns.get(record)
    if cached is not None and cached[1] == ident:
        return cached[0]
    key = repo_key(repo)

    def known() -> Optional[str]:
        named, token = read_record(record)
        return token if named == key and token else None    # a copied state names another repository

    def keep(token: str) -> None:
        tmp = f"{record}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(f"{key}\n{token}\n")
        os.replace(tmp, record)

    s = repo.settings
    assert s.refstore_url is not None           # a PostgreSQL store's record: the URL is set
    conn = db_postgres.connect_pg(s.refstore_url, key, s.refstore_pool, create, known, keep, adopt=replica_mode(s),
                                  may_migrate=lambda: may_migrate(s))
    if conn is None:
        return None
    ident = file_id(record)
    conns[record] = (conn, ident)
    return conn


def may_migrate(s: settings.Settings) -> bool:
    """Whether a store one migration behind may be moved on now: every node
    of the cluster reads the result (one node: always). With a shared pack
    store the nodes are not listed: `aspen db migrate` once each runs this Aspen."""
    if not replica_mode(s):
        return True
    if not s.node_url:
        return False
    from . import peers  # startup: a cluster's nodes only
    return peers.all_read(s, db.SCHEMA_VERSION)


def node_name(s: settings.Settings) -> str:
    """What the log records as the node that took a version."""
    import socket  # startup: only where a version is written
    return s.node_url or socket.gethostname()


def disabled(s: settings.Settings) -> bool:
    return not s.refstore


def file_id(path: str) -> Optional[tuple[int, int]]:
    try:
        st = os.stat(path)
        return (st.st_dev, st.st_ino)
    except OSError:
        return None


def sqlite_connection(path: str) -> db.Conn:
    """One connection per thread and file, dropped after a fork, and
    reopened when the file was deleted or replaced (`rm -r aspen/` re-imports)."""
    conns = getattr(_local, "conns", None)
    if conns is None or getattr(_local, "pid", None) != os.getpid():
        conns = _local.conns = {}
        _local.pid = os.getpid()
    cached = conns.get(path)
    if cached is not None and cached[1] == file_id(path):
        return cached[0]
    if cached is not None:
        try:
            cached[0].close()
        except db.Error:
            pass
        with cache_lock:
            cached_rows.pop(path, None)
    conn = db.connect(path)
    conns[path] = (conn, file_id(path))
    return conn


def release_thread() -> None:
    """Close the connections this thread opened, as it ends (a builder's): one
    left to the thread's end is freed by the cycle collector only, its
    statements with it, in a pause of whichever request runs then. One whose
    file was deleted or replaced meanwhile is left open (closing deletes the
    write-ahead log by name)."""
    conns = getattr(_local, "conns", None)
    if conns is None or getattr(_local, "pid", None) != os.getpid():
        return
    for path, (conn, ident) in list(conns.items()):
        if ident is not None and file_id(path) == ident:
            try:
                conn.close()
            except db.Error:
                continue
            del conns[path]
