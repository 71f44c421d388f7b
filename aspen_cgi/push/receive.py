"""The receive-pack service: the advertisement (with `push-cert=<nonce>`
when signed pushes are on), and a push end to end as stock receive-pack
does it (commands and certificate, pack intake into a quarantine,
connectivity, receive.* checks, hooks, ref updates, report-status)."""

from __future__ import annotations

import os
from typing import Iterable, Iterator

from .. import AGENT
from ..git.reader import read_refs, shallow_roots
from ..model.refs import HiddenRefs, namespace_prefix
from ..protocol import advertise as adv
from ..runtime.memo import Memo


def _caps(ctx) -> adv.ReceiveCaps:
    c = ctx.config
    nonce = None
    if c.has("receive.certnonceseed"):
        from .signed import NoncePolicy  # startup: only where signed pushes are on
        nonce = NoncePolicy.from_config(c).issue()
    return adv.ReceiveCaps(
        atomic=c.bool("receive.advertiseatomic", True),
        ofs_delta=c.bool("repack.usedeltabaseoffset", True),
        push_options=c.bool("receive.advertisepushoptions", False),
        push_cert_nonce=nonce,
        agent=AGENT,
        object_format=c.object_format,
    )


def _alternate_tips(ctx) -> list[str]:
    """Tips of the repositories in objects/info/alternates, offered as `.have`."""
    try:
        with open(os.path.join(ctx.gitdir, "objects", "info", "alternates")) as f:
            paths = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    except OSError:
        return []
    tips = []
    for path in paths:
        objects = path if os.path.isabs(path) else os.path.normpath(os.path.join(ctx.gitdir, "objects", path))
        repo = os.path.dirname(objects)
        if os.path.isdir(repo):
            tips += [r.oid for r in read_refs(repo, ctx.env.without("GIT_DIR")).refs]
    return tips


def advertise_lines(ctx, snap=None, alternates=None) -> list[tuple[str, str]]:
    """write_head_info(): visible refs, refs outside the namespace and
    alternates' tips as `.have` (each object once)."""
    hidden = HiddenRefs.from_config(ctx.config, "receive")
    prefix = ""
    snap = snap if snap is not None else ctx.snapshot(None)
    if ctx.namespace:
        prefix = namespace_prefix(ctx.namespace)
    seen: set[str] = set()
    lines = []
    for ref in snap.refs:
        full = ref.name
        name = full[len(prefix):] if full.startswith(prefix) else None
        if hidden.hidden(name if name is not None else full, full):
            continue
        if name is None:
            if ref.oid in seen:
                continue
            name = ".have"
        seen.add(ref.oid)
        lines.append((ref.oid, name))
    for oid in (alternates if alternates is not None else _alternate_tips(ctx)):
        if oid not in seen:
            seen.add(oid)
            lines.append((oid, ".have"))
    return lines


_memo = Memo()


def advertise(ctx) -> Iterator[bytes]:
    version = ctx.protocol_version if ctx.protocol_version == 1 else 0
    snap, caps, shallow = ctx.snapshot(None), _caps(ctx), tuple(shallow_roots(ctx.gitdir))
    alternates = tuple(_alternate_tips(ctx))
    # http/replay.py may record it: not a nonce (new each time), nor alternates' refs (not among its inputs)
    ctx.trace["replayable"] = (not ctx.config.includes and ctx.pin is None and caps.push_cert_nonce is None
                               and not os.path.exists(os.path.join(ctx.gitdir, "objects", "info", "alternates")))
    key = (caps, shallow, version, alternates, ctx.namespace, HiddenRefs.from_config(ctx.config, "receive").patterns)
    return iter([_memo.get(snap, key, lambda: b"".join(
        adv.receive_v0(advertise_lines(ctx, snap, alternates), caps, shallow, version)))])


def serve(ctx, body) -> Iterable[bytes]:
    """Answer one push request. Everything up to the end of the pack is read
    before the first chunk is produced, so a bad or short body becomes an
    HTTP error; later failures are reported in the protocol."""
    from .flow import Push  # startup
    return Push(ctx, body).run()
