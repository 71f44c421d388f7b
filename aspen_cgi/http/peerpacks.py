"""`/_aspen/packs/<store>/<file>`: a cluster's node gives (GET) and takes
(PUT) packs for its peers (refstore/peers.py), with ASPEN_NODE_URL set. A
request without a good signature gets 403; a file that is not the pack its
name says gets 400 and is not kept; GET of a file this node lacks, 404."""

from __future__ import annotations

import os
from typing import Iterator, Optional

from .. import settings
from ..model.trace import Trace
from ..refstore import db, peers
from ..refstore.packstore import PackStore
from ..refstore.registry import pack_root
from ..service import FileBody
from . import headers as H
from .message import HttpError, Request, Response

PREFIX = peers.PREFIX


def is_peer_path(path: Optional[str]) -> bool:
    return bool(path) and path.startswith(PREFIX)     # type: ignore[union-attr]


def _body(req: Request) -> Iterator[bytes]:
    left = req.content_length
    if left is None and req.env.get("CONTENT_LENGTH", "").isdigit():
        left = int(req.env["CONTENT_LENGTH"])
    while left is None or left > 0:
        chunk = req.input.read(peers.CHUNK if left is None else min(peers.CHUNK, left))
        if not chunk:
            if left:
                raise peers.PeerError("the request body ended early")
            return
        if left is not None:
            left -= len(chunk)
        yield chunk


def handle(req: Request, method: str) -> Response:
    env = req.env
    s = settings.of(env)
    path = env.get("PATH_INFO", "")
    if not s.node_url:
        raise HttpError(404, "Not Found", f"Request not supported: '{path}'")
    parts = path[len(PREFIX):].split("/")
    if len(parts) != 2 or not peers.SCHEMA.match(parts[0]) or not peers.NAME.match(parts[1]):
        raise HttpError(404, "Not Found", f"Request not supported: '{path}'")
    schema, name = parts
    node = peers.signer(s, env.get("HTTP_X_ASPEN_NODE"), method, path)
    if node is None:
        raise HttpError(403, "Forbidden", f"a pack request without a good signature: {path}")
    directory = PackStore(pack_root(s, env.get("GIT_PROJECT_ROOT") or os.environ.get("GIT_PROJECT_ROOT")),
                          schema).directory
    trace = Trace(service="peer-packs")
    if method == "GET":
        try:
            f = open(os.path.join(directory, name), "rb")
        except OSError:
            raise HttpError(404, "Not Found", f"no pack {name} of {schema} here") from None
        size = os.fstat(f.fileno()).st_size
        hdrs = H.nocache() + [("Content-Length", str(size)), ("Content-Type", "application/octet-stream")]
        return Response(200, "OK", hdrs, FileBody(f, size), trace=trace)
    if method != "PUT":
        raise HttpError(405, "Method Not Allowed", extra=[("Allow", "GET, HEAD, PUT")])
    try:
        peers.take(directory, name, _body(req))
    except peers.PeerError as e:
        raise HttpError(400, "Bad Request", f"pack from {node} refused: {e}", body=f"{e}\n".encode()) from None
    except OSError as e:
        raise HttpError(500, "Internal Server Error", f"pack from {node} not kept: {e}") from None
    log = []
    if not name.startswith("pack-"):
        try:
            peers.hold(s, schema, name)
        except (db.Error, db.Busy) as e:      # the sender records it too
            log.append(f"aspen: pack {name} of {schema} kept, not recorded ({e})\n")
    body = b"kept\n"
    hdrs = [("Status", "201 Created")] + H.nocache() + [("Content-Length", str(len(body))),
                                                          ("Content-Type", "text/plain")]
    return Response(201, "Created", hdrs, [body], log, trace)
