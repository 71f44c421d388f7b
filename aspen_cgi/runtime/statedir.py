"""Where Aspen keeps a repository's state: `<gitdir>/aspen`, or under
ASPEN_STATE_DIR for repositories it may not write into. Imports only os and
settings: the CGI program's first steps use it."""

from __future__ import annotations

import os

from .. import settings

TYPE_CHECKING = False   # typing itself costs a CGI start-up milliseconds

if TYPE_CHECKING:
    from typing import Mapping


def state_dir(gitdir: str, env: Mapping[str, str]) -> str:
    base = settings.of(env).state_dir
    if base:
        return os.path.join(base, os.path.realpath(gitdir).lstrip("/"))
    return os.path.join(gitdir, "aspen")
