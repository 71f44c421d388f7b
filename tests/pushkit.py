"""Helpers for push tests: repositories that accept pushes, client work
trees, hand-made receive-pack requests, and reading their responses."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Optional, Sequence

from . import differential as d
from . import harness as h

ZERO = "0" * 40


def enable_push(repo: Path, **config: str) -> Path:
    h.git("config", "http.receivepack", "true", cwd=str(repo))
    for k, v in config.items():
        h.git("config", k.replace("_", "."), v, cwd=str(repo))
    return repo


def set_config(repo: Path, key: str, value: str) -> None:
    h.git("config", key, value, cwd=str(repo))


def write_hook(repo: Path, name: str, script: str, gitdir: Optional[Path] = None) -> Path:
    hooks = (gitdir or repo) / "hooks"
    hooks.mkdir(exist_ok=True)
    path = hooks / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def clone(url: str, dest: Path, fsck: bool = False) -> Path:
    h.git("-c", f"transfer.fsckObjects={str(fsck).lower()}", "clone", "-q", url, str(dest))
    h.git("config", "transfer.fsckObjects", str(fsck).lower(), cwd=str(dest))
    return dest


def commit(work: Path, msg: str, name: Optional[str] = None) -> str:
    f = work / (name or f"f-{msg.replace(' ', '_')}.txt")
    f.write_text(f"{msg}\n" * 10)
    h.git("add", "-A", cwd=str(work))
    h.git("commit", "-q", "-m", msg, cwd=str(work))
    return h.out("rev-parse", "HEAD", cwd=str(work))


def push(work: Path, *args: str, check: bool = True, env: Optional[dict] = None):
    """`git push` with progress forced off-tty; returns the CompletedProcess."""
    proc = h.git("push", "--porcelain", *args, cwd=str(work), check=False, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"push {args} failed:\n{proc.stdout.decode()}\n{proc.stderr.decode()}")
    return proc


def rev(repo: Path, what: str) -> str:
    return h.out("rev-parse", what, cwd=str(repo))


# --- hand-made requests -------------------------------------------------------------

def request(commands: Sequence[tuple[str, str, str]], caps: str = "report-status side-band-64k",
            pack: bytes = b"", options: Sequence[str] = ()) -> bytes:
    out = b""
    for i, (old, new, ref) in enumerate(commands):
        line = f"{old} {new} {ref}"
        out += d.pkt((line + "\0" + caps if i == 0 else line) + "\n")
    out += d.FLUSH
    if options:
        out += b"".join(d.pkt(o + "\n") for o in options) + d.FLUSH
    return out + pack


def pack_for(repo: Path, revs: Sequence[str], thin: bool = False) -> bytes:
    """`git pack-objects --revs --stdout` over REVS (`^x` to exclude)."""
    args = ["pack-objects", "--revs", "--stdout", "-q"] + (["--thin"] if thin else [])
    return h.git(*args, cwd=str(repo), input=("\n".join(revs) + "\n").encode()).stdout


def report_lines(body: bytes) -> list[str]:
    """The report-status lines, from a side-band or plain response."""
    toks = d.tokens(body)
    if any(t[0] == "band" for t in toks):
        toks = d.tokens(d.demux(body)[1])
    return [t[1].decode().rstrip("\n") for t in toks if t[0] == "pkt"]


def messages(body: bytes) -> str:
    return d.demux(body)[2].decode(errors="replace")


def post(root: Path, repo: str, body: bytes, program: str = "aspen", **extra) -> h.CgiResult:
    env = d.post_env(root, repo, "receive-pack", body, REMOTE_USER="pusher", REMOTE_ADDR="127.0.0.1", **extra)
    return h.aspen(env, body) if program == "aspen" else h.stock(env, body)

