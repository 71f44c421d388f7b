"""A push from a shallow clone, as stock receive-pack takes it (shallow.c's
shallow_info and receive-pack's update_shallow_info(), update_shallow_ref()).

The client names its shallow commits (`shallow <oid>` before its commands).
Those this repository has and does not list as shallow itself are "ours",
those it lacks "theirs". When there are any, the pack is taken with a
temporary shallow file (this repository's roots and all of the client's),
the theirs the pack did not bring are dropped, and each new ref value whose
new history reaches one of them (stopping at shallow commits; a commit
reachable from an existing ref does not count) needs new shallow roots
here. With receive.shallowUpdate off such a ref is refused with `shallow
update not allowed`; with it on, hooks and checks see the temporary file
(GIT_SHALLOW_FILE), and the ref's roots are added to `shallow` under
`shallow.lock` once its connectivity holds with them.

Where stock misbehaves, Aspen does not follow: it never writes an empty
`shallow` file (stock does when a ref's roots turn out to be reachable
already, which makes a complete repository "shallow" to git), and it
updates several refs needing new roots in one push (stock dies after the
first, with no report)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from ..git import gitexec
from ..git.reader import object_info, shallow_roots
from . import intake

SHALLOW = "shallow"
LOCK = "shallow.lock"


@dataclass(frozen=True)
class FileState:
    """What `shallow` was when read: (inode, size, mtime) or None when absent."""
    stat: Optional[tuple[int, int, int]]

    @classmethod
    def of(cls, path: str) -> "FileState":
        try:
            st = os.stat(path)
            return cls((st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            return cls(None)


@dataclass
class ShallowPush:
    """One push's shallow information, from prepare() to the last ref's update."""
    gitdir: str
    client: tuple[str, ...]            # the client's shallow commits, as it sent them
    ours: tuple[str, ...]
    theirs: tuple[str, ...]
    roots: list[str]                    # this repository's shallow roots (and those this push added)
    state: FileState
    temp: Optional[str] = None          # the temporary shallow file
    needs: dict[int, tuple[str, ...]] = field(default_factory=dict)   # command index -> its new roots

    @property
    def active(self) -> bool:
        return bool(self.ours or self.theirs)

    def remove(self) -> None:
        if self.temp:
            try:
                os.unlink(self.temp)
            except OSError:
                pass
            self.temp = None


def prepare(gitdir: str, env: Mapping[str, str], client: Sequence[str]) -> Optional[ShallowPush]:
    """prepare_shallow_info(): None when the client's shallow commits ask
    nothing of this repository; else the split, with the temporary shallow
    file written for the pack's intake."""
    if not client:
        return None
    path = os.path.join(gitdir, SHALLOW)
    state = FileState.of(path)
    roots = shallow_roots(gitdir)
    known = set(roots)
    info = object_info(gitdir, env, list(dict.fromkeys(client)))
    kind = {o: info.get(o, ("missing",))[0] for o in client}
    # a "shallow" object here that is no commit (no client sends one) is left out:
    # stock crashes on a tree there, and git cannot walk with one in a shallow file
    client = tuple(o for o in client if kind[o] in ("commit", "missing"))
    ours = tuple(o for o in client if kind[o] == "commit" and o not in known)
    theirs = tuple(o for o in client if kind[o] == "missing")
    sp = ShallowPush(gitdir, client, ours, theirs, roots, state)
    if not sp.active:
        return None
    sp.temp = _write_temp(gitdir, sorted(set(roots)) + list(client))
    return sp


def _write_temp(gitdir: str, lines: Sequence[str]) -> str:
    """setup_temporary_shallow(): $GIT_DIR/shallow_XXXXXX."""
    fd, path = tempfile.mkstemp(prefix="shallow_", dir=gitdir)
    with os.fdopen(fd, "w") as f:
        f.write("".join(o + "\n" for o in lines))
    return path


