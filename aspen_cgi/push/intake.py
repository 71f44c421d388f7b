"""Pack intake for a push: a quarantine object directory inside objects/
(stock's tmp_objdir "incoming-XXXXXX"), the pack streamed into
`git index-pack --stdin --fix-thin` there, the connectivity check, and the
migration of the quarantined objects into the repository's object store."""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
import threading
from dataclasses import dataclass
from typing import Callable, Generator, Mapping, Optional, Sequence

from ..git import gitexec
from ..model.objectid import OID_PATTERN
from ..protocol.push import PackHeader
from ..runtime.owners import owner_alive, owner_id, pid_alive

CHUNK = 65536


@dataclass(frozen=True)
class IntakeOptions:
    fsck: bool = False
    fsck_msg_types: str = ""      # ",id=severity,..." suffix for --strict=
    max_input_size: int = 0
    unpack_limit: int = 100
    progress: bool = False         # side-band negotiated and not quiet
    quiet: bool = False
    shallow_file: Optional[str] = None   # a push from a shallow clone: its shallow commits and ours


@dataclass
class UnpackResult:
    error: Optional[str]           # stock's unpack status string, None when ok
    keep: Optional[str] = None     # objects/pack/pack-<hash>.keep once migrated: protects the
                                   # pack from a concurrent gc until the refs point at it


class Quarantine:
    """objects/incoming-<owner>-XXXXXX: objects of a push nobody else sees
    until migrate(). The name says which process owns it (host+pid+start),
    so that the quarantines of processes killed mid-push (kill -9 leaves
    them behind, stock's too) are swept by the next push."""

    def __init__(self, gitdir: str):
        self.objects = os.path.join(os.path.abspath(gitdir), "objects")
        sweep_stale(self.objects)
        # ':' would split the path where git reads a list of object directories
        self.path = tempfile.mkdtemp(prefix=f"{QUARANTINE_PREFIX}{owner_id().replace(':', '+')}-", dir=self.objects)
        os.chmod(self.path, 0o755)
        os.makedirs(os.path.join(self.path, "pack"), exist_ok=True)

    def env(self, base: Mapping[str, str]) -> gitexec.GitEnv:
        """tmp_objdir_env(): the quarantine as object directory, the real one as alternate."""
        alts = self.objects
        if base.get("GIT_ALTERNATE_OBJECT_DIRECTORIES"):
            alts += os.pathsep + base["GIT_ALTERNATE_OBJECT_DIRECTORIES"]
        return gitexec.child_env(base, GIT_OBJECT_DIRECTORY=self.path,
                                 GIT_ALTERNATE_OBJECT_DIRECTORIES=alts,
                                 GIT_QUARANTINE_PATH=self.path)

    def migrate(self) -> bool:
        """tmp_objdir_migrate(): loose objects and packs into objects/ (.idx
        last so a reader never sees an index without its pack)."""
        try:
            self._migrate_dir(self.path, self.objects)
        except OSError:
            return False
        self.remove()
        return True

    def _migrate_dir(self, src: str, dst: str) -> None:
        names = sorted(os.listdir(src), key=_pack_priority)
        for name in names:
            s, d = os.path.join(src, name), os.path.join(dst, name)
            if os.path.isdir(s):
                os.makedirs(d, exist_ok=True)
                self._migrate_dir(s, d)
            else:
                _finalize(s, d)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


QUARANTINE_PREFIX = "incoming-"
_KEEP_LINE = re.compile(r"^receive-pack (\d+) on (\S+)$")


def sweep_stale(objects: str) -> list[str]:
    """Remove what pushes of dead processes left in OBJECTS: their quarantines
    (named for their owner; stock's unnamed ones are left alone) and the
    .keep files that guarded their migrated packs (`receive-pack PID on HOST`).
    The paths removed."""
    gone: list[str] = []
    try:
        names = os.listdir(objects)
    except OSError:
        return gone
    for name in names:
        if not name.startswith(QUARANTINE_PREFIX):
            continue
        owner = name[len(QUARANTINE_PREFIX):].rpartition("-")[0].replace("+", ":")
        if owner.count(":") == 2 and not owner_alive(owner):
            shutil.rmtree(os.path.join(objects, name), ignore_errors=True)
            gone.append(os.path.join(objects, name))
    packs = os.path.join(objects, "pack")
    try:
        keeps = [n for n in os.listdir(packs) if n.endswith(".keep")]
    except OSError:
        keeps = []
    host = socket.gethostname() or "localhost"
    for name in keeps:
        path = os.path.join(packs, name)
        try:
            with open(path, "rb") as f:
                m = _KEEP_LINE.match(f.read(512).decode("utf-8", "replace").strip())
        except OSError:
            continue
        if m is None or m.group(2) != host or pid_alive(int(m.group(1))):
            continue
        try:
            os.unlink(path)
            gone.append(path)
        except OSError:
            pass
    return gone


def _pack_priority(name: str) -> tuple[int, str]:
    if not name.startswith("pack"):
        return (0, name)
    for i, ext in enumerate((".keep", ".pack", ".rev", ".idx"), 1):
        if name.endswith(ext):
            return (i, name)
    return (5, name)


