"""Recorded answers, for the CGI program: an answer that is a function of the
request, the environment and a known list of files is kept in the
repository's state directory, and a later request with the same inputs gets
the same bytes back without the request pipeline, its imports or a git child.

Recorded: upload-pack advertisements (`GET info/refs?service=git-upload-pack`,
any protocol version) and v2 `ls-refs` answers, which is what pollers send,
receive-pack advertisements (each push's first request; not with a
push-certificate nonce, which changes every time, nor with alternates, whose
refs it shows and this module does not watch),
and fetches the response cache answered from a complete entry (a clone storm:
one request in the pipeline, the rest replayed), kept as a reference to the
cache entry, whose identity is one of the inputs. An entry holds the
request's key (the environment less what varies per client, e.g. REMOTE_ADDR
and User-Agent; the body; the effective uid) and
the stat of every file the answer was computed from: the repository's path
candidates (as enter_repo tries them), the git directory, HEAD, packed-refs and
every directory under refs/ (git renames every ref into place, which changes
its directory), git-daemon-export-ok, shallow, and the configuration files.
Any difference and the entry is not used. An input modified after the
request began, or within the racy window before (a change in the same clock
tick could leave its timestamp unchanged: model/racy.py),
keeps the answer from being recorded. The service decides what may be
recorded (trace `replayable`: no per-process values such as a session id;
`replay_file` and `replay_effects` for a cache entry: what a replay must do
beside sending it, e.g. count the hit), and a configuration with include
directives is never recorded.

Imports only posix (not os: ~1 ms of every request), time, zlib, stat and
the light modules configfiles, statedir, settings and model/racy: it runs before
anything else in aspen-cgi (tests/test_replay.py holds it to that)."""

from __future__ import annotations

import posix
import time
import zlib
from stat import S_ISDIR

from .. import settings
from ..git.configfiles import sources
from ..model.racy import too_recent
from ..runtime.statedir import state_dir

TYPE_CHECKING = False   # typing itself costs a CGI start-up milliseconds

if TYPE_CHECKING:
    from typing import Mapping, Optional


# os.path's own for the paths here (absolute, from the environment): this module and the CGI
# program's first steps use posix, the builtin os is made of; importing os costs ~1 ms a request.
def _join(path: str, *names: str) -> str:
    for name in names:
        path = name if name.startswith("/") else path + name if not path or path.endswith("/") else f"{path}/{name}"
    return path


def _dirname(path: str) -> str:
    head = path[:path.rfind("/") + 1]
    return head.rstrip("/") or head


def _isdir(path: str) -> bool:
    try:
        return S_ISDIR(posix.stat(path).st_mode)
    except OSError:
        return False


MAGIC = b"aspen-replay 1\n"
MAX_BODY = 1 << 20          # request bodies larger than this are not looked up
MAX_ANSWER = 4 << 20        # answers larger than this are not recorded
SLOTS = 256                 # entries per repository at most: recording past it removes the oldest
SUFFIXES = ("/.git", "", ".git/.git", ".git")   # enter_repo's order (http/paths.py)

# What varies per client or per connection and never changes an advertisement or ls-refs answer.
_PER_CLIENT = frozenset((
    "REMOTE_ADDR", "REMOTE_PORT", "REMOTE_HOST", "UNIQUE_ID", "REQUEST_TIME", "REQUEST_TIME_FLOAT",
    "HTTP_USER_AGENT", "HTTP_ACCEPT", "HTTP_ACCEPT_ENCODING", "HTTP_ACCEPT_LANGUAGE", "HTTP_CONNECTION",
    "HTTP_PRAGMA", "HTTP_CACHE_CONTROL", "HTTP_X_FORWARDED_FOR", "HTTP_X_FORWARDED_PORT", "HTTP_X_REAL_IP",
    "HTTP_X_REQUEST_ID", "HTTP_TRACEPARENT", "HTTP_TRACESTATE", "SSL_SESSION_ID", "SSL_SESSION_RESUMED",
))


