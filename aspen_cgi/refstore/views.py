"""Stored rows as the advertisements see them, and the comparisons between
the store and the refs on disk (git's view for authority, the in-process
reader for a cheap check)."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

from ..git import gitexec, reader
from ..model import refs as refs_mod
from ..model.versions import StoredRef
from ..runtime.repository import Repository
from . import diskrefs


def ref_value(r: Optional[StoredRef]) -> Optional[tuple[Optional[str], Optional[str]]]:
    return None if r is None else (r.oid, r.symref)


def tip_rows(rows: Sequence[StoredRef]) -> list[tuple[str, str]]:
    out = []
    for r in rows:
        if r.oid:
            out.append((r.oid, r.name))
            if r.peeled:
                out.append((r.peeled, r.name))
    return out


def read_git(repo: Repository) -> list[StoredRef]:
    """Every ref under refs/ as git reads it, with types and peeled values."""
    snap = reader.read_refs(repo.gitdir, repo.git_env.without("GIT_NAMESPACE"), None)
    out = []
    for r in snap.refs:
        if r.symref_target:
            out.append(StoredRef(r.name, None, r.symref_target))
        else:
            otype = "missing" if r.missing else ("tag" if r.peeled else None)
            out.append(StoredRef(r.name, r.oid, None, otype, r.peeled))
    return out


def same(disk: Mapping[str, diskrefs.DiskRef], stored: Mapping[str, StoredRef], skip: set[str]) -> bool:
    dangling = {n for n, r in disk.items() if r.symref and _resolve_disk(disk, n) not in disk}
    names = (set(disk) - dangling | set(stored)) - skip
    for n in names:
        a, b = disk.get(n), stored.get(n)
        if a is None or b is None:
            return False
        if a.symref is not None or b.symref is not None:
            # stored symrefs name the end of their chain; compare where they lead
            if _resolve_disk(disk, n) != (_resolve_stored(stored, n)):
                return False
        elif a.oid != b.oid:
            return False
    return True


def _resolve_disk(disk: Mapping[str, diskrefs.DiskRef], name: str) -> Optional[str]:
    seen = set()
    while name in disk and disk[name].symref and name not in seen:
        seen.add(name)
        name = disk[name].symref or name
    return name


def _resolve_stored(stored: Mapping[str, StoredRef], name: str) -> Optional[str]:
    r = stored.get(name)
    return r.symref if r is not None and r.symref else name


def to_snapshot(rows: Sequence[StoredRef], repo: Repository, namespace: Optional[str]) -> refs_mod.RefSnapshot:
    gitdir = repo.gitdir
    prefix = refs_mod.namespace_prefix(namespace)
    by_name = {r.name: r for r in rows}
    Ref = refs_mod.Ref

    def value(r: StoredRef) -> Optional[StoredRef]:
        if r.symref is None:
            return r
        t = by_name.get(r.symref)
        return t if t is not None and t.symref is None else None

    out = []
    for r in rows:
        name = r.name
        if prefix:
            if not name.startswith(prefix):
                continue
            name = name[len(prefix):]
            if name == "HEAD" or not name.startswith("refs/"):
                continue
        v = value(r)
        if v is None or v.oid is None:      # (a direct ref always has its value)
            continue
        target = None
        if r.symref:
            target = r.symref
            if prefix:
                target = target[len(prefix):] if target.startswith(prefix) else None
        out.append(Ref(name, v.oid, v.peeled if v.otype == "tag" else None, target, v.otype == "missing"))
    index = {r.name: r for r in out}
    head = None
    if prefix:
        row = by_name.get(prefix + "HEAD")
        target = direct = None
        if row is not None:
            if row.symref:
                target = row.symref[len(prefix):] if row.symref.startswith(prefix) else None
            else:
                direct = row
        if target is not None:
            ref = index.get(target)
            if ref is not None:
                head = Ref("HEAD", ref.oid, ref.peeled, target, ref.missing)
        elif direct is not None and direct.oid is not None:
            head = Ref("HEAD", direct.oid, direct.peeled if direct.otype == "tag" else None, None,
                       direct.otype == "missing")
        return refs_mod.RefSnapshot(tuple(out), head, target, prefix)
    target, direct_oid = reader.read_head_file(gitdir, "")
    if target is not None:
        t = by_name.get(target)
        if t is not None and t.symref:
            target = t.symref
        ref = index.get(target)
        if ref is not None:
            head = Ref("HEAD", ref.oid, ref.peeled, target, ref.missing)
    elif direct_oid:
        info = reader.object_info(gitdir, gitexec.child_env(repo.git_env, GIT_DIR="."),
                                  [direct_oid]).get(direct_oid, ("missing", None))
        head = Ref("HEAD", direct_oid, info[1] if info[0] == "tag" else None, None, info[0] == "missing")
    return refs_mod.RefSnapshot(tuple(out), head, target, prefix)