def _finalize(src: str, dst: str) -> None:
    """finalize_object_file(): hard link (keep an existing copy), then unlink."""
    try:
        os.link(src, dst)
    except FileExistsError:
        pass
    except OSError:
        if not os.path.exists(dst):
            os.replace(src, dst)
            return
    os.unlink(src)


def intake_args(header: PackHeader, opts: IntakeOptions) -> list[str]:
    """Stock's unpack(): a push of fewer than receive.unpackLimit objects is
    exploded into loose objects by unpack-objects (so small pushes never pile
    up packs for gc --auto to repack); a larger one is kept as a pack."""
    shallow = ["--shallow-file", opts.shallow_file] if opts.shallow_file else []
    if header.entries < opts.unpack_limit:
        args = ["unpack-objects", f"--pack_header={header.version},{header.entries}"]
        if opts.quiet:
            args.append("-q")
        return shallow + args + _strict(opts) + _max_input(opts)
    return shallow + index_pack_args(header, opts)


def index_pack_args(header: PackHeader, opts: IntakeOptions) -> list[str]:
    args = ["index-pack", "--stdin", f"--pack_header={header.version},{header.entries}",
            f"--keep=receive-pack {os.getpid()} on {socket.gethostname() or 'localhost'}"]
    # Stock unpacks small pushes with unpack-objects, which shows no progress
    # on a pipe; it shows delta resolution only for packs at the unpack limit.
    if opts.progress and header.entries >= opts.unpack_limit:
        args.append("--show-resolving-progress")
    return args + _strict(opts) + ["--fix-thin"] + _max_input(opts)


def _strict(opts: IntakeOptions) -> list[str]:
    """receive.fsckObjects: both programs take the same --strict[=<msg types>]."""
    return ["--strict" + (("=" + opts.fsck_msg_types) if opts.fsck_msg_types else "")] if opts.fsck else []


def _max_input(opts: IntakeOptions) -> list[str]:
    return [f"--max-input-size={opts.max_input_size}"] if opts.max_input_size else []


def unpack(q: Quarantine, gitdir: str, env: Mapping[str, str], header: PackHeader,
           read: Callable[[int], bytes], opts: IntakeOptions,
           keepalive: float = 0, tee: Optional[Callable[[bytes], None]] = None
           ) -> Generator[Optional[bytes], None, UnpackResult]:
    """Stream the rest of the pack from READ into unpack-objects or index-pack
    (intake_args) in the quarantine, each chunk also given to TEE.

    Nothing is yielded until the whole body is read, so an exception from
    READ (a short body) propagates before any output, after index-pack is
    killed. Then index-pack's stderr is yielded as it comes, and None after
    every KEEPALIVE seconds of silence (stock's keepalive after end of input)."""
    proc = gitexec.start(intake_args(header, opts), cwd=gitdir, env=q.env(env),
                         stdin=gitexec.PIPE, stdout=gitexec.PIPE, stderr=gitexec.PIPE)
    assert proc.stdin is not None and proc.stderr is not None
    errors = gitexec.read_idle(proc.stderr, keepalive)
    outbuf = bytearray()
    drain = threading.Thread(target=_drain, args=(proc.stdout, outbuf), daemon=True)
    drain.start()
    done = False
    try:
        child_alive = True
        try:
            while True:
                chunk = read(CHUNK)
                if not chunk:
                    break
                if tee is not None:
                    tee(chunk)
                if child_alive:
                    try:
                        proc.stdin.write(chunk)
                    except (BrokenPipeError, OSError):
                        child_alive = False   # keep reading the body so the client is answered
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass
        yield from errors
        rc = proc.wait()
        drain.join(timeout=10)
        done = True
    finally:
        if not done:
            gitexec.kill(proc)
            proc.wait()
    if rc != 0:
        name = "unpack-objects" if header.entries < opts.unpack_limit else "index-pack"
        return UnpackResult(f"{name} abnormal exit")
    kind, _, pack_hash = bytes(outbuf).decode("latin-1").strip().partition("\t")
    keep = os.path.join(q.objects, "pack", f"pack-{pack_hash}.keep") if kind == "keep" and pack_hash else None
    return UnpackResult(None, keep)


def _drain(stream, buf: bytearray) -> None:
    try:
        while True:
            chunk = stream.read1(CHUNK) if hasattr(stream, "read1") else stream.read(CHUNK)
            if not chunk:
                break
            buf += chunk
    except (OSError, ValueError):
        pass
    finally:
        try:
            stream.close()
        except OSError:
            pass


@dataclass
class ConnectivityResult:
    ok: bool
    stderr: bytes = b""
    # the commits the push makes reachable (not reachable from any ref), newest
    # first, each with its parents; None when not asked for
    commits: Optional[dict[str, tuple[str, ...]]] = None
    # the other objects the walk listed, each with its path (its name for a tag);
    # None when not asked for or past LISTING_MAX
    objects: Optional[dict[str, str]] = None
    times: Optional[dict[str, int]] = None      # each listed commit's committer time


