"""A node as a replica of the log (ASPEN_PACK_STORE, docs/cluster.md).

Each node keeps its own git repository for each repository of the
cluster; the log in PostgreSQL is the truth, and the node's disk follows
it. Before a node answers, its store's sync compares the log's latest
version with the version the node's disk was last brought to (the file
`replica` in the repository's state). When it is behind, catch_up()
applies what it lacks, under the node's lock for that repository: the
stored packs of every version whose values the node does not have, oldest
first (`git unpack-objects` under 100 objects, as receive-pack keeps a
small push, else `git index-pack --fix-thin`), then the refs as the log
has them (`git update-ref --stdin`, no compare: the log decided), then the
new mark. A push through this node holds the same lock (shared with other
pushes) while it commits, so its disk write and a catch-up never
interleave."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Callable, Iterator, Optional, Protocol, Sequence

from .. import settings
from ..git import gitexec
from ..git.reader import object_info
from ..model.versions import ZERO, RefChange
from ..runtime import flocks
from ..runtime.repository import Repository
from . import db, diskrefs
from .packstore import PackStore, PackStoreError

MARK = "replica"
APPLYING = "replica.applying"
LOCK = "replica.lock"
GATE = "replica.gate"
HEAD_KEY = "replica_head"
UNPACK_LIMIT = 100       # receive.unpackLimit's default: smaller packs are applied as loose objects
LOCK_WAIT = 60.0         # a request waits this long for another catch-up of its repository on this node


class Copy(Protocol):
    """What a catch-up needs of a repository's store (store.RefStore is one)."""
    gitdir: str
    repo: Repository
    conn: db.Conn
    path: str


class ReplicaError(OSError):
    """The node cannot be brought to the log (a pack missing from the pack
    store, git failing): its requests are answered from its disk."""


def pack_store(store: Copy, root: str) -> PackStore:
    return PackStore(root, getattr(store.conn, "schema", "") or "sqlite")


def publish_all(store: Copy, root: str, hash_len: int) -> str:
    """Every object of this node's repository as one pack in the pack store
    (a repository's import: what the other nodes start from); its name."""
    up = pack_store(store, root).upload()
    assert up.f is not None                 # open until finish() or discard()
    try:
        res = gitexec.git_to_file(["pack-objects", "--all", "--stdout", "--quiet"], cwd=store.gitdir,
                                  out=up.f, env=store.repo.git_env)
        if res.returncode != 0:
            raise ReplicaError(f"pack-objects failed: {res.stderr.decode('utf-8', 'replace').strip()}")
        up.written()
        name = up.finish(hash_len)
    except BaseException:
        up.discard()
        raise
    s = store.repo.settings
    if s.node_url:      # packs between nodes: the import's pack on other nodes too, as far as they take it
        from . import peers  # startup: a cluster's nodes only
        try:
            peers.replicate(s, os.path.basename(up.directory), name, os.path.join(up.directory, name))
        except (OSError, db.Error, db.Busy):
            pass        # kept here; the others fetch it from this node (peers.fetch)
    return name


def init_bare(repo: Repository) -> bool:
    """An empty bare repository at REPO's path, for the log to fill: made under a
    temporary name and renamed into place, so that a request racing this one
    sees either no repository or a whole one. True when PATH is one now."""
    path = repo.gitdir
    tmp = f"{path}.aspen-new-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    res = gitexec.git(["init", "--bare", "--quiet", tmp], cwd=os.path.dirname(path) or "/",
                      env=gitexec.GitEnv({k: v for k, v in repo.git_env.items() if not k.startswith("GIT_DIR")}))
    if res.returncode == 0:
        try:
            os.rename(tmp, path)
        except OSError:
            pass                # another request's is in place
    shutil.rmtree(tmp, ignore_errors=True)
    return os.path.isfile(os.path.join(path, "HEAD"))


