"""A refused plan checked against git's own object walk.

The planner refuses a plan it cannot prove free of objects the client
already has (the cost rule's `held`) or that stock would not send
(`extra-objects`), and hands over that plan as a candidate
(planner/plan.py). Here `git rev-list --objects WANTS --not HAVES` lists
the objects stock's pack-objects would pack for the same request (its
walk, the same machinery); the candidate is sent only when every object of
its packs is among them, or is an annotated tag that include-tag would add
(its peeled object listed). Then it holds nothing the client has and
nothing stock would not send; the planner proved it complete.

In a round that does not end the negotiation (no `done`), stock packs that
list only when it is ready to (upload-pack's ok_to_give_up: every want
reaches a commit the client said it has); otherwise it would go on and
might learn of more that the client has. So there the candidate is sent
only when stock would be ready too: each want reaches a have or a have's
parent, walking commits no older than the oldest have, as ok_to_give_up
walks. The store's recorded parents and committer times answer that
(store_ready); where it has no record of a commit, git's commits are read
through one `cat-file --batch` (stock_ready).

A partial candidate (its packs surely hold more than that listing: the
import pack, a have's commit) may be sent as the listing's subset of its
packs
(`Check.only`: the splice leaves the other entries out, a delta on a left
out base becoming a REF_DELTA to it): every listed object must be in the
packs, and every base left out that a kept delta needs must be in the
client's store by git's own measure -- a have, or in the tree of an edge
commit (`rev-list --objects-edge`: the commits stock's thin pack takes its
bases from). Then the client gets exactly stock's objects, no object twice.
Not for the others: in the bench's lagging-clients workload, subsets of
candidates that held objects the client had, spread over 10 to 35 small
version packs, carried up to 1.20x stock's pack bytes (1.06x the whole
exchange) in 2 fetches of 7, where stock re-deltified across them.

A candidate whose packs hold a commit git's commit walk does not list
fails before the object walk (measured in lagging-clients: failed checks
took 12-30 ms each, that walk's, before git answered the fetch anyway).

Bounded: a candidate of more than MAX_OBJECTS objects, a listing longer
than that, or a walk over TIMEOUT_S seconds is not checked (git answers)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from ..git import gitexec
from ..packs.packfile import PackError, PackIndex

MAX_OBJECTS = 200_000
SUBSET_MAX = 20_000       # objects in a candidate's packs that may be sent as a subset (their headers are read)
MAX_WALK = 20_000         # commits read to decide whether stock would be ready
TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Check:
    ok: bool
    why: str = ""           # when not: "overlap" (an object stock would not send), "not-ready", "too-large", "git-failed"
    objects: int = 0        # objects in the candidate's packs
    only: Optional[frozenset[bytes]] = None     # ok as this subset of the packs' objects ("subset")


def check(gitdir: str, env: Mapping[str, str], packs_dir: str, packs: Sequence[str], wants: Sequence[str],
          haves: Sequence[str], tags: Mapping[str, str], include_tag: bool,
          indexes: Optional[dict] = None, partial: bool = False, commits: Sequence[str] = ()) -> Check:
    """Whether the packs named PACKS hold only objects stock's answer to
    WANTS and HAVES holds, in a round stock ends (the caller settled that:
    `done`, or may_be_ready() and stock_ready()); TAGS: annotated tag -> its
    peeled object. INDEXES: pack name -> loaded PackIndex, kept for the
    splice. PARTIAL: the packs surely hold more (the import pack, a have's
    commit): only the subset is looked for, and not in packs of over
    SUBSET_MAX objects (counted from their indexes' sizes, before any is read).
    COMMITS: the commits the packs hold; when not partial, they are looked
    for first in git's commit walk alone (`rev-list`, no trees): one it
    does not list fails the check before the object walk."""
    indexes = indexes if indexes is not None else {}
    names = [n for n in packs if n]
    if partial:
        counted = sum(indexes[n].count if n in indexes else _idx_count(os.path.join(packs_dir, f"pack-{n}.idx"))
                      for n in names)
        if counted > SUBSET_MAX:
            return Check(False, "too-large", counted)
    try:
        for n in names:
            if n not in indexes:
                indexes[n] = PackIndex.load(os.path.join(packs_dir, f"pack-{n}.idx"))
    except PackError:
        return Check(False, "pack-error")
    total = sum(indexes[n].count for n in names)
    if total > MAX_OBJECTS:
        return Check(False, "too-large", total)
    if not partial and commits:
        sent = _stock_commits(gitdir, env, wants, haves)
        if sent is not None and not sent.issuperset(commits):
            return Check(False, "overlap", total)
    walk = _stock_objects(gitdir, env, wants, haves)
    if walk is None:
        return Check(False, "git-failed", total)
    listed, edges = walk
    if include_tag:
        listed |= {bytes.fromhex(t) for t, p in tags.items() if bytes.fromhex(p) in listed and t not in haves}
    if not partial and all(o in listed for n in names for o in indexes[n].oids):
        return Check(True, "", total)
    if not partial or total > SUBSET_MAX:
        return Check(False, "overlap", total)
    return _subset(gitdir, env, packs_dir, names, indexes, listed, edges, haves, total)


def import_too_large(packs_dir: str, import_pack: Optional[str]) -> bool:
    """A partial candidate that needs the import pack IMPORT_PACK cannot be a
    subset when that pack alone holds over SUBSET_MAX objects: known from its
    index's size, before any walk (git.git's holds 367,255)."""
    return bool(import_pack) and _idx_count(os.path.join(packs_dir, f"pack-{import_pack}.idx")) > SUBSET_MAX


def _idx_count(path: str) -> int:
    """Objects a version 2 `.idx` of this size indexes (SHA-1; large offsets
    make it a slight overcount); a missing index counts as none."""
    try:
        size = os.stat(path).st_size
    except OSError:
        return 0
    return max(0, (size - 8 - 256 * 4 - 2 * 20) // 28)


def _subset(gitdir: str, env: Mapping[str, str], packs_dir: str, names: Sequence[str], indexes: dict,
            listed: set[bytes], edges: Sequence[str], haves: Sequence[str], total: int) -> Check:
    """The candidate as LISTED's subset of its packs (module docstring), or "overlap"."""
    from ..packs.packfile import OBJ_OFS_DELTA, OBJ_REF_DELTA, Pack  # startup
    held = set()
    for n in names:
        held.update(indexes[n].oids)
    if not listed <= held:
        return Check(False, "overlap", total)
    bases: set[bytes] = set()           # left-out objects a kept delta is made on
    try:
        for n in names:
            with Pack(os.path.join(packs_dir, f"pack-{n}.pack"), indexes[n]) as pack:
                index = pack.index
                at: dict[int, bytes] = {}
                for oid in listed.intersection(index.oids):
                    e = pack.entry(oid)
                    if e.type == OBJ_OFS_DELTA and not at:
                        at = {index.offset(i): index.oid(i) for i in range(index.count)}
                    base = at.get(e.base_offset) if e.type == OBJ_OFS_DELTA and e.base_offset is not None else \
                        e.base_oid if e.type == OBJ_REF_DELTA else None
                    if base is not None and base in held and base not in listed:
                        bases.add(base)
    except (PackError, OSError):
        return Check(False, "pack-error", total)
    if bases:
        bases -= {bytes.fromhex(h) for h in haves}
    if bases and not bases <= _edge_objects(gitdir, env, edges, bases):
        return Check(False, "overlap", total)
    return Check(True, "subset", total, frozenset(listed))