class Recorded:
    """A recorded answer: the CGI header block as sent; the body, inline or as
    (path, offset, length) of a file; what to do when it is sent (EFFECTS:
    (op, path, text)); and the access-line fields of the request that computed it."""
    __slots__ = ("head", "body", "file", "effects", "trace")

    def __init__(self, head: bytes, body: bytes, file: Optional[tuple[str, int, int]],
                 effects: list[tuple[str, str, str]], trace: dict):
        self.head, self.body, self.file, self.effects, self.trace = head, body, file, effects, trace

    @property
    def length(self) -> int:
        return self.file[2] if self.file is not None else len(self.body)

    def apply_effects(self) -> None:
        """`append` TEXT to a file; `atime`: mark a file used now (its mtime kept);
        `touch`: its mtime now. Never fails the request."""
        for op, path, text in self.effects:
            try:
                if op == "append":
                    fd = posix.open(path, posix.O_WRONLY | posix.O_APPEND | posix.O_CLOEXEC)
                    try:
                        posix.write(fd, text.encode())
                    finally:
                        posix.close(fd)
                elif op == "atime":
                    posix.utime(path, ns=(time.time_ns(), posix.stat(path).st_mtime_ns))
                elif op == "touch":
                    posix.utime(path)
            except OSError:
                pass


def kind(env: Mapping[str, str]) -> Optional[str]:
    """'advert' or 'post' for a request whose answer may have been recorded, else None."""
    method = env.get("REQUEST_METHOD")
    path = env.get("PATH_INFO", "")
    if method == "GET":
        if path.endswith("/info/refs") and env.get("QUERY_STRING") in ("service=git-upload-pack",
                                                                       "service=git-receive-pack"):
            return "advert"
    elif method == "POST" and path.endswith("/git-upload-pack"):
        if env.get("CONTENT_TYPE") == "application/x-git-upload-pack-request":
            length = env.get("CONTENT_LENGTH", "")
            if length.isdigit() and 0 < int(length) <= MAX_BODY:
                return "post"
    return None


def _repo_dir(env: Mapping[str, str]) -> Optional[str]:
    """getdir() less the route, for the two routes above; None where stock would refuse the path."""
    root = env.get("GIT_PROJECT_ROOT", "")
    path = env.get("PATH_INFO", "")
    if root:
        if not path.startswith("/") or "/." in path or "//" in path:
            return None
        full = root + ("" if root.endswith("/") else "/") + path[1:]
    else:
        full = env.get("PATH_TRANSLATED", "")
        if not full:
            return None
    for route in ("/info/refs", "/git-upload-pack"):
        if full.endswith(route):
            return full[:-len(route)]
    return None


def _key(env: Mapping[str, str], body: bytes) -> bytes:
    parts = [f"{k}={v}" for k, v in sorted(env.items()) if k not in _PER_CLIENT]
    parts.append(f"euid={posix.geteuid()}")
    return "\0".join(parts).encode("utf-8", "surrogateescape") + b"\0\0" + body


def _unkey(key: bytes) -> Optional[tuple[dict, bytes]]:
    """The environment (less what _key leaves out, and the euid) and body a key was made of."""
    text, sep, body = key.partition(b"\0\0")
    if not sep:
        return None
    pairs = [p.split("=", 1) for p in text.decode("utf-8", "surrogateescape").split("\0")]
    if any(len(p) != 2 for p in pairs):
        return None
    return {k: v for k, v in pairs if k != "euid"}, body


def listings(state: str) -> list[tuple[dict, bytes]]:
    """The requests whose answers are recorded in the state directory STATE
    and are listings (is_listing): each one's environment, less what varies
    per client, and body. What http/replayrefresh.py computes again after a push."""
    directory = _join(state, "replay")
    try:
        names = sorted(n for n in posix.listdir(directory) if _is_entry(n))
    except OSError:
        return []
    out = []
    for name in names:
        try:
            with open(_join(directory, name), "rb") as f:
                data = f.read(MAX_ANSWER + 65536)
        except OSError:
            continue
        parts = _parts(data)
        got = _unkey(parts[0]) if parts is not None else None
        if got is None:
            continue
        k = kind(got[0])
        if k is not None and is_listing(k, got[1]):
            out.append(got)
    return out


def _slot(key: bytes) -> str:
    """The entry's file name: the key's whole CRC-32. Two requests a poller
    alternates (an advertisement and an ls-refs) once shared one of 256
    names 1 time in 256, and each record replaced the other's."""
    return f"{zlib.crc32(key):08x}"


def _is_entry(name: str) -> bool:
    return len(name) == 8 and not name.startswith(".")


