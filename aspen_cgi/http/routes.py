"""The table of services, as in http-backend.c: first match of an
end-anchored pattern against the whole repository path wins."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Route:
    method: str
    pattern: re.Pattern
    handler: str
    content_type: str = ""


def _r(method: str, regex: str, handler: str, content_type: str = "") -> Route:
    return Route(method, re.compile(regex + r"\Z", re.DOTALL), handler, content_type)


ROUTES: tuple[Route, ...] = (
    _r("GET", r"/HEAD", "head"),
    _r("GET", r"/info/refs", "info_refs"),
    _r("GET", r"/objects/info/alternates", "text_file"),
    _r("GET", r"/objects/info/http-alternates", "text_file"),
    _r("GET", r"/objects/info/packs", "info_packs"),
    _r("GET", r"/objects/[0-9a-f]{2}/[0-9a-f]{38}", "file", "application/x-git-loose-object"),
    _r("GET", r"/objects/[0-9a-f]{2}/[0-9a-f]{62}", "file", "application/x-git-loose-object"),
    _r("GET", r"/objects/pack/pack-[0-9a-f]{40}\.pack", "file", "application/x-git-packed-objects"),
    _r("GET", r"/objects/pack/pack-[0-9a-f]{64}\.pack", "file", "application/x-git-packed-objects"),
    _r("GET", r"/objects/pack/pack-[0-9a-f]{40}\.idx", "file", "application/x-git-packed-objects-toc"),
    _r("GET", r"/objects/pack/pack-[0-9a-f]{64}\.idx", "file", "application/x-git-packed-objects-toc"),
    _r("GET", r"/aspen/bundle(?:@[^/]+)?", "bundle"),
    _r("GET", r"/aspen/pack/pack-(?:[0-9a-f]{40}|[0-9a-f]{64})\.pack", "stored_pack"),
    _r("POST", r"/git-upload-pack", "service"),
    _r("POST", r"/git-receive-pack", "service"),
)

ALLOW = {"GET": "GET, HEAD", "POST": "POST"}


@dataclass(frozen=True)
class Match:
    route: Route
    repo_dir: str   # the path before the match
    arg: str        # the matched text without its leading '/'


def match(path: str) -> Optional[Match]:
    for route in ROUTES:
        m = route.pattern.search(path)
        if m:
            return Match(route, path[:m.start()], m.group(0)[1:])
    return None
