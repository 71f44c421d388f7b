"""RefStore: one repository's versions, kept in step with its refs on disk.

- `sync()` runs before a request reads refs: it imports the repository on
  first use, finishes pushes whose writer died, and records changes made
  outside Aspen (noticed by the ref files' fingerprint) as `external` versions.
- `snapshot()` is the advertisement's view, one query, cached in process by
  (latest version, pending versions).
- `commit()` is a push: git locks and checks every old value on disk, the
  version is committed to the store (pending), git renames the locks into
  place, and the version is marked done and compacted.
- `tips()`, `tips_many()` and `last_rewind()` are the planner's history
  questions; `is_ancestor()` is the segment query (`aspen query
  ancestor`, bench stale-branch), whose answers say which versions and
  segments it read.
- The version and segment packs are built by packs/builder.py; the store
  records them (`record_version_pack()`, `record_segment_pack()`,
  `drop_nested_segments()`) and says what a full clone is spliced from
  (`clone_view()`).
"""

from __future__ import annotations

import os
import time
from typing import Callable, Iterator, Mapping, Optional, Protocol, Sequence

from ..model import refs as refs_mod
from ..model.pin import Pin, PinError
from ..model.versions import (
    ZERO,
    AncestryAnswer,
    ChainReport,
    CloneView,
    CompactReport,
    PackInfo,
    RefChange,
    SegmentPack,
    StoredRef,
    TipAnswer,
    UpdateRow,
    VerifyReport,
    Version,
    VersionMeta,
    Visits,
    is_null,
)
from ..runtime import pollfiles
from ..runtime.owners import fault, owner_alive, owner_id
from ..runtime.repository import Repository
from ..runtime.statedir import state_dir
from . import (
    chaining,
    db,
    db_postgres,
    diskrefs,
    fingerprint,
    hookruns,
    reflocks,
    registry,
    replica,
    segments,
    views,
)

# Crash-test hook: ASPEN_FAULT=<point> makes the process kill itself there.
LOCK_GRACE = 0.5   # seconds a dead writer's git child gets to drop its own locks
_inflight: set[tuple[str, int]] = set()


class PackFacts(Protocol):
    """What the store records of a built pack (packs/versionpack.BuiltPack)."""
    @property
    def name(self) -> str: ...
    @property
    def objects(self) -> int: ...
    @property
    def size(self) -> int: ...


class SearchFacts(Protocol):
    """What the store records of the delta search a pack was built with (versionpack.DeltaSearch)."""
    @property
    def window(self) -> int: ...
    @property
    def depth(self) -> int: ...
    @property
    def compression(self) -> int: ...


class BoundaryFacts(Protocol):
    """What the store records of a version's boundary (versionpack.Boundary)."""
    @property
    def introduced(self) -> Sequence[str]: ...
    @property
    def commits(self) -> Sequence[str]: ...
    @property
    def parents(self) -> Mapping[str, Sequence[str]]: ...
    @property
    def times(self) -> Mapping[str, int]: ...


_MIGRATE_EVERY_S = 10.0
_migrate_checked: dict[str, float] = {}


