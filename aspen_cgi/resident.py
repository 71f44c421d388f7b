"""The resident process aspen-cgi hands requests to (handoff.py).

Under Apache CGI every request starts a process, and a request no recorded
answer serves would otherwise import the whole pipeline first (60-80 ms).
The resident imports it once and keeps a pool of forked workers. aspen-cgi
passes each request's stdin, stdout and stderr, its environment and working
directory; a worker takes them as its own and runs the pipeline aspen-cgi
would have run (cgi._pipeline), then lets them go (back to /dev/null and /)
and waits for the next. So a worker serves one request at a time, with the
request's environment as its process environment, as the CGI program does,
and keeps only what the long-lived servers keep between requests (parsed
settings, git configuration by file stamps, imported modules).

The parent accepts, checks that the peer runs as the same user
(SO_PEERCRED: the socket sits in ASPEN_RUN_DIR, which other users may write
into), and passes the connection to an idle worker, forking one when none is
idle. With ASPEN_CGI_RESIDENT_WORKERS busy it answers "not taken", and
aspen-cgi serves the request in-process. A worker exits after 1,000
requests; one idle for a minute exits unless it is the last.

How it starts: the first aspen-cgi that finds no resident answering starts
one, detached (its own session, no pipe to Apache), and answers its own
request in-process; at most one start per 10 s while none answers. One runs
per user, install and ASPEN_RUN_DIR: a flock() on `<socket>.lock` decides,
before anything is imported. `aspen resident` shows it and stops it.

How it stops: after ASPEN_CGI_RESIDENT_IDLE seconds without a request; when
its socket is gone or replaced (the run directory was removed, another
resident took over); on SIGTERM; and when one of its modules changed on disk
(an upgrade): the request that finds out is answered "not taken", and
aspen-cgi serves it with the new code. Workers finish the request they have.

What happens when it is gone: aspen-cgi finds nothing at the socket and
answers in-process (and starts another). A worker killed mid-request is a
CGI program killed mid-request: that client sees the answer cut, and no
other request is touched."""

from __future__ import annotations

import argparse
import fcntl
import os
import select
import signal
import socket
import sys
import time
import traceback

from . import handoff

MAX_REQUESTS = 1000         # per worker, then it exits (and a fresh one forks when needed)
WORKER_IDLE_S = 60.0        # an idle worker beyond the first exits after this long
GO, IDLE, QUIT = b"R", b"I", b"Q"     # parent -> worker: a connection; worker -> parent: ready again, leaving


def _stamp() -> dict[str, int]:
    """The modification time of every Aspen module loaded: a change is an upgrade."""
    out = {}
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None)
        if path and (name == "aspen_cgi" or name.startswith("aspen_cgi.")):
            try:
                out[path] = os.stat(path).st_mtime_ns
            except OSError:
                out[path] = -1
    return out


def _changed(stamp: dict[str, int]) -> bool:
    for path, mtime in stamp.items():
        try:
            if os.stat(path).st_mtime_ns != mtime:
                return True
        except OSError:
            return True
    return False


def _warm() -> None:
    """Import everything a request may need, once, before any worker forks."""
    import pkgutil  # startup

    import aspen_cgi  # startup

    from . import cgi  # noqa: F401  # startup
    skip = {"aspen_cgi.cli", "aspen_cgi.devserver", "aspen_cgi.wsgi", "aspen_cgi.cgilauncher"}
    for info in pkgutil.walk_packages(aspen_cgi.__path__, "aspen_cgi."):
        if info.name not in skip and not info.name.startswith("aspen_cgi.cli.") and not info.name.endswith("__main__"):
            try:
                __import__(info.name)
            except Exception:
                pass
    from .refstore import db_schema  # startup
    db_schema.schema_tools()


