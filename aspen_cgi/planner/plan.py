"""FetchRequest -> Plan (stored version packs whose concatenation completes
the client, with the proof) or Fallback (why git must answer).

Pure: the planner reads the ref store through the small `History`
interface and runs no process, writes nothing, knows no HTTP.

Proof rules (reference/planner-notes.md): a want that became a ref's value
at version b needs Q_b; each boundary commit c of a needed version must be
in the client's closure, proved by
  1. c is a have;
  2. c became the value of ref s at version j, a have became the value of s
     at version k >= j, and s only fast-forwarded from j to k (the ref
     store's O(log N) segment query);
  3. c was introduced by a version j' that updated one ref, whose value
     there is proved by rule 2;
or else the version that holds c is needed too, recursively, down to the
import version (whose pack is the whole repository then). A plan is made
only when every version has its pack: anything unproved falls back.

A full clone (no haves) of every ref value of the latest version N is the
import pack, then segment packs and version packs partitioning versions
2 … N (the longest built segment first, `cover()`): each extent holds what
its versions' refs reach beyond the refs before them, with delta bases only
in earlier extents, so the splice is complete in O(log N) extents.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Protocol, Sequence

from ..protocol.requests import FetchRequest
from ..refstore.model import AncestryAnswer, CloneView, TipAnswer


class History(Protocol):
    def tips(self, commit: str) -> TipAnswer: ...
    def is_ancestor(self, ref: str, j: int, k: int) -> AncestryAnswer: ...
    def introduced_by(self, commit: str) -> list[int]: ...
    def pack_of(self, version: int) -> Optional[tuple[str, tuple[str, ...], tuple[str, ...]]]:
        """(pack name or "" when empty, boundary commits, refs it updated); None if not built."""
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

    @property
    def spans(self) -> tuple[tuple[int, int], ...]:
        return tuple(zip(self.firsts or self.versions, self.versions))


@dataclass(frozen=True)
class Fallback:
    reason: str
    versions_visited: int = 0
    segments_visited: int = 0


@dataclass
class _Count:
    versions: int = 0
    segments: int = 0
    proofs: list[str] = field(default_factory=list)


SUPPORTED_CAPS = {"multi_ack", "multi_ack_detailed", "no-done", "thin-pack", "side-band", "side-band-64k",
                  "ofs-delta", "shallow", "no-progress", "include-tag", "agent", "session-id", "object-format",
                  "allow-tip-sha1-in-want", "allow-reachable-sha1-in-want", "deepen-since", "deepen-not",
                  "deepen-relative", "filter"}


def plan(req: FetchRequest, history: History, advertised: frozenset[str],
         tag_values: frozenset[str] = frozenset()) -> Plan | Fallback:
    """ADVERTISED: every object the client may want (visible ref values and
    their peeled objects); TAG_VALUES: the visible refs/tags/* values, which
    include-tag could add."""
    reason = req.needs_fallback_reason
    if reason:
        return Fallback(reason)
    if req.haves and not req.has_capability("thin-pack"):
        return Fallback("no-thin-pack")          # version packs are thin against the client's objects
    if not req.has_capability("ofs-delta"):
        return Fallback("no-ofs-delta")
    if req.has_capability("include-tag") and not tag_values <= set(req.wants) | set(req.haves):
        return Fallback("include-tag")
    if any(w not in advertised for w in req.wants):
        return Fallback("want-not-advertised")
    if not history.all_packs_built():
        return Fallback("not-built")
    count = _Count()
    if not req.haves:
        whole = _clone(req, history, count)
        if whole is not None:
            return whole
    haves = set(req.haves)
    have_tips: dict[str, list[int]] = {}            # ref -> versions at which a have became its value
    for h in haves:
        ans = history.tips(h)
        count.versions += ans.visits.versions
        for version, ref in ans.tips:
            have_tips.setdefault(ref, []).append(version)
    needed: set[int] = set()
    work: list[int] = []
    for w in req.wants:
        if w in haves:
            continue
        first = history.tips(w)
        count.versions += first.visits.versions
        if first.first is None:
            return Fallback("want-not-a-tip", count.versions, count.segments)
        v = first.first[0]
        if v not in needed:
            needed.add(v)
            work.append(v)
    proved: dict[str, bool] = {}
    while work:
        v = work.pop()
        info = history.pack_of(v)
        if info is None:
            return Fallback("not-built", count.versions, count.segments)
        for c in info[1]:
            if c not in proved:
                proved[c] = _in_closure(c, haves, have_tips, history, count)
            if proved[c]:
                continue
            holder = _holder(c, history, count)
            if holder not in needed:
                needed.add(holder)
                work.append(holder)
    if 1 in needed and haves:
        # a client with history would get the whole repository: git negotiates better
        return Fallback("haves-not-proved", count.versions, count.segments)
    order = tuple(sorted(needed))
    packs = []
    for v in order:
        info = history.pack_of(v)
        packs.append(info[0] if info else "")
    return Plan(order, tuple(packs), count.versions, count.segments, tuple(count.proofs),
                tuple(v != 1 for v in order), order)


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
    if view is None:
        return None
    wants = set(req.wants)
    if not wants <= view.values | view.peeled or not view.values <= wants:
        return None
    segments = {(s.lo, s.hi): s.name for s in view.segments}
    spans = [(1, 1)] + cover(2, view.version, list(segments))
    names, firsts, lasts = [], [], []
    for lo, hi in spans:
        if (lo, hi) in segments:
            count.segments += 1
            name = segments[(lo, hi)]
        else:
            count.versions += 1
            info = history.pack_of(lo)
            if info is None:
                return None
            name = info[0]
        if name:
            names.append(name)
            firsts.append(lo)
            lasts.append(hi)
    count.proofs.append(f"clone of version {view.version}: {len(spans)} runs")
    return Plan(tuple(lasts), tuple(names), count.versions, count.segments, tuple(count.proofs),
                (False,) * len(names), tuple(firsts))


def _in_closure(c: str, haves: set[str], have_tips: dict[str, list[int]], history: History, count: _Count) -> bool:
    if c in haves:
        count.proofs.append(f"{c[:12]} is a have")
        return True
    tips = history.tips(c)
    count.versions += tips.visits.versions
    if _tip_below_have(c, tips.tips, have_tips, history, count):
        return True
    for j in history.introduced_by(c):
        count.versions += 1
        info = history.pack_of(j)
        if info is None or len(info[2]) != 1:
            continue
        ref = info[2][0]
        if _tip_below_have(c, ((j, ref),), have_tips, history, count):
            return True
    return False


def _tip_below_have(c: str, tips: Sequence[tuple[int, str]], have_tips: dict[str, list[int]],
                    history: History, count: _Count) -> bool:
    for j, ref in tips:
        for k in sorted(have_tips.get(ref, ()), reverse=True):
            if k < j:
                continue
            ans = history.is_ancestor(ref, j, k)
            count.versions += ans.visits.versions
            count.segments += ans.visits.segments
            if ans.ancestor:
                count.proofs.append(f"{c[:12]} <= {ref}@{k} (from @{j})")
                return True
    return False


def _holder(c: str, history: History, count: _Count) -> int:
    """The version whose pack holds commit C: the first that introduced it
    (every built version records what it introduced), else the import
    version, whose pack is the whole repository as first seen."""
    candidates = history.introduced_by(c)
    count.versions += 1
    return min(candidates) if candidates else 1
