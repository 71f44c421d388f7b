"""Packs between a cluster's nodes, with no shared filesystem (ASPEN_NODE_URL,
docs/cluster.md).

Each node keeps the packs of the repositories it serves in a directory of
its own (registry.pack_root). The database lists the cluster's nodes
(`aspen_nodes`: each node's URL, and when it last said it was there) and
which nodes hold each pack a push or an import made (`aspen_pack_holders`).
A push's pack is sent to other nodes (PUT) until ASPEN_REPLICAS nodes hold
it, before its version is committed; a node lacking a pack it needs fetches
it (GET) from a node that holds it, or, for a pack nobody records (one a
builder made), from any node that has it.

Every request between nodes is signed: the header `X-Aspen-Node: <node's
URL> <unix time> <HMAC-SHA256 of ASPEN_CLUSTER_SECRET over "METHOD PATH
TIME">`, taken within SKEW_S of the receiver's clock. Every pack is checked
on arrival before it is kept: its trailer is the hash of the bytes before
it and its name is that trailer; an index's trailer is the hash of the
bytes before it, and the pack's trailer in it is its name."""

from __future__ import annotations

import hashlib
import hmac
import http.client
import os
import random
import re
import threading
import time
import uuid
from typing import Callable, Iterable, Optional
from urllib.parse import quote, urlsplit

from .. import settings
from . import db, db_postgres
from .packstore import fsync_dir

HEADER = "X-Aspen-Node"
PREFIX = "/_aspen/packs/"
SKEW_S = 300                 # a signature older or newer than this is refused
SEEN_EVERY_S = 60            # a process says its node is there at most this often
GONE_S = 10 * SEEN_EVERY_S   # a node not heard of for this long is no longer sent packs nor asked for them
CONNECT_S = 5.0              # a node that takes no connection within this is skipped
IDLE_S = 60.0                # a transfer with no byte for this long is abandoned
CHUNK = 1 << 20
NAME = re.compile(r"\A(pack-)?([0-9a-f]{40}|[0-9a-f]{64})\.(pack|idx)\Z")
SCHEMA = re.compile(r"\A[a-z0-9_]{1,63}\Z")

_ready: set[str] = set()                 # database URLs whose peer tables this process made sure of
_seen: dict[tuple[str, str], float] = {}  # (database URL, node) -> when this process last said so
_lock = threading.Lock()


class PeerError(OSError):
    """A pack could not be sent, fetched or taken."""


# -- signatures ------------------------------------------------------------------------------------

def _mac(secret: str, method: str, path: str, at: str) -> str:
    return hmac.new(secret.encode(), f"{method} {path} {at}".encode("utf-8", "surrogateescape"),
                    hashlib.sha256).hexdigest()


def sign(s: settings.Settings, method: str, path: str) -> str:
    at = str(int(time.time()))
    assert s.cluster_secret is not None         # settings.parse: ASPEN_NODE_URL needs ASPEN_CLUSTER_SECRET
    return f"{s.node_url} {at} {_mac(s.cluster_secret, method, path, at)}"


def signer(s: settings.Settings, header: Optional[str], method: str, path: str) -> Optional[str]:
    """The node that signed HEADER for METHOD PATH, or None: no signature, a wrong one, or too old."""
    parts = (header or "").split(" ")
    if len(parts) != 3 or not parts[1].isdigit() or not s.cluster_secret:
        return None
    node, at, mac = parts
    if abs(time.time() - int(at)) > SKEW_S:
        return None
    return node if hmac.compare_digest(mac, _mac(s.cluster_secret, method, path, at)) else None


# -- the database's lists --------------------------------------------------------------------------

def _conn(s: settings.Settings):
    assert s.refstore_url is not None           # a cluster's node: settings.parse made sure
    conn = db.pgconn.PgConn(s.refstore_url, "public", 1, db.PG_USE_SCHEMA)
    if s.refstore_url not in _ready:
        db.retry(lambda: db_postgres.pg_peers_init(conn))
        _ready.add(s.refstore_url)
    return conn


def here(s: settings.Settings) -> None:
    """Say this node is part of the cluster (at most every SEEN_EVERY_S per process)."""
    node = s.node_url
    assert s.refstore_url is not None and node is not None
    key = (s.refstore_url, node)
    now = time.time()
    with _lock:
        if now - _seen.get(key, 0.0) < SEEN_EVERY_S:
            return
        _seen[key] = now
    conn = _conn(s)
    db.retry(lambda: db_postgres.pg_node_seen(conn, node, now))


