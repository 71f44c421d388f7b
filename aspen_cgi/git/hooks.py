"""Repository hooks as receive-pack runs them: found in core.hooksPath or
hooks/, skipped when missing or not executable, run in the git directory
with stdout and stderr merged so their output can be relayed as it comes."""

from __future__ import annotations

import os
from typing import Callable, Generator, Mapping, Optional, Sequence

from . import gitexec

IGNORED_HINT = ("hint: The '{}' hook was ignored because it's not set as executable.\n"
                "hint: You can disable this warning with `git config advice.ignoredHook false`.\n")


class Hooks:
    def __init__(self, gitdir: str, config, log: list):
        self.gitdir = gitdir
        self.log = log
        base = config.get("core.hookspath")
        if base:
            base = os.path.expanduser(base)
            self.dir = base if os.path.isabs(base) else os.path.join(gitdir, base)
        else:
            self.dir = os.path.join(gitdir, "hooks")
        self.advice = config.bool("advice.ignoredhook", True)

    def find(self, name: str) -> Optional[str]:
        path = os.path.join(self.dir, name)
        if not os.path.isfile(path):
            return None
        if not os.access(path, os.X_OK):
            if self.advice:
                self.log.append(IGNORED_HINT.format(path))
            return None
        return path

    def run(self, name: str, args: Sequence[str], env: Mapping[str, str],
            input: bytes = b"", idle: float = 0,
            more_env: Optional[Callable[[], Mapping[str, str]]] = None) -> Generator[Optional[bytes], None, int]:
        """Yield the hook's output as it comes (None after IDLE seconds of
        silence); return its exit status (0 if the hook is absent).
        MORE_ENV is asked for more variables only when the hook is there."""
        path = self.find(name)
        if path is None:
            return 0
        if more_env is not None:
            env = {**env, **more_env()}
        try:
            proc = gitexec.hook(path, list(args), cwd=self.gitdir, env=gitexec.child_env(env), input=input)
        except OSError as e:
            self.log.append(f"error: cannot run {name}: {e}\n")
            return 1
        assert proc.stdout is not None                  # a PIPE (gitexec.hook)
        try:
            yield from gitexec.read_idle(proc.stdout, idle)
            return proc.wait()
        finally:
            gitexec.kill(proc)
            proc.wait()
            proc.stdout.close()
