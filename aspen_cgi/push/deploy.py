"""receive.denyCurrentBranch=updateInstead: bring a non-bare worktree to the
pushed commit, through the push-to-checkout hook or stock's push_to_deploy()
checks and `read-tree -u -m`. Output goes to the server log, as stock's does."""

from __future__ import annotations

import os
from typing import Mapping, Optional

from ..git import gitexec
from ..git.hooks import Hooks
from .policy import Worktree

EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


def update_worktree(hooks: Hooks, base_env: Mapping[str, str], new: str, wt: Worktree, log: list) -> Optional[str]:
    """None when the worktree now matches NEW, else stock's ng reason."""
    env = gitexec.child_env(base_env)
    env["GIT_DIR"] = os.path.abspath(wt.gitdir)
    if hooks.find("push-to-checkout"):
        env["GIT_WORK_TREE"] = os.path.abspath(wt.path)
        run = hooks.run("push-to-checkout", [new], env)
        while True:
            try:
                chunk = next(run)
            except StopIteration as stop:
                return "push-to-checkout hook declined" if stop.value else None
            if chunk:
                log.append(chunk.decode("utf-8", "replace"))
    env.pop("GIT_WORK_TREE", None)
    has_head = gitexec.git(["rev-parse", "-q", "--verify", "HEAD"], cwd=wt.path, env=env).returncode == 0
    steps = [(["update-index", "-q", "--ignore-submodules", "--refresh"], "Up-to-date check failed"),
             (["diff-files", "--quiet", "--ignore-submodules", "--"], "Working directory has unstaged changes"),
             (["diff-index", "--quiet", "--cached", "--ignore-submodules", "HEAD" if has_head else EMPTY_TREE, "--"],
              "Working directory has staged changes"),
             (["read-tree", "-u", "-m", new], "Could not update working tree to new HEAD")]
    for args, reason in steps:
        res = gitexec.git(args, cwd=wt.path, env=env)
        if res.stdout or res.stderr:
            log.append((res.stdout + res.stderr).decode("utf-8", "replace"))
        if not res.ok:
            return reason
    return None
