"""Version packs (DESIGN §5): for a push version v with new values T_v, the
thin pack Q_v of the objects reachable from T_v and not from its boundary
B_v (the commits just outside what v introduced), with an index of exactly
its own entries. Built once, after the push, with a wider delta search than
a per-request server can afford, and kept beside the ref store.

`git index-pack` cannot index a thin pack alone; with `--fix-thin` it
appends the missing bases after the pack's own entries, leaving their
offsets unchanged. So the index is made that way in a scratch file, and the
entries that lie inside the thin pack are written as its own index.

A build is told its repository's guard (repoguard.RepoGuard): it is
checked before every file or directory is made and while git runs, so a
build whose repository was deleted stops, kills its git child and removes
its scratch directory; directories are made one level at a time, never
re-creating a deleted repository's parents.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
from dataclasses import dataclass, field
from typing import Any, Collection, Mapping, Optional, Sequence

from ..git import gitexec
from ..runtime.memo import put_bounded
from ..runtime.owners import owner_alive, owner_id
from ..runtime.repository import Repository

SCRATCH_PREFIX = "build-"


class BuildError(Exception):
    pass


def scratch_owner() -> str:
    """This process as a scratch directory names it ("PID.START"), see `owners`."""
    return ".".join(owner_id().rsplit(":", 2)[1:])


def scratch_owner_alive(dirname: str) -> bool:
    """Whether the process that made scratch directory DIRNAME still runs."""
    pid_start = dirname[len(SCRATCH_PREFIX):].split("-", 1)[0]
    pid, _, start = pid_start.partition(".")
    return owner_alive(f"{socket.gethostname()}:{pid}:{start}") if pid.isdigit() and start else False


@dataclass(frozen=True)
class DeltaSearch:
    """Built once, served many times: search deltas afresh (no reuse of the
    source packs' deltas, no verbatim pack or bitmap reuse) with a wide window."""
    window: int = 250
    depth: int = 50
    compression: int = 9
    reuse_deltas: bool = False
    threads: int = 0         # pack-objects --threads (0: git's default, one per core); background builds: 1
    nice: int = 0            # the git children's niceness, at least (background builds: 10)

    def args(self) -> list[str]:
        out = ["-c", f"pack.compression={self.compression}", "-c", "pack.allowPackReuse=false", "pack-objects",
               f"--window={self.window}", f"--depth={self.depth}", "--no-use-bitmap-index"]
        if self.threads:
            out.append(f"--threads={self.threads}")
        if not self.reuse_deltas:
            out.append("--no-reuse-delta")
        return out


class _Unguarded:
    """The guard of a build nobody watches (tests, by-hand calls)."""

    def check(self) -> None:
        pass

    def mkdir(self, path: str) -> None:
        try:
            os.mkdir(path)
        except FileExistsError:
            pass

    def mkdtemp(self, prefix: str, dir: str) -> str:
        return tempfile.mkdtemp(prefix=prefix, dir=dir)


def _git(repo: Repository, args: Sequence[str], search: DeltaSearch, guard, **kw):
    return gitexec.background_git(args, cwd=repo.gitdir, env=repo.git_env, check=guard.check, nice=search.nice, **kw)


@dataclass(frozen=True)
class Boundary:
    introduced: tuple[str, ...]    # commits reachable from the tips and from no earlier ref value
    commits: tuple[str, ...]       # B_v: parents of those outside them, and tips that already existed
    parents: Mapping[str, tuple[str, ...]] = field(default_factory=dict)   # each introduced commit's parents
    times: Mapping[str, int] = field(default_factory=dict)                 # and its committer time


@dataclass(frozen=True)
class BuiltPack:
    name: str        # the pack's trailer (SHA-1 or SHA-256), hex
    pack: str
    idx: str
    objects: int
    size: int


def boundary_of(repo: Repository, tips: Sequence[str], peeled: Sequence[str],
                before: Sequence[str], search: DeltaSearch = DeltaSearch(), guard=None) -> Boundary:
    """N_v and B_v for new values TIPS (PEELED: their commits) against the ref values BEFORE."""
    if not tips:
        return Boundary((), ())
    guard = guard or _Unguarded()
    stdin = "".join(f"{t}\n" for t in peeled) + "".join(f"^{b}\n" for b in before)
    res = _git(repo, ["rev-list", "--parents", "--timestamp", "--stdin"], search, guard, input=stdin.encode())
    if not res.ok:
        guard.check()      # git failed because the repository went: say that
        raise BuildError(res.stderr.decode("utf-8", "replace").strip())
    parents: dict[str, list[str]] = {}
    times: dict[str, int] = {}
    for line in res.stdout.decode().splitlines():
        parts = line.split()
        if len(parts) > 1:
            parents[parts[1]] = parts[2:]
            times[parts[1]] = int(parts[0])
    outside = {p for ps in parents.values() for p in ps if p not in parents}
    outside.update(p for p in peeled if p not in parents)
    return Boundary(tuple(parents), tuple(sorted(outside)), {c: tuple(ps) for c, ps in parents.items()}, times)


def boundary_listed(listing, tips: Sequence[str], peeled: Sequence[str], before: Collection[str]) -> Optional[Boundary]:
    """N_v and B_v from the push's own connectivity walk (sentpack.Listing),
    when that is sure to be them: the listing is of exactly TIPS, and every
    commit outside it that its commits' parents or PEELED name is one of the
    ref values BEFORE the version. Then closure(TIPS) lies in the listed
    commits and closure(BEFORE), so they hold all of N_v; the walk excluded
    what --all reached, so no listed commit is in closure(BEFORE) either
    unless a ref moved between the walk and the version (git's own, or
    another push's: then the listing holds more, never less). None sends
    the build to boundary_of."""
    if listing is None or sorted(listing.tips) != sorted(tips):
        return None
    commits = listing.commits
    outside = {p for ps in commits.values() for p in ps if p not in commits}
    outside.update(p for p in peeled if p not in commits)
    if not outside <= set(before):
        return None
    return Boundary(tuple(commits), tuple(sorted(outside)), {c: tuple(ps) for c, ps in commits.items()},
                    dict(listing.times))


def build(repo: Repository, tips: Sequence[str], boundary: Sequence[str], outdir: str,
          search: DeltaSearch = DeltaSearch(), guard=None) -> BuiltPack:
    """Q_v for TIPS over BOUNDARY, written to OUTDIR as pack-<name>.pack/.idx.
    GUARD (repoguard.RepoGuard) raises when the repository goes; OUTDIR's
    parent must exist (it is made, not its parents)."""
    built = build_smaller(repo, tips, boundary, outdir, search, guard)
    assert built is not None
    return built


def build_smaller(repo: Repository, tips: Sequence[str], boundary: Sequence[str], outdir: str,
                  search: DeltaSearch = DeltaSearch(), guard=None,
                  smaller_than: Optional[int] = None) -> Optional[BuiltPack]:
    """build(), or None, not indexed nor kept, when the pack has at least
    SMALLER_THAN bytes (its index costs a second git run)."""
    guard = guard or _Unguarded()
    if not os.path.isdir(outdir):
        guard.mkdir(outdir)
    scratch = guard.mkdtemp(f"{SCRATCH_PREFIX}{scratch_owner()}-", outdir)
    try:
        thin = os.path.join(scratch, "thin.pack")
        stdin = "".join(f"{t}\n" for t in tips) + "".join(f"^{b}\n" for b in boundary)
        guard.check()
        with open(thin, "wb") as out:
            res = _git(repo, [*search.args(), "--revs", "--thin", "--stdout", "-q", "--delta-base-offset"],
                       search, guard, input=stdin.encode(), stdout=out)
        if not res.ok:
            guard.check()
            raise BuildError(res.stderr.decode("utf-8", "replace").strip())
        size = os.path.getsize(thin)
        if smaller_than is not None and size >= smaller_than:
            return None
        hash_len = oid_len(repo)
        with open(thin, "rb") as f:
            f.seek(size - hash_len)
            trailer = f.read(hash_len)
        fixed_pack, fixed_idx = os.path.join(scratch, "fixed.pack"), os.path.join(scratch, "fixed.idx")
        with open(thin, "rb") as src:
            res = _git(repo, ["index-pack", "--stdin", "--fix-thin", "-o", fixed_idx, fixed_pack],
                       search, guard, stdin=src)
        if not res.ok:
            guard.check()
            raise BuildError(res.stderr.decode("utf-8", "replace").strip())
        entries = _own_entries(fixed_idx, size - hash_len)
        return _install(thin, os.path.join(scratch, "own.idx"), entries, trailer, outdir, size, guard)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _install(pack: str, tmp_idx: str, entries, trailer: bytes, outdir: str, size: int, guard) -> BuiltPack:
    """Write ENTRIES' index at TMP_IDX, then move PACK and it into OUTDIR under the trailer's name."""
    from dulwich.pack import write_pack_index_v2  # startup
    name = trailer.hex()
    pack_path = os.path.join(outdir, f"pack-{name}.pack")
    idx_path = os.path.join(outdir, f"pack-{name}.idx")
    guard.check()
    with open(tmp_idx, "wb") as f:
        write_pack_index_v2(f, entries, trailer)
    guard.check()
    os.replace(pack, pack_path)
    guard.check()
    os.replace(tmp_idx, idx_path)
    return BuiltPack(name, pack_path, idx_path, len(entries), size)


ADOPT_MAX = 4 << 20      # bytes: larger client packs are built by pack-objects as before


CLIENT_DELTAS = DeltaSearch(window=0, depth=0, compression=-1)    # recorded for an adopted pack: no search ran


def adopt(tips: Sequence[str], boundary: Boundary, sent: str, outdir: str, objects: "RepoObjects",
          guard=None, listed: Optional[Mapping[str, str]] = None) -> Optional[BuiltPack]:
    """Q_v without building it: the pack SENT (the thin pack the client pushed
    for this version, kept by the push) when it holds exactly the objects the
    version's commits introduced, path by path against their parents (what
    git's sparse pack-objects sends: RepoObjects.introduced_objects), with
    every thin base the object at its delta's path in a boundary commit's
    tree; indexed here (thinindex) and moved into OUTDIR under its trailer.
    None otherwise (the client sent more or less: say it had refs the server
    lacks, or a rename made the sets differ), or when it is too large: then
    `build`. The deltas are the client's; segment packs search wider later.
    No git runs: listing the objects with `rev-list --objects` cost 10.75 ms
    on the medium preset (it walks the boundary's whole tree), pack-objects
    and index-pack 10 ms. LISTED: the objects other than commits with their
    paths, as the push's connectivity walk listed them (boundary_listed):
    then the trees are not read here."""
    introduced, commits = boundary.introduced, boundary.commits
    guard = guard or _Unguarded()
    from . import thinindex  # startup
    from .packfile import PackError  # startup
    try:
        if os.path.getsize(sent) > ADOPT_MAX:
            return None
        with open(sent, "rb") as f:
            data = f.read()
    except OSError:
        return None
    paths: Optional[dict[str, Optional[str]]]
    if listed is not None:
        paths = dict.fromkeys(introduced)
        paths.update(listed)
    else:
        paths = objects.introduced_objects(introduced, tips)
    if paths is None:
        return None
    try:
        index = thinindex.index_thin(data, objects.raw, objects.oid_len)
    except PackError:
        return None
    entries = index.entries
    objects.remember(index.known)
    if {oid.hex() for oid, _, _ in entries} != set(paths):
        return None
    # A client served Q_v holds closure(B_v): a delta's base must be the object at its path in a
    # boundary commit's tree, as pack-objects --thin takes them (another client may have used any
    # object it knew the server had).
    for base, targets in index.thin_bases.items():
        for target in targets:
            path = paths[target.hex()]
            if path is None or not any(objects.at_path(b, path) == base for b in commits):
                return None
    if not os.path.isdir(outdir):
        guard.mkdir(outdir)
    trailer = data[-objects.oid_len:]
    tmp_idx = os.path.join(outdir, f"{SCRATCH_PREFIX}{scratch_owner()}-{trailer.hex()}.idx")    # swept if we die
    try:
        return _install(sent, tmp_idx, entries, trailer, outdir, len(data), guard)
    finally:
        try:
            os.unlink(tmp_idx)
        except OSError:
            pass


class RepoObjects:
    """The repository's objects read in this process (dulwich's object store:
    packs, loose objects, alternates), for adopt(). Opening a store reads its
    pack indexes (26 ms on a 50,000-object repository), so one is kept per
    repository and process (the KEEP latest), and opened again when
    objects/pack changes (gc)."""

    _open: dict[str, tuple[float, Any, dict]] = {}     # (stamp, dulwich's DiskObjectStore, parsed)
    KEEP = 16             # repositories whose stores stay open
    PARSED = 4096         # commits and trees kept parsed per repository (the next push's boundary)

    def __init__(self, repo: Repository):
        from dulwich.object_format import SHA1, SHA256  # startup
        from dulwich.object_store import DiskObjectStore  # startup
        objects = os.path.join(repo.gitdir, "objects")
        self.oid_len = oid_len(repo)
        try:
            stamp = os.stat(os.path.join(objects, "pack")).st_mtime
        except OSError:
            stamp = 0.0
        known = RepoObjects._open.get(objects)
        if known is None or known[0] != stamp:
            if not RepoObjects._open:
                import atexit  # startup
                atexit.register(RepoObjects.close_all)      # once more is harmless: it closes what is open
            while len(RepoObjects._open) >= RepoObjects.KEEP:
                RepoObjects._open.pop(next(iter(RepoObjects._open)), None)
            known = RepoObjects._open[objects] = (stamp, DiskObjectStore(objects, object_format=SHA256 if self.oid_len == 32 else SHA1), {})
        self.store: Any = known[1]          # dulwich takes its hex ids as its ObjectID (bytes)
        self.parsed: dict[bytes, object] = known[2]      # hex id -> dulwich Commit or Tree

    @staticmethod
    def close_all() -> None:
        """Close every kept store's packs while the interpreter still runs (at
        exit: dulwich's finalizers, run during its teardown, fill the server's
        error log with tracebacks)."""
        while RepoObjects._open:
            _, (_, store, _) = RepoObjects._open.popitem()
            try:
                store.close()
            except Exception:   # noqa: BLE001  (exiting: nothing to do about a pack that will not close)
                pass

    def obj(self, oid: bytes):
        """The commit or tree (any object) with hex id OID, parsed; KeyError when missing."""
        got = self.parsed.get(oid)
        if got is None:
            got = self.store[oid]
            if got.type_num in (1, 2):
                self._keep(oid, got)
        return got

    def _keep(self, oid: bytes, obj) -> None:
        put_bounded(self.parsed, oid, obj, self.PARSED)

    def remember(self, known: Mapping[bytes, tuple[int, bytes]]) -> None:
        """Commits and trees just read from a pack (binary id -> (type, content)):
        the next version's boundary is often this one's commit."""
        from dulwich.errors import ObjectFormatException  # startup
        from dulwich.object_format import SHA1, SHA256  # startup
        from dulwich.objects import Commit, Tree  # startup
        fmt = SHA256 if self.oid_len == 32 else SHA1
        for oid, (type_code, content) in known.items():
            cls = Commit if type_code == 1 else Tree if type_code == 2 else None
            if cls is not None:
                try:
                    self._keep(oid.hex().encode(), cls.from_raw_string(cls.type_num, content, object_format=fmt))
                except (ValueError, KeyError, ObjectFormatException):     # dulwich's parse errors
                    pass

    def raw(self, oid: bytes) -> Optional[tuple[int, bytes]]:
        """(type, content) of the object with binary id OID, None when missing."""
        try:
            return self.store.get_raw(oid.hex().encode())
        except (KeyError, OSError, ValueError):
            return None

    def introduced_objects(self, introduced: Sequence[str], tips: Sequence[str]) -> Optional[dict[str, Optional[str]]]:
        """Every object the commits INTRODUCED bring, with its path (None for
        commits and tags): each commit, and the objects of its tree at paths
        where they differ from every parent's object there (descending only
        into subtrees that differ from all the parents'); and the tag objects
        among TIPS. This holds all of closure(TIPS) beyond closure(B_v): an
        object missing from it lies at its path in some parent, which is in
        B_v or introduced itself. None when something cannot be read or a
        tag points at neither a commit nor a tag."""
        from dulwich.objects import Commit, Tag  # startup
        out: dict[str, Optional[str]] = {}
        try:
            for c in introduced:
                commit = self.obj(c.encode())
                if not isinstance(commit, Commit):
                    return None
                out[c] = None
                parents = [self.obj(p).tree for p in commit.parents]
                self._changed(commit.tree, parents, "", out)
            for t in tips:
                obj = self.obj(t.encode())
                while isinstance(obj, Tag):
                    out[obj.id.decode()] = None
                    kind, target = obj.object
                    obj = self.obj(target)
                if not isinstance(obj, Commit):
                    return None
        except (KeyError, OSError, ValueError):
            return None
        return out

    def _changed(self, tree: bytes, parents: list[bytes], path: str, out: dict[str, Optional[str]]) -> None:
        if tree in parents:
            return
        out.setdefault(tree.decode(), path)
        entries = self.obj(tree)
        olds = [self.obj(p) for p in parents]
        for entry in entries.iteritems():
            if stat.S_IFMT(entry.mode) == 0o160000:
                continue                       # a submodule's commit is no object of this repository
            before = [o[entry.path] for o in olds if entry.path in o]
            if any(sha == entry.sha for _, sha in before):
                continue
            sub = path + "/" + entry.path.decode("utf-8", "surrogateescape") if path else \
                entry.path.decode("utf-8", "surrogateescape")
            if stat.S_ISDIR(entry.mode):
                self._changed(entry.sha, [sha for mode, sha in before if stat.S_ISDIR(mode)], sub, out)
            else:
                out.setdefault(entry.sha.decode(), sub)

    def at_path(self, commit: str, path: str) -> Optional[bytes]:
        """The binary id of the object at PATH ("" for the root tree) in COMMIT's tree."""
        from dulwich.objects import Commit, Tree  # startup
        try:
            obj = self.obj(commit.encode())
            if not isinstance(obj, Commit):
                return None
            oid = obj.tree
            for part in path.split("/") if path else ():
                tree = self.obj(oid)
                if not isinstance(tree, Tree):
                    return None
                oid = tree[part.encode("utf-8", "surrogateescape")][1]
            return bytes.fromhex(oid.decode())
        except (KeyError, OSError, ValueError):
            return None



def oid_len(repo: Repository) -> int:
    """The length in bytes of the repository's object ids: 20 (SHA-1) or 32 (SHA-256)."""
    from ..git.repoconfig import RepoConfig  # startup
    from ..model.objectid import id_bytes  # startup
    return id_bytes(RepoConfig.load(repo.gitdir, repo.git_env).object_format)


def _own_entries(idx_path: str, end: int) -> list[tuple[bytes, int, int]]:
    """(object id, offset, crc32) of the entries before offset END, sorted by id."""
    from .packfile import PackIndex  # startup
    idx = PackIndex.load(idx_path)
    return sorted((idx.oid(i), idx.offset(i), idx.crc32(i)) for i in range(idx.count) if idx.offset(i) < end)
