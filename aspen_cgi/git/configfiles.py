"""The files git reads a repository's configuration from (includes aside),
as GIT_CONFIG_GLOBAL, GIT_CONFIG_NOSYSTEM, GIT_CONFIG_SYSTEM, HOME and
XDG_CONFIG_HOME place them. Imports nothing (not even os): the CGI
program's first steps use it."""

from __future__ import annotations

TYPE_CHECKING = False   # typing itself costs a CGI start-up milliseconds

if TYPE_CHECKING:
    from typing import Mapping, Optional


def _true(value: Optional[str]) -> bool:
    """git's boolean, with anything unparseable false (as git_env_bool's callers see it here)."""
    v = (value or "").strip().lower()
    if v in ("true", "yes", "on"):
        return True
    try:
        return int(v) != 0
    except ValueError:
        return False


def _join(path: str, name: str) -> str:
    """os.path.join for a relative NAME."""
    return path + name if not path or path.endswith("/") else f"{path}/{name}"


def sources(gitdir: str, env: Mapping[str, str]) -> list[str]:
    files = [_join(gitdir, "config"), _join(gitdir, "config.worktree")]
    if "GIT_CONFIG_GLOBAL" in env:
        files.append(env["GIT_CONFIG_GLOBAL"])
    else:
        home = env.get("HOME", "")
        xdg = env.get("XDG_CONFIG_HOME") or (_join(home, ".config") if home else "")
        if xdg:
            files.append(_join(xdg, "git/config"))
        if home:
            files.append(_join(home, ".gitconfig"))
    if not _true(env.get("GIT_CONFIG_NOSYSTEM")):
        files.append(env.get("GIT_CONFIG_SYSTEM") or "/etc/gitconfig")
    return files