def heartbeat(s: settings.Settings) -> None:
    """A long-lived process of a node (gunicorn's worker): say the node is
    there now and every SEEN_EVERY_S, from a thread, so that the others send
    it packs before it has served anything."""
    def run() -> None:
        while True:
            try:
                here(s)
            except (OSError, db.Error, db.Busy):
                with _lock:
                    _seen.pop((s.refstore_url or "", s.node_url or ""), None)     # said again at the next beat
            time.sleep(SEEN_EVERY_S / 4)
    threading.Thread(target=run, name="aspen-node-heartbeat", daemon=True).start()


def nodes(s: settings.Settings) -> list[str]:
    """Every node of the cluster seen within GONE_S, this one included."""
    here(s)
    conn = _conn(s)
    now = time.time()
    return [n for n, seen, _ in db.retry(lambda: db_postgres.pg_nodes(conn)) if now - seen < GONE_S or n == s.node_url]


def all_read(s: settings.Settings, schema: int) -> bool:
    """Whether every node seen within GONE_S runs an Aspen that reads a store at SCHEMA."""
    here(s)
    conn = _conn(s)
    now = time.time()
    return all(at >= schema for n, seen, at in db.retry(lambda: db_postgres.pg_nodes(conn)) if now - seen < GONE_S)


def holders(s: settings.Settings, schema: str, name: str) -> list[str]:
    conn = _conn(s)
    return db.retry(lambda: db_postgres.pg_pack_holders(conn, schema, name))


def hold(s: settings.Settings, schema: str, name: str, node: Optional[str] = None) -> None:
    """Record that NODE (this one) keeps SCHEMA's pack NAME on its disk."""
    conn = _conn(s)
    held = node or s.node_url
    assert held is not None                     # a cluster's node: settings.parse made sure
    db.retry(lambda: db_postgres.pg_hold(conn, schema, name, held, time.time()))


def _unhold(s: settings.Settings, schema: str, name: str, node: str) -> None:
    conn = _conn(s)
    db.retry(lambda: db_postgres.pg_unhold(conn, schema, name, node))


# -- checking and keeping a pack -------------------------------------------------------------------

class Checker:
    """A pack or index file's bytes as they arrive: at the end, whether they
    are the file NAME says (see the module's docstring)."""

    def __init__(self, name: str):
        m = NAME.match(name)
        if m is None:
            raise PeerError(f"not a pack's name: {name!r}")
        self.expect = bytes.fromhex(m.group(2))
        self.index = m.group(3) == "idx"
        self.n = len(self.expect)
        self.hash = hashlib.sha1() if self.n == 20 else hashlib.sha256()
        self.tail = b""
        self.head = b""
        self.size = 0

    def update(self, chunk: bytes) -> None:
        if len(self.head) < 4:
            self.head += chunk[:4 - len(self.head)]
        self.size += len(chunk)
        data = self.tail + chunk
        keep = 2 * self.n if self.index else self.n
        if len(data) > keep:
            self.hash.update(data[:-keep])
            data = data[-keep:]
        self.tail = data

    def good(self) -> bool:
        n = self.n
        if self.index:
            if len(self.tail) < 2 * n or self.head != b"\xfftOc":
                return False
            self.hash.update(self.tail[:n])
            return self.tail[:n] == self.expect and self.hash.digest() == self.tail[n:]
        if len(self.tail) < n or self.head != b"PACK":
            return False
        return self.tail == self.expect and self.hash.digest() == self.expect


def take(directory: str, name: str, chunks: Iterable[bytes]) -> int:
    """Keep the file NAME in DIRECTORY from CHUNKS, once checked: written
    under a temporary name, fsynced, renamed into place. Its size."""
    check = Checker(name)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f"tmp-{uuid.uuid4().hex}")
    try:
        with open(tmp, "xb") as f:
            for chunk in chunks:
                check.update(chunk)
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        if not check.good():
            raise PeerError(f"{name}: its bytes are not the pack its name says")
        os.rename(tmp, os.path.join(directory, name))
        fsync_dir(directory)
        return check.size
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# -- between nodes ---------------------------------------------------------------------------------

def _connection(node: str) -> tuple[http.client.HTTPConnection, str]:
    u = urlsplit(node)
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    return cls(u.netloc, timeout=CONNECT_S), u.path.rstrip("/")


def _path(schema: str, name: str) -> str:
    return PREFIX + quote(schema) + "/" + quote(name)


