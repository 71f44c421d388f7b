"""The installed `aspen-cgi` program's first line. pip installs it as
written in bin/aspen-cgi, a /bin/sh line that execs the venv's Python with
`-I -S` (pip rewrites only `#!python` lines, and drops their arguments).
`aspen install-cgi` rewrites that line to start the interpreter directly,
`#!<venv>/bin/python3 -IS`: the same interpreter and flags without a shell,
0.8 ms less of every CGI request (docs/cgi.md). The rest of the file is the
same either way: under the direct line the shell's exec line is a string."""

from __future__ import annotations

import os
import sys
from typing import Optional

SHELL_LINE = b"#!/bin/sh\n"
MARK = b"''''exec "          # bin/aspen-cgi's second line: how the sh form starts Python
MAX_LINE = 255               # the kernel reads a shebang line up to 255 bytes


def installed(python: str = sys.executable) -> str:
    """Where pip put aspen-cgi: beside PYTHON, in the venv's bin."""
    return os.path.join(os.path.dirname(python), "aspen-cgi")


def direct_line(python: str) -> bytes:
    return b"#!" + os.fsencode(python) + b" -IS\n"


def rewrite(path: str, python: str) -> Optional[str]:
    """Give the aspen-cgi at PATH the direct first line for PYTHON; None when
    done (or already so), else why not (left as it was)."""
    with open(path, "rb") as f:
        first, rest = f.readline(), f.read()
    line = direct_line(python)
    if first == line:
        return None
    if not rest.startswith(MARK) or not first.startswith(b"#!"):
        return f"{path} is not aspen-cgi as bin/aspen-cgi writes it"
    if len(line) > MAX_LINE or b" " in os.fsencode(python):
        return f"the interpreter's path is too long or has a space for a #! line: {python}"
    if not os.access(python, os.X_OK):
        return f"no interpreter at {python}"
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(line + rest)
    os.chmod(tmp, os.stat(path).st_mode & 0o7777)
    os.replace(tmp, path)
    return None
