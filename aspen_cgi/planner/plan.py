"""FetchRequest -> Plan (stored version packs whose concatenation completes
the client, with the proof) or Fallback (why git must answer).

Pure: the planner reads the ref store through the small `History`
interface and runs no process, writes nothing, knows no HTTP.

Proof rules (reference/planner-notes.md): a want that became a ref's value
at version b needs Q_b; each boundary commit c of a needed version must be
in the client's closure, proved by
  1. c is a have;
  2. c became the value of ref s at version j, a have became the value of s
     at version k >= j, and s only fast-forwarded from j to k (s's latest
     update up to k that was no fast-forward is at or before j: one
     indexed row per (s, k));
  3. c was introduced by a version j' that updated one ref, whose value
     there is proved by rule 2;
  4. (in any round, once rules 1-3 miss) c is in the boundary of a
     version k that updated one ref only, to a value that is a have: every
     boundary commit of such a version is an ancestor of its one new value.
     These commits then count as haves for rules 2 and 3 too. (An ACKed
     have's ancestors are never sent as haves, and git's client sends no
     ancestor of a ref it knows the server has; this is how the stale tip
     behind a branch, or the parent of a merge, is proved. In the first
     round too: waiting for `done` cost lagging clients extra rounds, each
     resending every have, where stock said `ready` at once.) Only the
     versions whose boundary holds c are read (an index names them; reading
     every have's version cost a stale-branch fetch one visit per have).
  5. (once rules 1-4 miss) c is reached by walking the recorded parents of
     commits down from the haves and the commits proved so far (`_Graph`:
     newest-introduced first, never below c's first version, at most
     WALK_MAX commits a request). This is how a commit behind a merge into
     another branch is proved.
A commit first introduced after every have is in no have's closure (all
a commit reaches was reachable when it first was): no rule is asked about
it. Otherwise the version that holds c is needed too, recursively, down to the
import version (whose pack is the whole repository then). A plan is made
only when every version has its pack: anything unproved falls back. A
client with haves falls back with UNPROVED when its proof pulls in a
holder version no newer than the client's own state (the latest version at
which a have was a ref value; the import version always is), unless every
have was first introduced before the holder (`holds_none`): otherwise the
client may hold part of the holder's pack (objects a rewrite kept, say)
and it would be sent again. Measured in the bench's lagging-clients
workload: such plans carried 1.7x to 2.9x stock's bytes, most of them
objects the client held; allowing the holder whenever rule 5's walk found
none of its commits below the haves gave a plan of 3.7x stock's pack bytes
in random-fetch (a force-push had kept the trees). A want the rules prove in the
client's closure is left out (rules 1-3 and 5: a want rule 4 misses needs
its version anyway): the client has it through another ref, as stock finds
by walking (measured in random-fetch: without this a plan
resent two such versions whole, 2x stock's pack bytes). Likewise when a
needed version introduced one of the haves that is no ref value (a v0
client walks back through its history, sending ancestors of its tips): that
version's pack holds what the client has below the have. Such a round
goes to git, which walks the commits; a later round of the same
negotiation, with more haves, may be proved. So does a plan that needs a
version which introduced a have, or a commit rule 5 found below one (a
branch deleted and pushed again): its pack would send that commit again.

include-tag (git's `pack-objects --include-tag`): an annotated tag under
refs/tags whose peeled object is sent is sent too, with its tag chain. After
the walk, each such tag T whose peeled object is in one of the needed
packs (their `.idx` bisected) while T is in none needs a version where T
became a ref value (its pack holds T and the chain below it; the latest
such); that version joins the walk like a want, its boundary proved or
held like any other, until no needed pack sends a peeled object without
its tag. A tag only the import version holds, for a client with haves,
falls back.

Exactness: a version pack holds everything its version introduced, which
may be more than the wants reach (another branch the import held, a tag
pushed with a commit, commits later rewound). A plan is made only when the
client ends with exactly the objects a stock fetch leaves it with: every
needed version's new values proved in the closure of the wants and haves
(rules 1-3, the wants counted as haves; a tag include-tag sends counts by
its peeled object; a version proved so adds its boundary to that closure),
else EXTRA_OBJECTS; and, when some refs are hidden from the client
(hideRefs, a namespace), no needed version wrote one (INVISIBLE_REF).

Candidates: a fallback for the cost rule (UNPROVED "held" or "import")
or for EXTRA_OBJECTS carries the plan it refused (walked when first asked
for): complete, but its packs may hold objects the client has or stock
would not send. The service sends it only once git's own object walk for
the same wants and haves (`rev-list --objects`, plancheck.py) lists every
object of its packs, or as that listing's subset of them: then the client
ends with exactly stock's objects, and no object twice. A candidate that
needs the import version or resends a have's commit (or an extra-objects
plan for a clone) is `partial`: only the subset is looked for.

A full clone (no haves) of every ref value of the latest version N is the
import pack, then segment packs and version packs partitioning versions
2 … N (the longest built segment first, `cover()`): each extent holds what
its versions' refs reach beyond the refs before them, with delta bases only
in earlier extents, so the splice is complete in O(log N) extents; used
only while no ref was deleted or moved other than forward since the import
(then every run's objects are reachable from the refs at N).

Counts: `versions_visited` is the number of distinct versions whose records
the proof read (packs and boundaries, the commits and values a version
wrote, the ancestry queries' update rows), `segments_visited` the distinct
segment nodes and segment packs, `lookups` the questions asked of the
history, among them the index probes per commit asked about: the tips
index and the introduced-by index (every have, want and boundary commit:
their number is the client's and the answer's, not the history's). Counted
as visits of the versions they name, the introduced-by probes were 85% of
random-fetch's visits (1,531 of 1,807 over 154 plans on the tiny preset),
most of them a v0 client's haves.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace
from typing import Callable, Collection, Mapping, Optional, Protocol, Sequence

from ..model.versions import AncestryAnswer, CloneView, PackInfo, SegmentPack, TipAnswer, Visits
from ..protocol.requests import FetchRequest

UNPROVED = "haves-not-proved"
EXTRA_OBJECTS = "extra-objects"    # stored packs hold objects stock's answer would not leave the client with
INVISIBLE_REF = "invisible-ref"     # a needed pack may hold objects of a ref this client may not see
OPEN_ROUND_HOLDERS = "open-round-holders"   # a version needed to hold a commit, in a round stock would not end

NO_PACK = PackInfo("", (), ())


class History(Protocol):
    def tips(self, commit: str) -> TipAnswer: ...
    def tips_many(self, commits: Sequence[str]) -> dict[str, TipAnswer]: ...
    def is_ancestor(self, ref: str, j: int, k: int) -> AncestryAnswer: ...
    def introduced_by(self, commit: str) -> list[int]: ...
    def introduced_many(self, commits: Sequence[str]) -> dict[str, list[int]]: ...
    def introduced_commits(self, version: int) -> Collection[str]:
        """The commits VERSION introduced."""
    def bounded_by(self, commits: Sequence[str]) -> dict[str, tuple[int, ...]]:
        """commit -> the versions whose boundary holds it."""
    def commit_facts(self, commits: Sequence[str]) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
        """commit -> (the versions that introduced it, oldest first; its parents), where a build recorded them."""
    def pack_of(self, version: int) -> Optional[PackInfo]:
        """VERSION's pack; None if not built."""
    def pack_holds(self, name: str, oids: Collection[str]) -> frozenset[str]:
        """Which of OIDS the stored pack NAME holds."""
    def version_values(self, version: int) -> tuple[str, ...]:
        """The values VERSION wrote (deletions left out)."""
    def all_packs_built(self) -> bool: ...
    def clone_view(self) -> Optional[CloneView]:
        """The latest version's ref values and the segment packs built; None while a version has no pack."""


