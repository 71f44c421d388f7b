"""Bundles from stored bytes: the file `GET /repo.git/aspen/bundle` (the
latest version whose packs are built) and `…/aspen/bundle@V` (version V)
serve, for `git clone --bundle-uri` and for downloads a proxy or CDN can
cache and a client can resume.

A bundle is git's v2 format: `# v2 git bundle`, one `<oid> <ref>` line per
ref the client may see at that version (HEAD first when it resolves), an
empty line, then a complete pack. Where every ref is visible (no hideRefs,
no namespace), the pack is the import pack, then the segment and version
packs partitioning versions 2 … V, spliced as a full clone is (stored bytes
copied, nothing inflated); else git's `pack-objects` over the visible refs'
values, after putting back what gc pruned (packs/reinject.py), so no object
only a hidden ref reaches is in it. Built once per version and view, into
`aspen/bundles/` (written to a temporary name, then renamed), single-flight
under a lock, and served as a static file after that; the newest
KEEP files are kept."""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
from dataclasses import dataclass
from typing import Optional

from ..git import gitexec
from ..model.objectid import id_bytes
from ..model.pin import Pin, PinError
from ..packs import background, reinject
from ..service import ServiceRefused
from .uploadconfig import UploadConfig

KEEP = 4                 # bundle files kept per repository (the newest by use)
DIRECTORY = "bundles"    # beside the store's file, in the repository's state directory
MAGIC = b"# v2 git bundle\n"


@dataclass(frozen=True)
class BundleFile:
    path: str
    size: int
    version: int
    etag: str            # quoted, from the header's digest and the pack's trailer
    mtime: float
    pinned: bool         # asked for by version (immutable) rather than "the latest"


def _refused(status: int, reason: str, msg: str, extra: Optional[list] = None) -> ServiceRefused:
    return ServiceRefused(status, reason, f"aspen: bundle: {msg}", extra=extra, body=(msg + "\n").encode())


def _version(ctx, store, pin: Optional[Pin]) -> int:
    if pin is None:
        background.await_built(store)     # starts a builder, waits a little (as a fetch)
        built = store.settled()[1]
        if built < 1:
            raise _refused(503, "Service Unavailable", "the repository's packs are being built; retry later",
                           [("Retry-After", "30")])
        return built
    try:
        ctx.pin_to(pin)
    except PinError as e:
        raise _refused(404, "Not Found", str(e)) from None
    v = ctx.pinned
    if store.settled()[1] < v and not (background.await_built(store).built
                                       or store.settled()[1] >= v):
        raise _refused(503, "Service Unavailable", f"version {v}'s packs are being built; retry later",
                       [("Retry-After", "30")])
    return v


def _header(ctx, store, version: int) -> tuple[bytes, list[str], bool]:
    """The bundle's header, the values it names, and whether every ref is in it."""
    config = UploadConfig.parse(ctx.config)
    snap = store.snapshot_at(version, ctx.namespace)
    hidden = config.hidden
    refs = [r for r in snap.refs if not r.symref_target
            and not hidden.hidden(r.name, snap.namespace_prefix + r.name)]
    lines = []
    if snap.head is not None and not hidden.hidden("HEAD", snap.namespace_prefix + "HEAD"):
        lines.append(f"{snap.head.oid} HEAD\n")
    lines += [f"{r.oid} {r.name}\n" for r in refs]
    whole = not ctx.namespace and len(refs) == len([r for r in snap.refs if not r.symref_target])
    values = sorted({r.oid for r in refs} | ({snap.head.oid} if snap.head is not None else set()))
    return MAGIC + "".join(lines).encode("utf-8", "surrogateescape") + b"\n", values, whole


def _write_pack(ctx, store, version: int, values: list[str], whole: bool, out) -> None:
    if whole:
        from ..planner.plan import clone_plan  # startup
        from .planned import prepare  # startup

        def version_pack(v: int) -> Optional[str]:
            got = store.version_pack(v)
            return None if got is None else got[0][0]
        plan = clone_plan(version, store.segment_packs(), version_pack)
        if plan is not None:
            splice = prepare(store.packs_dir, plan, None, id_bytes(ctx.config.object_format))
            try:
                for chunk in splice.chunks():
                    out.write(chunk)
            finally:
                splice.close()
            return
    try:
        reinject.ensure(store, ctx.repository, values, version)
    except reinject.ReinjectError as e:
        raise _refused(410, "Gone", f"version {version}'s objects are gone: {e}") from None
    out.flush()
    proc = gitexec.start(["pack-objects", "--stdout", "--revs", "--delta-base-offset", "-q"], cwd=ctx.gitdir,
                         env=ctx.env, stdout=out, stderr=None)
    assert proc.stdin is not None                       # a PIPE (gitexec.start's own)
    try:
        proc.stdin.write("".join(f"{v}\n" for v in values).encode())
        proc.stdin.close()
    finally:
        rc = proc.wait()
    if rc != 0:
        raise _refused(500, "Internal Server Error", f"pack-objects failed ({rc})")


def bundle_file(ctx, pin: Optional[Pin]) -> BundleFile:
    """The bundle of the latest built version, or of PIN's, built when first
    asked for (or, for the advertised one, after the compaction that moved
    it: fetch/bundlekeep.py)."""
    store = ctx.refstore()
    if store is None:
        raise _refused(404, "Not Found", "this repository has no ref store: no bundle")
    version = _version(ctx, store, pin)
    header, values, whole = _header(ctx, store, version)
    key = hashlib.sha256(header + ctx.config.object_format.encode()).hexdigest()[:16]
    directory = os.path.join(os.path.dirname(store.path), DIRECTORY)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"bundle-{version}-{key}.bundle")
    if not os.path.exists(path):
        with open(os.path.join(directory, f".{key}.lock"), "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not os.path.exists(path):
                tmp = f"{path}.tmp-{os.getpid()}"
                try:
                    with open(tmp, "wb") as f:
                        f.write(header)
                        _write_pack(ctx, store, version, values, whole, f)
                        f.flush()
                        os.fsync(f.fileno())
                    os.rename(tmp, path)
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
                ctx.trace["cache"] = "cold"
                _evict(directory, path)
    st = os.stat(path)
    try:
        os.utime(path, (time.time(), st.st_mtime))     # its use (atime), for eviction; Last-Modified stays
    except OSError:
        pass
    n = id_bytes(ctx.config.object_format)
    with open(path, "rb") as f:
        f.seek(st.st_size - n)
        trailer = f.read(n).hex()
    return BundleFile(path, st.st_size, version, f'"{version}-{key}-{trailer[:16]}"', st.st_mtime, pin is not None)


def _evict(directory: str, keep: str) -> None:
    """Remove all but the KEEP most recently used bundles (an open one stays readable)."""
    files = []
    for name in os.listdir(directory):
        if name.startswith("bundle-") and name.endswith(".bundle"):
            p = os.path.join(directory, name)
            try:
                files.append((os.stat(p).st_atime, p))
            except OSError:
                pass
    for _, p in sorted(files, reverse=True)[KEEP:]:
        if p != keep:
            try:
                os.unlink(p)
            except OSError:
                pass
