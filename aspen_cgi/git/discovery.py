"""The repositories under a directory, found as GIT_PROJECT_ROOT serves them
(`aspen import --all`, `aspen doctor`)."""

from __future__ import annotations

import os


def repositories(root: str) -> list[str]:
    """Every repository under ROOT (bare, or a work tree's .git) as GIT_PROJECT_ROOT serves them:
    a directory with HEAD, objects/ and refs/; not looking inside repositories, nor in
    hidden directories, nor through symbolic links."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        if "HEAD" in filenames and "objects" in dirnames and "refs" in dirnames:
            found.append(dirpath)
            dirnames[:] = []
            continue
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") or d == ".git")
    return sorted(found)