def _lock(path: str):
    """The lock that makes this the one resident for PATH, or None if another holds it."""
    fd = os.open(path[:-5] + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _listen(path: str) -> tuple[socket.socket, int]:
    tmp = os.path.join(os.path.dirname(path), f".r{os.getpid()}")     # shorter than PATH: sun_path holds 107 bytes
    if os.path.lexists(tmp):
        os.unlink(tmp)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(tmp)
    os.chmod(tmp, 0o600)
    listener.listen(128)
    os.rename(tmp, path)
    return listener, os.stat(path).st_ino


def _ours(path: str, ino: int) -> bool:
    try:
        return os.stat(path).st_ino == ino
    except OSError:
        return False


def _send_fd(sock: socket.socket, tag: bytes, fd: int) -> None:
    sock.sendmsg([tag], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fd.to_bytes(4, sys.byteorder))])


def _fds(anc) -> list[int]:
    out: list[int] = []
    for level, kind, raw in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            out += [int.from_bytes(raw[i:i + 4], sys.byteorder) for i in range(0, len(raw) - len(raw) % 4, 4)]
    return out


# -- a worker ----------------------------------------------------------------------------------------

class Request:
    """One request as aspen-cgi sent it (handoff.py's meta), with its fds."""

    def __init__(self, meta: bytes, prefix: bytes, fds: list[int]):
        fields = meta.split(b"\0")
        if fields[0] != handoff.VERSION or len(fields) < 5:
            raise ValueError("not an aspen-cgi request")
        self.started = float(fields[1])
        self.started_ns = int(fields[2])
        self.kind = fields[3].decode() or None
        self.cwd = fields[4]
        self.environ = dict(f.split(b"=", 1) for f in fields[5:] if b"=" in f)
        self.prefix = prefix
        self.fds = fds


def _receive(conn: socket.socket) -> Request | None:
    """Read one request; None if it is not whole (the fds it carried closed)."""
    data, anc, flags, _ = conn.recvmsg(65536, socket.CMSG_SPACE(3 * 4))
    fds = _fds(anc)
    try:
        head, _, rest = data.partition(b"\n")
        meta_len, prefix_len = (int(x) for x in head.split(b" "))
        if len(fds) != 3 or flags & socket.MSG_CTRUNC or meta_len > 1 << 20 or prefix_len > 1 << 20:
            raise ValueError("bad request")
        while len(rest) < meta_len + prefix_len:
            chunk = conn.recv(meta_len + prefix_len - len(rest))
            if not chunk:
                raise ValueError("cut request")
            rest += chunk
        return Request(rest[:meta_len], rest[meta_len:], fds)
    except (ValueError, OSError):
        for fd in fds:
            os.close(fd)
        return None


def _answer(req: Request, traces: list) -> int:
    """Be the CGI program for REQ: its fds as 0, 1 and 2, its environment and
    working directory; run the pipeline (TRACES gets its trace); give them all back."""
    from . import cgi, settings  # startup: loaded by _warm
    rc = 1
    try:
        for target, fd in enumerate(req.fds):
            os.dup2(fd, target)
            os.close(fd)
        req.fds = []
        os.chdir(req.cwd)
        os.environ.clear()
        os.environ.update({os.fsdecode(k): os.fsdecode(v) for k, v in req.environ.items()})
        env = dict(os.environ)
        try:
            config = settings.of(env)
        except settings.SettingsError as e:
            rc = cgi._refused(e)
        else:
            rc = cgi._pipeline(env, req.kind, req.prefix, req.started, req.started_ns, config, resident=True,
                               traces=traces)
    except Exception:
        try:
            sys.stderr.write("aspen: resident worker failed:\n" + traceback.format_exc())
        except Exception:
            pass
    finally:
        for fd in req.fds:
            os.close(fd)
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:
                pass
        null = os.open(os.devnull, os.O_RDWR)
        for target in (0, 1, 2):
            os.dup2(null, target)       # the client's pipes: Apache sees their end when aspen-cgi exits
        os.close(null)
        os.chdir("/")
    return rc


