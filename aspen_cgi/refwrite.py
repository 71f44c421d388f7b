"""Ref updates with compare-and-swap on the old value, through git's own
lock-file protocol (`git update-ref --stdin`, one transaction per call), so
of two racing pushes to one ref exactly one wins."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from . import gitexec


@dataclass(frozen=True)
class RefUpdate:
    ref: str                 # full name, namespace prefix included
    new: str                 # zero oid: delete
    old: Optional[str]       # expected value (zero: must not exist); None: no check


ZERO = "0" * 40


def transaction(gitdir: str, env: Mapping[str, str], updates: Sequence[RefUpdate],
                message: str = "push") -> Optional[str]:
    """Apply UPDATES all or nothing. None on success, else git's error text
    (without its `fatal: ` prefix), as stock's rp_error shows it."""
    if not updates:
        return None
    lines = []
    for u in updates:
        ref = u.ref.encode("utf-8", "surrogateescape")
        if u.new == ZERO:
            line = b"delete " + ref + (b" " + u.old.encode() if u.old else b"")
        else:
            line = b"update " + ref + b" " + u.new.encode() + (b" " + u.old.encode() if u.old else b"")
        lines.append(line + b"\n")
    res = gitexec.git(["update-ref", "-m", message, "--stdin"], cwd=gitdir, env=env, input=b"".join(lines))
    if res.ok:
        return None
    text = res.stderr.decode("utf-8", "replace").strip()
    for prefix in ("fatal: ", "error: "):
        if text.startswith(prefix):
            text = text[len(prefix):]
    return text or f"update-ref exited with {res.returncode}"