@dataclass(frozen=True)
class Plan:
    """The extents of the response pack in stream order: per extent, the last
    version it brings the client to, its pack name ("" when empty: skipped),
    whether its deltas may take bases from the client's objects (in a clone
    they all come from earlier extents), and its first version."""
    versions: tuple[int, ...]
    packs: tuple[str, ...]
    versions_visited: int
    segments_visited: int
    proofs: tuple[str, ...] = ()
    thin: tuple[bool, ...] = ()
    firsts: tuple[int, ...] = ()
    lookups: int = 0
    held: tuple[str, ...] = ()         # boundary commits proved in the client's closure
    holders: tuple[int, ...] = ()      # versions needed only to hold a boundary commit not proved held
    only: Optional[frozenset[bytes]] = None   # send only these objects of the packs (a checked candidate's subset)
    partial: bool = False              # a candidate whose packs surely hold more than git sends: only a subset may go

    @property
    def spans(self) -> tuple[tuple[int, int], ...]:
        return tuple(zip(self.firsts or self.versions, self.versions))


class Candidate:
    """The plan the cost rule or exactness refused (module docstring), walked
    when first asked for: the service first rules out the rounds stock would
    not end, where it is never sent. None: no such plan."""

    def __init__(self, make: Callable[[], Optional[Plan]]):
        self._make: Optional[Callable[[], Optional[Plan]]] = make
        self._plan: Optional[Plan] = None

    def plan(self) -> Optional[Plan]:
        if self._make is not None:
            self._plan, self._make = self._make(), None
        return self._plan


