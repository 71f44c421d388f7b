"""The upload-pack service: Aspen writes the advertisements and ls-refs itself,
parses every fetch into a FetchRequest, and answers it from stored version
packs when the planner proves a plan (protocol v2, and v0/v1 rounds whose
haves are all commits the ref store knows: version tips, or commits a
version introduced, which a client walks back through). A round the planner
cannot prove goes to git, open or `done`, so the negotiation is stock's own:
answering open rounds with Aspen's acknowledgments (every have common, no
`ready`) had clients send more rounds, and git's answer at their end was
larger than stock's (random-fetch tiny: 9 of 100 fetches over 1.02x stock's
bytes, the worst 1.19x; 4 and 1.08x without, with the same plan share).
Every other request goes to git's own upload-pack as it came (exact stock
semantics), the trace saying why.

Each have's tips are looked up once per request, all haves in one query
(the known-have check and the planner share them).

Protocol v2 also advertises packfile-uris and bundle-uri (ASPEN_OFFLOAD,
ASPEN_BUNDLE_URI): a planned answer names the import pack by URI for a
client that offers packfile-uris, and the bundle-uri command is answered
here (fetch/offload.py)."""

from __future__ import annotations

import hashlib
import itertools
import time
from dataclasses import dataclass, replace
from typing import Generator, Iterable, Iterator, Mapping, Optional, Union

from ..git import gitexec
from ..git.reader import object_info, shallow_roots
from ..model.objectid import id_bytes
from ..model.refs import RefSnapshot
from ..packs import background
from ..protocol import advertise as adv
from ..protocol import pktline
from ..protocol.pktline import ProtocolError
from ..protocol.requests import FetchRequest, LsRefsRequest, OtherCommand, parse_v0, parse_v2
from ..runtime.memo import Memo
from ..runtime.statedir import state_dir
from ..service import FileBody, ServiceRefused
from .uploadconfig import ALLOW_ANY, ALLOW_REACHABLE, ALLOW_TIP, UploadConfig


def _config(ctx) -> UploadConfig:
    """The request's upload-pack configuration, parsed once (ServiceContext.service_config)."""
    if ctx.service_config is None:
        ctx.service_config = UploadConfig.parse(ctx.config)
    return ctx.service_config


def _caps(ctx) -> adv.UploadCaps:
    """The configuration's capabilities, and what Aspen adds by default: packfile-uris
    (ASPEN_OFFLOAD) and bundle-uri (ASPEN_BUNDLE_URI) where a ref store answers."""
    caps = _config(ctx).caps
    s = ctx.settings
    if (s.offload and not caps.packfile_uris) or (s.bundle_uri and s.refstore and not caps.bundle_uri):
        caps = replace(caps, packfile_uris=caps.packfile_uris or s.offload,
                       bundle_uri=s.bundle_uri and s.refstore)
    return caps


def _hidden(ctx):
    return _config(ctx).hidden.hidden


def _not_our_ref(ctx, oid: str) -> Iterator[bytes]:
    """Stock's answer to a want it refuses: one ERR pkt-line (after a 200)."""
    ctx.trace.update(plan="refused", why="not-our-ref")
    ctx.log.append(f"fatal: git upload-pack: not our ref {oid}\n")
    return iter([pktline.encode(f"ERR upload-pack: not our ref {oid}")])


def _check_allowed(ctx, req: FetchRequest) -> None:
    """v2 fetch lines the configuration does not allow: git's upload-pack dies
    on them after the headers went out (an empty 200); Aspen answers 400."""
    caps = _caps(ctx)
    if req.want_refs and not caps.allow_ref_in_want:
        raise ProtocolError(f"unexpected line: 'want-ref {req.want_refs[0][:80]}'")
    if req.filter is not None and not caps.allow_filter:
        raise ProtocolError(f"unexpected line: 'filter {req.filter[:80]}'")
    if req.sideband_all and not caps.allow_sideband_all:
        raise ProtocolError("unexpected line: 'sideband-all'")


