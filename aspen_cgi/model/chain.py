"""The ref store's hash chain: each version, once done, gets a SHA-256 over
its content and the previous version's hash, so that a version changed,
removed or put in between afterwards breaks every hash from it on.

A version's content is its canonical text (`text()`): one line per field,
then one line per ref update sorted by ref, then the SHA-256 of its push
certificate when it has one. The first version hashed in a store (the
first after the schema that brought the chain, or version 1 of a new
store) is the chain's **start**: its `prev` is 64 zeros and it is marked.
docs/ref-store.md gives an auditor's procedure over `aspen log --export`,
needing only Python's hashlib."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

START_PREV = "0" * 64
FORMAT = "aspen-chain-v1"


@dataclass(frozen=True)
class Link:
    """One chained version: its hash, the previous one's, whether the chain starts here, its text."""
    version: int
    prev: str
    hash: str
    start: bool
    text: str


def text(version: int, prev: str, kind: str, who: Optional[str], at: float, push_id: Optional[str],
         updates: Sequence[tuple[str, str, str, bool]], cert: Optional[bytes]) -> str:
    """The canonical text of a version (UPDATES: ref, old, new, fast-forward)."""
    lines = [FORMAT, f"version {version}", f"prev {prev}", f"kind {kind}", f"who {_field(who)}",
             f"at {at!r}", f"push-id {_field(push_id)}"]
    lines += [f"update {_field(r)} {o} {n} {int(bool(f))}" for r, o, n, f in sorted(updates)]
    if cert is not None:
        lines.append(f"cert {hashlib.sha256(cert).hexdigest()}")
    return "\n".join(lines) + "\n"


def _field(value: Optional[str]) -> str:
    """A value on one line: `-` for none; backslash, newline and `-` alone escaped."""
    if value is None:
        return "-"
    if value == "-":
        return "\\-"
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def digest(canonical: str) -> str:
    return hashlib.sha256(canonical.encode("utf-8", "surrogateescape")).hexdigest()


def first_break(links: Iterable[Link], recomputed: Optional[Mapping[int, Optional[str]]] = None
                ) -> Optional[tuple[int, str]]:
    """The first link that does not hold, as (version, why), or None. Each
    link's hash must be the digest of its text, its text must name its prev,
    and its prev must be the hash before it (START_PREV at a start, which
    only the first link may be). RECOMPUTED: version -> the text the store's
    rows give now, which must be the text that was hashed."""
    before: Optional[Link] = None
    for link in links:
        if recomputed is not None and recomputed.get(link.version) != link.text:
            return link.version, "its content changed after it was hashed"
        if digest(link.text) != link.hash:
            return link.version, "its hash is not the SHA-256 of its text"
        if f"\nprev {link.prev}\n" not in link.text or f"\nversion {link.version}\n" not in link.text:
            return link.version, "its text names another version or previous hash"
        if before is None:
            if link.start and link.prev != START_PREV:
                return link.version, "the chain's start has a previous hash"
        elif link.start:
            return link.version, "a second start in the chain"
        elif link.version != before.version + 1:
            return link.version, f"versions {before.version + 1}..{link.version - 1} are missing"
        elif link.prev != before.hash:
            return link.version, f"its previous hash is not version {before.version}'s"
        before = link
    return None