@dataclass(frozen=True)
class Fallback:
    reason: str
    versions_visited: int = 0
    segments_visited: int = 0
    lookups: int = 0
    detail: str = ""          # UNPROVED: "import" (the whole repository needed) or "held" (a holder the client may have)
    candidate: Optional[Candidate] = None


@dataclass
class _Count:
    versions: set[int] = field(default_factory=set)
    segments: set[tuple[object, ...]] = field(default_factory=set)
    lookups: int = 0
    proofs: list[str] = field(default_factory=list)

    def read(self, visits: Visits) -> None:
        """One question answered: count it, and the versions and segment nodes it read."""
        self.lookups += 1
        self.versions.update(visits.version_ids)
        self.segments.update(("node",) + s for s in visits.segment_ids)

    def visit(self, versions: Collection[int]) -> None:
        """One question answered from the records of VERSIONS."""
        self.lookups += 1
        self.versions.update(versions)

    def look_up(self) -> None:
        """One tips-index lookup: an index probe per commit asked about (every
        have and want among them), counted as a lookup, not as a visit."""
        self.lookups += 1

    def fallback(self, reason: str, detail: str = "", candidate: Optional[Candidate] = None) -> Fallback:
        return Fallback(reason, len(self.versions), len(self.segments), self.lookups, detail, candidate)


SUPPORTED_CAPS = {"multi_ack", "multi_ack_detailed", "no-done", "thin-pack", "side-band", "side-band-64k",
                  "ofs-delta", "shallow", "no-progress", "include-tag", "agent", "session-id", "object-format",
                  "allow-tip-sha1-in-want", "allow-reachable-sha1-in-want", "deepen-since", "deepen-not",
                  "deepen-relative", "filter"}


def plan(req: FetchRequest, history: History, advertised: frozenset[str],
         tags: Optional[Mapping[str, str]] = None,
         visible: Optional[Callable[[str], bool]] = None,
         tag_objects: Collection[str] = (),
         holders_ok: Optional[Callable[[], bool]] = None) -> Plan | Fallback:
    """ADVERTISED: every object the client may want (visible ref values and
    their peeled objects); TAGS: each annotated refs/tags/* value (every one
    git's include-tag looks at, hidden or not) -> its peeled object;
    VISIBLE: given when some refs are not this client's to see (hideRefs, a
    namespace): a stored pack of a version that wrote a ref it rejects may
    hold objects only that ref reaches, so such a plan goes to git;
    TAG_OBJECTS: every annotated tag among the ref values (the tips index
    files a tag's commit under the tag's ref too, so the rules prove
    commits only); HOLDERS_OK: asked once, when the proof first needs a
    version only to hold a commit it could not prove held (a round without
    `done`: may such a plan be sent now?); False ends the walk there
    (OPEN_ROUND_HOLDERS), not after the chain of holders (git.git's
    stale-branch: 91 trunk versions walked, 11 ms, for a round git
    answered)."""
    reason = _request_reason(req, advertised)
    if reason:
        return Fallback(reason)
    if not history.all_packs_built():
        return Fallback("not-built")
    count = _Count()
    if not req.haves and visible is None:
        whole = _clone(req, history, count)
        if whole is not None:
            return whole
    walk = _Walk(history, count, req.haves, widen=True, tag_objects=frozenset(tags or ()) | frozenset(tag_objects),
                 peel=tags or {})
    walk.holders_ok = holders_ok
    why = (walk.want(req.wants) or walk.discharge() or walk.unproved()
           or _include_tags(req, tags or {}, walk) or walk.unproved()
           or (walk.invisible(visible) if visible is not None else None)
           or _exact(req, tags or {}, walk))
    if why == UNPROVED:
        if 1 in walk.needed:
            return count.fallback(why, "import", Candidate(lambda: _partial(walk.plan())))
        return count.fallback(why, "held", Candidate(lambda: _candidate(req, tags or {}, walk, visible)))
    if why == EXTRA_OBJECTS:
        # for a clone, or with the import pack (what later deletes left behind): only as a subset
        as_is = bool(req.haves) and 1 not in walk.needed
        return count.fallback(why, candidate=Candidate(walk.plan if as_is else lambda: _partial(walk.plan())))
    return count.fallback(why) if why else walk.plan()


