"""The request pipeline of stock's cmd_main(): method, path, route, repository,
export check, configuration, then one handler. Returns a Response; adapters
(CGI, WSGI) only frame it."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import Iterator, Mapping, Optional

from .. import settings
from ..git.gitexec import GitEnv
from ..git.repoconfig import ConfigError, RepoConfig
from ..model import refs as refs_mod
from ..model.pin import Pin, split_url
from ..model.trace import Trace
from ..protocol import pktline
from ..protocol.pktline import ProtocolError
from ..service import FileBody, RequestInfo, ServiceContext, ServiceRefused, child_env, service_enabled
from . import client as clients
from . import dumb, paths, routes
from . import headers as H
from .accesslog import METRICS_KEY
from .body import Body, BodyError, max_request_buffer, parse_content_length, read_upload_request
from .limits import Limits
from .message import HttpError, Request, Response
from .query import parameters

SERVICES = ("upload-pack", "receive-pack")
# A push refused as too large: what of the rest of its body is read and dropped, so the client reads the 413
DISCARD_MIN = 64 << 20
METRICS_PATH = "/_aspen/metrics"     # metrics.PATH (kept here so that the 404 path does not load metrics.py)
PEER_PACKS_PATH = "/_aspen/packs/"   # peers.PREFIX: packs between a cluster's nodes (http/peerpacks.py)


def _forbidden(msg: str, prefix: list[tuple[str, str]]) -> HttpError:
    return HttpError(403, "Forbidden", msg, headers=prefix)


def _note_service(seen: dict, name: str) -> None:
    """The service a request names, for its access line even when it is refused (403)."""
    if name.startswith("git-") and name[4:] in SERVICES:
        seen["service"] = name[4:]


def select_service(name: str, config: RepoConfig, env: Mapping[str, str], prefix) -> str:
    if not name.startswith("git-") or name[4:] not in SERVICES:
        raise _forbidden(f"Unsupported service: '{name}'", prefix)
    svc = name[4:]
    if not service_enabled(svc, config, env.get("REMOTE_USER")):
        raise _forbidden(f"Service not enabled: '{svc}'", prefix)
    return svc


def _getanyfile(config: RepoConfig, prefix) -> None:
    try:
        ok = config.bool("http.getanyfile", True)
    except ConfigError:
        ok = True
    if not ok:
        raise _forbidden("Unsupported service: getanyfile", prefix)


def handle(req: Request) -> Response:
    """Answer one request. Never raises: every failure is a Response."""
    seen: dict = {"started_ns": time.time_ns()}     # before anything is read (http/pollwrite.py)
    where = _metrics_dir(req.env)
    try:
        resp = _handle(req, seen)
    except HttpError as e:
        resp = error_response(e, seen)
    except BodyError as e:
        resp = error_response(HttpError(e.status, e.reason, "fatal: " + e.message), seen)
    except ProtocolError as e:
        resp = error_response(HttpError(400, "Bad Request", f"fatal: {e}"), seen)
    except ServiceRefused as e:
        resp = error_response(HttpError(e.status, e.reason, e.log, extra=e.extra, body=e.body), seen)
    except Exception:
        import traceback  # startup
        resp = error_response(HttpError(500, "Internal Server Error",
                                        "aspen: internal error\n" + traceback.format_exc()), seen)
    if where is not None:
        resp.trace[METRICS_KEY] = where      # counted as the adapter closes the response (accesslog.Counted)
    return resp


def _metrics_dir(env: Mapping[str, str]) -> Optional[str]:
    """Where this server counts (ASPEN_METRICS=1), or None; metrics.py loads only when it is on."""
    if not settings.of(env).metrics:
        return None
    from ..runtime import metrics  # startup
    return metrics.prepare(settings.of(env))


# What an error response's access line keeps of the request it ended: the repository, the
# service, and of the service's trace the ref-store version, the cache's mark (a 503 from
# admission says `cache=overloaded`), the client admission counted and whether its share refused it.
# Not the plan: no fetch was answered.
_ERROR_TRACE = ("version", "cache", "client", "over_share")


def error_response(e: HttpError, seen: Optional[dict] = None) -> Response:
    hdrs = list(e.prefix) + [("Status", f"{e.status} {e.reason}")] + e.extra + H.nocache()
    trace = Trace()
    if seen:
        ctx_trace = seen.get("trace") or {}
        trace.update({k: ctx_trace[k] for k in _ERROR_TRACE if k in ctx_trace})
        trace.update({k: seen[k] for k in ("repo", "service") if k in seen})
    return Response(e.status, e.reason, hdrs, [e.body] if e.body else [], [e.log] if e.log else [], trace)


def _metrics_response(env: Mapping[str, str]) -> Response:
    """The server's metrics in Prometheus' text format (metrics.PATH, ASPEN_METRICS=1)."""
    from ..runtime import metrics  # startup: only with ASPEN_METRICS=1
    from . import metricspage  # startup
    body = metrics.exposition(metricspage.snapshot(env)).encode()
    hdrs = H.nocache() + [("Content-Length", str(len(body))), ("Content-Type", metrics.CONTENT_TYPE)]
    return Response(200, "OK", hdrs, [body], trace=Trace(service="metrics"))


@dataclass
class _Call:
    """One routed request, as its handler sees it: stock's cmd_main() state
    once the repository is entered and its configuration read."""
    req: Request
    seen: dict
    repo: paths.Repo
    config: RepoConfig
    cenv: GitEnv
    namespace: Optional[str]
    arg: str                # the matched text without its leading '/'
    route: routes.Route
    max_buffer: int
    pin: Optional[Pin] = None   # `repo.git@V/…`: a read-only view of version V (model/pin.py)
    repo_dir: str = ""          # the repository's path in the URL (PATH_INFO before its route)

    @property
    def env(self) -> Mapping[str, str]:
        return self.req.env

    def context(self, protocol: Optional[int] = None) -> ServiceContext:
        s = settings.of(self.env)
        info = replace(RequestInfo.of(self.cenv, protocol, clients.of(self.env, s)), url=repo_url(self.env, self.repo_dir),
                       url_path=self.repo_dir)
        ctx = ServiceContext(self.repo, self.config, self.cenv, info, [], s, pin=self.pin)
        if ctx.settings.pack_store or ctx.settings.node_url:
            # a cluster's node: its copy at the log's latest version before anything is read or
            # received (a push's thin pack names bases another node advertised)
            ctx.refstore()
        return ctx

    def snapshot(self) -> refs_mod.RefSnapshot:
        return self.context(0).snapshot(self.namespace)


def repo_url(env: Mapping[str, str], repo_dir: str) -> str:
    """The repository's URL as the client reached it: scheme (HTTPS=on, else
    REQUEST_SCHEME, else http), Host, SCRIPT_NAME and the repository's path."""
    scheme = "https" if env.get("HTTPS", "").lower() in ("on", "1") else env.get("REQUEST_SCHEME") or "http"
    host = env.get("HTTP_HOST") or f"{env.get('SERVER_NAME', 'localhost')}:{env.get('SERVER_PORT', '80')}"
    path = (env.get("SCRIPT_NAME", "") + repo_dir).encode("utf-8", "surrogateescape")
    return f"{scheme}://{host}" + "".join(chr(b) if b in _URL_SAFE else f"%{b:02X}" for b in path)


