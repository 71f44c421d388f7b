"""Object ids of the two hash functions git knows: SHA-1 (40 hex digits)
and SHA-256 (64). A repository uses one (`extensions.objectFormat`); the
null id of either means "no object" (a created or deleted ref). Imports
nothing: the CGI program's first steps use it."""

from __future__ import annotations

ZERO = "0" * 40                       # SHA-1's null id; any all-zero id is null (is_null)
HEX_LENGTHS = {"sha1": 40, "sha256": 64}
OID_PATTERN = "[0-9a-f]{40}(?:[0-9a-f]{24})?"    # for regular expressions, str or bytes
_HEX = frozenset("0123456789abcdef")


def is_oid(s: str) -> bool:
    """A full object id of either hash, lower-case hex."""
    return len(s) in (40, 64) and set(s) <= _HEX


def is_null(oid: str | None) -> bool:
    """OID is the null id of either hash."""
    return oid is not None and len(oid) in (40, 64) and not oid.strip("0")


def null_of(format: str) -> str:
    """The null id of the hash FORMAT names (sha1, sha256)."""
    return "0" * HEX_LENGTHS[format]


def id_bytes(format: str) -> int:
    """How many bytes an id of the hash FORMAT names takes in a pack or index."""
    return HEX_LENGTHS[format] // 2