def _edge_objects(gitdir: str, env: Mapping[str, str], edges: Sequence[str], wanted: set[bytes]) -> set[bytes]:
    """Which of WANTED the edge commits' trees (and the commits) hold."""
    if not edges:
        return set()
    try:
        res = gitexec.git(["rev-list", "--objects", "--no-walk", "--stdin"], cwd=gitdir,
                          env=gitexec.child_env(env, GIT_DIR="."), input=("\n".join(edges) + "\n").encode(),
                          timeout=TIMEOUT_S)
    except gitexec.Timeout:
        return set()
    if not res.ok:
        return set()
    found = set()
    for line in res.stdout.splitlines():
        oid = bytes.fromhex(line.split(b" ", 1)[0].decode())
        if oid in wanted:
            found.add(oid)
    return found


def may_be_ready(history, wants: Sequence[str], haves: Sequence[str], tags: Mapping[str, str]) -> bool:
    """False when, by the commit parents the ref store recorded (HISTORY,
    the planner's), some of WANTS (peeled by TAGS) reaches no have nor a
    have's parent at all: then stock is not ready in this round, whatever
    the dates, and git need not be asked. True otherwise, or when the walk
    is too long."""
    wants = [tags.get(w, w) for w in wants]
    they_have = set(haves)
    for ps in (facts[1] for facts in history.commit_facts(list(haves)).values()):
        they_have.update(ps)
    for w in wants:
        frontier, seen, found, read = [w], {w}, w in they_have, 0
        while frontier and not found:
            read += len(frontier)
            if read > MAX_WALK:
                return True
            nxt: list[str] = []
            for _, parents in history.commit_facts(frontier).values():
                if they_have.intersection(parents):
                    found = True
                    break
                nxt += [p for p in parents if p not in seen]
                seen.update(parents)
            frontier = nxt
        if not found:
            return False
    return True