def _bound(directory: str, keep: str) -> None:
    """At most SLOTS entries in DIRECTORY: the oldest recorded go (KEEP, just
    written, stays). A lock file of a removed entry's flight stays: it is
    empty and taken again by name."""
    try:
        names = [n for n in posix.listdir(directory) if _is_entry(n)]
        if len(names) <= SLOTS:
            return
        aged = []
        for n in names:
            try:
                aged.append((posix.stat(_join(directory, n)).st_mtime_ns, n))
            except OSError:
                continue
        aged.sort()
        for _, n in aged[:len(aged) - SLOTS]:
            if n != keep:
                posix.unlink(_join(directory, n))
    except OSError:
        pass


def _stat_key(path: str) -> str:
    try:
        st = posix.lstat(path)
    except OSError:
        return "-"
    return f"{st.st_ino},{st.st_mtime_ns},{st.st_size},{st.st_mode},{st.st_uid}"


def _stats(paths: list[str]) -> bytes:
    return "\0".join(f"{p}\0{_stat_key(p)}" for p in paths).encode("utf-8", "surrogateescape")


def lookup(env: Mapping[str, str], body: bytes = b"") -> Optional[Recorded]:
    """The recorded answer to this request, if every input is as it was."""
    repo = _repo_dir(env)
    if repo is None:
        return None
    key = _key(env, body)
    slot = _slot(key)
    for suffix in SUFFIXES:
        try:
            with open(_join(state_dir(repo + suffix, settings.of(env)), "replay", slot), "rb") as f:
                data = f.read(MAX_ANSWER + 65536)
        except OSError:
            continue
        return _parse(data, key)
    return None


LEAD_WAIT_S = 2.0       # how long a request waits for another computing the same advertisement


def is_listing(kind_: str, body: bytes) -> bool:
    """An advertisement or an ls-refs request: cheap to compute, sent by crowds of pollers at once."""
    return kind_ == "advert" or body.startswith(b"0014command=ls-refs\n")


class Flight:
    """One request of a crowd asking the same listing computes it; the others
    wait for its record (at most LEAD_WAIT_S) and replay it. After a push,
    pollers arriving together would otherwise each run the whole pipeline."""

    def __init__(self, fd: int, leader: bool):
        self.fd = fd
        self.leader = leader

    @classmethod
    def begin(cls, env: Mapping[str, str], body: bytes, wait: bool = True) -> Optional["Flight"]:
        """The leader's flight (hold it until the answer is recorded), or a
        follower's, ended: look the answer up again. None where the
        repository has no state directory yet, and, without WAIT, where
        another process leads."""
        import fcntl  # startup
        repo = _repo_dir(env)
        if repo is None:
            return None
        slot = _slot(_key(env, body))
        for suffix in SUFFIXES:
            sdir = state_dir(repo + suffix, settings.of(env))
            if _isdir(sdir):
                break
        else:
            return None
        directory = _join(sdir, "replay")
        try:
            try:
                posix.mkdir(directory)
            except FileExistsError:
                pass
            fd = posix.open(_join(directory, f".{slot}.lock"), posix.O_RDWR | posix.O_CREAT | posix.O_CLOEXEC, 0o666)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return cls(fd, True)
        except OSError:
            if not wait:
                posix.close(fd)
                return None
        deadline = time.monotonic() + LEAD_WAIT_S
        while time.monotonic() < deadline:
            time.sleep(0.005)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                break
            except OSError:
                continue
        posix.close(fd)
        return cls(-1, False)

    def end(self) -> None:
        if self.fd >= 0:
            posix.close(self.fd)
            self.fd = -1


def _parts(data: bytes) -> Optional[list[bytes]]:
    """An entry's seven parts (key, stats, fields, head, answer, file, effects), or None."""
    if not data.startswith(MAGIC):
        return None
    end = data.find(b"\n", len(MAGIC))
    try:
        sizes = [int(n) for n in data[len(MAGIC):end].split(b" ")]
    except ValueError:
        return None
    if len(sizes) != 7:
        return None
    pos = end + 1
    parts = []
    for n in sizes:
        parts.append(data[pos:pos + n])
        pos += n
    return parts if pos == len(data) else None


def _parse(data: bytes, key: bytes) -> Optional[Recorded]:
    parts = _parts(data)
    if parts is None or parts[0] != key:
        return None
    names = parts[1].split(b"\0")[0::2]
    if parts[1] != _stats([n.decode("utf-8", "surrogateescape") for n in names]):
        return None
    text = [p.decode("utf-8", "surrogateescape") for p in (parts[2], parts[5], parts[6])]
    fields = dict(f.split("=", 1) for f in text[0].split("\0") if "=" in f)
    ref = text[1].split("\0")
    file = (ref[0], int(ref[1]), int(ref[2])) if len(ref) == 3 else None
    words = text[2].split("\0") if text[2] else []
    effects = [(words[i], words[i + 1], words[i + 2]) for i in range(0, len(words) - 2, 3)]
    return Recorded(parts[3], parts[4], file, effects, fields)