LISTING_MAX = 100_000     # objects: a larger push's listing is not kept (no adoptable pack is that large)


_COMMIT_LINE = re.compile(f"^[0-9]+ {OID_PATTERN}( {OID_PATTERN})*$".encode())
_OBJECT_LINE = re.compile(f"^({OID_PATTERN})(?: (.*))?$".encode(), re.S)


def connected(gitdir: str, env: Mapping[str, str], oids: Sequence[str], progress: bool = False,
              with_commits: bool = False, shallow_file: Optional[str] = None,
              exclude: Optional[Sequence[str]] = None) -> ConnectivityResult:
    """check_connected(): every new tip's closure is in the repository plus
    quarantine (git 2.39 walks against --all, hidden refs included). With
    WITH_COMMITS the same walk also lists the new commits and their parents
    (rev-list prints commits before any tree, blob or tag) with their
    committer times, and the other new objects with their paths. With
    SHALLOW_FILE, git takes its commits as the shallow ones (`--shallow-file`).

    EXCLUDE, when given, stands for --all and --alternate-refs (in a
    quarantine the repository is the alternate: its refs again, listed by a
    for-each-ref child): every ref's value, tags already peeled (the ref
    store knows them), so git parses no tag and starts no child. It reaches
    the commits --all reaches; an object it names that is missing fails the
    walk like a missing new one (the caller walks again with --all). Only for
    a repository that borrows no objects."""
    if not oids:
        return ConnectivityResult(True, b"", {} if with_commits else None)
    args = ["--shallow-file", shallow_file] if shallow_file is not None else []
    args += ["rev-list", "--objects", "--stdin"]
    args += [] if exclude is not None else ["--not", "--all", "--alternate-refs"]
    stdin = "".join(o + "\n" for o in oids) + "".join("^" + o + "\n" for o in exclude or ())
    args += ["--parents", "--timestamp"] if with_commits else ["--quiet"]
    if progress:
        args.append("--progress=Checking connectivity")
    if not with_commits:
        res = gitexec.git(args, cwd=gitdir, env=gitexec.child_env(env), input=stdin.encode())
        return ConnectivityResult(res.ok, res.stderr)
    proc = gitexec.start(args, cwd=gitdir, env=gitexec.child_env(env))
    assert proc.stdin is not None and proc.stdout is not None       # PIPEs (gitexec.start's own)
    err = bytearray()
    drain = threading.Thread(target=_drain, args=(proc.stderr, err), daemon=True)
    drain.start()
    try:
        proc.stdin.write(stdin.encode())
        proc.stdin.close()
    except OSError:
        pass
    commits: dict[str, tuple[str, ...]] = {}
    times: dict[str, int] = {}
    objects: Optional[dict[str, str]] = {}
    in_commits = True
    for line in proc.stdout:
        line = line[:-1] if line.endswith(b"\n") else line
        if in_commits and _COMMIT_LINE.match(line):
            parts = line.decode().split(" ")
            commits[parts[1]] = tuple(parts[2:])
            times[parts[1]] = int(parts[0])
            continue
        in_commits = False
        if objects is not None:
            m = _OBJECT_LINE.match(line)
            if m is None or len(objects) >= LISTING_MAX:
                objects = None          # a path with a newline, or too many: no listing
            else:
                objects[m.group(1).decode()] = (m.group(2) or b"").decode("utf-8", "surrogateescape")
    proc.stdout.close()
    rc = proc.wait()
    drain.join()
    if rc != 0:
        return ConnectivityResult(False, bytes(err))
    return ConnectivityResult(True, bytes(err), commits, objects, times)


def fast_forward(commits: Mapping[str, Sequence[str]], old: str, new: str) -> Optional[bool]:
    """Is OLD an ancestor of NEW, judged from the new commits' graph alone?
    True when OLD is a parent reached from NEW inside it; None when the graph
    cannot tell (NEW was not a new commit) or OLD may sit further down."""
    if old == new:
        return True
    if new not in commits:
        return None
    seen = {new}
    stack = [new]
    while stack:
        for parent in commits.get(stack.pop(), ()):
            if parent == old:
                return True
            if parent in commits and parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return None


def reachable_new(commits: Mapping[str, Sequence[str]], tip: str) -> list[str]:
    """The new commits reachable from TIP."""
    if tip not in commits:
        return []
    seen = {tip}
    stack = [tip]
    while stack:
        for parent in commits.get(stack.pop(), ()):
            if parent in commits and parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return sorted(seen)


def is_ancestor(gitdir: str, env: Mapping[str, str], old: str, new: str) -> bool:
    return gitexec.git(["merge-base", "--is-ancestor", old, new], cwd=gitdir,
                       env=gitexec.child_env(env)).returncode == 0


def ref_exists(gitdir: str, env: Mapping[str, str], ref: str) -> bool:
    return gitexec.git(["show-ref", "--verify", "--quiet", ref], cwd=gitdir, env=gitexec.child_env(env)).returncode == 0

