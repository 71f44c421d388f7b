"""The one place that starts processes: git plumbing and repository hooks.

Every other module asks this one for what it needs (a command's output, a
stream from a long-running child, a hook run) and never imports subprocess.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import IO, Callable, Iterator, Mapping, Optional, Sequence

GIT = os.environ.get("ASPEN_GIT", "git")   # internal (settings.INTERNAL): tests wrap git with it
Timeout = subprocess.TimeoutExpired
CHUNK = 65536
NICE = shutil.which("nice")            # coreutils: a background child's niceness
SETPRIV = shutil.which("setpriv")      # util-linux: a background child dies with its builder
CHRT = shutil.which("chrt")            # util-linux: a background child in the idle scheduling class
IONICE = shutil.which("ionice")        # util-linux: ... and in the idle I/O class
_thread = threading.local()


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class GitEnv(dict):
    """The environment a git child or a hook runs with: what stock's backend
    passes on to them (the server's environment and the CGI meta-variables,
    GIT_DIR, the committer identity, GIT_PROTOCOL), plus the variables a step
    adds (a quarantine's object directory, a shallow file). Settings are
    read from Settings and the request's metadata from RequestInfo
    (service.py), not from here; this is what crosses this module's door."""
    __slots__ = ()

    def without(self, *names: str) -> "GitEnv":
        """The same environment less NAMES (GIT_DIR for a command that finds its
        own, GIT_NAMESPACE for work over the whole repository)."""
        return GitEnv({k: v for k, v in self.items() if k not in names})


def child_env(base: Optional[Mapping[str, str]] = None, **extra: str) -> GitEnv:
    env = GitEnv(os.environ if base is None else base)
    env.update(extra)
    return env


def run_as_background() -> None:
    """From now on the calling thread is Aspen's own background work (pack
    builds, wide depth-1 answers, pre-warm): every process it starts runs in
    the kernel's idle scheduling class (SCHED_IDLE: it gets a core only
    when nothing else wants it) and the idle I/O class, through a `chrt
    --idle 0 ionice -c 3` prefix. The thread itself keeps the normal class:
    in the idle class, a thread holding the interpreter lock behind busy
    cores would stall the process's request threads waiting for it, and a
    builder whose own code starves could not see its repository deleted and
    stop its child (RepoGuard)."""
    _thread.background = True


def is_background() -> bool:
    return getattr(_thread, "background", False)


def _argv(argv: Sequence[str]) -> list[str]:
    """ARGV as this thread starts it: behind the idle-class prefix in a background thread."""
    if is_background():
        prefix = ([CHRT, "--idle", "0"] if CHRT else []) + ([IONICE, "-c", "3"] if IONICE else [])
        return [*prefix, *argv]
    return list(argv)


def git(args: Sequence[str], *, cwd: str, env: Optional[GitEnv] = None,
        input: Optional[bytes] = None, timeout: Optional[float] = None,
        stdin_path: Optional[str] = None) -> Result:
    """Run `git ARGS` to completion and capture its output; stdin is INPUT,
    or the file at STDIN_PATH (a stored pack, too large to hold in memory)."""
    if stdin_path is not None:
        with open(stdin_path, "rb") as f:
            proc = subprocess.run(_argv([GIT, *args]), cwd=cwd, env=env, stdin=f,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    else:
        proc = subprocess.run(_argv([GIT, *args]), cwd=cwd, env=env, input=input,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def git_to_file(args: Sequence[str], *, cwd: str, out: IO[bytes], env: Optional[GitEnv] = None) -> Result:
    """Run `git ARGS` with its standard output written to the open file OUT
    (a pack too large to hold in memory); stderr captured, stdin empty."""
    proc = subprocess.run(_argv([GIT, *args]), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                          stderr=subprocess.PIPE)
    return Result(proc.returncode, b"", proc.stderr)


def program(argv: Sequence[str], *, cwd: str, env: Optional[GitEnv] = None,
            input: Optional[bytes] = None, timeout: Optional[float] = None) -> Result:
    """Run another program git itself would run (gpg, gpgsm, ssh-keygen for
    signature checks) to completion and capture its output; stdin is INPUT,
    else nothing. Raises OSError when it cannot be started."""
    proc = subprocess.run(list(argv), cwd=cwd, env=env, input=input,
                          stdin=subprocess.DEVNULL if input is None else None,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def _feed(stdin: IO[bytes], data: bytes | Iterator[bytes]) -> None:
    try:
        if isinstance(data, (bytes, bytearray, memoryview)):
            stdin.write(data)
        else:
            for chunk in data:
                stdin.write(chunk)
    except (BrokenPipeError, OSError):
        pass
    finally:
        try:
            stdin.close()
        except OSError:
            pass


def _our_stderr() -> IO | int:
    """Where a child's messages go: our stderr, or the process's fd 2 when
    sys.stderr is not a file (mod_wsgi's log object has no descriptor)."""
    try:
        sys.stderr.fileno()
        return sys.stderr
    except (AttributeError, OSError, ValueError):
        return 2


class Stream:
    """A child whose stdout is read as it is produced.

    The input is written from a thread so that a child answering while it
    reads never deadlocks against us. `close()` kills a child still running:
    when the client goes away, git goes too.
    """

    def __init__(self, argv: Sequence[str], *, cwd: str, env: Optional[GitEnv],
                 input: bytes | Iterator[bytes] | None, stderr: Optional[IO] = None):
        self.argv = list(argv)
        self.proc = subprocess.Popen(_argv(self.argv), cwd=cwd, env=env,
                                     stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                                     stdout=subprocess.PIPE,
                                     stderr=stderr if stderr is not None else _our_stderr())
        self._feeder = None
        if input is not None:
            self._feeder = threading.Thread(target=_feed, args=(self.proc.stdin, input), daemon=True)
            self._feeder.start()

    def __iter__(self) -> Iterator[bytes]:
        try:
            out = self.proc.stdout
            assert out is not None                      # a PIPE
            while True:
                chunk = out.read1(CHUNK)    # type: ignore[attr-defined]  # a BufferedReader; IO[bytes] has no read1
                if not chunk:
                    break
                yield chunk
            self.wait()
        finally:
            self.close()

    def wait(self) -> int:
        rc = self.proc.wait()
        if self._feeder is not None:
            self._feeder.join(timeout=5)
        return rc

    @property
    def returncode(self) -> Optional[int]:
        return self.proc.returncode

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()


def git_stream(args: Sequence[str], *, cwd: str, env: Optional[GitEnv] = None,
               input: bytes | Iterator[bytes] | None = None, stderr: Optional[IO] = None,
               lower: int = 0) -> Stream:
    """Start `git ARGS` and return its stdout as a stream of chunks; LOWER:
    that much nicer than the calling thread (a `nice -n` prefix)."""
    prefix = [NICE, "-n", str(lower)] if lower > 0 and NICE else []
    return Stream([*prefix, GIT, *args], cwd=cwd, env=env, input=input, stderr=stderr)


def start(args: Sequence[str], *, cwd: str, env: Optional[GitEnv] = None,
          stdin: int | IO | None = subprocess.PIPE, stdout: int | IO | None = subprocess.PIPE,
          stderr: int | IO | None = subprocess.PIPE) -> subprocess.Popen:
    """Start `git ARGS` with the pipes the caller wants (for pack intake)."""
    return subprocess.Popen(_argv([GIT, *args]), cwd=cwd, env=env, stdin=stdin, stdout=stdout, stderr=stderr)


def hook(path: str, args: Sequence[str], *, cwd: str, env: GitEnv,
         input: bytes = b"") -> subprocess.Popen:
    """Start a repository hook with stdout and stderr merged, as stock relays them."""
    proc = subprocess.Popen([path, *args], cwd=cwd, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    threading.Thread(target=_feed, args=(proc.stdin, input), daemon=True).start()
    return proc


def hook_conversation(path: str, *, cwd: str, env: GitEnv) -> subprocess.Popen:
    """Start a hook that speaks a protocol on its stdin and stdout (proc-receive),
    its stderr a pipe of its own for the caller to relay."""
    return subprocess.Popen([path], cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def niceness() -> int:
    """The calling thread's niceness (Linux keeps one per thread; children inherit the forking thread's)."""
    try:
        return os.getpriority(os.PRIO_PROCESS, 0)
    except OSError:
        return 0


def background_git(args: Sequence[str], *, cwd: str, env: Optional[GitEnv] = None,
                   input: Optional[bytes] = None, stdin: int | IO | None = None,
                   stdout: int | IO | None = subprocess.PIPE, check: Optional[Callable[[], None]] = None,
                   nice: int = 0, interval: float = 0.02) -> Result:
    """Run `git ARGS` as background work (pack builds) to completion: at
    niceness NICE at least (a `nice -n` prefix when the calling thread runs
    below it), killed by the kernel if this process dies (`setpriv
    --pdeathsig KILL`), and killed as soon as CHECK() raises: it is called
    every INTERVAL seconds while git runs, and its exception is raised again
    once the child is reaped. Input is INPUT (bytes) or the file STDIN;
    stdout goes to STDOUT (a file) or is captured."""
    argv = [GIT, *args]
    if SETPRIV:
        argv = [SETPRIV, "--pdeathsig", "KILL", "--", *argv]
    below = nice - niceness()
    if below > 0 and NICE:
        argv = [NICE, "-n", str(below), *argv]
    if check is not None:
        check()
    proc = subprocess.Popen(_argv(argv), cwd=cwd, env=env,
                            stdin=subprocess.PIPE if input is not None else (stdin if stdin is not None
                                                                             else subprocess.DEVNULL),
                            stdout=stdout, stderr=subprocess.PIPE)
    # Threads feed stdin and drain the pipes while this one polls CHECK: communicate() with a
    # timeout cannot go on writing stdin after its first timeout (git then waited forever).
    chunks: dict[str, bytes] = {}

    def drain(name: str, stream: IO[bytes]) -> None:
        try:
            chunks[name] = stream.read()
        except (OSError, ValueError):
            chunks[name] = b""
    threads = [threading.Thread(target=drain, args=("err", proc.stderr), daemon=True)]
    if proc.stdout is not None:
        threads.append(threading.Thread(target=drain, args=("out", proc.stdout), daemon=True))
    if input is not None:
        threads.append(threading.Thread(target=_feed, args=(proc.stdin, input), daemon=True))
    # Reaped by a thread of its own, so its end is seen at once: Popen.wait(timeout) polls with
    # sleeps that double up to the timeout (a 10 ms pack-objects was seen ~8 ms late).
    ended = threading.Event()

    def reap() -> None:
        proc.wait()
        ended.set()
    threads.append(threading.Thread(target=reap, daemon=True))
    for t in threads:
        t.start()
    try:
        while not ended.wait(interval):
            if check is not None:
                check()
    except BaseException:
        kill(proc)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        raise
    finally:
        for t in threads:
            t.join(timeout=30)
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
    return Result(proc.returncode, chunks.get("out", b""), chunks.get("err", b""))


def detached(argv: Sequence[str], *, env: Mapping[str, str]) -> None:
    """Start a background job that outlives this request (and process): its
    own session, no pipes back to us."""
    subprocess.Popen(list(argv), env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)


PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL


def kill(proc: subprocess.Popen) -> None:
    """Kill a child we started (pack intake, hook) that is still running."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGKILL)
        except ProcessLookupError:
            pass


def read_idle(stream: IO[bytes], idle: float) -> Iterator[Optional[bytes]]:
    """A child's output pipe as chunks, with None after every IDLE seconds of
    silence (so a caller can send keepalives); IDLE <= 0 never yields None."""
    import queue  # startup
    q: "queue.Queue[Optional[bytes]]" = queue.Queue()

    def pump() -> None:
        try:
            while True:
                chunk = stream.read1(CHUNK)     # type: ignore[attr-defined]  # a pipe's BufferedReader
                if not chunk:
                    break
                q.put(chunk)
        except (OSError, ValueError):
            pass
        finally:
            q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    while True:
        try:
            item = q.get(timeout=idle) if idle > 0 else q.get()
        except queue.Empty:
            yield None
            continue
        if item is None:
            return
        yield item
