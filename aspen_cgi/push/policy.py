"""The receive.* settings a push obeys (receive_pack_config()), whether
receive-pack sees the repository as bare, and where branches are checked
out (worktrees), as typed values."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from ..git.repoconfig import ConfigError, parse_bool
from ..protocol.procreceive import RefPattern, patterns

UNCONFIGURED, IGNORE, WARN, REFUSE, UPDATE_INSTEAD = "unconfigured", "ignore", "warn", "refuse", "updateinstead"

REFUSE_CURRENT_MSG = (
    "By default, updating the current branch in a non-bare repository\n"
    "is denied, because it will make the index and work tree inconsistent\n"
    "with what you pushed, and will require 'git reset --hard' to match\n"
    "the work tree to HEAD.\n"
    "\n"
    "You can set the 'receive.denyCurrentBranch' configuration variable\n"
    "to 'ignore' or 'warn' in the remote repository to allow pushing into\n"
    "its current branch; however, this is not recommended unless you\n"
    "arranged to update its work tree to match what you pushed in some\n"
    "other way.\n"
    "\n"
    "To squelch this message and still keep the default behaviour, set\n"
    "'receive.denyCurrentBranch' configuration variable to 'refuse'.")

REFUSE_DELETE_CURRENT_MSG = (
    "By default, deleting the current branch is denied, because the next\n"
    "'git clone' won't result in any file checked out, causing confusion.\n"
    "\n"
    "You can set 'receive.denyDeleteCurrent' configuration variable to\n"
    "'warn' or 'ignore' in the remote repository to allow deleting the\n"
    "current branch, with or without a warning message.\n"
    "\n"
    "To squelch this message, you can set it to 'refuse'.")


def _deny_action(value: Optional[str], present: bool) -> str:
    if not present:
        return UNCONFIGURED
    if value is not None:
        v = value.lower()
        if v in (IGNORE, WARN, REFUSE, UPDATE_INSTEAD):
            return v
    try:
        return REFUSE if parse_bool(value) else IGNORE
    except ConfigError:
        return IGNORE


def _bool(config, name: str, default: bool) -> bool:
    try:
        return config.bool(name, default)
    except ConfigError:
        return default


@dataclass(frozen=True)
class PushPolicy:
    deny_deletes: bool = False
    deny_non_fast_forwards: bool = False
    deny_current_branch: str = UNCONFIGURED
    deny_delete_current: str = UNCONFIGURED
    fsck: bool = False
    fsck_msg_types: str = ""
    unpack_limit: int = 100
    max_input_size: int = 0
    advertise_atomic: bool = True
    advertise_push_options: bool = False
    update_server_info: bool = False
    auto_gc: bool = True
    keepalive: int = 5
    object_format: str = "sha1"
    shallow_update: bool = False
    proc_receive_refs: tuple[RefPattern, ...] = ()
    refused: Optional[str] = None     # a setting stock will not start with: why (no push is taken)

    @classmethod
    def from_config(cls, config) -> "PushPolicy":
        def has(name):
            return config.has(name)
        fsck = _bool(config, "receive.fsckobjects", _bool(config, "transfer.fsckobjects", False)) \
            if has("receive.fsckobjects") else _bool(config, "transfer.fsckobjects", False)
        msg_types = []
        for key, value in config.entries:
            if key.startswith("receive.fsck.") and value is not None and key != "receive.fsckobjects":
                msg_types.append(f"{key[len('receive.fsck.'):]}={value}")
        limit = config.int("receive.unpacklimit", config.int("transfer.unpacklimit", 100))
        return cls(
            deny_deletes=_bool(config, "receive.denydeletes", False),
            deny_non_fast_forwards=_bool(config, "receive.denynonfastforwards", False),
            deny_current_branch=_deny_action(config.get("receive.denycurrentbranch"),
                                             has("receive.denycurrentbranch")),
            deny_delete_current=_deny_action(config.get("receive.denydeletecurrent"),
                                             has("receive.denydeletecurrent")),
            fsck=fsck,
            fsck_msg_types=",".join(msg_types),
            unpack_limit=limit,
            max_input_size=config.int("receive.maxinputsize", 0),
            advertise_atomic=_bool(config, "receive.advertiseatomic", True),
            advertise_push_options=_bool(config, "receive.advertisepushoptions", False),
            object_format=config.object_format,
            update_server_info=_bool(config, "receive.updateserverinfo", False),
            auto_gc=_bool(config, "receive.autogc", True),
            keepalive=config.int("receive.keepalive", 5),
            shallow_update=_bool(config, "receive.shallowupdate", False),
            proc_receive_refs=patterns(config.get_all("receive.procreceiverefs")),
            refused=("bad config variable 'receive.procreceiverefs': missing value"
                     if None in config.get_all("receive.procreceiverefs") else None),
        )


@dataclass(frozen=True)
class Worktree:
    path: str
    gitdir: str


def is_bare(config) -> bool:
    """is_bare_repository() in receive-pack, which enters the git directory
    itself: core.bare says, and a repository that does not say is bare,
    whatever its directory is called (a copy of a work tree's `.git` named
    `x.git` keeps `core.bare = false` and is not)."""
    return _bool(config, "core.bare", True)


def main_worktree_path(gitdir: str) -> str:
    """get_main_worktree(): the git directory's real path less a final `/.git`."""
    path = os.path.realpath(gitdir)
    return path[:-len("/.git")] if path.endswith("/.git") else path


def checked_out(gitdir: str, bare: bool, config) -> dict[str, Worktree]:
    """Branch -> non-bare worktree whose HEAD points at it (find_shared_symref);
    BARE as is_bare() says."""
    out: dict[str, Worktree] = {}
    if not bare:
        wt = config.get("core.worktree")
        path = (wt if os.path.isabs(wt) else os.path.normpath(os.path.join(gitdir, wt))) if wt \
            else main_worktree_path(gitdir)
        target = _head_target(gitdir)
        if target:
            out[target] = Worktree(path, gitdir)
    base = os.path.join(gitdir, "worktrees")
    try:
        ids = sorted(os.listdir(base))
    except OSError:
        ids = []
    for wid in ids:
        wdir = os.path.join(base, wid)
        target = _head_target(wdir)
        if not target or target in out:
            continue
        try:
            with open(os.path.join(wdir, "gitdir")) as f:
                path = os.path.dirname(f.read().strip())
        except OSError:
            continue
        out[target] = Worktree(path, wdir)
    return out


def _head_target(dirname: str) -> Optional[str]:
    try:
        with open(os.path.join(dirname, "HEAD"), "rb") as f:
            text = f.read().decode("utf-8", "surrogateescape").strip()
    except OSError:
        return None
    return text[4:].strip() if text.startswith("ref:") else None


def head_name(gitdir: str) -> Optional[str]:
    """What HEAD points at (resolve_refdup("HEAD") for the usual symbolic HEAD)."""
    return _head_target(gitdir)
