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
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from .. import gitexec
from ..refname import check_refname_format
from .model import ZERO, RefChange

_HEX = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class DiskRef:
    oid: Optional[str]
    symref: Optional[str] = None


def _packed(gitdir: str) -> dict[str, DiskRef]:
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


def _loose_value(path: str) -> Optional[DiskRef]:
    try:
        with open(path, "rb") as f:
            text = f.read(4096).decode("utf-8", "surrogateescape")
    except OSError:
        return None
    if text.startswith("ref:"):
        target = text[4:].strip()
        return DiskRef(None, target) if target else None
    oid = text[:40]
    if _HEX.match(oid) and (len(text) == 40 or text[40].isspace()):
        return DiskRef(oid)
    return None


def read_all(gitdir: str) -> dict[str, DiskRef]:
    """Every ref under refs/ as git's files backend resolves names (no peeling)."""
    refs = _packed(gitdir)
    root = os.path.join(gitdir, "refs")
    stack = [("refs", root)]
    while stack:
        name, path = stack.pop()
        try:
            entries = list(os.scandir(path))
        except OSError:
            continue
        for e in entries:
            full = f"{name}/{e.name}"
            if e.is_dir(follow_symlinks=False):
                stack.append((full, e.path))
            elif not e.name.endswith(".lock") and check_refname_format(full):
                value = _loose_value(e.path)
                if value is not None:
                    refs[full] = value
                elif full in refs and os.path.lexists(e.path):
                    del refs[full]   # a broken loose ref hides its packed value
    return refs


def read_some(gitdir: str, names: Sequence[str]) -> dict[str, DiskRef]:
    """The refs NAMES (loose wins over packed); absent names are left out."""
    out: dict[str, DiskRef] = {}
    packed: Optional[dict[str, DiskRef]] = None
    for name in names:
        path = os.path.join(gitdir, *name.split("/"))
        if os.path.isfile(path):
            value = _loose_value(path)
            if value is not None:
                out[name] = value
            continue
        if packed is None:
            packed = _packed(gitdir)
        if name in packed:
            out[name] = packed[name]
    return out


class UpdateRef:
    """One `git update-ref --stdin` transaction: prepare (lock + CAS), then
    commit or abort."""

    def __init__(self, gitdir: str, env: Mapping[str, str], message: str = "push"):
        self.proc = gitexec.start(["update-ref", "-m", message, "--stdin"], cwd=gitdir, env=dict(env),
                                  stdin=gitexec.PIPE, stdout=gitexec.PIPE, stderr=gitexec.PIPE)
        self.error: Optional[str] = None

    def _send(self, data: bytes, expect: bytes) -> bool:
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
            if c.new == ZERO:
                lines.append(b"delete " + ref + (b" " + c.old.encode() if c.old else b"") + b"\n")
            else:
                lines.append(b"update " + ref + b" " + c.new.encode() + (b" " + c.old.encode() if c.old else b"") + b"\n")
        lines.append(b"prepare\n")
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


def apply(gitdir: str, env: Mapping[str, str], changes: Sequence[RefChange], message: str = "push") -> Optional[str]:
    """Prepare and commit CHANGES in one go (recovery); git's error text or None."""
    if not changes:
        return None
    tx = UpdateRef(gitdir, env, message)
    try:
        return tx.prepare(changes) or tx.commit()
    finally:
        tx.close()