def _inputs(repo: str, gitdir: str, env: Mapping[str, str]) -> list[str]:
    paths = [repo + s for s in SUFFIXES]
    if gitdir.endswith("/.git"):
        paths.append(_dirname(gitdir))     # a work tree's owner counts too (paths.check_ownership)
    paths += [gitdir] + [_join(gitdir, n) for n in (
        "HEAD", "packed-refs", "objects", "git-daemon-export-ok", "shallow", "commondir")]
    return paths + ref_dirs(gitdir) + sources(gitdir, env)


def inputs_of(env: Mapping[str, str], gitdir: str) -> Optional[list[str]]:
    """The files the answer to ENV's request (repository GITDIR) is computed
    from, as record() watches them; None where stock would refuse the path."""
    repo = _repo_dir(env)
    return None if repo is None else _inputs(repo, gitdir, env)


def ref_dirs(gitdir: str) -> list[str]:
    """refs/ and every directory under it: git renames a ref's lock into place,
    which changes its directory."""
    paths = []
    stack = [_join(gitdir, "refs")]
    while stack:
        d = stack.pop()
        paths.append(d)
        try:
            with posix.scandir(d) as it:
                stack.extend(sorted((e.path for e in it if e.is_dir(follow_symlinks=False)), reverse=True))
        except OSError:
            pass
    return paths


def refs_stamp(gitdir: str) -> bytes:
    """The stat of HEAD, packed-refs and every directory under refs/: a ref
    written or deleted changes it."""
    return _stats([_join(gitdir, "HEAD"), _join(gitdir, "packed-refs")] + ref_dirs(gitdir))


def record(env: Mapping[str, str], body: bytes, gitdir: str, head: bytes, answer: bytes, trace: Mapping,
           started_ns: int) -> str:
    """Keep the answer for later requests like this one: ANSWER, or the file
    trace['replay_file'] names. "" when kept, else why not (the access
    line's `unrecorded`): `racy:PATH` (an input changed after STARTED_NS or
    within the racy window before), `large`, `path`, `gone` (no state
    directory), `unwritable`.

    STARTED_NS is when the request began (time.time_ns()), before anything was
    read: every input must be older than that by the racy window, so that
    nothing changed while the answer was computed (the stats are taken after
    it, and would otherwise name a newer state than the answer's)."""
    repo = _repo_dir(env)
    file = trace.get("replay_file")
    if repo is None:
        return "path"
    if len(answer) > MAX_ANSWER:
        return "large"
    paths = _inputs(repo, gitdir, env) + ([file[0]] if file else [])
    for p in paths:
        try:
            st = posix.lstat(p)
        except OSError:
            continue
        if too_recent(st.st_mtime_ns, started_ns):
            return f"racy:{p}"
    key = _key(env, body)
    stats = _stats(paths)
    sdir = state_dir(gitdir, settings.of(env))
    if not _isdir(sdir):
        return "gone"       # never made here: a repository deleted meanwhile gets nothing back
    directory = _join(sdir, "replay")
    fields = "\0".join(f"{k}={trace[k]}" for k in ("repo", "service", "version", "cache", "depth1") if k in trace)
    ref = "\0".join(str(v) for v in file) if file else ""
    effects = "\0".join(w for e in trace.get("replay_effects", ()) for w in e)
    parts = [p.encode("utf-8", "surrogateescape") for p in (fields, ref, effects)]
    parts = [key, stats, parts[0], head, answer, parts[1], parts[2]]
    data = MAGIC + " ".join(str(len(p)) for p in parts).encode() + b"\n" + b"".join(parts)
    tmp = _join(directory, f".{_slot(key)}.{posix.getpid()}")
    try:
        try:
            posix.mkdir(directory)
        except FileExistsError:
            pass
        with open(tmp, "wb") as f:
            f.write(data)
        posix.replace(tmp, _join(directory, _slot(key)))
        _bound(directory, _slot(key))
    except OSError:
        try:
            posix.unlink(tmp)
        except OSError:
            pass
        return "unwritable"
    return ""


