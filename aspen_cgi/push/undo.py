"""Undo and restore: versions that put refs back as they were.

- `undo(V)`: one new version that sets every ref version V changed back to
  its value before V (a ref V created is deleted). Refused when one of them
  moved since V (its value now is not the one V left), unless forced.
- `restore(REF, V)`: one new version that sets REF to its value at version
  V, a deleted branch included.

Either is a version like a push (kind `undo` or `restore`, its push id
naming what it undid, chained like any), written with compare-and-swap on
the values read (a push that lands meanwhile makes it fail, nothing
written). Before the refs move, what their new values need that `git gc`
pruned is put back from the version packs (packs/reinject.py); after,
post-receive and post-update run as they do for a push, and the new
version's pack is built in the background."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ..git.hooks import Hooks
from ..git.repoconfig import RepoConfig
from ..model.objectid import ZERO, is_null
from ..model.versions import RefChange, StoredRef, VersionMeta
from ..packs import background, reinject
from ..refstore.store import RefStore
from ..runtime.repository import Repository
from . import refwrite


class Refused(Exception):
    """Why an undo or restore was not made (nothing was written)."""


@dataclass(frozen=True)
class Done:
    version: int                         # the version it made
    changes: tuple[RefChange, ...]
    reinjected: tuple[int, ...]          # versions whose packs were indexed back into the repository
    hook_output: bytes                   # what post-receive and post-update wrote
    hook_status: int                     # post-receive's exit status (0 when absent)


def _change(ref: str, now: Optional[StoredRef], then: Optional[StoredRef]) -> RefChange:
    return RefChange(ref, now.oid if now is not None else ZERO,
                     then.oid if then is not None and then.oid is not None else ZERO, False,
                     then.otype if then is not None else None, then.peeled if then is not None else None)


def undo_changes(store: RefStore, version: int, force: bool = False) -> list[RefChange]:
    """The ref changes that undo VERSION; Refused when it cannot be undone."""
    v = store.version_record(version)
    if v is None:
        raise Refused(f"no version {version}: the latest is {store.latest()}")
    if v.state != "done":
        raise Refused(f"version {version} is {v.state}: it changed no ref")
    if v.kind == "import":
        raise Refused(f"version {version} is the import: there is nothing before it to go back to")
    before, now = store.refs_at(version - 1), store.refs_now()
    moved = [u.ref for u in v.updates if (now[u.ref].oid if u.ref in now else ZERO) != u.new
             and not (is_null(u.new) and u.ref not in now)]
    if moved and not force:
        raise Refused(f"moved since version {version}: {', '.join(moved[:5])}"
                      f"{' …' if len(moved) > 5 else ''}; --force puts them back anyway")
    changes = [_change(u.ref, now.get(u.ref), before.get(u.ref)) for u in v.updates]
    changes = [c for c in changes if c.old != c.new]
    if not changes:
        raise Refused(f"every ref version {version} changed is already as it was before it")
    return changes


def restore_changes(store: RefStore, ref: str, version: int) -> list[RefChange]:
    """The change that sets REF to its value at VERSION; Refused when there is none."""
    if version > store.latest() or version < 1:
        raise Refused(f"no version {version}: the latest is {store.latest()}")
    then, now = store.refs_at(version).get(ref), store.refs_now().get(ref)
    if then is None:
        raise Refused(f"{ref} did not exist at version {version}")
    assert then.oid is not None                 # refs_at(): direct refs, each with its value
    if now is not None and now.oid == then.oid:
        raise Refused(f"{ref} is already at its value of version {version} ({then.oid[:12]})")
    return [_change(ref, now, then)]


def apply(store: RefStore, repo: Repository, changes: Sequence[RefChange], meta: VersionMeta,
          through: int) -> Done:
    """Put back the objects, move the refs as one version, run the hooks, start the build.
    THROUGH: the latest version whose packs may hold the objects."""
    try:
        gitdir, env = repo.gitdir, repo.git_env
        back = reinject.ensure(store, repo, [c.new for c in changes if not is_null(c.new)], through)
    except reinject.ReinjectError as e:
        raise Refused(f"the objects are gone: {e}") from None
    err = refwrite.transaction(store, repo, changes, meta)
    if err is not None:
        raise Refused(f"a ref moved meanwhile; nothing was changed ({err.strip()})")
    made = next((v.id for v in store.log(50) if v.kind == meta.kind and v.push_id == meta.push_id), store.latest())
    log: list[str] = []
    hooks = Hooks(gitdir, RepoConfig.load(gitdir, env), log)
    hook_env = {**env, "GIT_PUSH_OPTION_COUNT": "0"}
    lines = "".join(f"{c.old} {c.new} {c.ref}\n" for c in changes).encode("utf-8", "surrogateescape")
    out: list[bytes] = []
    status = _drain(hooks.run("post-receive", [], hook_env, lines), out)
    _drain(hooks.run("post-update", [c.ref for c in changes], env), out)
    background.kick(repo, store.packs_dir)
    return Done(made, tuple(changes), tuple(back), b"".join(s.encode() for s in log) + b"".join(out), status)


def _drain(gen, out: list[bytes]) -> int:
    """Run a hook generator to its end, keeping its output; its exit status."""
    while True:
        try:
            chunk = next(gen)
        except StopIteration as stop:
            return stop.value or 0
        if chunk:
            out.append(chunk)
