"""Where Aspen keeps a repository's state: `<gitdir>/aspen`, or under
ASPEN_STATE_DIR for repositories it may not write into. Imports nothing (not
even os) unless ASPEN_STATE_DIR is set: the CGI program's first steps use it."""

from __future__ import annotations

TYPE_CHECKING = False   # typing itself costs a CGI start-up milliseconds

if TYPE_CHECKING:
    from ..settings import Settings


def state_dir(gitdir: str, s: Settings) -> str:
    base = s.state_dir
    if base:
        from posixpath import join, realpath  # startup: only with ASPEN_STATE_DIR
        return join(base, realpath(gitdir).lstrip("/"))
    return gitdir + ("aspen" if not gitdir or gitdir.endswith("/") else "/aspen")     # os.path.join's rule
