"""git's `uploadpack.packObjectsHook` for shallow clones: a smaller pack.

Role: for a depth-1 clone (a `deepen 1` request without haves) the upload
path runs `git -c uploadpack.packObjectsHook=... upload-pack` (see
`upload_pack_config`), and upload-pack then runs

    <hook> git [global options] pack-objects <args>

with the revs on stdin, the pack read from stdout, progress on stderr. This
program runs the same command with a wide delta search (`wide_args()`: stored
deltas are not reused, so the tip's objects are deltified against each
other) and pipes the pack through `packs.recompress` (libdeflate level 12
wherever that is smaller). It exits with pack-objects' status; if the rewrite
fails it stops writing (the client sees a truncated pack, never a bad one
that checks out) and exits non-zero.

The hook is honoured only from protected configuration (`git -c` counts);
upload-pack runs it from the repository with its own environment.
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import Optional, Sequence

from .. import settings
from ..git import gitexec
from ..packs.recompress import RecompressError, rewrite
from ..protocol.requests import FetchRequest


def wide_args(s: settings.Settings) -> tuple[str, ...]:
    """pack-objects' arguments for the wide search: the window is ASPEN_DEPTH1_WINDOW
    (settings.py; git's own is 10), of the request's settings or, in the hook,
    of the environment upload-pack passed on."""
    window = s.depth1_window
    return (f"--window={window}", "--depth=50", "--no-reuse-delta", "--compression=9")


def upload_pack_config(python: str = sys.executable, object_format: str = "sha1") -> list[str]:
    """git's global arguments (before `upload-pack`) that install this hook,
    for a repository of OBJECT_FORMAT's hash. `-P` keeps the repository
    directory (the hook's cwd) off sys.path."""
    hook = f"{shlex.quote(python)} -P -m aspen_cgi.fetch.packobjectshook"
    if object_format == "sha256":
        hook += " --sha256"
    return ["-c", f"uploadpack.packObjectsHook={hook}"]


def wants_wide_pack(req: FetchRequest, s: settings.Settings) -> bool:
    """True for a depth-1 clone: `deepen 1`, no haves, no packfile URIs
    (pack-objects then writes more than a pack); off with ASPEN_WIDE_DEPTH1=0.

    Deeper shallow clones are left to stock: without delta reuse, pack-objects
    would recompute every delta of the whole requested history."""
    if not s.wide_depth1:
        return False
    return req.deepen == 1 and not req.haves and req.packfile_uris is None


def _pack_objects_args(argv: Sequence[str]) -> Optional[list[str]]:
    """The git arguments after the program name, or None if this is not
    `git ... pack-objects ...`."""
    if len(argv) < 2 or "pack-objects" not in argv[1:]:
        return None
    return list(argv[1:])


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    oid_len = 20
    if argv[:1] == ["--sha256"]:
        argv, oid_len = argv[1:], 32
    args = _pack_objects_args(argv)
    if args is None:
        print("usage: python -m aspen_cgi.fetch.packobjectshook git [options] pack-objects <args>", file=sys.stderr)
        return 129
    if "--stdout" not in args or any(a.startswith("--uri-protocol") for a in args):
        # Not a plain pack on stdout (packfile URIs come first): run it as it came.
        return gitexec.start(args, cwd=os.getcwd(), stdin=None, stdout=None, stderr=None).wait()
    proc = gitexec.start([*args, *wide_args(settings.of(os.environ))], cwd=os.getcwd(), stdin=None, stdout=gitexec.PIPE,
                         stderr=None)
    assert proc.stdout is not None
    out = sys.stdout.buffer
    try:
        for chunk in rewrite(proc.stdout, oid_len=oid_len):
            out.write(chunk)
        out.flush()
    except RecompressError as e:
        gitexec.kill(proc)
        rc = proc.wait()
        print(f"aspen packhook: {e}", file=sys.stderr)
        return rc if rc > 0 else 1
    except (BrokenPipeError, ConnectionResetError):
        gitexec.kill(proc)
        proc.wait()
        return 1
    finally:
        proc.stdout.close()
    rc = proc.wait()
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:
        os._exit(1)   # the reader went away; nothing left to say
