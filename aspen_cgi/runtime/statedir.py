"""Where Aspen keeps a repository's state: `<gitdir>/aspen`, or under
ASPEN_STATE_DIR for repositories it may not write into. Imports only os: the
CGI program's first steps use it."""

from __future__ import annotations

import os

TYPE_CHECKING = False   # typing itself costs a CGI start-up milliseconds

if TYPE_CHECKING:
    from ..settings import Settings


def state_dir(gitdir: str, s: Settings) -> str:
    base = s.state_dir
    if base:
        return os.path.join(base, os.path.realpath(gitdir).lstrip("/"))
    return os.path.join(gitdir, "aspen")