def refused_want(ctx, req: FetchRequest) -> Optional[str]:
    """The first want the client may not have, or None.

    git's v2 upload-pack sends any object the repository holds (parse_want
    checks only that it exists), and its v0 check over HTTP feeds non-commit
    wants to `rev-list` without `--objects`, so a blob or tree only a hidden
    ref reaches passes. When some refs are hidden from the client (hideRefs,
    or refs outside its namespace) Aspen refuses, in v2, a commit that is not
    visible ref's value and that the visible refs do not reach, as v0 does;
    and in both versions an object only hidden refs reach. As in stock's
    is_our_ref(), allowTipSHA1InWant makes hidden tips ours and
    allowReachableSHA1InWant everything hidden refs reach; allowAnySHA1InWant
    lifts the check. Objects the repository lacks are left to git."""
    allow = _config(ctx).allow
    if not req.wants or allow & ALLOW_ANY:
        return None
    snap, hidden = _snapshot(ctx), _hidden(ctx)
    whole = ctx.snapshot(None) if snap.namespace_prefix else snap
    visible = [r for r in snap.refs if not hidden(r.name, snap.namespace_prefix + r.name)]
    if len(visible) == len(whole.refs):
        return None
    # stock's is_our_ref(): under allowTip or allowReachable a hidden ref (inside the namespace) counts as ours
    counted = list(snap.refs) if allow & ALLOW_REACHABLE else visible
    ours = _advertised(snap, hidden)
    if allow & (ALLOW_TIP | ALLOW_REACHABLE):
        ours |= {r.oid for r in snap.refs}
    rest = [w for w in dict.fromkeys(req.wants) if w not in ours]
    if not rest:
        return None
    kinds = object_info(ctx.gitdir, ctx.env, rest)
    commits = [w for w in rest if kinds.get(w, ("missing",))[0] == "commit"]
    others = [w for w in rest if kinds.get(w, ("missing",))[0] not in ("commit", "missing")]
    visible_tips = sorted({r.oid for r in counted})
    if others:
        hidden_tips = sorted({r.oid for r in whole.refs} - set(visible_tips))
        res = gitexec.git(["rev-list", "--objects", "--stdin"], cwd=ctx.gitdir, env=ctx.env,
                          input="".join(f"{t}\n" for t in hidden_tips).encode()
                          + "".join(f"^{t}\n" for t in visible_tips).encode())
        only_hidden = {line.split(" ", 1)[0] for line in res.stdout.decode().splitlines()} if res.ok else set(others)
        refused = next((w for w in others if w in only_hidden), None)
        if refused is not None:
            return refused
    if req.version != 2 or not commits:
        return None
    kinds = object_info(ctx.gitdir, ctx.env, sorted({r.peeled or r.oid for r in counted}))
    tips = [t for t, (kind, _) in kinds.items() if kind == "commit"]
    res = gitexec.git(["rev-list", "--stdin"], cwd=ctx.gitdir, env=ctx.env,
                      input="".join(f"{c}\n" for c in commits).encode() + "".join(f"^{t}\n" for t in tips).encode())
    unreachable = set(res.stdout.decode().split()) if res.ok else set(commits)
    return next((c for c in commits if c in unreachable), None)


def _snapshot(ctx) -> RefSnapshot:
    return ctx.snapshot(ctx.namespace)


_memo = Memo()


def _replayable(ctx) -> bool:
    """Whether http/replay.py may record this answer: the same request, refs and
    files give the same bytes (not with included configuration files, whose
    names and times are not among the inputs it watches; not a time-travel
    view, which is read from the store's history, not the refs it watches)."""
    return not ctx.config.includes and ctx.pin is None


def _resolve_pin(ctx, server_options=()) -> Optional[bytes]:
    """A time-travel request (model/pin.py): the version its URL or, over
    protocol v2, its server options (`aspen-version=V`, `aspen-at=T`; they
    win over the URL's) name, set on CTX; an ERR pkt-line for the client
    when it names none."""
    from ..model import pin as pins  # startup
    try:
        pin = pins.from_server_options(server_options) or ctx.pin
        if pin is not None:
            ctx.pin_to(pin)
    except pins.PinError as e:
        ctx.trace.update(plan="refused", why="pin")
        ctx.log.append(f"aspen: time travel refused: {e}\n")
        return pktline.encode(f"ERR aspen: {e}")
    return None


def _pinned_refused(ctx, req: FetchRequest) -> Optional[str]:
    """A time-travel fetch may want only what its view advertises (the visible
    refs' values and peeled tags at its version, HEAD), unless
    allowAnySHA1InWant: its git fallback is told to take any object."""
    if _config(ctx).allow & ALLOW_ANY:
        return None
    ours = _advertised(_snapshot(ctx), _hidden(ctx))
    return next((w for w in req.wants if w not in ours), None)


def _advertised(snap: RefSnapshot, hidden) -> set[str]:
    """What the advertisement shows: the visible refs' values and peeled tags, and HEAD's value."""
    ours = {x for r in snap.refs if not hidden(r.name, snap.namespace_prefix + r.name) for x in (r.oid, r.peeled) if x}
    if snap.head is not None and not hidden("HEAD", snap.namespace_prefix + "HEAD"):
        ours.add(snap.head.oid)
    return ours


def advertise(ctx) -> Iterator[bytes]:
    err = _resolve_pin(ctx)
    if err is not None:
        return iter([err])
    caps = _caps(ctx)
    ctx.trace["replayable"] = _replayable(ctx) and caps.session_id is None
    if ctx.protocol_version == 2:
        return adv.v2_capabilities(caps)
    snap, hidden, shallow = _snapshot(ctx), _config(ctx).hidden, shallow_roots(ctx.gitdir)
    key = ("v0", caps, hidden.patterns, tuple(shallow), ctx.protocol_version)
    return iter([_memo.get(snap, key, lambda: b"".join(
        adv.upload_v0(snap, caps, hidden.hidden, shallow, ctx.protocol_version)))])


