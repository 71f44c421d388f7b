"""Typed objects the ref store hands across module boundaries."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Optional, Sequence

from .objectid import ZERO, is_null  # noqa: F401  (re-exported: the store's null id)

KINDS = ("import", "push", "external", "undo", "restore")


@dataclass(frozen=True)
class RefChange:
    """One ref update a writer asks for: CAS on OLD (None: no check; ZERO: must
    not exist), NEW (ZERO: delete), and what is known of the new value."""
    ref: str
    old: Optional[str]
    new: str
    ff: bool = False                 # OLD is an ancestor of NEW (False when unknown)
    otype: Optional[str] = None      # object type of NEW
    peeled: Optional[str] = None     # NEW fully peeled, when NEW is a tag


@dataclass(frozen=True)
class PushCert:
    """A signed push's certificate as its version records it: what its
    hooks saw as GIT_PUSH_CERT* (the blob id, signer, key, signature status,
    nonce, nonce status and slop) and the certificate itself, kept here
    because its blob is unreachable in the repository and gc prunes it."""
    blob: str
    signer: str
    key: str
    status: str                        # G, B, E, X, Y, R, or N: no signature check answered
    nonce_status: str                  # OK, SLOP, BAD, MISSING or UNSOLICITED
    nonce: Optional[str] = None        # the nonce the server issued (or accepted, within the slop)
    nonce_slop: Optional[int] = None
    text: bytes = b""


@dataclass(frozen=True)
class VersionMeta:
    kind: str = "push"
    who: Optional[str] = None
    push_id: Optional[str] = None
    introduced: tuple[str, ...] = ()   # commits this version made reachable
    cert: Optional[PushCert] = None    # the push certificate of a signed push
    packs: tuple[str, ...] = ()        # the pack store's packs of its objects (a replica's push)


@dataclass(frozen=True)
class Update:
    ref: str
    old: str
    new: str
    ff: bool


@dataclass(frozen=True)
class UpdateRow:
    """One ref update a version recorded, as the store keeps it: OLD and NEW
    values (ZERO: absent), the fast-forward flag, the type of NEW (the
    `type` column) and NEW peeled when it is a tag."""
    ref: str
    old: str
    new: str
    ff: bool
    otype: Optional[str]
    peeled: Optional[str]


@dataclass(frozen=True)
class Version:
    id: int
    kind: str
    who: Optional[str]
    at: float
    push_id: Optional[str]
    state: str
    updates: tuple[Update, ...] = ()
    cert: Optional[PushCert] = None
    node: Optional[str] = None      # the cluster's node that took it (ASPEN_NODE_URL, else its host's name)


@dataclass(frozen=True)
class StoredRef:
    """A ref as the store holds it: a value (with type and peeled target) or a
    symbolic ref naming another ref."""
    name: str
    oid: Optional[str]
    symref: Optional[str] = None
    otype: Optional[str] = None
    peeled: Optional[str] = None


@dataclass(frozen=True)
class Visits:
    """What a history query read: counts, and which versions (ids) and
    segment nodes ((level, idx)) their records belong to, so that a caller
    asking several questions can count each version once."""
    versions: int = 0
    segments: int = 0
    version_ids: tuple[int, ...] = ()
    segment_ids: tuple[tuple[int, int], ...] = ()

    @property
    def total(self) -> int:
        return self.versions + self.segments


@dataclass(frozen=True)
class AncestryAnswer:
    """Whether the value of REF at version J is an ancestor of (or equal to) its
    value at version K, as proved by fast-forward flags alone."""
    ref: str
    j: int
    k: int
    ancestor: bool
    value_j: Optional[str]
    value_k: Optional[str]
    visits: Visits


@dataclass(frozen=True)
class TipAnswer:
    commit: str
    tips: tuple[tuple[int, str], ...]   # (version, ref), oldest first
    visits: Visits

    @property
    def first(self) -> Optional[tuple[int, str]]:
        return self.tips[0] if self.tips else None

    @classmethod
    def of(cls, commit: str, rows: "Sequence[tuple[int, str]]") -> "TipAnswer":
        """The answer the store's rows ROWS (version, ref) give, one record read."""
        return cls(commit, tuple(rows), Visits(1, 0, tuple(sorted({v for v, _ in rows}))))


@dataclass(frozen=True)
class CompactReport:
    versions: int
    nodes_built: int
    segments: int
    segment_rows: int
    levels: int


@dataclass
class VerifyReport:
    versions: int = 0
    refs: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class ChainReport:
    """`aspen verify --chain`: the chained versions FIRST..LAST (LINKS of
    them), where the chain starts (STARTS_AT: versions before it predate
    it), and the first version at which it does not hold, with why."""
    starts_at: int = 1
    latest: int = 0
    links: int = 0
    first: Optional[int] = None
    last: Optional[int] = None
    broken_at: Optional[int] = None
    why: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.broken_at is None


@dataclass(frozen=True)
class SegmentPack:
    """The stored pack of versions LO … HI: what their refs reach beyond the
    refs before LO, thin against those ("" when that is nothing)."""
    lo: int
    hi: int
    name: str
    objects: int = 0
    size: int = 0


@dataclass(frozen=True)
class CloneView:
    """What a full clone at VERSION can be planned from: the direct refs'
    values then (and their peeled targets), the segment packs built, and
    whether every ref only moved forward since the import (then every
    earlier state's objects are reachable from this one)."""
    version: int
    values: frozenset[str]
    peeled: frozenset[str]
    segments: tuple[SegmentPack, ...]
    monotone: bool = True        # no ref deleted or moved other than forward since the import


class PackInfo(NamedTuple):
    """A built version pack as the planner reads it."""
    name: str                       # the pack's name, "" when the version introduced no object
    boundary: tuple[str, ...]       # the commits just outside what the version introduced
    refs: tuple[str, ...]           # the refs the version updated