def _partial(made: Optional[Plan]) -> Optional[Plan]:
    return replace(made, partial=True) if made is not None else None


def _candidate(req: FetchRequest, tags: Mapping[str, str], walk: "_Walk",
               visible: Optional[Callable[[str], bool]]) -> Optional[Plan]:
    """The plan the cost rule refused: the walk finished without it (every
    holder needed, as for a client without haves), None when another reason
    refuses it; partial when it needs the import version or resends a have's
    commit. It is complete, but may send objects the client has: the caller
    checks it against git's own object walk before it is sent (plancheck.py)."""
    walk.hold_rule = False
    walk.work.extend(sorted(walk.needed))       # an early stop may have left boundaries unvisited
    why = (walk.discharge() or _include_tags(req, tags, walk)
           or (walk.invisible(visible) if visible is not None else None))
    if why:
        return None
    made = walk.plan()
    if made is not None and (1 in walk.needed or walk.resends_a_have()):
        return _partial(made)       # its packs hold a have's commit or the import: only git's listing of them
    return made


def _request_reason(req: FetchRequest, advertised: frozenset[str]) -> Optional[str]:
    reason = req.needs_fallback_reason
    if reason:
        return reason
    if req.haves and not req.has_capability("thin-pack"):
        return "no-thin-pack"          # version packs are thin against the client's objects
    if not req.has_capability("ofs-delta"):
        return "no-ofs-delta"
    if any(w not in advertised for w in req.wants):
        return "want-not-advertised"
    return None