def ls_refs(ctx, req: LsRefsRequest) -> Iterator[bytes]:
    """The ls-refs answer as one block (one write, not one per ref)."""
    err = _resolve_pin(ctx, req.server_options)
    if err is not None:
        return iter([err])
    snap = _snapshot(ctx)
    ctx.trace["replayable"] = _replayable(ctx)
    key = ("ls-refs", req.peel, req.symrefs, req.unborn, tuple(req.prefixes), _caps(ctx).unborn,
           _config(ctx).hidden.patterns)
    return iter([_memo.get(snap, key, lambda: b"".join(_ls_refs_lines(ctx, req, snap)))])


def _ls_refs_lines(ctx, req: LsRefsRequest, snap: RefSnapshot) -> Iterator[bytes]:
    hidden = _hidden(ctx)
    unborn = req.unborn and _caps(ctx).unborn != "ignore"
    prefixes = req.prefixes or [""]
    ns = snap.namespace_prefix

    def line(name: str, oid, symref, peeled) -> bytes:
        text = f"{oid} {name}" if oid else f"unborn {name}"
        if req.symrefs and symref:
            text += f" symref-target:{symref}"
        if req.peel and oid and peeled:
            text += f" peeled:{peeled}"
        return pktline.encode((text + "\n").encode("utf-8", "surrogateescape"))

    def wanted(name: str) -> bool:
        return not hidden(name, ns + name) and any(name.startswith(p) for p in prefixes)

    head = snap.head
    if head is not None and wanted("HEAD"):
        yield line("HEAD", head.oid, head.symref_target, head.peeled)
    elif head is None and snap.head_target is not None and unborn and req.symrefs and wanted("HEAD"):
        yield line("HEAD", None, snap.head_target, None)
    if ns and head is not None and wanted("HEAD"):
        # stock lists a namespace's HEAD twice: once as HEAD, once as the ref
        # refs/namespaces/<ns>/HEAD met while walking the namespace.
        yield line("HEAD", head.oid, head.symref_target, head.peeled)
    for ref in snap.refs:
        if wanted(ref.name):
            yield line(ref.name, ref.oid, ref.symref_target, ref.peeled)
    yield pktline.FLUSH


def bundle_uri(ctx) -> Iterator[bytes]:
    """The `bundle-uri` command (fetch/offload.py): the bundle of the last
    compaction, where the client may see every ref; else no bundle."""
    from . import offload  # startup
    ctx.trace.update(plan="bundle-uri")
    err = _resolve_pin(ctx)
    if err is not None:
        return iter([err])
    store = ctx.refstore()
    snap = _snapshot(ctx)
    if store is None or ctx.pinned is not None or _visibility(ctx, snap) is not None or not snap.refs:
        ctx.trace["why"] = "none"
        return iter([offload.bundle_uri_answer(None, 0)])
    version = offload.bundle_version(store)
    base = ctx.request.url          # Aspen's own route: the bundle is made after compaction, or on its first download
    ctx.trace.update(why="advertised" if version >= 1 and base else "none", bundle=version)
    if version >= 1 and base:
        from .demand import BUNDLE_DEMAND_FILE, note_demand  # startup
        note_demand(state_dir(ctx.gitdir, ctx.settings), BUNDLE_DEMAND_FILE)     # pushes keep it current
    return iter([offload.bundle_uri_answer(base, version)])


def git_upload_pack(ctx, data: bytes, req: Optional[FetchRequest] = None, any_want: bool = False) -> Iterable[bytes]:
    """The fallback responder: git's upload-pack, stateless, with the request
    as it came, once admission control gives it a slot (503 past the queue).
    Always git's plain upload-pack, depth-1 clones too: their wider pack
    (packhook) is built in the background for later clients (fetch/depth1.py),
    never while a client waits."""
    from ..runtime import admission  # startup
    client = ctx.request.client
    lim = admission.capacity(ctx.settings)
    if client is not None and lim.share < 100:
        ctx.trace["client"] = client.label
    try:
        slot = admission.acquire(lim, ctx.gitdir, client=client)
    except admission.Overloaded as e:
        ctx.trace["cache"] = "overloaded"
        who = ""
        if e.client and client is not None:
            ctx.trace["over_share"] = "refused"
            who = f" (client {client.label}, ASPEN_CLIENT_SHARE={lim.share}%)"
        raise ServiceRefused(503, "Service Unavailable", f"aspen: {e.why}{who}; retry after {e.retry_after} s",
                        extra=[("Retry-After", str(e.retry_after))],
                        body=b"Too many requests are waiting; retry later.\n") from None
    if slot.waited_s:
        ctx.trace["queued_ms"] = round(slot.waited_s * 1000)
        if slot.over_share:
            ctx.trace["over_share"] = "waited"
    if slot.behind:
        ctx.trace["behind"] = admission.BEHIND_NICE
    args = ["upload-pack", "--stateless-rpc", "."]
    if req is not None and req.haves and not _config(ctx).pack_threads_set:
        # git's threaded delta search splits the objects between threads, and steals
        # work, differently from run to run: one lagging-clients request got 12,586
        # bytes every time from one thread, 12,586 or 17,132 from two. A fetch with
        # haves is small; one thread answers it as stock usually does, every time.
        args = ["-c", "pack.threads=1", *args]
    if any_want:
        args = ["-c", "uploadpack.allowAnySHA1InWant=true", *args]
    try:
        stream = gitexec.git_stream(args, cwd=ctx.gitdir, env=ctx.env, input=data,
                                    lower=admission.BEHIND_NICE if slot.behind else 0)
    except BaseException:
        slot.release()
        raise
    return _Admitted(stream, slot, ctx.after_answer)


