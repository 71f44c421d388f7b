"""Who is writing: a writer's identity (host, pid, process start time) as
recorded on a pending version, whether that writer still lives, and the
test-only fault points at which a writer kills itself."""

from __future__ import annotations

import os
import socket
from typing import Optional

from ..git.gitexec import GitEnv

FAULT_ENV = "ASPEN_FAULT"      # internal, for tests (settings.INTERNAL)


def fault(point: str, env: GitEnv) -> None:
    """Tests only: with ASPEN_FAULT=POINT the process kills itself (SIGKILL)
    here; with ASPEN_FAULT_ONCE=FILE as well, only while FILE exists (it is
    removed first), so a restarted worker runs clean."""
    if (env.get(FAULT_ENV) or os.environ.get(FAULT_ENV)) != point:
        return
    once = env.get(FAULT_ENV + "_ONCE") or os.environ.get(FAULT_ENV + "_ONCE")
    if once:
        try:
            os.unlink(once)
        except OSError:
            return
    os.kill(os.getpid(), 9)


def _start_time(pid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        fields = data[data.rindex(b")") + 2:].split()
        if fields[0] in (b"Z", b"X"):
            return None     # a zombie is dead: killed, not yet reaped by its (maybe also dead) parent
        return fields[19].decode()
    except (OSError, ValueError, IndexError):
        return None


_own: dict[int, str] = {}     # pid -> its id (a forked child has its own pid)


def owner_id() -> str:
    pid = os.getpid()
    got = _own.get(pid)
    if got is None:
        got = f"{socket.gethostname()}:{pid}:{_start_time(pid) or '-'}"
        if not got.endswith(":-"):
            _own[pid] = got
    return got


def owner_alive(owner: Optional[str]) -> bool:
    if not owner:
        return False
    try:
        host, pid_s, start = owner.rsplit(":", 2)
        pid = int(pid_s)
    except ValueError:
        return False
    if host != socket.gethostname():
        return True     # another host's writer: not ours to judge
    if start != "-":
        return _start_time(pid) == start
    return pid_alive(pid)


def pid_alive(pid: int) -> bool:
    """Is there a process PID on this host (whoever owns it)?"""
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
