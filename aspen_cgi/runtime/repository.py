"""A repository as storage and packs see it: its git directory, the
server's settings, the tree it is served from, and the environment its git
children get. Made once where a request's or a command's environment is
known (service.ServiceContext, the command line, a background process's
start); nothing below the services reads that environment itself."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Mapping, Optional

from .. import settings
from ..git import gitexec


@dataclass(frozen=True)
class Repository:
    gitdir: str
    settings: settings.Settings
    git_env: gitexec.GitEnv         # what a git child or hook of this repository runs with
    project_root: Optional[str]     # GIT_PROJECT_ROOT: the request's, else the process's

    @classmethod
    def of(cls, gitdir: str, environ: Optional[Mapping[str, str]] = None) -> "Repository":
        """GITDIR served with ENVIRON (None: the process's environment)."""
        env = os.environ if environ is None else environ
        return cls(gitdir, settings.of(env), gitexec.GitEnv(env),
                   env.get("GIT_PROJECT_ROOT") or os.environ.get("GIT_PROJECT_ROOT") or None)

    def without(self, *names: str) -> "Repository":
        """The same, its git children's environment less NAMES (gitexec.GitEnv.without)."""
        return replace(self, git_env=self.git_env.without(*names))

    def at(self, gitdir: str) -> "Repository":
        """Another repository of the same tree, served the same way."""
        return replace(self, gitdir=gitdir)
