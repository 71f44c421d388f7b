"""A repository's refs as values: a ref (value, peeled tag, symbolic target),
a snapshot of them with HEAD, namespaces' prefixes, and git's hideRefs
rules. Reading them from a repository is git/reader.py's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol


class OrderedConfig(Protocol):
    """What HiddenRefs reads of a repository's configuration (git/repoconfig.py's RepoConfig)."""

    def ordered(self, *keys: str) -> list[Optional[str]]: ...


@dataclass(frozen=True)
class Ref:
    name: str                      # full name inside the namespace (namespace prefix removed)
    oid: str
    peeled: Optional[str] = None   # fully peeled object when the ref points at a tag
    symref_target: Optional[str] = None
    missing: bool = False          # the object is not in the repository (stock's dumb info/refs skips it)


@dataclass(frozen=True)
class RefSnapshot:
    refs: tuple[Ref, ...]
    head: Optional[Ref]            # HEAD resolved, or None if unborn/missing
    head_target: Optional[str]     # what HEAD points at when symbolic (even unborn)
    namespace_prefix: str = ""

    def by_name(self) -> dict[str, Ref]:
        return {r.name: r for r in self.refs}


def namespace_prefix(namespace: Optional[str]) -> str:
    """refs/namespaces/<a>/refs/namespaces/<b>/ for GIT_NAMESPACE=a/b."""
    if not namespace:
        return ""
    parts = [p for p in namespace.split("/") if p]
    return "".join(f"refs/namespaces/{p}/" for p in parts)


@dataclass(frozen=True)
class HiddenRefs:
    """git's ref_is_hidden(): the last matching pattern decides; `!` negates,
    `^` matches the full name (namespace included)."""
    patterns: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, config: OrderedConfig, section: str) -> "HiddenRefs":
        values = config.ordered("transfer.hiderefs", f"{section}.hiderefs")
        return cls(tuple(v.rstrip("/") for v in values if v))

    def hidden(self, name: str, full_name: Optional[str] = None) -> bool:
        full = full_name if full_name is not None else name
        for pat in reversed(self.patterns):
            neg = pat.startswith("!")
            if neg:
                pat = pat[1:]
            subject = name
            if pat.startswith("^"):
                subject, pat = full, pat[1:]
            if subject.startswith(pat) and (len(subject) == len(pat) or subject[len(pat)] == "/"):
                return not neg
        return False

    def __bool__(self) -> bool:
        return bool(self.patterns)
