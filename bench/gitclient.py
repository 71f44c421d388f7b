"""Timed git client operations against a smart-HTTP URL, and client-side helpers.

Every operation runs one `git` process with an isolated configuration
(no system or global config, fixed identity, no prompts), `-c protocol.version=2`
unless `protocol=0` is given (or `set_default_protocol(0)` was called), and
returns a `ClientResult`; a failing git command is a result with `ok=False`, never an exception.

History building: `advance_by_pushes` fast-imports N commits into a client and
pushes each one as its own HTTP push (one version per push on the server: what
`push-history` and `stale-branch` need); `advance_direct` writes N commits
straight into a served bare repository with fast-import + `git update-ref`
(one ref change, no HTTP: only for preparing state where versions don't matter).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

IDENT_NAME, IDENT_EMAIL = "Bench Client", "client@aspen.invalid"
BASE_TIME = 1_700_000_000
DEFAULT_PROTOCOL = 2   # wire protocol when a call gives none; `set_default_protocol(0)` for v0


def set_default_protocol(version: int) -> None:
    """The protocol.version every later call uses unless it passes `protocol=`."""
    global DEFAULT_PROTOCOL
    if version not in (0, 1, 2):
        raise ValueError(f"protocol version {version}")
    DEFAULT_PROTOCOL = version


def git_env(when: Optional[int] = None) -> dict:
    env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null", GIT_TERMINAL_PROMPT="0",
               GIT_AUTHOR_NAME=IDENT_NAME, GIT_AUTHOR_EMAIL=IDENT_EMAIL,
               GIT_COMMITTER_NAME=IDENT_NAME, GIT_COMMITTER_EMAIL=IDENT_EMAIL)
    env.pop("GIT_PROTOCOL", None)
    env.pop("GIT_DIR", None)
    if when is not None:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = f"{when} +0000"
    return env


@dataclass
class ClientResult:
    """One git command: success, wall time, the end of its stderr, and its stdout."""
    ok: bool
    wall_ms: float
    stderr_tail: str
    stdout: str = ""


def run(args: Sequence[str], cwd: Optional[Path] = None, protocol: Optional[int] = None, timeout: float = 600,
        input: Optional[bytes] = None, when: Optional[int] = None, config: Sequence[str] = ()) -> ClientResult:
    """Run `git -c protocol.version=P [-c CONFIG]... ARGS` and time it."""
    argv = ["git", "-c", f"protocol.version={DEFAULT_PROTOCOL if protocol is None else protocol}",
            *(x for c in config for x in ("-c", c)), *args]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(argv, cwd=str(cwd) if cwd else None, env=git_env(when), input=input,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return ClientResult(False, (time.perf_counter() - t0) * 1000, f"timeout after {timeout}s: {e}")
    except OSError as e:
        return ClientResult(False, (time.perf_counter() - t0) * 1000, f"cannot run git: {e}")
    wall = (time.perf_counter() - t0) * 1000
    return ClientResult(p.returncode == 0, wall, p.stderr.decode(errors="replace")[-800:],
                        p.stdout.decode(errors="replace"))


def clone(url: str, dest: Path, depth: Optional[int] = None, mirror: bool = False, bare: bool = False,
          branch: Optional[str] = None, protocol: Optional[int] = None, timeout: float = 600,
          config: Sequence[str] = ()) -> ClientResult:
    """`git clone` (full, `--depth N`, `--mirror` or `--bare`) of URL into DEST; CONFIG: `-c` settings."""
    args = ["clone", "-q", "--no-checkout" if not (mirror or bare) else "--bare"]
    if mirror:
        args = ["clone", "-q", "--mirror"]
    if depth:
        args += ["--depth", str(depth)]
    if branch:
        args += ["--branch", branch, "--single-branch"]
    return run([*args, url, str(dest)], protocol=protocol, timeout=timeout, config=config)


def fetch(repo: Path, url: str = "origin", refspecs: Sequence[str] = (), prune: bool = False,
          protocol: Optional[int] = None, timeout: float = 600) -> ClientResult:
    args = ["fetch", "-q", "--no-tags" if refspecs else "--tags"]
    if prune:
        args.append("--prune")
    return run([*args, url, *refspecs], cwd=repo, protocol=protocol, timeout=timeout)


def push(repo: Path, url: str, src: str, ref: str, force: bool = False, protocol: Optional[int] = None,
         timeout: float = 600) -> ClientResult:
    """Push SRC (a commit or ref in REPO; empty to delete) to REF on URL."""
    spec = f"{'+' if force else ''}{src}:{ref}"
    return run(["push", "-q", url, spec], cwd=repo, protocol=protocol, timeout=timeout)


def ls_remote(url: str, protocol: Optional[int] = None, timeout: float = 120) -> ClientResult:
    return run(["ls-remote", url], protocol=protocol, timeout=timeout)


def parse_refs(ls_remote_out: str) -> dict[str, str]:
    """refname -> id from `ls-remote` output, without HEAD and peeled `^{}` lines."""
    refs = {}
    for line in ls_remote_out.splitlines():
        oid, _, name = line.partition("\t")
        if name and name != "HEAD" and not name.endswith("^{}"):
            refs[name] = oid
    return refs


def local_refs(repo: Path) -> dict[str, str]:
    r = run(["for-each-ref", "--format=%(objectname) %(refname)"], cwd=repo)
    return {name: oid for oid, _, name in (l.partition(" ") for l in r.stdout.splitlines()) if name}


def rev_parse(repo: Path, rev: str) -> Optional[str]:
    r = run(["rev-parse", "--verify", "-q", rev + "^{commit}"], cwd=repo)
    return r.stdout.strip() if r.ok else None


@dataclass
class Verified:
    """Outcome of `verify`: fsck clean and refs equal, with what differed."""
    ok: bool
    fsck_ok: bool
    refs_equal: bool
    detail: str = ""


def verify(client_repo: Path, server_refs: dict[str, str], mirror: bool = True) -> Verified:
    """`git fsck --strict` on CLIENT_REPO, and its refs against SERVER_REFS.

    MIRROR: the client holds refs under the same names (a `--mirror` clone or a
    fetch of `+refs/*:refs/*`); otherwise server `refs/heads/X` is compared with
    the client's `refs/remotes/origin/X` and tags by name."""
    fsck = run(["fsck", "--strict", "--no-progress", "--no-dangling"], cwd=client_repo)
    mine = local_refs(client_repo)
    want = dict(server_refs)
    if not mirror:
        want = {("refs/remotes/origin/" + k[len("refs/heads/"):] if k.startswith("refs/heads/") else k): v
                for k, v in want.items() if k.startswith(("refs/heads/", "refs/tags/"))}
        mine = {k: v for k, v in mine.items() if k in want or k.startswith("refs/tags/")
                or (k.startswith("refs/remotes/origin/") and k != "refs/remotes/origin/HEAD")}
    diff = sorted(set(k for k in want.keys() | mine.keys() if want.get(k) != mine.get(k)))
    detail = "" if fsck.ok else "fsck: " + fsck.stderr_tail[-300:]
    if diff:
        detail += f" refs differ: {diff[:5]}"
    return Verified(fsck.ok and not diff, fsck.ok, not diff, detail.strip())