def send(s: settings.Settings, node: str, schema: str, name: str, path: str) -> bool:
    """PUT the file at PATH to NODE: whether NODE now keeps it."""
    conn, base = _connection(node)
    target = base + _path(schema, name)
    try:
        size = os.path.getsize(path)
        conn.putrequest("PUT", target, skip_accept_encoding=True)
        conn.putheader(HEADER, sign(s, "PUT", _path(schema, name)))
        conn.putheader("Content-Type", "application/octet-stream")
        conn.putheader("Content-Length", str(size))
        conn.endheaders()
        if conn.sock is not None:
            conn.sock.settimeout(IDLE_S)
        with open(path, "rb") as f:
            while True:
                chunk = f.read(CHUNK)
                if not chunk:
                    break
                conn.send(chunk)
        resp = conn.getresponse()
        resp.read()
        return resp.status in (200, 201)
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def _get(s: settings.Settings, node: str, schema: str, name: str, directory: str) -> Optional[int]:
    """GET NAME from NODE into DIRECTORY: its status (200: kept), or None when NODE could not be asked."""
    conn, base = _connection(node)
    try:
        conn.putrequest("GET", base + _path(schema, name), skip_accept_encoding=True)
        conn.putheader(HEADER, sign(s, "GET", _path(schema, name)))
        conn.endheaders()
        if conn.sock is not None:
            conn.sock.settimeout(IDLE_S)
        resp = conn.getresponse()
        if resp.status != 200:
            resp.read()
            return resp.status
        take(directory, name, iter(lambda: resp.read(CHUNK), b""))
        return 200
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def replicate(s: settings.Settings, schema: str, name: str, path: str, log: Optional[Callable[[str], None]] = None
              ) -> list[str]:
    """This node holds the pack at PATH (named NAME): send it to other nodes
    until ASPEN_REPLICAS nodes hold it (at most as many as the cluster has).
    The nodes holding it; PeerError when too few took it."""
    hold(s, schema, name)
    others = [n for n in nodes(s) if n != s.node_url]
    random.shuffle(others)
    want = min(s.replicas, len(others) + 1)
    assert s.node_url is not None
    held = [s.node_url]
    for node in others:
        if len(held) >= want:
            break
        if send(s, node, schema, name, path):
            hold(s, schema, name, node)
            held.append(node)
        elif log is not None:
            log(f"aspen: node {node} did not take pack {name}\n")
    if len(held) < want:
        raise PeerError(f"pack {name} is kept on {len(held)} node(s) of the {want} ASPEN_REPLICAS asks for")
    return held


def fetch(s: settings.Settings, schema: str, name: str, directory: str,
          recorded: Optional[list[str]] = None, known: Optional[list[str]] = None) -> bool:
    """Bring the file NAME of SCHEMA into DIRECTORY from a node that has it:
    the nodes recorded as holding it first (RECORDED, else asked), then every
    other node (KNOWN, else asked)."""
    if recorded is None:
        recorded = holders(s, schema, name)
    if s.node_url in recorded:
        _unhold(s, schema, name, s.node_url)     # this node lost it (its disk was replaced)
    rest = [n for n in (nodes(s) if known is None else known) if n not in recorded]
    random.shuffle(rest)
    for node in recorded + rest:
        if node == s.node_url:
            continue
        status = _get(s, node, schema, name, directory)
        if status == 200:
            if not name.startswith("pack-"):
                hold(s, schema, name)
            return True
        if status == 404 and node in recorded:
            _unhold(s, schema, name, node)     # it lost its disk: it is no holder any more
    return False


FETCHES_AT_ONCE = 4


def fetch_many(s: settings.Settings, schema: str, names: list[str], directory: str) -> None:
    """fetch() each of NAMES, FETCHES_AT_ONCE at a time, their holders read in one query."""
    from concurrent.futures import ThreadPoolExecutor  # startup: a catch-up's only
    conn = _conn(s)
    recorded = db.retry(lambda: db_postgres.pg_pack_holders_of(conn, schema, names))
    known = nodes(s)
    with ThreadPoolExecutor(FETCHES_AT_ONCE, thread_name_prefix="aspen-peer-fetch") as pool:
        list(pool.map(lambda n: fetch(s, schema, n, directory, recorded.get(n, []), known), names))


_wanted: set[tuple[str, str]] = set()    # (directory, name) a background fetch of this process is bringing


def fetch_later(s: settings.Settings, schema: str, directory: str, names: Iterable[str]) -> None:
    """Bring NAMES (in order: an index last, once its pack is here) into
    DIRECTORY in a background thread, each once per process at a time; no
    request waits for it."""
    todo = []
    with _lock:
        for name in names:
            if (directory, name) not in _wanted:
                _wanted.add((directory, name))
                todo.append(name)
    if not todo:
        return

    def run() -> None:
        try:
            for name in todo:
                if not os.path.isfile(os.path.join(directory, name)) and not fetch(s, schema, name, directory):
                    return
        except (OSError, db.Error, db.Busy):
            pass
        finally:
            with _lock:
                _wanted.difference_update((directory, n) for n in todo)

    threading.Thread(target=run, name="aspen-peer-fetch", daemon=True).start()