_URL_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~/@:+!$&()*,;=")


def _head(c: _Call) -> Response:
    _getanyfile(c.config, [])
    return dumb.strbuf([], "text/plain", dumb.head_body(c.snapshot()))


def _info_refs(c: _Call) -> Response:
    params = parameters(c.env.get("QUERY_STRING", ""))
    prefix = H.nocache()
    if "service" not in params:
        if c.pin is not None:
            raise HttpError(404, "Not Found", "A time-travel view is served over smart HTTP only")
        _getanyfile(c.config, prefix)
        return dumb.strbuf(prefix, "text/plain", dumb.info_refs_body(c.snapshot()))
    _note_service(c.seen, params["service"])
    svc = select_service(params["service"], c.config, c.env, prefix)
    if svc == "receive-pack" and c.pin is not None:
        return _read_only(c, prefix)
    poll = None
    if svc == "upload-pack" and c.pin is None:
        from . import pollwrite  # startup: only where a poll file may be written
        poll = pollwrite.begin(c.env, c.repo.gitdir, c.seen["started_ns"], c.seen)
    resp = _advertise(svc, c.context(), prefix)
    resp.trace["service"] = svc
    if poll is not None:
        pollwrite.finish(poll, resp, c.env)
    elif "pollfile" in c.seen:
        resp.trace["pollfile"] = c.seen["pollfile"]
    return resp


def _info_packs(c: _Call) -> Response:
    _getanyfile(c.config, [])
    return dumb.strbuf(H.nocache(), "text/plain; charset=utf-8", dumb.info_packs_body(c.repo.gitdir))