def _after(traces: list, env: dict) -> None:
    """Once a request's client has its answer: a push that updated refs gets
    its repository's recorded listings computed again (http/replayrefresh.py)."""
    trace = traces[0] if traces else {}
    pushed = str(trace.get("push", ""))           # ok=N,ng=M
    if trace.get("service") != "receive-pack" or not pushed.startswith("ok=") or pushed.startswith("ok=0,") \
            or "gitdir" not in trace:
        return
    try:
        from .http import replayrefresh  # startup: only where a push landed
        replayrefresh.refresh(trace["gitdir"], env)
    except Exception:  # noqa: BLE001  (nobody waits for it; the next poll computes its own answer)
        pass


def _worker(pair: socket.socket, stamp: dict[str, int]) -> None:
    """A forked worker's life: take a connection from the parent, answer it, say so."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    served = 0
    while served < MAX_REQUESTS:
        try:
            tag, anc, _, _ = pair.recvmsg(1, socket.CMSG_SPACE(4))
        except OSError:
            break
        fds = _fds(anc)
        if tag != GO or len(fds) != 1:
            break                                   # the parent is gone, or let us go
        served += 1
        with socket.socket(fileno=fds[0]) as conn:
            conn.settimeout(5.0)
            req = _receive(conn)
            if req is None:
                pair.sendall(IDLE)
                continue
            if _changed(stamp):
                for fd in req.fds:
                    os.close(fd)
                conn.sendall(handoff.STALE)
                pair.sendall(QUIT)
                break
            conn.settimeout(None)
            try:
                conn.sendall(handoff.TAKEN)
            except OSError:
                for fd in req.fds:
                    os.close(fd)
                pair.sendall(IDLE)
                continue
            traces: list = []
            rc = _answer(req, traces)
            try:
                conn.sendall(handoff.DONE + str(rc).encode() + b"\n")
            except OSError:
                pass
            _after(traces, dict(os.environ))
        pair.sendall(IDLE)
    os._exit(0)


# -- the parent --------------------------------------------------------------------------------------

class Worker:
    def __init__(self, pid: int, pair: socket.socket):
        self.pid = pid
        self.pair = pair
        self.busy = False
        self.since = time.monotonic()


class Pool:
    def __init__(self, listener: socket.socket, lock: int, stamp: dict[str, int], most: int):
        self.listener = listener
        self.lock = lock
        self.stamp = stamp
        self.most = most
        self.workers: list[Worker] = []
        self.stale = False

    def _fork(self, conn: socket.socket) -> Worker:
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:
            try:
                for held in (parent_end, self.listener, conn, *(w.pair for w in self.workers)):
                    held.close()        # a copy of a client's connection kept here would hold its end open
                os.close(self.lock)
                _worker(child_end, self.stamp)
            finally:
                os._exit(0)
        child_end.close()
        w = Worker(pid, parent_end)
        self.workers.append(w)
        return w

    def _drop(self, w: Worker) -> None:
        w.pair.close()
        self.workers.remove(w)

    def dispatch(self, conn: socket.socket) -> None:
        idle = [w for w in self.workers if not w.busy]
        if not idle and len(self.workers) >= self.most:
            try:
                conn.sendall(handoff.STALE)     # not taken: aspen-cgi answers it in-process
            except OSError:
                pass
            return
        w = idle[-1] if idle else self._fork(conn)
        try:
            _send_fd(w.pair, GO, conn.fileno())
        except OSError:
            self._drop(w)
            return
        w.busy = True

    def heard(self, w: Worker) -> None:
        try:
            said = w.pair.recv(64)
        except OSError:
            said = b""
        if not said or QUIT in said:
            self.stale = self.stale or QUIT in said
            self._drop(w)
            return
        w.busy = False
        w.since = time.monotonic()

    def retire_idle(self) -> None:
        idle = [w for w in self.workers if not w.busy]
        now = time.monotonic()
        for w in idle[1:]:
            if now - w.since > WORKER_IDLE_S:
                self._drop(w)                   # its recvmsg sees the end and it exits

    def close(self) -> None:
        for w in list(self.workers):
            self._drop(w)


def _reap() -> None:
    """Wait for workers that exited: their CPU joins this process's cutime, as a
    CGI program's joins Apache's (what `ps` and the bench's server CPU read)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def serve(path: str, idle: float, most: int) -> int:
    lock = _lock(path)
    if lock is None:
        return 0
    _warm()
    stamp = _stamp()
    listener, ino = _listen(path)
    try:
        os.unlink(path[:-5] + ".spawned")
    except OSError:
        pass
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    uid = os.getuid()
    pool = Pool(listener, lock, stamp, most)
    last = time.monotonic()
    try:
        while _ours(path, ino) and not pool.stale:
            _reap()
            pairs = {w.pair.fileno(): w for w in pool.workers}
            watched: list[socket.socket | int] = [listener, *pairs]
            ready, _, _ = select.select(watched, [], [], 1.0)
            for fd in ready:
                if fd in pairs:
                    pool.heard(pairs[fd])
            if listener in ready:
                conn, _ = listener.accept()
                last = time.monotonic()
                with conn:
                    if handoff.peer_uid(conn) == uid:
                        pool.dispatch(conn)
            elif not ready:
                pool.retire_idle()
                busy = any(w.busy for w in pool.workers)
                if (time.monotonic() - last > idle and not busy) or _changed(stamp):
                    break
    finally:
        if _ours(path, ino):
            os.unlink(path)
        listener.close()
        pool.close()
        os.close(lock)
    return 0


# -- what `aspen resident` shows ----------------------------------------------------------------------

class Running:
    """A resident found in a run directory: its socket, its pid, whether this install's, its workers."""

    def __init__(self, socket_path: str, pid: int | None, ours: bool):
        self.socket = socket_path
        self.pid = pid
        self.ours = ours
        self.workers = _children(pid) if pid else []

    def as_dict(self) -> dict:
        return {"socket": self.socket, "pid": self.pid, "this_install": self.ours, "workers": len(self.workers)}


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _holder(lock_path: str) -> int | None:
    """The pid in a resident's lock file, if that process still holds the lock."""
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return int(os.pread(fd, 32, 0).split()[0])       # held: the resident that wrote it runs
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    except (ValueError, IndexError):
        return None
    finally:
        os.close(fd)


def running(run_dir: str) -> list[Running]:
    """The residents of this user serving sockets in RUN_DIR."""
    ours = handoff.socket_path(run_dir)
    prefix = f"resident-{os.getuid()}-"
    try:
        names = sorted(n for n in os.listdir(run_dir) if n.startswith(prefix) and n.endswith(".sock"))
    except OSError:
        return []
    found = []
    for name in names:
        path = os.path.join(run_dir, name)
        found.append(Running(path, _holder(path[:-5] + ".lock"), path == ours))
    return found


def stop(r: Running, timeout: float = 10.0) -> bool:
    """SIGTERM R's resident and wait for it to go; whether it went."""
    if r.pid is None:
        return True
    try:
        os.kill(r.pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _holder(r.socket[:-5] + ".lock") is None:
            return True
        time.sleep(0.05)
    return False


def _failed(path: str) -> None:
    """Why the resident stopped on an error, beside its socket (it has no
    terminal and no log of Apache's): `<socket>.error`."""
    try:
        with open(path[:-5] + ".error", "w") as f:
            f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} pid {os.getpid()}\n{traceback.format_exc()}")
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="aspen-resident", description=__doc__.split("\n\n")[1])
    ap.add_argument("--socket", required=True, help="the Unix socket to serve (handoff.socket_path)")
    ap.add_argument("--idle", type=float, default=300.0, help="exit after this many seconds without a request")
    ap.add_argument("--workers", type=int, default=32, help="requests answered at once; past it, aspen-cgi "
                                                            "answers in-process")
    args = ap.parse_args(argv)
    try:
        return serve(args.socket, args.idle, args.workers)
    except Exception:
        _failed(args.socket)
        return 1


if __name__ == "__main__":
    sys.exit(main())