def store_ready(history, wants: Sequence[str], haves: Sequence[str], tags: Mapping[str, str]) -> Optional[bool]:
    """stock_ready() answered from the ref store's recorded parents and
    committer times (HISTORY, the planner's), without starting git; None
    when the walk meets a commit the store has no record of (git is asked).
    The walk goes frontier by frontier (one store query each) where git's
    goes depth first: which commits it reaches is the same, and past
    MAX_WALK both answer not ready."""
    wants = list(dict.fromkeys(tags.get(w, w) for w in wants))
    haves = list(dict.fromkeys(haves))
    facts, times = history.commit_facts(haves + wants), history.commit_times(haves + wants)
    if not haves or any(c not in facts or c not in times for c in haves + wants):
        return None
    they_have = set(haves)
    for h in haves:
        they_have.update(facts[h][1])
    oldest = min(times[h] for h in haves)
    read = 0
    for w in wants:
        frontier, seen, found = [w], {w}, w in they_have
        while frontier and not found:
            parents = [p for c in frontier for p in facts[c][1]]
            if they_have.intersection(parents):
                found = True
                break
            fresh = [p for p in dict.fromkeys(parents) if p not in seen]
            seen.update(fresh)
            read += len(fresh)
            if read > MAX_WALK:
                return False
            facts.update(history.commit_facts([p for p in fresh if p not in facts]))
            times.update(history.commit_times([p for p in fresh if p not in times]))
            if any(p not in facts or p not in times for p in fresh):
                return None
            frontier = [p for p in fresh if times[p] >= oldest]
        if not found:
            return False
    return True


def stock_ready(gitdir: str, env: Mapping[str, str], wants: Sequence[str], haves: Sequence[str],
                tags: Mapping[str, str]) -> bool:
    """Whether stock ends the negotiation in this round (upload-pack's
    ok_to_give_up): each of WANTS (peeled by TAGS) that is a commit reaches
    a commit the client has, or a parent of one (THEY_HAVE), walking commits
    no older than the oldest have. The commits are read from one `git cat-file
    --batch` (one process, not a walk per question)."""
    wants = [tags.get(w, w) for w in wants]
    reader = _Commits(gitdir, env)
    try:
        they_have: set[str] = set()
        oldest = None
        for h in dict.fromkeys(haves):
            got = reader.read(h)
            if got is not None:
                they_have.add(h)
                they_have.update(got[1])
                oldest = got[0] if oldest is None else min(oldest, got[0])
        if oldest is None:
            return False
        read = 0
        for w in wants:
            got = reader.read(w)
            if got is None:
                return False                  # not a commit: not known to reach one
            stack, seen, found = [(w, got)], {w}, w in they_have
            while stack and not found:
                _, (_, parents) = stack.pop()
                for p in parents:
                    if p in they_have:
                        found = True
                        break
                    if p in seen:
                        continue
                    seen.add(p)
                    parent = reader.read(p)
                    read += 1
                    if read > MAX_WALK:
                        return False
                    if parent is not None and parent[0] >= oldest:
                        stack.append((p, parent))
            if not found:
                return False
        return True
    finally:
        reader.close()


