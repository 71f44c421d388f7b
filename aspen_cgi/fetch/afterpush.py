"""What a push's background jobs (fetch/prewarm.py, fetch/bundlekeep.py)
share: whether another holds a repository's job mutex, and starting one as
a low-priority thread of a long-lived server or as a detached program
under CGI."""

from __future__ import annotations

import fcntl
import os
import sys
import threading
from typing import Callable

from ..git import gitexec

NICE = 10


def held(mutex: str) -> bool:
    """Whether a running job holds the flock on the file MUTEX."""
    try:
        fd = os.open(mutex, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def start(work: Callable[[], object], what: str, name: str, gitdir: str) -> None:
    """WORK() in a daemon thread NAME at niceness NICE, its git children in
    the idle scheduling class; a deleted repository ends it quietly, any
    other failure is said in the server's log as WHAT's of GITDIR."""
    def run() -> None:
        from ..runtime.repoguard import RepositoryGone  # startup
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)   # this thread and its children
        except (OSError, AttributeError):
            pass
        gitexec.run_as_background()
        try:
            work()
        except RepositoryGone:
            pass                 # deleted or replaced: nothing to do, nothing left behind
        except Exception as e:   # a background nicety: the server's log says why, nothing fails
            sys.stderr.write(f"aspen: {what} of {gitdir} failed: {e}\n")
        finally:
            from ..refstore.registry import release_thread  # startup
            release_thread()
    threading.Thread(target=run, name=name, daemon=True).start()


def detach(module: str, env: gitexec.GitEnv) -> None:
    """`python -m MODULE` detached, with ENV."""
    gitexec.detached([sys.executable, "-m", module], env=env)