def applied(state_dir: str, token: str) -> int:
    """The version of the store made as TOKEN that this node's disk was last
    brought to (0: never, or a store since dropped and made anew)."""
    try:
        with open(os.path.join(state_dir, MARK), "rb") as f:
            version, _, made = f.read().decode("ascii", "replace").strip().partition(" ")
        return int(version) if version.isdigit() and made == token else 0
    except OSError:
        return 0


def set_applied(state_dir: str, version: int, token: str) -> None:
    tmp = os.path.join(state_dir, f"{MARK}.tmp{os.getpid()}-{threading.get_ident()}")
    with open(tmp, "w") as f:
        f.write(f"{version} {token}\n")
    os.replace(tmp, os.path.join(state_dir, MARK))


def applying(state_dir: str) -> int:
    """The version a catch-up that did not finish was applying packs through (0: none)."""
    try:
        with open(os.path.join(state_dir, APPLYING), "rb") as f:
            text = f.read().strip()
        return int(text) if text.isdigit() else 0
    except OSError:
        return 0


def set_applying(state_dir: str, version: int) -> None:
    path = os.path.join(state_dir, APPLYING)
    if not version:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    tmp = f"{path}.tmp{os.getpid()}-{threading.get_ident()}"
    with open(tmp, "w") as f:
        f.write(f"{version}\n")
    os.replace(tmp, path)