class _Walk:
    """The version walk: the versions needed, those whose boundaries are not
    discharged yet, and what is known of the client's closure."""

    def __init__(self, history: History, count: _Count, haves: Sequence[str], widen: bool,
                 tag_objects: frozenset[str] = frozenset(), peel: Mapping[str, str] = {},
                 known: Optional["_Walk"] = None):
        self.history = history
        self.count = count
        self.haves = set(haves)
        self.may_widen = widen                        # rule 4 (the client's walk; not the exactness check's)
        self.have_tips: dict[str, set[int]] = {}      # ref -> versions at which a have became its value
        self.state = 0                                # client_state()
        self.beneath: set[str] = set()                # rule 4's commits
        self.newer: set[str] = set()                  # commits first introduced after every have (newer_than_haves)
        self.needed: set[int] = set()
        self.held_for: set[int] = set()               # versions needed only to hold an unproved boundary commit
        self.tag_objects = tag_objects                # annotated tags: the rules speak of their commits only
        self.peel = peel                              # annotated refs/tags/* values -> their peeled objects
        self.work: list[int] = []
        self.proved: dict[str, bool] = {}
        self.packs: dict[int, Optional[PackInfo]] = {}
        self.tip_answers: dict[str, TipAnswer] = dict(known.tip_answers) if known else {}   # KNOWN: same request
        self.introduced: dict[str, list[int]] = dict(known.introduced) if known else {}
        self.have_answers = self.tips_many(sorted(self.haves))
        self.learn(self.have_answers)
        self.graph = _Graph(history, count)           # rule 5
        self.seeded_from = (0, 0)
        self.newest_have: tuple[int, Optional[int]] = (-1, None)   # (haves counted, the latest first version of one)
        self.hold_rule = True                         # off: every holder is needed (a candidate, _candidate())
        self.holders_ok: Optional[Callable[[], bool]] = None   # plan()'s HOLDERS_OK, until asked

    # -- counted reads

    def tips(self, commit: str) -> TipAnswer:
        ans = self.tip_answers.get(commit)
        if ans is None:
            ans = self.tip_answers[commit] = self.history.tips(commit)
            self.count.look_up()
        return ans

    def tips_many(self, commits: Sequence[str]) -> dict[str, TipAnswer]:
        todo = [c for c in commits if c not in self.tip_answers]
        if todo:
            for c, ans in self.history.tips_many(todo).items():
                self.tip_answers[c] = ans
                self.count.look_up()
        return {c: self.tip_answers[c] for c in commits}

    def introduced_by(self, commit: str) -> list[int]:
        got = self.introduced.get(commit)
        if got is None:
            got = self.introduced[commit] = self.history.introduced_by(commit)
        self.count.look_up()
        return got

    def prefetch(self, commits: Sequence[str]) -> None:
        """What the rules ask of each of COMMITS, in two queries."""
        if len(commits) > 1:
            self.tips_many(commits)
            self.introduced.update(self.history.introduced_many([c for c in commits if c not in self.introduced]))

    def pack(self, version: int) -> Optional[PackInfo]:
        if version not in self.packs:
            self.packs[version] = self.history.pack_of(version)
            self.count.visit((version,))
        return self.packs[version]

    def is_ancestor(self, ref: str, j: int, k: int) -> bool:
        ans = self.history.is_ancestor(ref, j, k)
        self.count.read(ans.visits)
        return ans.ancestor

    # -- the walk

    def need(self, version: int) -> None:
        if version not in self.needed:
            self.needed.add(version)
            self.work.append(version)

    def want(self, wants: Sequence[str]) -> Optional[str]:
        self.prefetch([w for w in wants if w not in self.haves])
        for w in wants:
            if w in self.haves:
                continue
            first = self.tips(w).first
            if first is None:
                return "want-not-a-tip"
            if self.haves and w not in self.tag_objects and self.proved_by_rules(w):
                continue                  # the client has it through another ref: stock sends none of it
            self.need(first[0])
        return None

    def discharge(self) -> Optional[str]:
        """Prove or hold every boundary commit of the versions on the work list.
        UNPROVED as soon as the cost rule (unproved()) is certain to refuse the
        plan: the client state only grows as the walk learns, so a holder no
        newer than it now stays so (planning stopped there, not 70 ms later)."""
        while self.work:
            if self.haves and 1 in self.needed:
                return UNPROVED if self.hold_rule else "import"
            info = self.pack(self.work.pop())
            if info is None:
                return "not-built"
            self.in_closure([c for c in info.boundary if c not in self.proved])
            for c in info.boundary:
                if not self.proved[c]:
                    v = self.holder(c)
                    if v not in self.needed:
                        self.held_for.add(v)
                        if self.haves and self.hold_rule and (v == 1 or (v <= self.client_state()
                                                                         and not self.holds_none(v))):
                            self.needed.add(v)
                            return UNPROVED
                        if self.hold_rule and self.holders_ok is not None:
                            ask, self.holders_ok = self.holders_ok, None
                            if not ask():
                                return OPEN_ROUND_HOLDERS
                    self.need(v)
        return None

    def in_closure(self, commits: Sequence[str]) -> None:
        """PROVED[c] for each of COMMITS: rules 1-3 and 5, then rule 4 for
        those they miss, in one question."""
        self.prefetch(commits)
        missed = [c for c in commits if not self.proved_by_rules(c)]
        self.proved.update((c, True) for c in commits)
        if missed and self.widen_to([c for c in missed if c not in self.newer]):
            self.proved.update((c, self.proved_by_rules(c)) for c in missed)
        else:
            self.proved.update((c, False) for c in missed)

    def proved_by_rules(self, c: str) -> bool:
        if c in self.haves:
            self.count.proofs.append(f"{c[:12]} is a have")
            return True
        if c in self.beneath:
            self.count.proofs.append(f"{c[:12]} is in the boundary of a have's version")
            return True
        introduced = self.introduced_by(c)
        if introduced and self.newer_than_haves(introduced[0]):
            self.newer.add(c)
            return False
        if self.tip_below_have(c, self.tips(c).tips):
            return True
        for j in introduced:
            info = self.pack(j)
            if info is None or len(info.refs) != 1:
                continue
            if self.tip_below_have(c, ((j, info.refs[0]),)):
                return True
        if introduced and self.graph_reaches(c, introduced[0]):
            self.count.proofs.append(f"{c[:12]} is an ancestor of a have (parents walked)")
            return True
        return False

    def newer_than_haves(self, first: int) -> bool:
        """A commit first introduced at FIRST is in no have's closure when every
        have was first introduced before it: all a commit reaches was
        reachable when it was first introduced (so were the commits rule 4
        and 5 find, all below haves). Settles most boundary commits of a
        lagging client's walk without the other rules' questions."""
        newest = self.newest_first() if self.haves else None
        return newest is not None and first > newest

    def graph_reaches(self, c: str, first: int) -> bool:
        if self.seeded_from != (len(self.haves), len(self.beneath)):   # both only grow
            self.seeded_from = (len(self.haves), len(self.beneath))
            self.graph.seed(self.haves | self.beneath)
        return self.graph.reaches(c, first)

    def tip_below_have(self, c: str, tips: Sequence[tuple[int, str]]) -> bool:
        for j, ref in tips:
            for k in sorted(self.have_tips.get(ref, ()), reverse=True):
                if k >= j and self.is_ancestor(ref, j, k):
                    self.count.proofs.append(f"{c[:12]} <= {ref}@{k} (from @{j})")
                    return True
        return False

    def widen_to(self, commits: Sequence[str]) -> bool:
        """Rule 4 for COMMITS: the versions whose boundary holds one of them
        (an index probe) where a have became the one ref they updated; their
        boundaries count as haves from here on (rules 1-3 and 5 use them).
        True when that added any. Reading every have's version instead
        proved nothing more in random-fetch (115 plans where it ran) and was
        most of the versions a plan visited."""
        if not self.may_widen or not commits:
            return False
        self.count.look_up()
        holders = {v for vs in self.history.bounded_by(commits).values() for v in vs}
        fresh: set[str] = set()
        for ans in self.have_answers.values():
            for k, ref in ans.tips:
                if k in holders:
                    info = self.pack(k)
                    if info is not None and info.refs == (ref,):
                        fresh.update(info.boundary)
        fresh -= self.haves | self.beneath
        self.beneath |= fresh
        self.learn(self.tips_many(sorted(fresh)))
        return bool(fresh)

    def learn(self, answers: Mapping[str, TipAnswer]) -> None:
        for ans in answers.values():
            for version, ref in ans.tips:
                self.have_tips.setdefault(ref, set()).add(version)
                self.state = max(self.state, version)

    def unproved(self) -> Optional[str]:
        """UNPROVED when a client with haves would get a holder's pack it may
        already hold (module docstring), a pack of a version that introduced
        one of its haves, or the whole repository."""
        if not self.haves:
            return None
        if 1 in self.needed:
            return UNPROVED
        state = self.client_state()
        if any(v <= state and not self.holds_none(v) for v in self.held_for):
            return UNPROVED
        return UNPROVED if self.resends_a_have() else None

    def resends_a_have(self) -> bool:
        """A needed version introduced a commit the client has: a have, one
        below a have the walk found, or a have that is no ref value (then its
        pack holds that commit; git's walk never sends it)."""
        if self.needed & (self.inside_haves() | self.graph.holders):
            return True
        for v in sorted(self.needed):
            self.count.visit((v,))
            if not self.haves.isdisjoint(self.history.introduced_commits(v)):
                return True
        return False

    def inside_haves(self) -> set[int]:
        """The versions that introduced a have which is no version's ref value
        (a commit a v0 client walked back to): their packs hold commits, and
        the objects below them, that the client has."""
        inside: set[int] = set()
        untipped = [c for c, ans in self.have_answers.items() if not ans.tips]
        self.prefetch(untipped)
        for c in untipped:
            inside.update(self.introduced_by(c))
        return inside

    def holds_none(self, version: int) -> bool:
        """The client holds nothing VERSION introduced: every have was first
        introduced before it (so is every commit below a have), and none is
        a commit VERSION introduced again. The client state says less: a
        have may have become a ref value again after VERSION."""
        newest = self.newest_first()
        return newest is not None and newest < version and version not in self.graph.holders

    def newest_first(self) -> Optional[int]:
        """The latest version that first introduced one of the haves (their
        peeled commits); None when one has no record."""
        if self.newest_have[0] != len(self.haves):      # the haves only grow
            firsts = self.graph.firsts({self.peel.get(h, h) for h in self.haves}).values()
            known = [f for f in firsts if f is not None]
            self.newest_have = (len(self.haves), None if len(known) < len(firsts) else max(known, default=0))
        return self.newest_have[1]

    def client_state(self) -> int:
        """The latest version at which one of the client's haves was a ref value."""
        return self.state

    def invisible(self, visible: Callable[[str], bool]) -> Optional[str]:
        """INVISIBLE_REF when a needed version wrote a ref VISIBLE rejects."""
        for v in self.needed:
            info = self.pack(v)
            if info is None or not all(visible(ref) for ref in info.refs):
                return INVISIBLE_REF
        return None

    def holder(self, c: str) -> int:
        """The version whose pack holds commit C: the first that introduced it
        (every built version records what it introduced), else the import
        version, whose pack is the whole repository as first seen."""
        candidates = self.introduced_by(c)
        return min(candidates) if candidates else 1

    def plan(self) -> Plan:
        order = tuple(sorted(self.needed))
        packs = tuple((self.pack(v) or NO_PACK).name for v in order)
        c = self.count
        return Plan(order, packs, len(c.versions), len(c.segments), tuple(c.proofs),
                    tuple(v != 1 for v in order), order, c.lookups,
                    tuple(sorted(x for x, ok in self.proved.items() if ok)),
                    tuple(sorted(self.held_for & self.needed)))


