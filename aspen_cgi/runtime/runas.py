"""Acting as a repository's owner: an operator's command run as root
switches to the user who owns the repository before it touches anything, so
every file it writes, and every process it starts (builders, the
pre-warmer), belongs to the user the server runs as."""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from typing import Iterable, Optional

from .. import settings


class CannotActAs(Exception):
    """Root could not become the repository's owner (no CAP_SETUID, say)."""


@dataclass(frozen=True)
class Owner:
    uid: int
    gid: int
    name: str           # the login name, or the uid as text when it has none
    home: Optional[str]


def owner_of(path: str) -> Owner:
    """The owner of PATH, or of its nearest existing parent (a repository a
    command is about to make)."""
    here = os.path.abspath(path)
    while True:
        try:
            st = os.stat(here)
            break
        except FileNotFoundError:
            parent = os.path.dirname(here)
            if parent == here:
                raise
            here = parent
    try:
        pw = pwd.getpwuid(st.st_uid)
        return Owner(st.st_uid, pw.pw_gid, pw.pw_name, pw.pw_dir)
    except KeyError:
        return Owner(st.st_uid, st.st_gid, str(st.st_uid), None)


def owners_of(paths: Iterable[str]) -> list[Owner]:
    seen: dict[int, Owner] = {}
    for p in paths:
        o = owner_of(p)
        seen.setdefault(o.uid, o)
    return list(seen.values())


def become(owner: Owner) -> None:
    """Switch this process, for good, to OWNER: groups, group, user, and the
    HOME git reads its configuration from. Raises CannotActAs."""
    try:
        groups = os.getgrouplist(owner.name, owner.gid) if owner.name != str(owner.uid) else [owner.gid]
        os.setgroups(groups)
        os.setgid(owner.gid)
        os.setuid(owner.uid)
    except OSError as e:
        raise CannotActAs(f"{e.strerror or e}") from e
    os.environ["HOME"] = owner.home if owner.home and os.path.isdir(owner.home) else "/"
    os.environ.pop("XDG_CONFIG_HOME", None)
    settings.forget()          # the owner's defaults: its own run directory, as its server has
    if not os.access(".", os.R_OK | os.X_OK):
        os.chdir("/")      # root's working directory (/root, say) is closed to the owner, and git needs one
