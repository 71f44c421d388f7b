"""From the CGI environment to a repository on disk: stock's getdir(),
daemon_avoid_alias(), enter_repo() and its ownership check."""

from __future__ import annotations

import os
import stat
from typing import Mapping, Optional

from ..git import gitexec
from ..service import Repo
from .message import HttpError

PATH_MAX = 4096
_SUFFIXES = ("/.git", "", ".git/.git", ".git")


def die(msg: str) -> HttpError:
    return HttpError(500, "Internal Server Error", f"fatal: {msg}\n")


def avoid_alias(p: str) -> bool:
    """True when P is acceptable: starts with / or ~ and has no //, /./, /../,
    trailing /. or /.. (three or more dots are a name)."""
    if not p or p[0] not in "/~":
        return False
    sl, ndot = True, 0
    for ch in p[1:] + "\0":
        if sl:
            if ch == ".":
                ndot += 1
            elif ch == "/":
                if ndot < 3:
                    return False
                ndot = 0
            elif ch == "\0":
                return not (0 < ndot < 3)
            else:
                sl, ndot = False, 0
        elif ch == "\0":
            return True
        elif ch == "/":
            sl, ndot = True, 0
    return True


def getdir(env: Mapping[str, str]) -> str:
    root = env.get("GIT_PROJECT_ROOT", "")
    path_info = env.get("PATH_INFO", "")
    if root:
        if not path_info:
            raise die("GIT_PROJECT_ROOT is set but PATH_INFO is not")
        if not avoid_alias(path_info):
            raise die(f"'{path_info}': aliased")
        sep = "" if root.endswith("/") else "/"
        return root + sep + path_info[1:]
    translated = env.get("PATH_TRANSLATED", "")
    if translated:
        return translated
    raise die("No GIT_PROJECT_ROOT or PATH_TRANSLATED from server")


def _valid_head(gitdir: str) -> bool:
    head = os.path.join(gitdir, "HEAD")
    try:
        if os.path.islink(head):
            return os.readlink(head).startswith("refs/")
        with open(head, "rb") as f:
            data = f.read(256)
    except OSError:
        return False
    if data.startswith(b"ref:"):
        return data[4:].lstrip(b" \t").startswith(b"refs/")
    text = data.strip()
    return len(text) in (40, 64) and all(c in b"0123456789abcdef" for c in text)


def is_git_directory(path: str) -> bool:
    return (os.access(os.path.join(path, "objects"), os.X_OK)
            and os.access(os.path.join(path, "refs"), os.X_OK)
            and _valid_head(path))


MAX_GITFILE = 1 << 20


def _read_gitfile(path: str) -> Optional[str]:
    """Stock's read_gitfile(): None for anything but a regular file; a
    regular file must be a valid gitfile or the request dies (500) with
    git's own message."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    if st.st_size > MAX_GITFILE:
        raise die(f"too large to be a .git file: '{path}'")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise die(f"error opening '{path}': {e.strerror}") from None
    data = raw.decode("utf-8", "surrogateescape")
    if not data.startswith("gitdir: "):
        raise die(f"invalid gitfile format: {path}")
    data = data.rstrip("\r\n")
    if len(data) < 9:
        raise die(f"no path in gitfile: {path}")
    target = data[8:]
    if not target.startswith("/") and "/" in path:
        target = path[:path.rindex("/") + 1] + target
    if not is_git_directory(target):
        raise die(f"not a git repository: {target}")
    return os.path.realpath(target)


def enter_repo(path: str) -> Optional[Repo]:
    """Stock's enter_repo(path, strict=0), without changing directory."""
    n = len(path)
    while n > 1 and path[n - 1] == "/":
        n -= 1
    if n >= PATH_MAX:
        return None
    used = path[:n]
    validated = used
    if used.startswith("~"):
        expanded = os.path.expanduser(used)
        if expanded == used and not used.startswith("~/"):
            return None
        used = expanded
    for suffix in _SUFFIXES:
        candidate = used + suffix
        try:
            st = os.stat(candidate)
        except (OSError, ValueError):
            continue
        if stat.S_ISREG(st.st_mode) or (stat.S_ISDIR(st.st_mode) and is_git_directory(candidate)):
            validated += suffix
            used = candidate
            break
    else:
        return None
    target = _read_gitfile(used)
    if target is not None:
        used = target
    if not os.path.isdir(used) or not is_git_directory(used):
        return None
    gitdir = os.path.abspath(used)
    bare = not (os.path.basename(gitdir) == ".git" or target is not None)
    return Repo(validated, gitdir, bare)


def _owner_uid() -> int:
    euid = os.geteuid()
    if euid == 0:
        sudo = os.environ.get("SUDO_UID", "")
        if sudo.isdigit():
            return int(sudo)
    return euid


def _safe_directories(env: Mapping[str, str]) -> list[str]:
    child = gitexec.child_env(env)
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_CONFIG"):
        child.pop(name, None)
    res = gitexec.git(["config", "--includes", "--get-all", "safe.directory"], cwd="/", env=child)
    values: list[str] = []
    for line in res.stdout.decode("utf-8", "surrogateescape").splitlines():
        if line == "":
            values = []
        else:
            values.append(line)
    return values


def check_ownership(repo: Repo, env: Mapping[str, str]) -> None:
    """Stock 2.39.4+ refuses repositories owned by another user unless safe.directory allows them."""
    uid = _owner_uid()
    paths = [repo.gitdir]
    if not repo.bare:
        paths.append(os.path.dirname(repo.gitdir))
    try:
        if all(os.lstat(p).st_uid == uid for p in paths):
            return
    except OSError:
        return
    for value in _safe_directories(env):
        if value == "*" or os.path.normpath(os.path.expanduser(value)) in (
                os.path.normpath(p) for p in paths):
            return
    where = paths[-1] if not repo.bare else repo.gitdir
    raise HttpError(500, "Internal Server Error",
                    f"fatal: detected dubious ownership in repository at '{where}'\n"
                    "To add an exception for this directory, call:\n\n"
                    f"\tgit config --global --add safe.directory {where}\n")