@contextmanager
def locked(state_dir: str, wait: float, shared: bool = False) -> Iterator[None]:
    """This node's lock on the repository's disk (flocks: released by the
    kernel when their holder dies), waited for WAIT seconds at most. A
    catch-up holds it alone; pushes (SHARED) hold it together, each with its
    refs' lock files, so that pushes to different refs commit side by side
    and no catch-up writes refs while a push is between the log and the
    disk. A gate taken first, and held by a catch-up throughout, lets no
    new push in while a catch-up waits for the pushes under way."""
    deadline = time.monotonic() + wait
    gate = os.open(os.path.join(state_dir, GATE), os.O_RDWR | os.O_CREAT, 0o644)
    fd = -1
    try:
        if not flocks.take(gate, deadline, 0.001, 0.05):
            raise db.Busy("the repository's replica lock is held")
        fd = os.open(os.path.join(state_dir, LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        taken = flocks.take(fd, deadline, 0.001, 0.05, shared=shared)
        if shared:
            flocks.release(gate)
        if not taken:
            raise db.Busy("the repository's replica lock is held")
        yield
    finally:
        if fd >= 0:
            os.close(fd)
        os.close(gate)


def catch_up(store: Copy, root: str, latest: int, token: str,
             progress: Optional[Callable[[int, int], None]] = None) -> int:
    """Bring this node's disk to the log of the store made as TOKEN (at least
    to LATEST); the version it is at."""
    sdir = os.path.dirname(store.path)
    if applied(sdir, token) >= latest:
        return latest
    with locked(sdir, LOCK_WAIT):
        return _apply(store, pack_store(store, root), sdir, token, progress)


def _apply(store: Copy, packs: PackStore, sdir: str, token: str,
           progress: Optional[Callable[[int, int], None]]) -> int:
    have = applied(sdir, token)
    conn = store.conn
    with db.reading(conn):
        through = db.latest_version(conn)
        plan = db.replica_plan(conn, have, through)
        rows = db.all_refs(conn)
        head = db.get_state(conn, HEAD_KEY)
    if through <= have:
        return have
    repo = store.repo
    values = sorted({v for _, vals, _ in plan for v in vals})
    present = _present(repo, values)
    # a catch-up killed while it applied packs may have left part of a version's objects
    # (unpack-objects writes them one by one): those versions are applied again, whatever is present
    redo = applying(sdir)
    todo = [(v, names) for v, vals, names in plan if v <= redo or not all(x in present for x in vals)]
    if todo:
        set_applying(sdir, through)
        _prefetch(repo.settings, packs, [n for _, names in todo for n in names])
    for i, (v, names) in enumerate(todo):
        if not names:
            raise ReplicaError(f"version {v}'s objects are neither here nor in the pack store")
        for name in names:
            _index(repo, packs, name)
        if progress is not None:
            progress(i + 1, len(todo))
    _write_refs(repo, rows, head)
    set_applied(sdir, through, token)
    set_applying(sdir, 0)
    return through


def _present(repo: Repository, oids: Sequence[str]) -> set[str]:
    info = object_info(repo.gitdir, repo.git_env, list(oids))
    return {o for o, (t, _) in info.items() if t != "missing"}


def _index(repo: Repository, packs: PackStore, name: str) -> None:
    try:
        path = packs.path(name)
    except PackStoreError as e:
        raise ReplicaError(str(e)) from e
    try:
        head = _head(path)
    except OSError:
        if not _fetched(repo.settings, packs, name):
            raise ReplicaError(f"pack {name} is missing from the pack store ({packs.directory})") from None
        head = _head(path)
    # as receive-pack keeps a push's objects: loose under the unpack limit, else a pack of its own
    # (a pack per version would have every node's `gc --auto` repack after each 50 versions)
    small = len(head) == 12 and head[:4] == b"PACK" and int.from_bytes(head[8:12], "big") < UNPACK_LIMIT
    args = ["unpack-objects", "-q"] if small else ["index-pack", "--stdin", "--fix-thin"]
    res = gitexec.git(args, cwd=repo.gitdir, env=repo.git_env, stdin_path=path)
    if res.returncode != 0:
        raise ReplicaError(f"index-pack of {name} failed: {res.stderr.decode('utf-8', 'replace').strip()}")


def _head(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(12)


def _prefetch(s: settings.Settings, packs: PackStore, names: Sequence[str]) -> None:
    """Packs between nodes: bring the packs of NAMES this node lacks from the
    others, several at once, before they are applied one by one (_index
    fetches any still missing then)."""
    if not s.node_url:
        return
    missing = [n for n in names if not packs.has(n)]
    if not missing:
        return
    from . import peers  # startup: a cluster's nodes only
    try:
        peers.fetch_many(s, os.path.basename(packs.directory), missing, packs.directory)
    except (OSError, db.Error, db.Busy):
        pass


def _fetched(s: settings.Settings, packs: PackStore, name: str) -> bool:
    """Packs between nodes (ASPEN_NODE_URL): NAME brought from a node that holds it."""
    if not s.node_url:
        return False
    from . import peers  # startup: a cluster's nodes only
    try:
        return peers.fetch(s, os.path.basename(packs.directory), name, packs.directory)
    except (OSError, db.Error, db.Busy):
        return False


def _write_refs(repo: Repository, rows, head: Optional[str]) -> None:
    gitdir = repo.gitdir
    disk = diskrefs.read_all(gitdir)
    want = {r.name: r.oid for r in rows if r.symref is None and r.oid and r.name.startswith("refs/")}
    changes = [RefChange(n, None, oid) for n, oid in sorted(want.items())
               if disk.get(n) is None or disk[n].symref is not None or disk[n].oid != oid]
    changes += [RefChange(n, None, ZERO) for n, r in sorted(disk.items()) if n not in want and r.symref is None]
    if changes:
        err = diskrefs.apply(repo, changes, "aspen replica")
        if err:
            raise ReplicaError(f"the refs could not be written: {err}")
    if head and head.startswith("refs/"):
        if local_head(gitdir) != head:
            gitexec.git(["symbolic-ref", "HEAD", head], cwd=gitdir, env=repo.git_env)


def local_head(gitdir: str) -> Optional[str]:
    """The ref HEAD names on this node's disk, or None (detached, unreadable)."""
    try:
        with open(os.path.join(gitdir, "HEAD"), "rb") as f:
            text = f.read().decode("utf-8", "replace").strip()
    except OSError:
        return None
    return text[5:].strip() if text.startswith("ref: ") else None