class _Graph:
    """Rule 5: C is in the client's closure when a walk of recorded parents
    from the haves reaches it. The walk only goes down: a commit first
    introduced at version i reaches only commits first introduced at or
    before i (all it reaches was reachable when it was), so asking about C
    expands the commits found so far that were first introduced no earlier
    than C, newest first, and keeps the rest for a later question. Bounded
    by WALK_MAX commits a request; beyond that nothing more is proved so.
    HOLDERS: the versions that introduced a commit found in the closure
    (their packs hold objects the client has)."""

    WALK_MAX = 2000

    def __init__(self, history: History, count: _Count):
        self.history = history
        self.count = count
        self.found: set[str] = set()                        # in the client's closure
        self.first: dict[str, int] = {}                     # found, with recorded parents -> first version
        self.seeded: set[str] = set()
        self.heap: list[tuple[int, str, tuple[str, ...]]] = []   # (-first version, commit, parents): not expanded
        self.holders: set[int] = set()
        self.walked = 0

    def add(self, commits: Collection[str]) -> None:
        fresh = sorted(c for c in commits if c not in self.found)
        if not fresh:
            return
        self.found.update(fresh)
        self.count.lookups += 1
        for c, (versions, parents) in self.history.commit_facts(fresh).items():
            if versions:
                self.first[c] = versions[0]
                self.holders.update(versions)
                heapq.heappush(self.heap, (-versions[0], c, parents))

    def seed(self, commits: Collection[str]) -> None:
        """COMMITS are in the client's closure (haves, commits proved)."""
        new = [c for c in commits if c not in self.seeded]
        if new:
            self.seeded.update(new)
            self.add(new)

    def firsts(self, seeds: Collection[str]) -> dict[str, Optional[int]]:
        """Each of SEEDS -> the first version that introduced it (None: not recorded)."""
        self.seed(seeds)
        return {c: self.first.get(c) for c in seeds}

    def reaches(self, c: str, first: int) -> bool:
        """Is C, first introduced at FIRST, below what was seeded?"""
        while c not in self.found and self.heap and -self.heap[0][0] >= first and self.walked < self.WALK_MAX:
            batch: list[str] = []
            while self.heap and -self.heap[0][0] >= first and len(batch) < 256:
                batch.extend(heapq.heappop(self.heap)[2])
                self.walked += 1
            self.add(batch)
        return c in self.found