class _Admitted:
    """git's output stream, holding its admission slot until it ends; then
    AFTER runs (once, whether the stream ended or was closed early)."""

    def __init__(self, stream: gitexec.Stream, slot, after: list):
        self.stream = stream
        self.slot = slot
        self.after = after

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self.stream
        finally:
            self.slot.release()
        self._after()

    @property
    def returncode(self) -> Optional[int]:
        return self.stream.returncode

    def close(self) -> None:
        self.stream.close()
        self.slot.release()
        self._after()

    def _after(self) -> None:
        todo, self.after[:] = list(self.after), []
        for f in todo:
            try:
                f()
            except OSError:
                pass            # no builder now (no process could start): the next fetch starts one


def respond(ctx, req: FetchRequest, data: bytes) -> Iterable[bytes]:
    """The answer through the response cache (hit, shared, cold), or computed
    here when the cache is off.

    A depth-1 clone (packhook.wants_wide_pack) that misses is answered by
    git's plain upload-pack (`depth1=stock`), and its wide answer is built in
    the background for the requests after (fetch/depth1.py); later hits get
    whichever the entry holds (`depth1=wide` once built). Pre-warm (no
    client waits) builds the wide answer at once."""
    from ..cache import responses  # startup
    from . import packobjectshook as packhook  # startup
    if ctx.pinned is not None:
        return compute(ctx, req, data)      # a view of the past: no cache entries, no depth-1 builds for it
    if _offload_base(ctx, req) is not None:
        # an answer naming packs by URI is a few small stored packs spliced: not kept (its URLs
        # are the Host's the client came by, and the metrics count every answer's offloaded bytes)
        planned = _planned(ctx, req)
        if not isinstance(planned, GitAnswers):
            return planned
        ctx.trace.pop("plan", None)
        ctx.trace.pop("why", None)
    depth1 = packhook.wants_wide_pack(req, ctx.settings)
    sdir = state_dir(ctx.gitdir, ctx.settings)
    if depth1:
        ctx.trace["depth1"] = "stock"
        from . import demand
        from . import depth1 as wide  # startup
        if not wide.no_client(ctx.env):
            demand.note_demand(sdir)
    settings = responses.settings(sdir, ctx.settings)
    if settings is None:
        return compute(ctx, req, data)
    key = _cache_key(ctx, data)
    interim = None
    if depth1:
        job = wide.Job(settings, key.name, key.version, ctx.gitdir, dict(ctx.env), data)
        interim = lambda: wide.kick(job, background.IN_PROCESS)      # noqa: E731
        if wide.no_client(ctx.env) and not wide.done(job):
            ctx.trace.update(cache="prewarm", depth1="wide")
            return _prewarmed(ctx, wide.build(job, wait=True, log=ctx.log.append),
                              lambda: _cached(ctx, settings, responses.answer(
                                  settings, key, lambda: compute(ctx, req, data), ctx.log, interim)))
    return _cached(ctx, settings, responses.answer(settings, key, lambda: compute(ctx, req, data), ctx.log, interim,
                                                   _judge(ctx)))


def _judge(ctx):
    """What the cache keeps of this request's answer (what made it) and when
    git's answer made while packs were unbuilt gives way to a planned one."""
    from ..cache import entries  # startup
    from ..cache.responses import Judge  # startup

    def kind() -> int:
        plan, why = ctx.trace.get("plan"), ctx.trace.get("why")
        if plan == "planned":
            return entries.PLANNED
        return entries.GIT_UNBUILT if why == "not-built" else entries.GIT if plan == "fallback" else 0

    def better() -> bool:
        store = ctx.refstore()
        return store is not None and store.all_packs_built()

    def superseded() -> None:
        ctx.trace["entry"] = "superseded"

    def stale(created_ns: int) -> bool:
        store = ctx.refstore()
        at = store.import_built_at() if store is not None else None
        return at is not None and at * 1e9 > created_ns
    return Judge(kind, better, superseded, stale)


