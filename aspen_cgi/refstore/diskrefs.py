"""The refs on disk, read and written as git's files backend keeps them.

Reading is done in-process (packed-refs, then loose files under refs/, which
win), only to compare the disk with the store. Writing goes through
`git update-ref --stdin` in transaction mode: `prepare` takes git's lock files
and checks every old value (compare-and-swap), the caller records the version
in the store, and only then `commit` renames the locks into place. If the
caller dies in between, git sees its input end and aborts, removing its locks.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Optional, Sequence

from ..git import gitexec
from ..model.objectid import OID_PATTERN
from ..model.racy import COARSE_RACY_NS
from ..model.refname import check_refname_format
from ..model.versions import ZERO, RefChange, is_null
from ..runtime.repository import Repository

_HEX = re.compile(f"^{OID_PATTERN}$")


@dataclass(frozen=True)
class DiskRef:
    oid: Optional[str]
    symref: Optional[str] = None


def read_packed(gitdir: str) -> dict[str, DiskRef]:
    out: dict[str, DiskRef] = {}
    try:
        with open(os.path.join(gitdir, "packed-refs"), "rb") as f:
            data = f.read().decode("utf-8", "surrogateescape")
    except OSError:
        return out
    for line in data.splitlines():
        if not line or line[0] in "#^":
            continue
        oid, _, name = line.partition(" ")
        if _HEX.match(oid) and name.startswith("refs/") and check_refname_format(name):
            out[name] = DiskRef(oid)
    return out


def loose_value(path: str) -> Optional[DiskRef]:
    try:
        with open(path, "rb") as f:
            text = f.read(4096).decode("utf-8", "surrogateescape")
    except OSError:
        return None
    if text.startswith("ref:"):
        target = text[4:].strip()
        return DiskRef(None, target) if target else None
    oid = text.split(None, 1)[0] if text.strip() else ""
    if _HEX.match(oid) and (len(text) == len(oid) or text[len(oid)].isspace()):
        return DiskRef(oid)
    return None


STABLE_NS = COARSE_RACY_NS    # a listing older than this is kept
_BROKEN = "broken"
_CACHE_MAX = 20_000           # directories
# directory path -> (stat key, [(ref name, value or _BROKEN)], [(subdir name, path)])
_dirs: dict[str, tuple[tuple[int, int, int], list, list]] = {}


def read_all(gitdir: str) -> dict[str, DiskRef]:
    """Every ref under refs/ as git's files backend resolves names (no peeling).

    Git writes a loose ref by renaming its lock file into place, which
    changes the directory's modification time: a directory whose stat is
    unchanged since a listing at least STABLE_NS old is not read again (a
    repository of 955 loose tags had every push's sync read them all)."""
    refs = read_packed(gitdir)
    for full, value in _loose(os.path.join(gitdir, "refs"), "refs"):
        if value == _BROKEN:
            refs.pop(full, None)     # a broken loose ref hides its packed value
        else:
            refs[full] = value
    return refs


def _loose(root: str, prefix: str):
    if len(_dirs) > _CACHE_MAX:
        _dirs.clear()
    stack = [(prefix, root)]
    while stack:
        name, path = stack.pop()
        try:
            st = os.stat(path)
        except OSError:
            continue
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        cached = _dirs.get(path)
        if cached is not None and cached[0] == key:
            files, subdirs = cached[1], cached[2]
        else:
            listed_at = time.time_ns()
            try:
                entries = list(os.scandir(path))
            except OSError:
                continue
            files, subdirs = [], []
            for e in entries:
                full = f"{name}/{e.name}"
                if e.is_dir(follow_symlinks=False):
                    subdirs.append((full, e.path))
                elif not e.name.endswith(".lock") and check_refname_format(full):
                    value = loose_value(e.path)
                    if value is not None or os.path.lexists(e.path):     # else gone since the listing
                        files.append((full, value if value is not None else _BROKEN))
            if listed_at - st.st_mtime_ns > STABLE_NS:
                _dirs[path] = (key, files, subdirs)
        yield from files
        stack.extend(subdirs)


def read_some(gitdir: str, names: Sequence[str]) -> dict[str, DiskRef]:
    """The refs NAMES (loose wins over packed); absent names are left out."""
    out: dict[str, DiskRef] = {}
    packed: Optional[dict[str, DiskRef]] = None
    for name in names:
        path = os.path.join(gitdir, *name.split("/"))
        if os.path.isfile(path):
            value = loose_value(path)
            if value is not None:
                out[name] = value
            continue
        if packed is None:
            packed = read_packed(gitdir)
        if name in packed:
            out[name] = packed[name]
    return out


class UpdateRef:
    """One `git update-ref --stdin` transaction: prepare (lock + CAS), then
    commit or abort."""

    def __init__(self, repo: Repository, message: str = "push"):
        # GIT_DIR "." from inside the repository, as stock's receive-pack runs: git's messages
        # then name paths as stock's do ("<repo>/./refs/heads/main.lock")
        self.proc = gitexec.start(["update-ref", "-m", message, "--stdin"], cwd=repo.gitdir,
                                  env=gitexec.child_env(repo.git_env, GIT_DIR="."),
                                  stdin=gitexec.PIPE, stdout=gitexec.PIPE, stderr=gitexec.PIPE)
        self.error: Optional[str] = None

    def _send(self, data: bytes, expect: bytes) -> bool:
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.proc.stderr is not None   # PIPEs
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = b""
        if line.strip() == expect:
            return True
        self._fail()
        return False

    def _fail(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.proc.stderr is not None   # PIPEs
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        err = self.proc.stderr.read()
        rc = self.proc.wait()
        text = err.decode("utf-8", "replace").strip()
        for prefix in ("fatal: ", "error: ", "prepare: ", "commit: "):
            if text.startswith(prefix):
                text = text[len(prefix):]
        self.error = text or f"update-ref exited with {rc}"

    def prepare(self, changes: Sequence[RefChange]) -> Optional[str]:
        """Lock every ref and check every old value; git's error text or None."""
        lines = [b"start\n"]
        for c in changes:
            ref = c.ref.encode("utf-8", "surrogateescape")
            if is_null(c.new):
                lines.append(b"delete " + ref + (b" " + c.old.encode() if c.old else b"") + b"\n")
            else:
                lines.append(b"update " + ref + b" " + c.new.encode() + (b" " + c.old.encode() if c.old else b"") + b"\n")
        lines.append(b"prepare\n")
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.proc.stderr is not None   # PIPEs
        try:
            self.proc.stdin.write(b"".join(lines))
            self.proc.stdin.flush()
            first = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            first = b""
        if first.strip() != b"start: ok":
            self._fail()
            return self.error
        if not self._send(b"", b"prepare: ok"):
            return self.error
        return None

    def commit(self) -> Optional[str]:
        if not self._send(b"commit\n", b"commit: ok"):
            return self.error
        self.close()
        return None

    def close(self) -> None:
        """Abort unless committed: git drops its locks when its input ends."""
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.proc.stderr is not None   # PIPEs
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            self.proc.wait()
        for f in (self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except OSError:
                pass


_packed_cache: dict[str, tuple[tuple[int, int, int], dict[str, DiskRef]]] = {}


def _packed_cached(gitdir: str) -> dict[str, DiskRef]:
    path = os.path.join(gitdir, "packed-refs")
    try:
        st = os.stat(path)
    except OSError:
        return {}
    key = (st.st_ino, st.st_mtime_ns, st.st_size)
    hit = _packed_cache.get(gitdir)
    if hit is not None and hit[0] == key:
        return hit[1]
    refs = read_packed(gitdir)
    _packed_cache[gitdir] = (key, refs)
    return refs


MAX_DEPTH = 100   # deeper refs go to git: os.makedirs recurses once per directory level


class LooseWrite:
    """The common push written in-process with git's files-backend protocol:
    `<ref>.lock` created exclusively, the old value checked under the lock,
    the new value written into the lock and renamed over the ref.

    Only for plain creates and updates of loose-or-packed refs with no reflog
    to append, no shared-permission rules, no directory/file conflict and no
    lock already held; `prepare()` returns False for anything else (and on a
    failed check) so that the caller asks git, which also words the error."""

    def __init__(self, gitdir: str):
        self.gitdir = gitdir
        self.locks: list[tuple[str, str]] = []   # (lock path, ref path)

    def _path(self, ref: str) -> str:
        return os.path.join(self.gitdir, *ref.split("/"))

    def _eligible(self, changes: Sequence[RefChange]) -> bool:
        if not changes or len({c.ref for c in changes}) != len(changes):
            return False
        packed = _packed_cached(self.gitdir)
        for c in changes:
            if is_null(c.new) or not c.ref.startswith("refs/") or not check_refname_format(c.ref):
                return False
            if c.ref.startswith("refs/heads/") and c.otype != "commit":
                return False    # git refuses a non-commit on a branch ("trying to write non-commit object")
            if os.path.lexists(os.path.join(self.gitdir, "logs", *c.ref.split("/"))):
                return False
            parts = c.ref.split("/")
            if len(parts) > MAX_DEPTH:
                return False
            for i in range(2, len(parts)):
                prefix = "/".join(parts[:i])
                if prefix in packed or os.path.isfile(os.path.join(self.gitdir, *parts[:i])):
                    return False
            path = self._path(c.ref)
            if os.path.isdir(path) or os.path.islink(path):
                return False
            if is_null(c.old) and any(n.startswith(c.ref + "/") for n in packed):
                return False
        return True

    def prepare(self, changes: Sequence[RefChange], claim) -> bool:
        """Take every change's lock and check its old value under it. Each
        lock is first written under its side name and claimed in CLAIM
        (reflocks.Claim), then linked into place, so that a writer killed at
        any point leaves no lock the next push cannot remove."""
        if not self._eligible(changes):
            return False
        try:
            for c in sorted(changes, key=lambda c: c.ref):
                path = self._path(c.ref)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                if not self._claimed_lock(path, c.new, claim):
                    self.close()
                    return False
                current = self._current(c.ref, path)
                if c.old is not None and current != c.old and not (is_null(current) and is_null(c.old)):
                    self.close()
                    return False
        except OSError:
            self.close()
            return False
        return True

    def _claimed_lock(self, path: str, new: str, claim) -> bool:
        side = claim.side_name(path)
        if not claim.add_side(side):
            return False
        fd = os.open(side, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            try:
                os.write(fd, (new + "\n").encode())
                ino = os.fstat(fd).st_ino
            finally:
                os.close(fd)
            if not claim.add(ino, path + ".lock", side):
                return False
            try:
                os.link(side, path + ".lock")
            except FileExistsError:
                return False
            self.locks.append((path + ".lock", path))
            return True
        finally:
            try:
                os.unlink(side)
            except OSError:
                pass

    def _current(self, ref: str, path: str) -> Optional[str]:
        if os.path.isfile(path):
            value = loose_value(path)
            return value.oid if value is not None and value.symref is None else None
        packed = _packed_cached(self.gitdir).get(ref)
        return packed.oid if packed is not None else ZERO

    def commit(self) -> Optional[str]:
        for lock, path in self.locks:
            try:
                os.rename(lock, path)
            except OSError as e:
                self.close()
                return f"cannot update ref '{path}': {e.strerror}"
        self.locks = []
        return None

    def close(self) -> None:
        for lock, _ in self.locks:
            try:
                os.unlink(lock)
            except OSError:
                pass
        self.locks = []


def stale_locks(gitdir: str, older_than: float) -> list[str]:
    """Ref lock files (refs/**.lock, packed-refs.lock) untouched for OLDER_THAN seconds."""
    now = time.time()
    out = []
    candidates = [os.path.join(gitdir, "packed-refs.lock"), os.path.join(gitdir, "HEAD.lock")]
    stack = [os.path.join(gitdir, "refs")]
    while stack:     # not os.walk, which recurses once per level: a ref may be 1,000 directories deep
        try:
            with os.scandir(stack.pop()) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                    elif e.name.endswith(".lock"):
                        candidates.append(e.path)
        except OSError:
            pass
    for path in candidates:
        try:
            if now - os.stat(path).st_mtime > older_than:
                out.append(path)
        except OSError:
            pass
    return out


def apply(repo: Repository, changes: Sequence[RefChange], message: str = "push") -> Optional[str]:
    """Prepare and commit CHANGES in one go (recovery); git's error text or None."""
    if not changes:
        return None
    tx = UpdateRef(repo, message)
    try:
        return tx.prepare(changes) or tx.commit()
    finally:
        tx.close()
