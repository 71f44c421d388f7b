"""Version packs built after pushes, off the response path: a push that
landed starts one detached `aspen import -q REPO` when none is running for
the repository (a lock file names the builder; a dead builder's lock is
taken over). The builder loops until every version has its pack. Long-lived servers
(gunicorn, mod_wsgi) build in a thread of the worker instead.

Opt-in for now (ASPEN_VERSION_PACKS=auto) until its cost under push load is
measured; `aspen import REPO` builds the same packs by hand."""

from __future__ import annotations

import os
import sys
import threading
from typing import Mapping, Optional

from .. import gitexec
from ..refstore.owners import owner_alive, owner_id

ENV = "ASPEN_VERSION_PACKS"
LOCK = ".build.lock"


def enabled(env: Mapping[str, str]) -> bool:
    return (env.get(ENV) or os.environ.get(ENV, "")).lower() == "auto"


def _holder(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


def running(packs_dir: str) -> bool:
    return owner_alive(_holder(os.path.join(packs_dir, LOCK)))


class BuildLock:
    """Held by the one builder of a repository's packs; False from acquire()
    when a live builder has it."""

    def __init__(self, packs_dir: str):
        self.path = os.path.join(packs_dir, LOCK)
        self.held = False

    def acquire(self) -> bool:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                if owner_alive(_holder(self.path)):
                    return False
                try:
                    os.unlink(self.path)     # a dead builder's
                except OSError:
                    pass
                continue
            with os.fdopen(fd, "w") as f:
                f.write(owner_id() + "\n")
            self.held = True
            return True
        return False

    def release(self) -> None:
        if self.held:
            try:
                os.unlink(self.path)
            except OSError:
                pass
            self.held = False


# Set by long-lived servers (the WSGI application): build in a thread of this
# process, ready milliseconds after the push, instead of starting a program.
IN_PROCESS = False


def kick(gitdir: str, packs_dir: str, env: Mapping[str, str]) -> bool:
    """Start a builder unless one is running; True when started."""
    if not enabled(env) or running(packs_dir):
        return False
    child = {k: v for k, v in env.items() if k not in ("GIT_NAMESPACE",)}
    if IN_PROCESS:
        threading.Thread(target=_build, args=(gitdir, child), daemon=True, name="aspen-packs").start()
        return True
    child.pop("GIT_DIR", None)
    gitexec.detached([sys.executable, "-m", "aspen_cgi.cli", "import", "-q", "--wait-lock", gitdir], env=child)
    return True


def _build(gitdir: str, env: Mapping[str, str]) -> None:
    from ..refstore.store import RefStore
    store = RefStore.open(gitdir, env)
    if store is None:
        return
    lock = BuildLock(store.packs_dir)
    if not lock.acquire():
        return
    try:
        while True:
            store.sync()
            if not store.build_packs():
                break
    except Exception as e:  # noqa: BLE001  (a failed build leaves the version to git; say why)
        sys.stderr.write(f"aspen: building version packs for {gitdir} failed: {e}\n")
    finally:
        lock.release()
