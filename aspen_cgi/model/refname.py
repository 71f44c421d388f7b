"""git's check_refname_format() rules (refs.c), for the names a push may write."""

from __future__ import annotations

_BAD = set(range(0, 0x20)) | {0x7F} | set(b" :?[\\^~*")


def check_refname_format(name: str, allow_onelevel: bool = False) -> bool:
    """True when NAME is a valid ref name (flags 0 or ALLOW_ONELEVEL)."""
    raw = name.encode("utf-8", "surrogateescape")
    if not raw or raw == b"@":
        return False
    components = raw.split(b"/")
    for comp in components:
        if not comp or comp.startswith(b".") or comp.endswith(b".lock"):
            return False
        if b".." in comp or b"@{" in comp or any(c in _BAD for c in comp):
            return False
    if raw.endswith(b"."):
        return False
    return allow_onelevel or len(components) >= 2