def _cached(ctx, settings, answer) -> Iterable[bytes]:
    from ..cache import responses  # startup
    ctx.trace["cache"] = answer.mark
    if isinstance(answer.body, responses.EntryFile):
        from ..cache.entries import DEPTH1_LABELS, DEPTH1_STOCK, GIT_UNBUILT, KIND_LABELS  # startup
        if answer.body.kind:
            ctx.trace["entry"] = KIND_LABELS[answer.body.kind]
        if (answer.mark == "hit" and answer.body.depth1 != DEPTH1_STOCK and answer.body.kind != GIT_UNBUILT
                and _import_final(ctx) and _replayable(ctx)):
            # http/replay.py: the same request, refs and settings get this entry again
            effects = responses.replay_effects(settings, answer.body)
            if "depth1" in ctx.trace:
                from .demand import demand_effect  # startup
                effects.append(demand_effect(state_dir(ctx.gitdir, ctx.settings)))
            ctx.trace.update(replayable=True, replay_file=responses.entry_span(answer.body), replay_effects=effects)
        if "depth1" in ctx.trace:           # what the entry holds (an entry older than the marks: unknown)
            label = DEPTH1_LABELS.get(answer.body.depth1)
            if label:
                ctx.trace["depth1"] = label
            else:
                del ctx.trace["depth1"]
        return FileBody(answer.body.file, answer.body.length)
    return answer.body


def _import_final(ctx) -> bool:
    """No replay is recorded while the import's pack waits to be built wide:
    a recorded answer lasts while the refs do, and a planned entry made
    before the import's pack was built again gives way (_judge)."""
    store = ctx.refstore()
    return store is None or background.import_final(store)


def _prewarmed(ctx, built: Generator[bytes, None, None], otherwise) -> Iterator[bytes]:
    """Pre-warm's answer: the wide one as it is built; when another build had
    it (nothing came), the answer a client would get now (a hit)."""
    sent = 0
    try:
        for chunk in built:
            sent += len(chunk)
            yield chunk
    finally:
        built.close()
    if not sent:
        body = otherwise()
        try:
            yield from body
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()


def _cache_key(ctx, data: bytes):
    from ..cache.key import fetch_key  # startup
    store = ctx.refstore()
    snap = _snapshot(ctx)
    refs_digest = _memo.get(snap, ("digest",), lambda: _digest(snap)).decode()
    extra = [f"{k}={v}" for k, v in sorted(ctx.env.items()) if k == "GIT_TEST_SIDEBAND_ALL"]   # GIT_CONFIG_*: in the entries
    return fetch_key(ctx.gitdir, store.version if store is not None else 0, refs_digest, ctx.protocol_version,
                     ctx.namespace, ctx.config.entries, shallow_roots(ctx.gitdir), extra, data)