def _include_tags(req: FetchRequest, tags: Mapping[str, str], walk: _Walk) -> Optional[str]:
    """Add the versions holding the tags include-tag sends (module docstring);
    the reason to fall back, or None."""
    if not req.has_capability("include-tag"):
        return None
    wants = set(req.wants)
    due = {t: p for t, p in tags.items() if t not in wants and t not in walk.haves and p not in walk.haves}
    probe = set(due) | set(due.values())
    sent: set[str] = set()
    looked: set[int] = set()
    while due:
        fresh = sorted(walk.needed - looked)
        if not fresh:
            return None
        looked.update(fresh)
        for v in fresh:
            name = (walk.pack(v) or NO_PACK).name
            if name:
                walk.count.lookups += 1
                sent |= walk.history.pack_holds(name, probe - sent)
        for t in sorted(t for t, p in due.items() if p in sent and t not in sent):
            why = _need_tag(walk, t)
            if why:
                return why
        for t in [t for t in due if t in sent]:
            del due[t]
        why = walk.discharge()
        if why:
            return why
    return None


def _exact(req: FetchRequest, tags: Mapping[str, str], walk: _Walk) -> Optional[str]:
    """EXTRA_OBJECTS unless every object the plan sends is one stock's answer
    leaves the client with: a version pack holds what its new values reach,
    so each needed version's values must be in the closure of the wants and
    haves (rules 1-3, with the wants counted as haves), or be a tag
    include-tag sends (its peeled object so proved). A version proved so has
    its boundary in that closure too (its commits are ancestors of its
    values), which proves the holders below it. Then the client ends with
    exactly the objects and, following tags by the objects it has, the tags a
    stock fetch gives it."""
    closure = sorted(set(req.wants) | walk.haves)
    reach = _Walk(walk.history, walk.count, closure, widen=False, known=walk)
    include_tag = req.has_capability("include-tag")
    todo = sorted(walk.needed, reverse=True)
    while todo:
        left = []
        for v in todo:
            values = walk.history.version_values(v)
            walk.count.visit((v,))
            reach.prefetch([x for x in values if x not in reach.haves])
            if all(_reached(x, reach, tags, include_tag) for x in values):
                info = walk.pack(v)
                fresh = [c for c in (info.boundary if info else ()) if c not in reach.haves]
                reach.haves.update(fresh)
                reach.learn(reach.tips_many(fresh))
            else:
                left.append(v)
        if len(left) == len(todo):
            return EXTRA_OBJECTS
        todo = left
    return None