def assign(sp: ShallowPush, env: Mapping[str, str], tips: Mapping[int, str]) -> None:
    """update_shallow_info() after the pack: drop the theirs it did not bring,
    then note for each command (index -> new value in TIPS) the ours and
    theirs its new history reaches. ENV sees the pushed objects."""
    if sp.theirs:
        info = object_info(sp.gitdir, env, list(sp.theirs))
        sp.theirs = tuple(o for o in sp.theirs if info.get(o, ("missing",))[0] != "missing")
    if not sp.active or not tips:
        return
    wanted = set(sp.ours) | set(sp.theirs)
    commits = _peel_commits(sp.gitdir, env, sorted(set(tips.values())))
    starts = sorted({c for c in commits.values() if c})
    graph = _new_history(sp.gitdir, env, sp.temp, starts)
    for idx, tip in tips.items():
        start = commits.get(tip)
        if not start or start not in graph:
            continue
        seen = set(intake.reachable_new(graph, start))
        used = tuple(o for o in sp.client if o in wanted and o in seen)
        if used:
            sp.needs[idx] = used


def _peel_commits(gitdir: str, env: Mapping[str, str], oids: Sequence[str]) -> dict[str, Optional[str]]:
    """oid -> the commit it peels to (lookup_commit_reference_gently()), None for none."""
    if not oids:
        return {}
    res = gitexec.git(["cat-file", "--batch-check=%(objectname) %(objecttype)"], cwd=gitdir, env=gitexec.child_env(env),
                      input="".join(f"{o}^{{commit}}\n" for o in oids).encode())
    lines = res.stdout.decode("utf-8", "replace").splitlines()
    out: dict[str, Optional[str]] = {}
    for oid, line in zip(oids, lines):
        parts = line.split(" ")
        out[oid] = parts[0] if len(parts) == 2 and parts[1] == "commit" else None
    return out


def _new_history(gitdir: str, env: Mapping[str, str], shallow_file: Optional[str],
                 starts: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """The commits STARTS reach that no ref reaches, each with its parents,
    every shallow commit (here or the client's) taken as a root."""
    if not starts:
        return {}
    args = (["--shallow-file", shallow_file] if shallow_file else []) + [
        "rev-list", "--parents", "--stdin", "--not", "--all"]
    res = gitexec.git(args, cwd=gitdir, env=gitexec.child_env(env), input="".join(s + "\n" for s in starts).encode())
    if not res.ok:
        return {}
    graph: dict[str, tuple[str, ...]] = {}
    for line in res.stdout.decode("latin-1").splitlines():
        parts = line.split()
        if parts:
            graph[parts[0]] = tuple(parts[1:])
    return graph


def child_env(sp: ShallowPush, env: Mapping[str, str]) -> dict[str, str]:
    """prepare_shallow_update()'s GIT_SHALLOW_FILE: with receive.shallowUpdate
    on, every later child (hooks, checks) sees the temporary file."""
    if not sp.active or not sp.temp:
        return dict(env)
    return gitexec.child_env(env, GIT_SHALLOW_FILE=sp.temp)


@dataclass(frozen=True)
class RootsResult:
    """update_shallow_ref()'s answer: OK when the ref's connectivity held with
    its new roots and they are in `shallow`; else MESSAGE is what stock says
    with rp_error (None: nothing, the check failed), LOG the check's stderr."""
    ok: bool
    message: Optional[str] = None
    log: str = ""


def add_roots(sp: ShallowPush, env: Mapping[str, str], idx: int, new: str) -> RootsResult:
    """Check command IDX's new value NEW with its new roots added, and add
    them to `shallow` when it holds. ENV is the push's, without the
    quarantine (the objects are migrated by now)."""
    extra = [o for o in sp.needs.get(idx, ()) if o not in sp.roots]
    path = os.path.join(sp.gitdir, SHALLOW)
    if not extra:
        res = intake.connected(sp.gitdir, env, [new], shallow_file=path)
        return RootsResult(res.ok, None, res.stderr.decode("utf-8", "replace"))
    lock = os.path.join(sp.gitdir, LOCK)
    try:
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as e:
        return RootsResult(False, f"Unable to create '{lock}': {e.strerror}.")
    committed = False
    try:
        with os.fdopen(fd, "w") as f:
            if FileState.of(path) != sp.state:
                return RootsResult(False, "shallow file has changed since we read it")
            f.write("".join(o + "\n" for o in sorted(set(sp.roots)) + extra))
        res = intake.connected(sp.gitdir, env, [new], shallow_file=lock)
        if not res.ok:
            return RootsResult(False, None, res.stderr.decode("utf-8", "replace"))
        os.replace(lock, path)
        committed = True
        sp.roots.extend(extra)
        sp.state = FileState.of(path)
        return RootsResult(True, None, res.stderr.decode("utf-8", "replace"))
    finally:
        if not committed:
            try:
                os.unlink(lock)
            except OSError:
                pass