def _text_file(c: _Call) -> Response:
    _getanyfile(c.config, [])
    return dumb.local_file(c.repo.gitdir, c.arg, H.nocache(), "text/plain", c.env)


def _file(c: _Call) -> Response:
    _getanyfile(c.config, [])
    return dumb.local_file(c.repo.gitdir, c.arg, H.forever(), c.route.content_type, c.env)


def _service(c: _Call) -> Response:
    _note_service(c.seen, c.arg)
    svc = select_service(c.arg, c.config, c.env, [])
    if svc == "receive-pack" and c.pin is not None:
        raise _forbidden(f"{c.repo.path}@{c.pin} is a read-only view", [])
    want = f"application/x-git-{svc}-request"
    got = c.env.get("CONTENT_TYPE", "")
    if got != want:
        raise HttpError(415, "Unsupported Media Type",
                        body=f"Expected POST with Content-Type '{want}', but received '{got}' instead.\n".encode())
    ctx = c.context()
    c.seen["trace"] = ctx.trace
    resp = _rpc(svc, ctx, c.req, c.max_buffer)
    resp.trace["service"] = svc
    return resp


def _read_only(c: _Call, prefix) -> Response:
    """A push to a time-travel view: refused in the advertisement, as git
    shows it (`fatal: remote error: …`)."""
    msg = (f"ERR aspen: {c.repo.path}@{c.pin} is a read-only view of the repository's past;"
           f" push to {c.repo.path} instead")
    body = pktline.encode("# service=git-receive-pack\n") + pktline.FLUSH + pktline.encode(msg)
    hdrs = prefix + [("Content-Type", "application/x-git-receive-pack-advertisement")]
    return Response(200, "OK", hdrs, [body], [f"aspen: push to a time-travel view refused ({c.repo.path}@{c.pin})\n"],
                    Trace(service="receive-pack", plan="refused", why="pin-read-only"))


def _bundle(c: _Call) -> Response:
    """GET aspen/bundle[@V]: the repository's bundle (fetch/bundle.py), served as a static file. A fetch
    by other means: allowed where upload-pack is (http.uploadpack), from the same access rules."""
    from ..fetch import bundle  # startup
    from . import staticfile  # startup
    c.seen["service"] = "bundle"
    if not service_enabled("upload-pack", c.config, c.env.get("REMOTE_USER")):
        raise _forbidden("Service not enabled: 'upload-pack'", [])
    pin = c.pin
    if "@" in c.arg:
        from ..model.pin import PinError, parse  # startup
        try:
            pin = parse(c.arg.split("@", 1)[1])
        except PinError as e:
            raise HttpError(404, "Not Found", f"aspen: bundle: {e}", body=f"{e}\n".encode()) from None
    ctx = c.context()
    c.seen["trace"] = ctx.trace
    got = bundle.bundle_file(ctx, pin)
    from ..fetch.demand import BUNDLE_DEMAND_FILE, note_demand  # startup
    from ..runtime.statedir import state_dir  # startup
    note_demand(state_dir(ctx.gitdir, ctx.settings), BUNDLE_DEMAND_FILE)     # pushes keep it current (bundlekeep)
    cache = ([("Cache-Control", "public, max-age=31536000, immutable")] if got.pinned
             else [("Cache-Control", "public, max-age=60")])
    resp = staticfile.serve(c.env, got.path, got.size, got.etag, got.mtime, cache, "application/x-git-bundle")
    resp.trace.update(ctx.trace)
    resp.trace["service"] = "bundle"
    if got.pinned:
        resp.trace["pin"] = got.version
    return resp


def _stored_pack(c: _Call) -> Response:
    """GET aspen/pack/pack-<name>.pack: a stored pack, as the packfile-uris of
    a planned answer name it (fetch/offload.py), served as a static file.
    Allowed where upload-pack is and the dumb protocol's files are
    (http.getanyfile: stock serves every pack of objects/pack/ there), and
    only where the client may see every ref (no hideRefs, no namespace)."""
    from ..fetch.uploadconfig import UploadConfig  # startup
    from . import staticfile  # startup
    c.seen["service"] = "pack"
    if not service_enabled("upload-pack", c.config, c.env.get("REMOTE_USER")):
        raise _forbidden("Service not enabled: 'upload-pack'", [])
    _getanyfile(c.config, [])
    name = c.arg.rsplit("/", 1)[1]
    if c.namespace or UploadConfig.parse(c.config).hidden:
        raise HttpError(404, "Not Found", f"aspen: pack: {name}: some refs are hidden from this client")
    ctx = c.context()
    c.seen["trace"] = ctx.trace
    store = ctx.refstore()
    path = os.path.join(store.packs_dir, name) if store is not None else None
    try:
        st = os.stat(path) if path is not None else None
    except OSError:
        st = None
    if st is None or path is None or not os.path.isfile(path):
        raise HttpError(404, "Not Found", f"aspen: pack: no stored pack {name}", body=b"no such stored pack\n")
    etag = '"' + name[len("pack-"):-len(".pack")] + '"'      # named by its trailer: never changes
    resp = staticfile.serve(c.env, path, st.st_size, etag, st.st_mtime,
                            [("Cache-Control", "public, max-age=31536000, immutable")],
                            "application/x-git-packed-objects")
    resp.trace.update(ctx.trace)
    resp.trace["service"] = "pack"
    return resp