def _reached(x: str, reach: _Walk, tags: Mapping[str, str], include_tag: bool) -> bool:
    if x in reach.haves:
        return True
    peeled = tags.get(x)
    if peeled is not None:
        return include_tag and _reached(peeled, reach, tags, include_tag)
    return reach.proved_by_rules(x)


def _need_tag(walk: _Walk, tag: str) -> Optional[str]:
    """Need a version whose pack holds TAG: each that made it a ref value
    does (tag objects are reachable from no boundary commit); the latest,
    and never the import's for a client with haves."""
    versions = [v for v, _ in walk.tips(tag).tips]
    if not versions or walk.needed.intersection(versions):
        return "include-tag"              # no version holds it, or a needed pack should have
    v = versions[-1]
    if v == 1 and walk.haves:
        return "include-tag"
    walk.count.proofs.append(f"tag {tag[:12]} from @{v} (include-tag)")
    walk.need(v)
    return None


def cover(first: int, last: int, runs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Versions FIRST … LAST partitioned into RUNS (built segment packs) and
    single versions, taking at each step the longest run that starts there
    and ends by LAST."""
    longest: dict[int, int] = {}
    for lo, hi in runs:
        if first <= lo and hi <= last and hi > longest.get(lo, lo):
            longest[lo] = hi
    out = []
    v = first
    while v <= last:
        hi = longest.get(v, v)
        out.append((v, hi))
        v = hi + 1
    return out


def _clone(req: FetchRequest, history: History, count: _Count) -> Optional[Plan]:
    """The whole repository at the latest version, when the client wants every
    ref value of it (nothing hidden, no namespace, no ref left out is sent)
    and nothing else; None leaves the request to the version walk."""
    view = history.clone_view()
    count.lookups += 1
    if view is None or not view.monotone:
        return None
    wants = set(req.wants)
    if not wants <= view.values | view.peeled or not view.values <= wants:
        return None

    def version_pack(v: int) -> Optional[str]:
        info = history.pack_of(v)
        count.visit((v,))
        return None if info is None else info.name

    def run(lo: int, hi: int) -> None:
        count.segments.add(("run", lo, hi))

    plan_ = clone_plan(view.version, view.segments, version_pack, run)
    if plan_ is None:
        return None
    count.proofs.extend(plan_.proofs)
    return replace(plan_, versions_visited=len(count.versions), segments_visited=len(count.segments),
                   proofs=tuple(count.proofs), lookups=count.lookups)


def clone_plan(version: int, segments: Sequence[SegmentPack], version_pack: Callable[[int], Optional[str]],
               on_run: Callable[[int, int], None] = lambda lo, hi: None) -> Optional[Plan]:
    """The extents of the whole repository at VERSION: the import pack, then
    the built segment packs (the longest first, `cover()`) and version packs
    partitioning 2 … VERSION, each complete against those before it. None
    when a version has no pack (VERSION_PACK's None). ON_RUN is told of each
    segment pack used."""
    runs = {(s.lo, s.hi): s.name for s in segments if s.hi <= version}
    spans = [(1, 1)] + cover(2, version, list(runs))
    names, firsts, lasts = [], [], []
    for lo, hi in spans:
        if (lo, hi) in runs:
            on_run(lo, hi)
            name = runs[(lo, hi)]
        else:
            got = version_pack(lo)
            if got is None:
                return None
            name = got
        if name:
            names.append(name)
            firsts.append(lo)
            lasts.append(hi)
    return Plan(tuple(lasts), tuple(names), 0, 0, (f"clone of version {version}: {len(spans)} runs",),
                (False,) * len(names), tuple(firsts))