def _digest(snap: RefSnapshot) -> bytes:
    h = hashlib.sha256(repr((snap.head, snap.head_target, snap.namespace_prefix)).encode())
    for r in snap.refs:
        h.update(f"{r.name}\0{r.oid}\0{r.peeled}\0{r.symref_target}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest().encode()


def compute(ctx, req: FetchRequest, data: bytes) -> Iterable[bytes]:
    """A planned answer from stored packs when the planner proves one, else git's."""
    planned = _planned(ctx, req)
    if isinstance(planned, GitAnswers):
        if ctx.pinned is not None:
            return _git_pinned(ctx, req, data)
        return git_upload_pack(ctx, data, req)
    return planned


def _git_pinned(ctx, req: FetchRequest, data: bytes) -> Iterable[bytes]:
    """git answers a time-travel fetch the planner did not: the objects its
    wants reach are put back from the version packs first where gc pruned
    them (packs/reinject.py), and git takes wants no current ref reaches
    (Aspen checked them against the view: _pinned_refused)."""
    from ..packs import reinject  # startup
    store = ctx.refstore()
    try:
        back = reinject.ensure(store, ctx.repository, req.wants, ctx.pinned)
    except reinject.ReinjectError as e:
        ctx.log.append(f"aspen: time travel: {e}\n")
        ctx.trace.update(plan="refused", why="objects-gone")
        return iter([pktline.encode(f"ERR aspen: version {ctx.pinned}'s objects are no longer in the repository"
                                    f" and no stored pack holds them ({e})")])
    if back:
        ctx.trace["reinjected"] = ",".join(map(str, back))
    return git_upload_pack(ctx, data, req, any_want=True)


@dataclass(frozen=True)
class GitAnswers:
    """No answer from stored packs: git upload-pack answers the request; WHY
    is the reason the access line gives (`plan=fallback why=...`)."""
    why: str


def _planned(ctx, req: FetchRequest) -> Union[Iterator[bytes], GitAnswers]:
    """Aspen's answer, or GitAnswers. v2: fetches without want-ref,
    wait-for-done or sideband-all (packfile-uris too where
    uploadpack.blobPackfileUri is set: git's own); a plan proved from a
    round's haves ends the negotiation there (`ready`), naming the import
    pack by URI where the client offers packfile-uris (fetch/offload.py).
    v0/v1: one stateless
    round whose haves are all version tips (see `_v0_reason`). Everything
    else, and every round the store cannot prove, is git's (the trace says
    why)."""
    ctx.trace["protocol"] = ctx.protocol_version
    why = _request_reason(ctx, req)
    store = ctx.refstore() if why is None else None
    if why is None:
        # before any work over the refs: the common case without version packs
        why = "no-store" if store is None else None if _built(ctx, store) else "not-built"
    if why is not None:
        return _fallback(ctx, why)
    assert store is not None                    # why would be "no-store"
    from ..planner.plan import Fallback  # startup
    from .history import PinnedHistory, StoreHistory  # startup
    history = StoreHistory(store) if ctx.pinned is None else PinnedHistory(store, ctx.pinned)
    # haves that are no version's ref value must be commits a version introduced (ancestors
    # a client walks back through) to be known common, as stock acknowledges them
    unknown = [h for h, t in history.tips_many(req.haves).items() if not t.tips]
    known = all(history.introduced_by(h) for h in unknown)
    if ctx.protocol_version != 2 and not known:
        return _fallback(ctx, "unknown-have")
    stock_ends = _StockEnds(ctx, req, history)
    result = _plan(ctx, req, history, None if req.done else stock_ends)
    if isinstance(result, Fallback) and result.candidate is not None:
        result = _checked(ctx, req, store, history, result, stock_ends)
    if isinstance(result, Fallback):
        if result.detail:
            ctx.trace["unproved"] = result.detail
        return _fallback(ctx, result.reason)
    offloaded = _offloaded(ctx, req, store, history, result)      # before the whole plan's packs are opened
    if offloaded is not None:
        return offloaded
    splice = _prepare(ctx, store, result, history.indexes)
    if isinstance(splice, GitAnswers):
        return splice
    splice, result = _span(ctx, store, history, result, splice)
    if isinstance(splice, GitAnswers):
        return splice
    ctx.trace.update(plan="planned", extents=len([n for n in result.packs if n]), objects=splice.objects)
    from . import planned as responder  # startup
    if ctx.protocol_version == 2:
        return responder.v2_packfile(splice, result, progress=not req.has_capability("no-progress"),
                                     ready=not req.done)
    return _v0_response(ctx, req, splice, result)


def _offload_base(ctx, req: FetchRequest) -> Optional[str]:
    """Where this answer's packs would be named from (fetch/offload.py), or
    None: offload off, the client offers no scheme the URL has, a view of
    the past, some refs hidden from the client, git's own packfile-uris."""
    from . import offload  # startup
    if (not ctx.settings.offload or req.packfile_uris is None or ctx.pinned is not None
            or ctx.protocol_version != 2 or _config(ctx).caps.packfile_uris):
        return None
    base = offload.repo_base(ctx.settings, ctx.request.url, ctx.request.url_path)
    if base is None or not offload.scheme_offered(base, offload.protocols(req.packfile_uris)):
        return None
    if _visibility(ctx, _snapshot(ctx)) is not None:
        return None
    return base


def _offloaded(ctx, req: FetchRequest, store, history, result) -> Optional[Iterator[bytes]]:
    """The planned answer with the import pack named by URI, or None (sent
    inline). Only the rest's packs are opened: opening the import pack (its
    offsets sorted to check its index) costs ~1 s of CPU on git.git."""
    from ..packs.packfile import PackError  # startup
    from . import offload  # startup
    base = _offload_base(ctx, req)
    if base is None:
        return None
    imported = history.pack_of(1)
    try:
        off = offload.plan_offload(store.packs_dir, result, imported.name if imported is not None else None, base,
                                   ctx.settings.offload_min_bytes, history.indexes,
                                   id_bytes(ctx.config.object_format))
    except (PackError, OSError) as e:
        ctx.log.append(f"aspen: offload: stored packs unusable ({e}); sent inline\n")
        return None
    if off is None:
        ctx.trace["offload"] = "inline"
        return None
    ctx.trace.update(plan="planned", extents=len([n for n in result.packs if n]), objects=off.inline.objects,
                     offload="uri", offload_bytes=sum(u.size for u in off.uris), offload_chain=off.chain_objects)
    return offload.v2_offloaded(off, result, progress=not req.has_capability("no-progress"), ready=not req.done)


def _built(ctx, store) -> bool:
    """Every version has its pack (waiting a little for a running build);
    for a time-travel fetch, every version up to its own (the history
    PinnedHistory reads)."""
    def pinned_built() -> bool:
        return ctx.pinned is not None and store.settled()[1] >= ctx.pinned
    if pinned_built():
        return True
    waited = background.await_built(store, later=ctx.after_answer)
    if not waited.built or waited.waited:
        ctx.trace["build_wait_ms"] = round(waited.waited * 1000, 1)
    return waited.built or pinned_built()


def _request_reason(ctx, req: FetchRequest) -> Optional[str]:
    why = req.needs_fallback_reason
    if why is not None:
        return why
    if shallow_roots(ctx.gitdir):
        return "shallow-repository"     # its answers carry shallow lines; stored packs know none
    if ctx.protocol_version != 2:
        return _v0_reason(req)
    if req.packfile_uris is not None and _config(ctx).caps.packfile_uris:
        return "packfile-uris"          # uploadpack.blobPackfileUri: git's own packfile-uris
    if req.want_refs or req.wait_for_done:
        return "want-ref" if req.want_refs else "wait-for-done"
    if req.sideband_all:
        return "sideband-all"           # every section framed on band 1, or refused when not allowed: git's
    return None


def _v0_reason(req: FetchRequest) -> Optional[str]:
    """Aspen answers one stateless round: haves then `done`, or haves then a
    flush answered `ready` (multi_ack_detailed, the only mode whose ACKs
    Aspen writes; a clone without haves needs none)."""
    if req.rounds != 1:
        return "rounds"
    if req.later_capabilities:
        return "later-capabilities"
    if req.haves and not req.has_capability("multi_ack_detailed"):
        return "no-multi-ack-detailed"
    if not req.haves and not req.done:
        return "empty-round"
    return None


def _fallback(ctx, why: str) -> GitAnswers:
    ctx.trace.update(plan="fallback", why=why)
    return GitAnswers(why)


def _plan(ctx, req: FetchRequest, history, stock_ends: Optional["_StockEnds"]):
    """The planner's answer; STOCK_ENDS (a round without `done`): a plan
    holding commits it could not prove is made only when stock would end
    the round, asked at its first holder (its time is check_us, not
    planning's)."""
    from ..packs.packfile import PackError  # startup
    from ..planner.plan import Fallback, plan  # startup
    snap, hidden = _snapshot(ctx), _hidden(ctx)
    visible = [r for r in snap.refs if not hidden(r.name, snap.namespace_prefix + r.name)]
    advertised = frozenset({r.oid for r in visible} | {r.peeled for r in visible if r.peeled})
    t0 = time.perf_counter()
    try:
        result = plan(req, history, advertised, _annotated_tags(ctx, snap), _visibility(ctx, snap),
                      frozenset(r.oid for r in snap.refs if r.peeled), stock_ends)
    except (PackError, OSError) as e:
        ctx.log.append(f"aspen: stored pack index unusable ({e}); git answers\n")
        result = Fallback("pack-error")
    micros = (time.perf_counter() - t0 - (stock_ends.seconds if stock_ends else 0.0)) * 1e6
    ctx.trace.update(plan_us=round(micros), visits=f"{result.versions_visited}+{result.segments_visited}",
                     versions_visited=result.versions_visited, segments_visited=result.segments_visited,
                     lookups=result.lookups)
    return result


def _stock_ends(ctx, req: FetchRequest, history, tags: Mapping[str, str]) -> bool:
    """Whether stock would end the negotiation in this open round (plancheck).
    A plan that needs versions only to hold commits it could not prove held
    is sent in an open round only then: the client has not listed all it
    has, and may hold those versions' objects (git.git's stale-branch: a
    client current on trunk whose first round of haves was older tagged
    commits was sent 10 trunk pushes again, 3.69x stock's bytes)."""
    from . import plancheck  # startup
    t0 = time.perf_counter()
    ready: Optional[bool]
    ready = plancheck.may_be_ready(history, req.wants, req.haves, tags)
    by = "store"
    if ready:
        ready = plancheck.store_ready(history, req.wants, req.haves, tags)
        if ready is None:
            ready, by = plancheck.stock_ready(ctx.gitdir, ctx.env, req.wants, req.haves, tags), "git"
    ctx.trace.update(checked="ready" if ready else "not-ready", ready_by=by,
                     check_us=round((time.perf_counter() - t0) * 1e6))
    return ready


class _StockEnds:
    """Whether stock would end this open round (_stock_ends), asked at most
    once a request (the planner's first holder, then _checked); SECONDS:
    how long asking took."""

    def __init__(self, ctx, req: FetchRequest, history):
        self.ctx, self.req, self.history = ctx, req, history
        self.answer: Optional[bool] = None
        self.seconds = 0.0

    def __call__(self) -> bool:
        if self.answer is None:
            t0 = time.perf_counter()
            tags = _annotated_tags(self.ctx, _snapshot(self.ctx))
            self.answer = _stock_ends(self.ctx, self.req, self.history, tags)
            self.seconds = time.perf_counter() - t0
        return self.answer


def _checked(ctx, req: FetchRequest, store, history, refused, stock_ends: _StockEnds):
    """The refused plan's candidate when git's object walk for the request
    lists every object of its packs and stock would pack that walk in this
    round (plancheck.py), else the fallback. In a round without `done`,
    stock's readiness is settled first (the store's recorded parents, then
    git's commits): the candidate is walked only for a round stock ends (its
    walk counts as planning time)."""
    from . import plancheck  # startup
    t0 = time.perf_counter()
    from ..planner.plan import EXTRA_OBJECTS  # startup
    if refused.detail == "import" or (refused.reason == EXTRA_OBJECTS and not req.haves):
        imported = history.pack_of(1)
        if plancheck.import_too_large(store.packs_dir, imported.name if imported is not None else None):
            ctx.trace.update(checked="too-large")
            return refused
    tags = _annotated_tags(ctx, _snapshot(ctx))
    if not req.done and not stock_ends():
        return refused
    t1 = time.perf_counter()
    candidate = refused.candidate.plan()
    walked = time.perf_counter() - t1
    ctx.trace["plan_us"] = ctx.trace.get("plan_us", 0) + round(walked * 1e6)
    if candidate is None:
        return refused
    commits = () if candidate.partial else sorted({c for v in candidate.versions
                                                   for c in history.introduced_commits(v)})
    verdict = plancheck.check(ctx.gitdir, ctx.env, store.packs_dir, candidate.packs, req.wants, req.haves, tags,
                              req.has_capability("include-tag"), history.indexes, candidate.partial, commits)
    ctx.trace.update(checked=verdict.why or "ok",
                     check_us=round((time.perf_counter() - t0 - walked) * 1e6))
    if not verdict.ok:
        return refused
    return candidate if verdict.only is None else replace(candidate, only=verdict.only)


def _visibility(ctx, snap: RefSnapshot):
    """None when the client may see every ref of the repository; else the
    test of a stored (full) ref name: inside the namespace and not hidden."""
    hidden = _config(ctx).hidden
    prefix = snap.namespace_prefix
    if not prefix and not hidden:
        return None

    def visible(full: str) -> bool:
        if not full.startswith(prefix):
            return False
        return not hidden.hidden(full[len(prefix):], full)
    return visible


def _annotated_tags(ctx, snap: RefSnapshot) -> dict[str, str]:
    """What git's include-tag looks at: every annotated refs/tags/* ref of the
    repository, hidden or not, outside any namespace -> its peeled object."""
    if snap.namespace_prefix:
        snap = ctx.snapshot(None)
    return {r.oid: r.peeled for r in snap.refs if r.peeled and r.name.startswith("refs/tags/")}


def _span(ctx, store, history, result, splice):
    """The plan's splice, or one span pack over the same objects when that is
    smaller (packs/spanpack.py): (splice, plan) to send; (GitAnswers, plan)
    when a pack became unusable meanwhile."""
    from ..packs import spanpack  # startup
    if result.only is not None or not spanpack.worth(result.thin, result.packs, splice.size):
        return splice, result
    k = spanpack.key(result.packs)
    name = spanpack.recorded(store.packs_dir, k)
    if name is None:
        values = [x for v in result.versions for x in history.version_values(v)]
        built = spanpack.make(ctx.repository, store.packs_dir, values, result.held, splice.size)
        name = built.name if built is not None else spanpack.SPLICE
        spanpack.record(store.packs_dir, k, name)
        ctx.trace["span"] = "built" if name != spanpack.SPLICE else "spliced"
    else:
        ctx.trace["span"] = "kept" if name != spanpack.SPLICE else "spliced"
    if name == spanpack.SPLICE:
        return splice, result
    splice.close()
    one = replace(result, versions=(result.versions[-1],), packs=(name,), thin=(True,),
                  firsts=(result.firsts[0] if result.firsts else result.versions[0],))
    return _prepare(ctx, store, one), one


def _prepare(ctx, store, result, indexes=None):
    """The plan's packs opened and checked, or GitAnswers when they are unusable."""
    from ..packs.packfile import PackError  # startup
    from . import planned as responder  # startup
    try:
        return responder.prepare(store.packs_dir, result, indexes,
                                 id_bytes(ctx.config.object_format))
    except (PackError, OSError) as e:
        ctx.log.append(f"aspen: stored packs unusable ({e}); git answers\n")
        return _fallback(ctx, "pack-error")


def _v0_response(ctx, req: FetchRequest, splice, result) -> Iterator[bytes]:
    """The ACK/NAK lines of the round, then the pack unless the round ended
    `ready` without no-done (the client says `done` next and is planned again)."""
    from . import planned as responder  # startup
    acks, pack_follows = responder.v0_acks(req.haves, req.done, req.has_capability("no-done"))
    ctx.trace["why"] = "done" if req.done else "no-done" if pack_follows else "ready"
    if not pack_follows:
        splice.close()
        ctx.trace["objects"] = 0
        return iter([acks])
    sideband = (responder.BAND_DATA if req.has_capability("side-band-64k")
                else responder.SIDEBAND_DATA if req.has_capability("side-band") else 0)
    pack = responder.v0_pack(splice, result, sideband, progress=not req.has_capability("no-progress"))
    return itertools.chain([acks], pack)


def serve(ctx, data: bytes) -> Iterable[bytes]:
    if ctx.protocol_version == 2:
        req = parse_v2(data)
        if req is None:
            return iter(())
        if isinstance(req, LsRefsRequest):
            return ls_refs(ctx, req)
        if isinstance(req, OtherCommand):
            if req.name == "bundle-uri" and _caps(ctx).bundle_uri:
                return bundle_uri(ctx)
            return git_upload_pack(ctx, data)
        err = _resolve_pin(ctx, req.server_options)
        if err is not None:
            return iter([err])
        _check_allowed(ctx, req)
        refused = refused_want(ctx, req) if ctx.pinned is None else _pinned_refused(ctx, req)
        if refused is not None:
            return _not_our_ref(ctx, refused)
        return respond(ctx, req, data)
    req = parse_v0(data)
    if not req.wants:
        return iter(())
    err = _resolve_pin(ctx)
    if err is not None:
        return iter([err])
    refused = refused_want(ctx, req) if ctx.pinned is None else _pinned_refused(ctx, req)
    if refused is not None:
        return _not_our_ref(ctx, refused)
    return respond(ctx, req, data)
