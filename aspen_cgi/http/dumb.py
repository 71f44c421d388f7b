"""The dumb-protocol routes: HEAD, text info/refs, objects/info/*, loose objects, packs and indexes."""

from __future__ import annotations

import errno
import os
import stat
from typing import Mapping, Optional

from .. import settings
from ..model.refs import RefSnapshot
from ..service import FileBody
from . import headers as H
from .message import HttpError, Response

CHUNK = 65536


def head_body(snap: RefSnapshot) -> bytes:
    head = snap.head
    if head is None:
        return b""
    if head.symref_target is not None:
        # stock resolves the symref chain fully (HEAD -> alias -> branch names the branch)
        target, index, seen = head.symref_target, snap.by_name(), set()
        while target in index and index[target].symref_target and target not in seen:
            seen.add(target)
            target = index[target].symref_target or target
        return f"ref: {target}\n".encode("utf-8", "surrogateescape")
    return f"{head.oid}\n".encode()


def info_refs_body(snap: RefSnapshot) -> bytes:
    out = []
    for ref in snap.refs:
        if getattr(ref, "missing", False):
            continue    # stock's show_text_ref skips refs whose object is missing
        out.append(f"{ref.oid}\t{ref.name}\n")
        if ref.peeled:
            out.append(f"{ref.peeled}\t{ref.name}^{{}}\n")
    return "".join(out).encode("utf-8", "surrogateescape")


def info_packs_body(gitdir: str) -> bytes:
    """`P pack-<h>.pack` per local pack in git's packed_git order, then a blank line.

    git reads the pack directory in readdir order, prepends each pack to its
    list, then stable-sorts newest first by the pack's mtime in whole seconds;
    so packs with equal mtimes come out in reverse directory order."""
    packdir = os.path.join(gitdir, "objects", "pack")
    packs = []
    try:
        names = os.listdir(packdir)
    except OSError:
        names = []
    for name in names:
        if name.startswith("pack-") and name.endswith(".idx"):
            pack = name[:-4] + ".pack"
            try:
                packs.append((int(os.stat(os.path.join(packdir, pack)).st_mtime), pack))
            except OSError:
                continue
    packs.reverse()
    packs.sort(key=lambda p: -p[0])
    return ("".join(f"P {p}\n" for _, p in packs) + "\n").encode()


def strbuf(prefix: list[tuple[str, str]], content_type: str, body: bytes) -> Response:
    hdrs = prefix + [("Content-Length", str(len(body))), ("Content-Type", content_type)]
    return Response(200, "OK", hdrs, [body])


def _opened_path(fd: int, path: str) -> str:
    """Where the open file really is (race-free through /proc; realpath otherwise)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(path)


def within(base: str, real: str) -> bool:
    base = os.path.realpath(base).rstrip("/")
    return real == base or real.startswith(base + "/")


def _servable(gitdir: str, name: str, real: str, s: settings.Settings) -> bool:
    """Inside the repository (or its objects directory, which may be linked
    elsewhere as a whole), and not inside Aspen's own state: the ref store,
    response cache and stored packs are never files to serve."""
    roots = [gitdir] + ([os.path.join(gitdir, "objects")] if name.startswith("objects/") else [])
    if not any(within(r, real) for r in roots):
        return False
    private = [os.path.join(gitdir, "aspen")] + [d for d in (s.state_dir, s.cache_dir) if d]
    return not any(within(p, real) for p in private)


def local_file(gitdir: str, name: str, prefix: list[tuple[str, str]], content_type: str,
               env: Optional[Mapping[str, str]] = None) -> Response:
    """send_local_file(), serving only regular files inside the repository
    (ENV: the request's, for where Aspen's state is).

    Stock follows a symbolic link anywhere (objects/pack/pack-<h>.pack ->
    /etc/passwd is served) and blocks forever on a FIFO; Aspen answers both
    as a missing file (404), so the dumb routes never serve a file from
    outside the repository's real directory, nor Aspen's state."""
    path = os.path.join(gitdir, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise HttpError(404, "Not Found", f"Cannot open '{name}': {e.strerror}", headers=prefix) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            why = os.strerror(errno.EISDIR) if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise HttpError(404, "Not Found", f"Cannot open '{name}': {why}", headers=prefix)
        if not _servable(gitdir, name, _opened_path(fd, path), settings.of(env)):
            raise HttpError(404, "Not Found", f"Cannot open '{name}': outside the repository", headers=prefix)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    hdrs = prefix + [("Content-Length", str(st.st_size)), ("Content-Type", content_type),
                     ("Last-Modified", H.date(st.st_mtime))]
    return Response(200, "OK", hdrs, FileBody(f, st.st_size))
