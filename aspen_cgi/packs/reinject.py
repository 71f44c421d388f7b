"""Objects put back into the repository from the version packs: a
time-travel fetch (model/pin.py), an undo or a restore may need objects no
current ref reaches, which `git gc` may have pruned; every version's pack
still holds what it introduced.

For each missing object, the version whose pack holds it (the versions
that introduced it or made it a ref value, else any up to the pinned one);
then, since a version pack is thin against its boundary, each boundary
commit of those versions that is missing too, recursively, down to the
import version, whose pack is whole. The packs go in oldest first through
`git index-pack --stdin --fix-thin`, so every delta base is in the
repository (or an earlier re-injected pack) when its pack is indexed."""

from __future__ import annotations

import os
from typing import Optional, Sequence

from ..git import gitexec
from ..git.reader import object_info
from ..runtime.repository import Repository
from .packfile import PackError, PackIndex


class ReinjectError(Exception):
    pass


def missing(repo: Repository, oids: Sequence[str]) -> list[str]:
    """Those of OIDS the repository does not hold."""
    info = object_info(repo.gitdir, gitexec.child_env(repo.git_env, GIT_DIR="."), list(dict.fromkeys(oids)))
    return [o for o in dict.fromkeys(oids) if info.get(o, ("missing", None))[0] == "missing"]


def _holds(store, name: str, oid: str) -> bool:
    if not name:
        return False
    try:
        return bytes.fromhex(oid) in PackIndex.load(os.path.join(store.packs_dir, f"pack-{name}.idx"))
    except (PackError, OSError):
        return False


def _holder(store, oid: str, through: int) -> Optional[int]:
    """The oldest version up to THROUGH whose pack holds OID."""
    hints = sorted({v for v in store.introduced_by(oid) if v <= through}
                   | {v for v, _ in store.tips(oid).tips if v <= through})
    for v in hints + [v for v in range(through, 0, -1) if v not in hints]:
        got = store.version_pack(v)
        if got is not None and _holds(store, got[0][0], oid):
            return v
    return None


def ensure(store, repo: Repository, oids: Sequence[str], through: int) -> list[int]:
    """Put back what the repository lacks of OIDS and of the closure of each
    version pack that holds them (versions up to THROUGH); the versions
    whose packs were indexed into the repository, oldest first."""
    needed: set[int] = set()
    seen: set[str] = set()
    todo = missing(repo, oids)
    while todo:
        boundary: list[str] = []
        for oid in todo:
            if oid in seen:
                continue
            seen.add(oid)
            v = _holder(store, oid, through)
            if v is None:
                raise ReinjectError(f"no stored pack holds {oid}")
            if v not in needed:
                needed.add(v)
                boundary.extend(store.version_pack(v)[1])
        todo = missing(repo, boundary) if boundary else []
    for v in sorted(needed):
        name = store.version_pack(v)[0][0]
        res = gitexec.git(["index-pack", "--stdin", "--fix-thin"], cwd=repo.gitdir,
                          env=gitexec.child_env(repo.git_env, GIT_DIR="."),
                          stdin_path=os.path.join(store.packs_dir, f"pack-{name}.pack"))
        if not res.ok:
            raise ReinjectError(f"index-pack of version {v}'s pack failed: "
                                f"{res.stderr.decode(errors='replace').strip()[:200]}")
    return sorted(needed)