# Stock's services[] table: each route of http/routes.py names its handler here.
HANDLERS = {
    "head": _head,
    "info_refs": _info_refs,
    "info_packs": _info_packs,
    "text_file": _text_file,
    "file": _file,
    "service": _service,
    "bundle": _bundle,
    "stored_pack": _stored_pack,
}


def _handle(req: Request, seen: dict) -> Response:
    env = req.env
    method = env.get("REQUEST_METHOD")
    if method is None:
        raise paths.die("No REQUEST_METHOD from server")
    if method == "HEAD":
        method = "GET"
    if env.get("PATH_INFO", "").startswith(PEER_PACKS_PATH) and settings.of(env).node_url:
        from . import peerpacks  # startup: a cluster's nodes only
        return peerpacks.handle(req, method)
    full = paths.getdir(env)
    m = routes.match(full)
    if m is None:
        # no route can match metrics.PATH (see there), so it never hides a repository
        if method == "GET" and env.get("PATH_INFO") == METRICS_PATH and _metrics_dir(env) is not None:
            return _metrics_response(env)
        raise HttpError(404, "Not Found", f"Request not supported: '{full}'")
    if m.route.method != method:
        if env.get("SERVER_PROTOCOL") == "HTTP/1.1":
            raise HttpError(405, "Method Not Allowed", extra=[("Allow", routes.ALLOW[m.route.method])])
        raise HttpError(400, "Bad Request")
    repo, pin = paths.enter_repo(m.repo_dir), None
    if repo is None and "@" in m.repo_dir:
        split = split_url(m.repo_dir)
        if split is not None:
            repo, pin = paths.enter_repo(split[0]), split[1]
    if repo is None and pin is None and (settings.of(env).pack_store or settings.of(env).node_url):
        from ..refstore.registry import materialize  # startup: replicas only
        from ..runtime.repository import Repository  # startup: replicas only
        if materialize(m.repo_dir, Repository.of(m.repo_dir, env)):
            repo = paths.enter_repo(m.repo_dir)     # a replica's copy of a repository the log knows, made now
    if repo is None:
        raise HttpError(404, "Not Found", f"Not a git repository: '{m.repo_dir}'")
    if pin is not None and m.route.handler not in ("info_refs", "service", "bundle"):
        raise HttpError(404, "Not Found", f"A time-travel view is served over smart HTTP only: '{m.repo_dir}'")
    seen["repo"] = repo.path
    paths.check_ownership(repo, env)
    if "GIT_HTTP_EXPORT_ALL" not in env and not os.access(os.path.join(repo.gitdir, "git-daemon-export-ok"), os.F_OK):
        raise HttpError(404, "Not Found", f"Repository not exported: '{m.repo_dir}'")
    cenv = child_env(env, repo.gitdir, with_exec_path=method == "POST")
    config = RepoConfig.load(repo.gitdir, cenv)
    max_buffer = max_request_buffer(env.get("GIT_HTTP_MAX_REQUEST_BUFFER"), config.get("http.maxrequestbuffer"))
    info = env.get("PATH_INFO", "")
    url_dir = info[:-len(m.arg) - 1] if info.endswith("/" + m.arg) else ""
    call = _Call(req, seen, repo, config, cenv, env.get("GIT_NAMESPACE") or None, m.arg, m.route, max_buffer, pin,
                 url_dir)
    resp = HANDLERS[m.route.handler](call)
    resp.trace.update({"repo": repo.path, "gitdir": repo.gitdir})
    return resp


