"""aspen-cgi's side of the resident process (resident.py): hand this request
to it over a Unix socket, passing the request's stdin, stdout and stderr
themselves (SCM_RIGHTS), so that the resident's worker reads and answers the
client exactly as this process would have, with none of the pipeline's
imports paid here.

Imports posix, sys, time and _socket only: it runs on every request a
recorded answer does not serve, before anything else is loaded.

The exchange, one connection per request:
  aspen-cgi -> resident  b"<meta length> <prefix length>\\n", the meta, the prefix
                         (the fds 0, 1, 2 ride on the first bytes)
  resident -> aspen-cgi  b"A" (a worker has the request) or b"S" (not taken:
                         its code changed, it is stopping; answer in-process)
  worker -> aspen-cgi    b"D<exit status>\n" when the answer is sent
The meta is NUL-separated: started (monotonic), started (ns), the replay
kind, the working directory, then the environment's KEY=VALUE entries.

Both ends check that the other runs as the same user (SO_PEERCRED): the
socket sits in ASPEN_RUN_DIR, which other users may write into."""

from __future__ import annotations

import _socket
import posix
import sys
import time

TAKEN, STALE, DONE = b"A", b"S", b"D"
VERSION = b"aspen-resident-1"
SPAWN_EVERY_S = 10      # at most one start attempt per this long while none answers
SUN_PATH_MAX = 107      # a Unix socket's path, in bytes


def key(git: bytes) -> str:
    """This install's resident: the package's directory and ASPEN_GIT (read
    once at import, so a resident serves one value of it); FNV-1a, 64 bits."""
    h = 0xcbf29ce484222325
    for b in __file__.rsplit("/", 1)[0].encode() + b"\0" + git:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def socket_path(run_dir: str) -> str:
    return f"{run_dir}/resident-{posix.getuid()}-{key(posix.environ.get(b'ASPEN_GIT', b''))}.sock"


def peer_uid(sock) -> int:
    """The uid of the process at the other end of SOCK (struct ucred: pid, uid, gid)."""
    cred = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    return int.from_bytes(cred[4:8], sys.byteorder)


def _spawn(path: str, idle: float, workers: int) -> None:
    """Start a resident for PATH, at most once per SPAWN_EVERY_S (a stamp
    file's age): it detaches, and this request goes on in-process."""
    stamp = path[:-5] + ".spawned"
    try:
        if posix.stat(stamp).st_mtime > time.time() - SPAWN_EVERY_S:
            return
    except OSError:
        pass
    try:
        posix.mkdir(path.rsplit("/", 1)[0], 0o1777)      # as runtime/admission.py makes it
    except OSError:
        pass
    try:
        posix.close(posix.open(stamp, posix.O_WRONLY | posix.O_CREAT | posix.O_TRUNC, 0o600))
        posix.utime(stamp)
    except OSError:
        return                  # no run directory we can write: no resident
    from .git import gitexec  # startup: only when none answers
    code = ("import sys; sys.path[:0] = " + repr([p for p in sys.path if p]) +
            "; from aspen_cgi.resident import main; sys.exit(main())")
    keep = (b"PATH", b"LANG", b"LC_ALL", b"LC_CTYPE", b"ASPEN_GIT")     # not this request's: workers take theirs
    env = {k.decode(): posix.environ[k].decode("utf-8", "surrogateescape") for k in keep if k in posix.environ}
    gitexec.detached([sys.executable, "-I", "-S", "-c", code, "--socket", path, "--idle", str(idle),
                      "--workers", str(workers)], env=env)


def _connect(path: str):
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(10.0)
        sock.connect(path)
        if peer_uid(sock) != posix.getuid():
            sys.stderr.write(f"aspen: resident socket {path} is another user's; ignored\n")
            sock.close()
            return None
        return sock
    except OSError:
        sock.close()
        return None


def hand_off(run_dir: str, idle: float, workers: int, kind, prefix: bytes, started: float, started_ns: int):
    """Have the resident answer this request: its exit status, or None when
    no resident took it (nothing was read or written for it; one is started
    if none answers). A resident that took it and died, or that does not say
    within 10 s whether it takes it, gives 1."""
    path = socket_path(run_dir)
    if len(path.encode()) > SUN_PATH_MAX:
        sys.stderr.write(f"aspen: ASPEN_RUN_DIR {run_dir} is too long for the resident's socket ({len(path.encode())}"
                         f" bytes, at most {SUN_PATH_MAX}): this request is answered in its own process; set a "
                         f"shorter ASPEN_RUN_DIR\n")
        return None
    sock = _connect(path)
    if sock is None:
        _spawn(path, idle, workers)
        return None
    try:
        fields = [repr(started).encode(), str(started_ns).encode(), (kind or "").encode(), posix.getcwdb()]
        fields += [k + b"=" + v for k, v in posix.environ.items()]
        meta = b"\0".join([VERSION] + fields)
        data = f"{len(meta)} {len(prefix)}\n".encode() + meta + prefix
        fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2))
        sent = sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
        if sent < len(data):
            sock.sendall(data[sent:])
        answer = sock.recv(1)
    except TimeoutError:
        # It may yet take it (a worker then answers on the fds it holds): never answer twice.
        sys.stderr.write(f"aspen: the resident at {path} took no request for 10 s\n")
        sock.close()
        return 1
    except OSError:
        answer = b""
    if answer != TAKEN:
        sock.close()
        return None
    try:
        sock.settimeout(None)
        out = b""
        while not out.endswith(b"\n"):
            chunk = sock.recv(16)
            if not chunk:
                break
            out += chunk
    except OSError:
        out = b""
    sock.close()
    if out[:1] != DONE or not out[1:-1].isdigit():
        sys.stderr.write("aspen: the resident's worker ended before finishing the request\n")
        return 1
    return int(out[1:-1])