class _Commits:
    """Commits read through one `git cat-file --batch`: (committer time, parents)."""

    def __init__(self, gitdir: str, env: Mapping[str, str]):
        self.proc = gitexec.start(["cat-file", "--batch"], cwd=gitdir, env=gitexec.child_env(env, GIT_DIR="."),
                                  stderr=gitexec.DEVNULL)

    def read(self, oid: str) -> Optional[tuple[int, list[str]]]:
        """OID's committer time and parents; None when it is no commit here."""
        assert self.proc.stdin is not None and self.proc.stdout is not None     # PIPEs (gitexec.start's own)
        try:
            self.proc.stdin.write(oid.encode() + b"\n")
            self.proc.stdin.flush()
            header = self.proc.stdout.readline().split()
            if len(header) != 3:
                return None
            body = self.proc.stdout.read(int(header[2]) + 1)
        except (OSError, ValueError):
            return None
        if header[1] != b"commit":
            return None
        parents, when = [], 0
        for line in body.split(b"\n\n", 1)[0].split(b"\n"):
            if line.startswith(b"parent "):
                parents.append(line[7:].decode())
            elif line.startswith(b"committer "):
                when = int(line.rsplit(b" ", 2)[-2])
        return when, parents

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None     # PIPEs (gitexec.start's own)
        try:
            self.proc.stdin.close()         # cat-file ends at the end of its input
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except gitexec.Timeout:
            gitexec.kill(self.proc)
            self.proc.wait()
        self.proc.stdout.close()


def _stock_commits(gitdir: str, env: Mapping[str, str], wants: Sequence[str],
                   haves: Sequence[str]) -> Optional[set[str]]:
    """The commits `rev-list WANTS --not HAVES` lists: those of
    _stock_objects' listing, without reading a tree; None when git fails."""
    lines = list(wants) + [f"^{h}" for h in haves]
    try:
        res = gitexec.git(["rev-list", "--ignore-missing", "--stdin"], cwd=gitdir,
                          env=gitexec.child_env(env, GIT_DIR="."), input=("\n".join(lines) + "\n").encode(),
                          timeout=TIMEOUT_S)
    except gitexec.Timeout:
        return None
    return set(res.stdout.decode().split()) if res.ok else None


def _stock_objects(gitdir: str, env: Mapping[str, str], wants: Sequence[str],
                   haves: Sequence[str]) -> Optional[tuple[set[bytes], list[str]]]:
    """The objects `rev-list --objects WANTS --not HAVES` lists (haves this
    repository lacks left out, as stock ignores them), and the edge commits
    (`--objects-edge`: excluded commits next to listed ones); None when git
    fails, takes too long, or the list is too long."""
    lines = list(wants) + [f"^{h}" for h in haves]
    try:
        res = gitexec.git(["rev-list", "--objects-edge", "--ignore-missing", "--stdin"], cwd=gitdir,
                          env=gitexec.child_env(env, GIT_DIR="."), input=("\n".join(lines) + "\n").encode(),
                          timeout=TIMEOUT_S)
    except gitexec.Timeout:
        return None
    if not res.ok:
        return None
    out: set[bytes] = set()
    edges: list[str] = []
    for line in res.stdout.splitlines():
        if line.startswith(b"-"):
            edges.append(line[1:].decode())
            continue
        out.add(bytes.fromhex(line.split(b" ", 1)[0].decode()))
        if len(out) > MAX_OBJECTS:
            return None
    return out, edges