class RefStore:
    def __init__(self, repo: Repository, conn: db.Conn, path: str, create: bool = True):
        self.repo = repo
        self.gitdir = repo.gitdir
        self.conn = conn
        self.path = path
        self.create = create        # a PostgreSQL store dropped while open is made anew (a request's)
        self.version = 0
        self.imported = False       # this store's sync recorded the repository (version 1)

    @classmethod
    def open(cls, repo: Repository, create: bool = True, log: Optional[list] = None) -> Optional["RefStore"]:
        """The repository's store, or None when the store is turned off or
        cannot be kept here (read-only repository without ASPEN_STATE_DIR:
        said in LOG). With ASPEN_REFSTORE_URL it is in that PostgreSQL
        database, and the state directory keeps its record beside its packs
        and ref-lock claims."""
        s, gitdir = repo.settings, repo.gitdir
        if registry.disabled(s):
            return None
        sdir = state_dir(gitdir, s)
        path = os.path.join(sdir, registry.store_file_name(s))
        try:
            kept = not s.refstore_url and os.path.exists(path)          # a SQLite file opens without HEAD
            if not kept and not os.path.isfile(os.path.join(gitdir, "HEAD")):
                return None         # no store is made for what is not (or no longer) a repository
            if not os.path.isdir(sdir):
                if not create:
                    return None
                if sdir == os.path.join(gitdir, "aspen"):
                    try:
                        os.mkdir(sdir)  # one level: a deleted repository's directory is never made again
                    except FileExistsError:
                        pass
                else:
                    os.makedirs(sdir, exist_ok=True)
            if s.refstore_url:
                conn = db.retry(lambda: registry.pg_connection(path, repo, create))
                return None if conn is None else cls(repo, conn, path, create)
            # a file locked by another process is waited for within the caller's patience (db.Busy after)
            return cls(repo, db.retry(lambda: registry.sqlite_connection(path)), path)
        except (OSError, db.Error) as e:
            if log is not None and isinstance(e, db.pgconn.Unavailable):
                log.append(f"aspen: ref store unavailable ({e}); serving refs from disk\n")
            elif log is not None and (isinstance(e, (PermissionError, NotADirectoryError))
                                    or (os.path.isdir(sdir) and not os.access(sdir, os.W_OK))):
                log.append(f"aspen: the ref store cannot be kept in {sdir} ({e.__class__.__name__}: {e}); "
                           f"serving refs from disk (make it writable by the server's user, or set "
                           f"ASPEN_STATE_DIR)\n")
            return None

    # -- keeping in step with the disk -------------------------------------------------------

    def sync(self, by: Optional[VersionMeta] = None) -> int:
        """Bring the store up to the refs on disk; the latest version id. BY
        says whose the changes found are (a push's proc-receive hook wrote
        them); without it they are an `external` version."""
        try:
            self.version = self._sync(by)
        except db.pgconn.StoreError as e:
            if "UndefinedTable" not in str(e) and "InvalidSchemaName" not in str(e):
                raise
            # dropped by another process (`aspen db drop`): this thread's connection is looked up
            # again; a store opened without making one (background work) stays dropped
            self._reconnect()
            self.version = self._sync(by)
        return self.version

    def _reconnect(self) -> None:
        registry.forget_pg_connection(self.path)
        conn = db.retry(lambda: registry.pg_connection(self.path, self.repo, self.create))
        if conn is None:
            raise db.pgconn.StoreError("the store was dropped")
        self.conn = conn

    @property
    def replica_root(self) -> Optional[str]:
        """The pack store's root when this node is a replica of the log, else None."""
        s = self.repo.settings
        return registry.pack_root(s, self.repo.project_root) if registry.replica_mode(s) else None

    @property
    def node(self) -> str:
        return registry.node_name(self.repo.settings)

    def _move_on(self) -> None:
        """A store still one migration behind (nodes of the older Aspen were
        running when it was opened): moved on once they are gone, looked at
        every _MIGRATE_EVERY_S per process."""
        conn = self.conn
        if conn.dialect == "sqlite" or db.store_schema(conn) >= db.SCHEMA_VERSION:
            return
        now = time.monotonic()
        if now - _migrate_checked.get(self.path, -_MIGRATE_EVERY_S) < _MIGRATE_EVERY_S:
            return
        _migrate_checked[self.path] = now
        if registry.may_migrate(self.repo.settings):
            conn.store_schema = db.retry(lambda: db_postgres.pg_migrate(conn, registry.repo_key(self.repo)))

    def _made(self) -> str:
        """The token of the making of this PostgreSQL store, as the state records it."""
        return registry.read_record(self.path)[1]

    def catch_up(self, progress: Optional[Callable[[int, int], None]] = None) -> tuple[int, int]:
        """A replica brought to the log now (`aspen replica sync`): (the version
        its disk was at, the version it is at). PROGRESS(done, total) per
        version whose pack is applied."""
        root = self.replica_root
        if root is None:
            raise OSError("this node is no replica: set ASPEN_REFSTORE_URL and ASPEN_PACK_STORE or ASPEN_NODE_URL")
        before = replica.applied(os.path.dirname(self.path), self._made())
        latest = db.head(self.conn)[0] or self._import()
        self.version = replica.catch_up(self, root, latest, self._made(), progress)
        return before, self.version

    def _sync(self, by: Optional[VersionMeta] = None) -> int:
        reflocks.sweep(os.path.dirname(self.path))
        latest, stored_fp, pending = db.head(self.conn)
        root = self.replica_root
        if root is not None:
            if self.repo.settings.node_url:
                from . import peers  # startup: a cluster's nodes only
                peers.here(self.repo.settings)      # a node the others send packs to
            self._move_on()
            # the log is the truth and the disk follows it: never an external version
            return replica.catch_up(self, root, latest or self._import(), self._made())
        if latest == 0:
            return self._import()
        if pending:
            self.recover()
        fp = fingerprint.take(self.gitdir)
        if fp.trusted and fp.digest == stored_fp:
            return latest
        return self._sync_disk(fp, stored_fp, by)

    def _import(self) -> int:
        root = self.replica_root
        rows = views.read_git(self.repo)
        packs: tuple[str, ...] = ()
        if root is not None and any(r.symref is None for r in rows):
            oid_len = next(len(r.oid) for r in rows if r.symref is None and r.oid)
            packs = (replica.publish_all(self, root, oid_len // 2),)   # the first node's objects, for the others

        def tx(conn: db.Conn) -> int:
            self.imported = False
            if db.latest_version(conn):
                return db.latest_version(conn)
            fp = fingerprint.take(self.gitdir)
            v = db.insert_version(conn, "import", None, time.time(), None, "done", None, self.node)
            if root is not None:
                db.insert_replica_packs(conn, v, packs)
                db.set_state(conn, replica.HEAD_KEY, replica.local_head(self.gitdir))
            direct = [r for r in rows if r.symref is None]
            db.insert_updates(conn, v, [(r.name, ZERO, r.oid, False, r.otype, r.peeled) for r in direct])
            db.insert_tips(conn, v, views.tip_rows(direct))
            db.put_refs(conn, rows, v)
            db.set_state(conn, "fingerprint", fp.digest if fp.trusted else None)
            db.set_state(conn, "compacted_through", "1")
            chaining.seal(conn)
            self.imported = True
            return v
        v = db.write(self.conn, tx)
        if root is not None and self.imported:
            replica.set_applied(os.path.dirname(self.path), v, self._made())
        return v

    def _pending_refs(self, conn: db.Conn) -> set[str]:
        names: set[str] = set()
        for vid, _, _ in db.pending_versions(conn):
            names.update(r for r, *_ in db.version_updates(conn, vid))
        return names

    def _sync_disk(self, fp: fingerprint.Fingerprint, stored_fp: Optional[str],
                   by: Optional[VersionMeta] = None) -> int:
        if by is None and hookruns.running(os.path.dirname(self.path)):
            return db.latest_version(self.conn)      # a proc-receive hook's changes are its push's
        disk = diskrefs.read_all(self.gitdir)
        stored = {r.name: r for r in self._stored_rows()}
        if views.same(disk, stored, self._pending_refs(self.conn)):
            value = fp.digest if fp.trusted else None
            if value is None and stored_fp is None:
                return db.latest_version(self.conn)

            def note(conn: db.Conn) -> int:
                db.set_state(conn, "fingerprint", value)
                return db.latest_version(conn)
            return db.write(self.conn, note)

        def tx(conn: db.Conn) -> int:
            # The disk is read under the write lock: a push that finished (disk written, version
            # done) after an earlier read would otherwise be recorded as reverted by an
            # "external" version. Values are compared, not the types a push recorded.
            rows = {r.name: r for r in views.read_git(self.repo)}
            skip = self._pending_refs(conn)
            current = {r.name: r for r in db.all_refs(conn)}
            changed = [r for n, r in rows.items() if n not in skip and views.ref_value(current.get(n)) != views.ref_value(r)]
            gone = [n for n in current if n not in rows and n not in skip]
            if changed or gone:
                meta = by or VersionMeta("external")
                v = db.insert_version(conn, meta.kind, meta.who, time.time(), meta.push_id, "done", None, self.node)
                ups: list[db.UpdateRow] = []
                for r in changed:
                    if r.symref is None:
                        before = current.get(r.name)
                        old = before.oid if before is not None and before.symref is None else ZERO
                        ups.append((r.name, old or ZERO, r.oid, False, r.otype, r.peeled))
                for n in gone:
                    if current[n].symref is None:
                        ups.append((n, current[n].oid, ZERO, False, None, None))
                db.insert_updates(conn, v, ups)
                db.insert_tips(conn, v, views.tip_rows([r for r in changed if r.symref is None]))
                db.put_refs(conn, changed, v)
                db.delete_refs(conn, gone)
                self._compact(conn)
            db.set_state(conn, "fingerprint", fp.digest if fp.trusted else None)
            return db.latest_version(conn)
        return db.write(self.conn, tx)

    def recover(self) -> int:
        """Finish pending versions whose writer is gone: roll each ref forward
        when the disk still holds its old value, void it when the disk moved on.
        Returns the number of versions finished."""
        done = 0
        me = owner_id()
        for vid, owner, at in db.pending_versions(self.conn):
            # this process's own version not in flight: its writer failed after the disk
            # was written (the store refused to mark it done), so it is finished here
            if (self.path, vid) in _inflight or (owner != me and owner_alive(owner)):
                continue

            if not db.write(self.conn, lambda conn: db.claim_pending(conn, vid, owner, me)):
                continue
            ups = db.version_updates(self.conn, vid)
            disk = diskrefs.read_some(self.gitdir, [r for r, *_ in ups])
            forward, void = [], []
            for ref, old, new, ff, otype, peeled in ups:
                have = disk.get(ref)
                value = have.oid if have is not None and have.symref is None else (None if have else ZERO)
                if value == new:
                    continue
                if value == old:
                    self._drop_stale_lock(ref, at, is_null(new))
                    forward.append(RefChange(ref, old, new))
                else:
                    void.append(ref)
            if forward and diskrefs.apply(self.repo, forward, "push (recovered by aspen)"):
                void += [c.ref for c in forward]
            self._finish(vid, void)
            pollfiles.invalidate(self.gitdir, self.repo.settings)    # the advertisement shows it from now
            done += 1
        return done

    def _drop_stale_lock(self, ref: str, committed_at: float, delete: bool = False) -> None:
        """Remove the lock files the dead writer took for REF: REF's own, and
        those `git update-ref` takes with it -- HEAD.lock when HEAD names REF,
        packed-refs.lock when REF is a packed ref being deleted. Each was
        taken before the version was committed and held while it stood, so
        nobody else could take it meanwhile. A lock taken later belongs to a
        live writer."""
        locks = [os.path.join(self.gitdir, *ref.split("/")) + ".lock"]
        head = diskrefs.loose_value(os.path.join(self.gitdir, "HEAD"))
        if head is not None and head.symref == ref:
            locks.append(os.path.join(self.gitdir, "HEAD.lock"))
        if delete and ref in diskrefs.read_packed(self.gitdir):
            # under packed-refs.lock git also writes the new file as packed-refs.new
            locks += [os.path.join(self.gitdir, "packed-refs.lock"), os.path.join(self.gitdir, "packed-refs.new")]
        def stale() -> list[str]:
            out = []
            for lock in locks:
                try:
                    if os.stat(lock).st_mtime_ns <= int(committed_at * 1e9):
                        out.append(lock)
                except OSError:
                    pass
            return out
        # a `git update-ref` child outliving its writer aborts (and drops its locks)
        # when its input ends: give it a moment rather than race its clean-up
        deadline = time.monotonic() + LOCK_GRACE
        while stale() and time.monotonic() < deadline:
            time.sleep(0.02)
        for lock in stale():
            try:
                os.unlink(lock)
            except OSError:
                pass

    # -- reading -------------------------------------------------------------------------------

    def _stored_rows(self) -> list[StoredRef]:
        latest, _, pending = db.head(self.conn)
        made = registry.file_id(self.path)        # a store dropped and made anew counts its versions from 1 again
        key = (latest, pending, made)
        with registry.cache_lock:
            hit = registry.cached_rows.get(self.path)
        if hit is not None and hit[0] == key:
            return hit[1]
        with db.reading(self.conn) as conn:
            latest, _, pending = db.head(conn)
            rows = db.all_refs(conn)
        with registry.cache_lock:
            registry.cached_rows[self.path] = ((latest, pending, made), rows)
        return rows

    def snapshot(self, namespace: Optional[str] = None) -> refs_mod.RefSnapshot:
        """The refs as the advertisements need them (stock's for-each-ref view),
        the same object while neither the store nor HEAD changed."""
        rows = self._stored_rows()
        return self._view((self.path, id(rows), namespace, self._head()), lambda: rows, namespace, rows)

    def _head(self) -> Optional[bytes]:
        try:
            with open(os.path.join(self.gitdir, "HEAD"), "rb") as f:
                return f.read(4096)
        except OSError:
            return None

    def _view(self, key: tuple, rows: Callable[[], list[StoredRef]], namespace: Optional[str],
              same: Optional[list[StoredRef]] = None) -> refs_mod.RefSnapshot:
        """The snapshot of ROWS() kept under KEY; with SAME, only while it was made from that
        very list (KEY holds its id, which a later list may reuse)."""
        with registry.cache_lock:
            hit = registry.cached_views.get(key)
        if hit is not None and (same is None or hit[0] is same):
            return hit[1]
        got = rows()
        snap = views.to_snapshot(got, self.repo, namespace)
        with registry.cache_lock:
            if len(registry.cached_views) > 256:
                registry.cached_views.clear()
            registry.cached_views[key] = (got, snap)
        return snap

    # -- writing -------------------------------------------------------------------------------

    def commit(self, changes: Sequence[RefChange], meta: VersionMeta, fast: bool = False) -> Optional[str]:
        """Apply CHANGES all or nothing as one version; git's error text or None.
        FAST allows the in-process lock-file writer (no reflogs, no shared
        permissions configured) for the changes it can take."""
        if not changes:
            return None
        if self.replica_root is not None:
            return self._commit_replica(changes, meta, fast)
        tx: "diskrefs.LooseWrite | diskrefs.UpdateRef | None" = None
        held: Optional[reflocks.Claim] = None
        if fast:
            tx = diskrefs.LooseWrite(self.gitdir)
            held = reflocks.Claim(os.path.dirname(self.path))
            if not tx.prepare(changes, held):
                held.release()
                held = None
                tx = None
        if tx is None:
            tx = diskrefs.UpdateRef(self.repo)
            err = tx.prepare(changes)
            if err:
                tx.close()
                return err
        fault("refs-locked", self.repo.git_env)
        tried: list[tuple[str, int]] = []     # (path, version) of each attempt, marked in flight by _insert
        try:
            try:
                vid = db.write(self.conn, lambda conn: self._insert(conn, changes, meta, tried))
            except BaseException:
                for key in tried:
                    _inflight.discard(key)
                raise
            for key in set(tried) - {(self.path, vid)}:     # attempts that were rolled back
                _inflight.discard(key)
            try:
                fault("store-committed", self.repo.git_env)
                err = tx.commit()
                if err:
                    self._finish(vid, [c.ref for c in changes])
                    return err
                fault("disk-written", self.repo.git_env)
                try:
                    self._finish(vid, [])
                except (db.Error, db.Busy):
                    # The refs are on disk and the version is in the store: the push is
                    # done. Marking it done is left to the next request's recover().
                    pass
            finally:
                _inflight.discard((self.path, vid))
            return None
        finally:
            tx.close()
            if held is not None:
                held.release()

    def _insert(self, conn: db.Conn, changes: Sequence[RefChange], meta: VersionMeta,
                tried: list[tuple[str, int]]) -> int:
        vid = db.insert_version(conn, meta.kind, meta.who, time.time(), meta.push_id, "pending", owner_id(),
                                self.node)
        # in flight before the version can be seen: recover() in another thread of this process leaves it alone
        tried.append((self.path, vid))
        _inflight.add((self.path, vid))
        current = db.refs_named(conn, [c.ref for c in changes])
        rows = []
        for c in changes:
            old = c.old
            if old is None:   # no CAS asked (deleting a corrupt ref): the store's view
                cur = current.get(c.ref)
                old = cur.oid if cur is not None and cur.oid else ZERO
            rows.append((c.ref, old, c.new, c.ff and not is_null(old) and not is_null(c.new), c.otype, c.peeled))
        db.insert_updates(conn, vid, rows)
        db.insert_tips(conn, vid, [(c.new, c.ref) for c in changes if not is_null(c.new)]
                       + [(c.peeled, c.ref) for c in changes if c.peeled and not is_null(c.new)])
        db.insert_introduced(conn, vid, meta.introduced)
        if meta.cert is not None:
            db.insert_push_cert(conn, vid, meta.cert)
        return vid

    def _finish(self, vid: int, void: Sequence[str]) -> None:
        """Mark VID done (its VOID refs never changed on disk: their updates
        become no-ops), apply it to the current refs, and compact."""
        db.write(self.conn, lambda conn: self._done(conn, vid, void))

    def _done(self, conn: db.Conn, vid: int, void: Sequence[str]) -> None:
        for ref in void:
            db.void_update(conn, vid, ref)
        if void and len(void) == len(db.version_updates(conn, vid)):
            db.drop_introduced(conn, vid)
        if not db.mark_done(conn, vid):
            return
        for ref, old, new, ff, otype, peeled in db.version_updates(conn, vid):
            latest = db.latest_done_update(conn, ref)
            if latest is None or is_null(latest[0]):
                db.delete_refs(conn, [ref])
            else:
                db.put_refs(conn, [StoredRef(ref, latest[0], None, latest[1], latest[2])], latest[3])
        self._compact(conn)

    def _commit_replica(self, changes: Sequence[RefChange], meta: VersionMeta, fast: bool) -> Optional[str]:
        """A replica's push: the compare-and-swap is the log's (another node may
        have moved the ref), the version is done when committed, and this
        node's disk follows under its replica lock. The push's objects are
        already in the pack store (META.packs)."""
        sdir = os.path.dirname(self.path)
        with replica.locked(sdir, self.repo.settings.store_wait, shared=True):
            made = self._made()
            disk = [RefChange(c.ref, None, c.new, c.ff, c.otype, c.peeled) for c in changes]
            tx: "diskrefs.LooseWrite | diskrefs.UpdateRef | None" = None
            held: Optional[reflocks.Claim] = None
            if fast:        # the in-process lock-file writer: no git started while the node's lock is held
                tx, held = diskrefs.LooseWrite(self.gitdir), reflocks.Claim(sdir)
                if not tx.prepare(disk, held):
                    held.release()
                    tx, held = None, None
            if tx is None:
                tx = diskrefs.UpdateRef(self.repo)
            try:
                err = tx.prepare(disk) if isinstance(tx, diskrefs.UpdateRef) else None
                if err:
                    return err
                fault("refs-locked", self.repo.git_env)
                tried: list[tuple[str, int]] = []
                try:
                    got = db.write(self.conn, lambda conn: self._insert_replica(conn, changes, meta, tried))
                finally:
                    for key in tried:
                        _inflight.discard(key)
                if isinstance(got, str):
                    return got
                fault("store-committed", self.repo.git_env)
                if tx.commit() is None and replica.applied(sdir, made) == got - 1:
                    replica.set_applied(sdir, got, made)     # pushes side by side: only v-1 -> v, never back
                # else the disk lags the log: the next request's catch-up writes the refs
                return None
            finally:
                tx.close()
                if held is not None:
                    held.release()

    def _insert_replica(self, conn: db.Conn, changes: Sequence[RefChange], meta: VersionMeta,
                        tried: list[tuple[str, int]]) -> "int | str":
        refused = db_postgres.writable_schema(conn, registry.repo_key(self.repo))
        if refused:     # a newer Aspen's node moved it on: write nothing it may not read
            return refused
        current = db.refs_named(conn, [c.ref for c in changes])
        for c in changes:
            if c.old is None:
                continue
            cur = current.get(c.ref)
            have = cur.oid if cur is not None and cur.oid else ZERO
            if is_null(c.old) and not is_null(have):
                return f"cannot lock ref '{c.ref}': reference already exists"
            if not is_null(c.old) and is_null(have):
                return f"cannot lock ref '{c.ref}': unable to resolve reference '{c.ref}'"
            if not is_null(c.old) and have != c.old:
                return f"cannot lock ref '{c.ref}': is at {have} but expected {c.old}"
        vid = self._insert(conn, changes, meta, tried)
        db.insert_replica_packs(conn, vid, meta.packs)
        self._done(conn, vid, [])
        return vid

    # -- compaction ------------------------------------------------------------------------------

    def _compact(self, conn: db.Conn) -> int:
        """Chain the versions now done, and build every segment node that the versions so far complete."""
        chaining.seal(conn)
        through = int(db.get_state(conn, "compacted_through") or "0")
        latest = db.latest_version(conn)
        built = 0
        for v in range(through + 1, latest + 1):
            for level, idx in segments.nodes_ending_at(v):
                lo, hi = segments.span(level, idx)
                left = db.segment_summary(conn, level - 1, 2 * idx, *segments.span(level - 1, 2 * idx))
                right = db.segment_summary(conn, level - 1, 2 * idx + 1, *segments.span(level - 1, 2 * idx + 1))
                merged = dict(left)
                for ref, (o, n, f) in right.items():
                    if ref in merged:
                        o0, _, f0 = merged[ref]
                        merged[ref] = (o0, n, f0 and f)
                    else:
                        merged[ref] = (o, n, f)
                db.insert_segment(conn, level, idx, lo, hi, merged)
                built += 1
        if latest > through:
            db.set_state(conn, "compacted_through", str(latest))
        return built

    def compact(self) -> CompactReport:
        self.sync()
        built = db.write(self.conn, self._compact)
        db.checkpoint(self.conn)
        n = db.count_versions(self.conn)
        segs, rows, top = db.segment_counts(self.conn)
        return CompactReport(n, built, segs, rows, top)

    # -- version packs ---------------------------------------------------------------------------

    @property
    def packs_dir(self) -> str:
        """Where its version, segment and import packs are: the state's
        `packs/`, or a replica's directory in the pack store (shared by every
        node) or in this node's own (ASPEN_NODE_URL: packs between nodes)."""
        root = self.replica_root
        if root is not None:
            return os.path.join(root, getattr(self.conn, "schema", ""))
        return os.path.join(os.path.dirname(self.path), "packs")

    def refs_before(self, version: int) -> dict[str, str]:
        """S_{v-1}: every ref's value after the done versions before VERSION."""
        return db.refs_before(self.conn, version)

    def version_updates(self, version: int) -> list[UpdateRow]:
        """The updates VERSION recorded, by ref."""
        return [UpdateRow(ref, old, new, bool(ff), otype, peeled)
                for ref, old, new, ff, otype, peeled in db.version_updates(self.conn, version)]

    def sent_pack(self, version: int) -> Optional[str]:
        """The pack VERSION's push sent, if it kept one (adopt() checks that it holds
        exactly this version's objects: a push of several refs makes several versions)."""
        push_id = db.version_push_id(self.conn, version)
        if not push_id:
            return None
        path = registry.sent_pack_path(self.packs_dir, push_id)
        return path if os.path.exists(path) else None

    def push_built(self, push_id: str) -> bool:
        """Whether every version the push PUSH_ID made has its pack."""
        return db.push_built(self.conn, push_id)

    def record_version_pack(self, version: int, built: Optional[PackFacts], boundary: BoundaryFacts,
                            how: SearchFacts) -> None:
        """Record VERSION's pack (BUILT; None: the version has no new values), built
        with delta search HOW, its boundary, and the commits it introduced."""
        def tx(conn: db.Conn) -> None:
            db.drop_introduced(conn, version)                   # N_v exactly, whatever the push listed
            db.insert_introduced(conn, version, boundary.introduced)
            db.insert_parents(conn, boundary.parents, boundary.times)
            db.record_pack(conn, version, built.name if built else "", built.objects if built else 0,
                           built.size if built else 0, time.time(), how.window, how.depth,
                           how.compression, boundary.commits)
        db.write(self.conn, tx)

    def all_packs_built(self) -> bool:
        return not db.versions_without_pack(self.conn, 1)

    def unbuilt(self, limit: int) -> list[int]:
        """Up to LIMIT done versions, oldest first, without their pack."""
        return db.versions_without_pack(self.conn, limit)

    def version_values(self, version: int) -> tuple[str, ...]:
        return tuple(db.version_values(self.conn, version))

    def version_refs(self, version: int) -> tuple[str, ...]:
        return tuple(r for r, *_ in db.version_updates(self.conn, version))

    def version_pack(self, version: int):
        """(name, objects, size) of VERSION's pack, and its boundary commits; None if not built."""
        row = db.version_pack(self.conn, version)
        return None if row is None else (row, db.version_boundary(self.conn, version))

    def built_records(self, lo: int, hi: int) -> dict[int, tuple[PackInfo, tuple[str, ...], frozenset[str]]]:
        """Each version LO … HI that has its pack -> (its PackInfo, the values
        it wrote, the commits it introduced), in one read."""
        with db.reading(self.conn) as conn:
            rows = db.built_records(conn, lo, hi)
        return {v: (PackInfo(name, tuple(boundary), tuple(refs)), tuple(values), frozenset(introduced))
                for v, (name, boundary, refs, values, introduced) in rows.items()}

    # -- segment packs ---------------------------------------------------------------------------

    def packed_through_and_runs(self) -> tuple[int, set[tuple[int, int]]]:
        """settled()'s packed-through version and the runs (lo, hi) of the
        segment packs recorded, read together."""
        with db.reading(self.conn) as conn:
            return db.packed_through(conn), {(lo, hi) for lo, hi, *_ in db.segment_packs(conn)}

    def run_values(self, lo: int, hi: int) -> tuple[list[str], list[str]]:
        """The ref values after version HI and those before version LO, read together."""
        with db.reading(self.conn) as conn:
            after = list(db.refs_before(conn, hi + 1).values())
            before = list(db.refs_before(conn, lo).values())
        return after, before

    def record_segment_pack(self, lo: int, hi: int, built: Optional[PackFacts], search: SearchFacts) -> None:
        """Record the segment pack of versions LO … HI (BUILT; None: it holds nothing)."""
        db.write(self.conn, lambda conn: db.record_segment_pack(
            conn, lo, hi, built.name if built else "", built.objects if built else 0, built.size if built else 0,
            time.time(), search.window, search.depth, search.compression))

    def drop_nested_segments(self) -> tuple[list[tuple[int, int]], list[str]]:
        """Forget the segment packs that lie inside a larger recorded one: their
        runs, and the names of their packs no row names any more (sorted)."""
        def tx(conn: db.Conn) -> tuple[list[tuple[int, int]], list[str]]:
            rows = db.segment_packs(conn)
            runs = [(lo, hi) for lo, hi, *_ in rows]
            gone = [(lo, hi, name) for lo, hi, name, *_ in rows if any(segments.inside((lo, hi), r) for r in runs)]
            for lo, hi, _ in gone:
                db.delete_segment_pack(conn, lo, hi)
            used = db.pack_names(conn)
            return [(lo, hi) for lo, hi, _ in gone], sorted({n for *_, n in gone if n and n not in used})
        return db.write(self.conn, tx)

    def pack_names(self) -> set[str]:
        """Every pack name a version or segment pack row refers to."""
        return db.pack_names(self.conn)

    def segment_packs(self) -> list[SegmentPack]:
        return [SegmentPack(*row) for row in db.segment_packs(self.conn)]

    def clone_view(self) -> Optional[CloneView]:
        """The refs and segment packs a full clone of the latest version is
        planned from; None while a version is pending or has no pack."""
        with db.reading(self.conn) as conn:
            latest, _, pending = db.head(conn)
            if pending or db.versions_without_pack(conn, 1):
                return None
            rows = db.all_refs(conn)
            segs = db.segment_packs(conn)
            monotone = not db.rewritten_since(conn, 2)
        direct = [r for r in rows if r.symref is None and r.oid]
        return CloneView(latest, frozenset(r.oid for r in direct if r.oid), frozenset(r.peeled for r in direct if r.peeled),
                         tuple(SegmentPack(*row) for row in segs), monotone)

    # -- time travel (model/pin.py) ----------------------------------------------------------------

    def resolve_pin(self, pin: Pin) -> int:
        """The version PIN names: its number, or the latest version committed
        by its time; PinError (its text for the client) when there is none."""
        with db.reading(self.conn) as conn:
            latest = db.latest_version(conn)
            if pin.version is not None:
                if pin.version > latest:
                    raise PinError(f"no version {pin.version}: the latest is {latest}")
                return pin.version
            assert pin.at is not None
            found = db.version_at_time(conn, pin.at)
        if not found:
            raise PinError(f"no version at or before {pin}: the first was committed "
                           f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(db.first_version_at(self.conn)))}")
        return found

    def refs_at(self, version: int) -> dict[str, StoredRef]:
        """Every direct ref as the done versions up to VERSION left it (0: none), by name."""
        with db.reading(self.conn) as conn:
            return {r.name: r for r in db.refs_at(conn, version)}

    def refs_now(self) -> dict[str, StoredRef]:
        """Every direct ref's stored value now, by name."""
        return {r.name: r for r in self._stored_rows() if r.symref is None and r.oid}

    def version_record(self, version: int) -> Optional[Version]:
        """VERSION's record with its updates, or None."""
        got = db.versions_desc(self.conn, 1, version + 1)
        return got[0] if got and got[0].id == version else None

    def snapshot_at(self, version: int, namespace: Optional[str] = None) -> refs_mod.RefSnapshot:
        """snapshot() as the done versions up to VERSION left the refs (HEAD
        and symbolic refs as they are now, where their targets existed then)."""
        def rows() -> list[StoredRef]:
            with db.reading(self.conn) as conn:
                return sorted(db.refs_at(conn, version) + db.symrefs(conn), key=lambda r: r.name)
        return self._view((self.path, "at", version, namespace, self._head()), rows, namespace)

    def clone_view_at(self, version: int) -> Optional[CloneView]:
        """clone_view() of VERSION: its refs, the segment packs within 2 … VERSION."""
        with db.reading(self.conn) as conn:
            unbuilt = db.versions_without_pack(conn, 1)
            if unbuilt and unbuilt[0] <= version:
                return None
            rows = db.refs_at(conn, version)
            segs = [row for row in db.segment_packs(conn) if row[1] <= version]
            monotone = not db.rewritten_between(conn, 2, version)
        return CloneView(version, frozenset(r.oid for r in rows if r.oid), frozenset(r.peeled for r in rows if r.peeled),
                         tuple(SegmentPack(*row) for row in segs), monotone)

    # -- history queries ------------------------------------------------------------------------

    def is_ancestor(self, ref: str, j: int, k: int) -> AncestryAnswer:
        """Is the value of REF after version J an ancestor of (or equal to) its
        value after version K (J <= K), proved from fast-forward flags alone."""
        with db.reading(self.conn) as conn:
            through = int(db.get_state(conn, "compacted_through") or "0")
            (vj, at_j), (vk, at_k) = db.value_row_at(conn, ref, j), db.value_row_at(conn, ref, k)
            read = [v for v in (at_j, at_k) if v is not None]     # the versions whose rows gave the values
            nodes: list[tuple[int, int]] = []
            nv = ns = 0
            ok = vj is not None and vk is not None and j <= k
            if ok:
                pieces = segments.cover(j + 1, k, through)
                # the first piece alone (a rewrite right after J ends it there), then the rest at once
                for part in (pieces[:1], pieces[1:]):
                    if not part:
                        continue
                    singles = [idx + 1 for level, idx in part if level == 0]
                    some = [(level, idx) for level, idx in part if level > 0]
                    nv, ns = nv + len(singles), ns + len(some)
                    read.extend(singles)
                    nodes.extend(some)
                    updates, segs = db.ff_flags(conn, ref, singles, some)
                    if False in updates.values() or False in segs.values():
                        ok = False
                        break
        return AncestryAnswer(ref, j, k, ok, vj, vk, Visits(nv, ns, tuple(sorted(set(read))), tuple(nodes)))

    def last_rewind(self, ref: str, version: int) -> Optional[tuple[int, Optional[str]]]:
        """REF's latest update up to settled VERSION that was no fast-forward:
        (its version, the value it wrote or None for a deletion), or None."""
        with db.reading(self.conn) as conn:
            return db.last_rewind(conn, ref, version)

    def tips(self, commit: str) -> TipAnswer:
        """Which versions made COMMIT the value of which refs (oldest first)."""
        return TipAnswer.of(commit, db.tips_of(self.conn, commit))

    def tips_many(self, commits: Sequence[str]) -> dict[str, TipAnswer]:
        """tips() of each of COMMITS, in one query (per 500)."""
        return {c: TipAnswer.of(c, rows) for c, rows in db.tips_of_many(self.conn, commits).items()}

    def introduced_by(self, commit: str) -> list[int]:
        return db.introduced_by(self.conn, commit)

    def introduced_commits(self, version: int) -> list[str]:
        return db.introduced_commits(self.conn, version)

    def introduced_by_many(self, commits: Sequence[str]) -> dict[str, list[int]]:
        return db.introduced_by_many(self.conn, commits)

    def bounded_by_many(self, commits: Sequence[str]) -> dict[str, list[int]]:
        """commit -> the versions whose boundary holds it."""
        return db.bounded_by_many(self.conn, commits)

    def commit_facts(self, commits: Sequence[str]) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
        """commit -> (versions that introduced it, its parents), for the commits a build recorded."""
        return db.commit_facts(self.conn, commits)

    def commit_times(self, commits: Sequence[str]) -> dict[str, int]:
        """commit -> its committer time, for the commits a build recorded it for."""
        return db.commit_times(self.conn, commits)

    def latest(self) -> int:
        return db.latest_version(self.conn)

    def settled(self) -> tuple[tuple[str, float, str], int]:
        """identity() with the import's pack, and the highest version V such
        that every version up to V is done and has its pack: the records of
        those never change, but for the import's pack, built again with the
        wide search once (`widen_import`): then the caches of what settled
        versions say start anew."""
        with db.reading(self.conn) as conn:
            first = db.version_pack_window(conn, 1)
            return (self.path, db.first_version_at(conn), first[0] if first else ""), db.packed_through(conn)

    def import_window(self) -> Optional[int]:
        """The delta window the import version's pack was built with; None when not built or none (no values)."""
        row = db.version_pack_window(self.conn, 1)
        return row[1] if row and row[0] else None

    def import_built_at(self) -> Optional[float]:
        """When the import version's pack was built (or built again: widen_import); None when not built."""
        row = db.version_pack_window(self.conn, 1)
        return row[2] if row else None

    def widen_import(self, built: PackFacts, how: SearchFacts) -> None:
        """The import version's pack is BUILT now (the same objects, searched with HOW)."""
        db.write(self.conn, lambda conn: db.replace_pack(conn, 1, built.name, built.objects, built.size, time.time(),
                                                         how.window, how.depth, how.compression))

    def commits_recorded(self, lo: int, hi: int) -> set[str]:
        """The commits the tips, introduced and boundary records of versions LO … HI name."""
        return db.commits_recorded(self.conn, lo, hi)

    def identity(self) -> tuple[str, float]:
        """This store among all a path ever held: its file and its first version's time."""
        with db.reading(self.conn) as conn:
            return self.path, db.first_version_at(conn)

    def latest_at(self) -> float:
        """The wall-clock time the latest version was committed."""
        with db.reading(self.conn) as conn:
            return db.latest_version_at(conn)

    def log(self, limit: Optional[int] = None) -> Iterator[Version]:
        before = None
        while True:
            batch = db.versions_desc(self.conn, 200 if limit is None else min(200, limit), before)
            for v in batch:
                yield v
                if limit is not None:
                    limit -= 1
                    if limit <= 0:
                        return
            if len(batch) < 200:
                return
            before = batch[-1].id

    # -- verification -----------------------------------------------------------------------------

    def verify_chain(self) -> ChainReport:
        """The hash chain end to end (refstore/chaining.py)."""
        return chaining.check(self.conn)

    def chain(self, versions: Sequence[int]) -> dict[int, tuple[str, str, int]]:
        """version -> (prev, hash, start) of those of VERSIONS that are chained."""
        with db.reading(self.conn) as conn:
            return db.chain_of(conn, versions)

    def chain_links(self) -> Iterator:
        """Every link of the chain, oldest first (model/chain.Link)."""
        with db.reading(self.conn) as conn:
            yield from chaining.links(conn)

    def verify(self, progress: Optional[Callable[[str], None]] = None) -> VerifyReport:
        """The store against itself, the refs on disk and the objects."""
        from .verify import verify  # startup
        return verify(self.conn, self.repo, progress)