def _advertise(svc: str, ctx: ServiceContext, prefix) -> Response:
    if svc == "upload-pack":
        from ..fetch.upload import advertise  # startup: a CGI request loads the one service it serves
    else:
        from ..push.receive import advertise  # startup
    head = b""
    if ctx.protocol_version != 2:
        head = pktline.encode(f"# service=git-{svc}\n") + pktline.FLUSH
    body = head + b"".join(advertise(ctx))
    hdrs = prefix + [("Content-Type", f"application/x-git-{svc}-advertisement")]
    return Response(200, "OK", hdrs, [body], ctx.log, ctx.trace)


def _rpc(svc: str, ctx: ServiceContext, req: Request, max_buffer: int) -> Response:
    length = req.content_length
    if length is None and "CONTENT_LENGTH" in req.env:
        length = parse_content_length(req.env.get("CONTENT_LENGTH"))
    gzip = req.env.get("HTTP_CONTENT_ENCODING") in ("gzip", "x-gzip")
    limits = req.limits or Limits.from_env(req.env)
    body_obj: Optional[Body] = None
    if svc == "upload-pack":
        from ..fetch import upload  # startup
        data = read_upload_request(req.input, length, gzip, max_buffer, limits)
        if not data:
            # stock's upload-pack dies on an empty request (t5562); Aspen says so with a status
            raise HttpError(400, "Bad Request", "fatal: the remote end hung up unexpectedly")
        stream = upload.serve(ctx, data)
    else:
        from ..fetch import bundlekeep, prewarm  # startup
        from ..push import receive  # startup
        # a push's new version warms the cache for depth-1 clones, and the bundle once compacted
        ctx.after_push = (prewarm.kick, bundlekeep.kick)
        if limits.max_push_bytes and length is not None and length > limits.max_push_bytes:
            raise HttpError(413, "Payload Too Large",
                            f"fatal: push of {length} bytes is larger than the server's limit of "
                            f"{limits.max_push_bytes} bytes (ASPEN_MAX_PUSH_BYTES)")
        body_obj = Body(req.input, length, gzip, limits)
        stream = receive.serve(ctx, body_obj)
    hdrs = H.nocache() + [("Content-Type", f"application/x-git-{svc}-result")]
    if isinstance(stream, FileBody):
        return Response(200, "OK", hdrs, stream, ctx.log, ctx.trace)     # a cached answer: sent as a file
    primed = _primed(iter(stream), body_obj)
    resp = Response(200, "OK", hdrs, primed, ctx.log, ctx.trace)
    primed.watch_log(ctx.log)
    resp.late = primed.late_messages
    return resp


class _primed:
    """Runs a response stream up to its first chunk before headers go out, so
    a request that fails early still gets a real status.

    BODY is the request body the stream consumes (receive-pack). If the
    stream ends without a byte, the rest of the body is read as stock reads
    it to the end, so a short or corrupt body is always an HTTP error rather
    than a race; an error found after the headers went out is reported as a
    late `fatal:` message, the body is simply truncated."""

    def __init__(self, it: Iterator[bytes], body: Optional[Body] = None):
        self.it = it
        self.body = body
        self._late: list[str] = []
        self._log: list[str] = []
        self._logged = 0
        try:
            self.first: Optional[bytes] = next(it)
        except StopIteration:
            self.first = None
            self.it = iter(())
        except BaseException:
            self.close()
            self._linger()
            raise
        if self.first is None and body is not None:
            self._drain()
        if body is not None and body.error is not None:
            self.close()
            self._linger()
            raise body.error

    def _linger(self) -> None:
        """A body refused as too large: what the client still sends of it is
        read and dropped (Body.discard), so that it reads the 413."""
        if self.body is not None and self.body.error is not None and self.body.error.status == 413:
            self.body.discard(max(DISCARD_MIN, 4 * self.body.limits.max_push_bytes))

    def _drain(self) -> None:
        assert self.body is not None                # the caller's condition
        try:
            while self.body.read(65536):
                pass
        except BodyError:
            pass
        except OSError:
            pass

    def __iter__(self) -> Iterator[bytes]:
        if self.first:
            yield self.first
        self.first = None
        yield from self.it

    def watch_log(self, log: list[str]) -> None:
        """The service's message list: what it adds after the adapter wrote
        the messages it had (at header time) is reported late."""
        self._log, self._logged = log, len(log)

    def late_messages(self) -> list[str]:
        out = self._log[self._logged:]
        self._logged = len(self._log)
        if self.body is not None and self.body.error is not None and not self._late:
            self._late.append(f"fatal: {self.body.error.message}")
            out.append(self._late[-1])
        return out

    def close(self) -> None:
        close = getattr(self.it, "close", None)
        if close is not None:
            close()