def commit_file(repo: Path, path: str, text: str, message: str = "", parent: str = "HEAD",
                when: int = BASE_TIME) -> Optional[str]:
    """A commit on top of PARENT in REPO (bare or not; index and work tree untouched)
    that sets PATH to TEXT. Fixed dates make it identical across targets. Returns the id
    (the caller pushes it), or None on failure."""
    blob = run(["hash-object", "-w", "--stdin"], cwd=repo, input=text.encode())
    base = rev_parse(repo, parent)
    if not blob.ok or not base:
        return None
    return _commit_with(repo, base, {path: blob.stdout.strip()}, message or f"edit {path}\n", when)


def _commit_with(repo: Path, base: str, files: dict[str, str], message: str, when: int) -> Optional[str]:
    idx = repo / f".bench-index-{os.getpid()}-{id(files)}"
    env_run = dict(git_env(when), GIT_INDEX_FILE=str(idx))
    try:
        def g(*args, input=None):
            return subprocess.run(["git", *args], cwd=str(repo), env=env_run, input=input,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if g("read-tree", base).returncode:
            return None
        for path, blob in files.items():
            if g("update-index", "--add", "--cacheinfo", f"100644,{blob},{path}").returncode:
                return None
        tree = g("write-tree")
        if tree.returncode:
            return None
        c = g("commit-tree", tree.stdout.decode().strip(), "-p", base, "-m", message)
        return c.stdout.decode().strip() if c.returncode == 0 else None
    finally:
        idx.unlink(missing_ok=True)


def fast_import_chain(repo: Path, parent: str, n: int, ref: str, when: int = BASE_TIME,
                      path_prefix: str = "history", tag: str = "") -> list[str]:
    """Write N commits in a line on top of PARENT into REPO's object store with one
    `git fast-import`, each editing one small text file (deltas against the previous
    version), and set REF to the last. Deterministic for equal inputs. Returns the ids
    in order."""
    if n <= 0:
        return []
    out = []
    lines = [f"{tag} line {j}" for j in range(40)]
    for i in range(n):
        lines[(i * 7) % len(lines)] = f"{tag} line {(i * 7) % len(lines)} edited at step {i}"
        if i % 10 == 9:
            lines.append(f"{tag} appended at step {i}")
        body = ("\n".join(lines) + "\n").encode()
        stamp = f"{IDENT_NAME} <{IDENT_EMAIL}> {when + i} +0000\n"
        msg = f"{tag} step {i}\n".encode()
        out.append(f"commit {ref}\nmark :{i + 1}\nauthor {stamp}committer {stamp}".encode()
                   + b"data %d\n" % len(msg) + msg
                   + (f"from {parent}\n" if i == 0 else "").encode()
                   + f"M 100644 inline {path_prefix}/{tag or 'log'}-{i % 8}.txt\n".encode()
                   + b"data %d\n" % len(body) + body + b"\n")
    marks = repo / f".bench-marks-{os.getpid()}"
    out.append(b"done\n")
    r = run(["fast-import", "--quiet", "--done", "--force", f"--export-marks={marks}"], cwd=repo, input=b"".join(out))
    if not r.ok:
        raise RuntimeError(f"fast-import failed: {r.stderr_tail}")
    ids = {}
    for line in marks.read_text().splitlines():
        m, oid = line.split()
        ids[int(m[1:])] = oid
    marks.unlink(missing_ok=True)
    return [ids[i + 1] for i in range(n)]


def advance_by_pushes(client: Path, url: str, n: int, branch: str = "main", when: int = BASE_TIME,
                      tag: str = "push", on_push=None) -> tuple[list[ClientResult], list[str]]:
    """N real HTTP pushes to BRANCH, one commit each (built first with fast-import into
    CLIENT on top of CLIENT's `refs/remotes/origin/BRANCH` or `refs/heads/BRANCH`).
    ON_PUSH(i, result) is called after each push. Returns the results and commit ids."""
    base = rev_parse(client, f"refs/remotes/origin/{branch}") or rev_parse(client, f"refs/heads/{branch}")
    if base is None:
        return [ClientResult(False, 0.0, f"no {branch} in client")], []
    ids = fast_import_chain(client, base, n, f"refs/bench/{tag}", when=when, tag=tag)
    results = []
    for i, oid in enumerate(ids):
        r = push(client, url, oid, f"refs/heads/{branch}")
        results.append(r)
        if on_push:
            on_push(i, r)
    return results, ids


def advance_direct(bare: Path, n: int, branch: str = "main", when: int = BASE_TIME, tag: str = "direct") -> list[str]:
    """N commits on BRANCH written straight into served bare repository BARE
    (fast-import + `git update-ref`): one ref change, no HTTP, no per-push version."""
    base = rev_parse(bare, f"refs/heads/{branch}")
    ids = fast_import_chain(bare, base, n, f"refs/bench-tmp/{tag}", when=when, tag=tag)
    if ids:
        run(["update-ref", f"refs/heads/{branch}", ids[-1], base], cwd=bare)
        run(["update-ref", "-d", f"refs/bench-tmp/{tag}"], cwd=bare)
    return ids
