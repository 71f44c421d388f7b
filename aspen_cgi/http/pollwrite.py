"""Which advertisements become poll files (runtime/pollfiles.py), and
writing them as Aspen answers.

Only what nginx may hand to anyone asking the same URL: `GET` or `HEAD` of
`.../info/refs?service=git-upload-pack` (that query exactly), anonymous
(no REMOTE_USER: nginx/aspen.conf asks no password for it), with no
`Git-Protocol` header (v0) or exactly `version=2` (v2), answered 200 by the
repository itself (not a time-travel view), and recordable as
http/replay.py records answers (no session id, no included configuration
files). nginx serves the file under the same conditions (its `map` on the
method, the query and the header); anything else reaches Aspen.

The inputs checked before a file is written are http/replay.py's: the
repository's path candidates, its git directory, HEAD, packed-refs and
every directory under refs/, git-daemon-export-ok, shallow and the
configuration files; none may have changed since the request began (nor
in the racy window before). Ref changes Aspen makes are caught by the
generation read here before the answer is computed (pollfiles.invalidate)."""

from __future__ import annotations

from typing import Mapping, Optional

from .. import settings
from ..runtime import pollfiles
from . import replay
from .message import Response


def kind_of(env: Mapping[str, str]) -> Optional[str]:
    """The poll file this request's answer would be, or None."""
    if env.get("REQUEST_METHOD") not in ("GET", "HEAD") or env.get("QUERY_STRING") != "service=git-upload-pack":
        return None
    if env.get("REMOTE_USER") or "GIT_PROTOCOL" in env:
        return None
    proto = env.get("HTTP_GIT_PROTOCOL", "")
    return "upload-pack.v0" if proto == "" else "upload-pack.v2" if proto == "version=2" else None


class Pending:
    """A poll file to write once the answer is computed."""
    __slots__ = ("base", "gitdir", "url", "kind", "gen", "started_ns")

    def __init__(self, base: str, gitdir: str, url: str, kind: str, gen: bytes, started_ns: int):
        self.base, self.gitdir, self.url, self.kind, self.gen, self.started_ns = base, gitdir, url, kind, gen, started_ns


def begin(env: Mapping[str, str], gitdir: str, started_ns: int, trace: dict) -> Optional[Pending]:
    """Before the advertisement is computed: what to write after, or None."""
    kind = kind_of(env)
    if kind is None:
        return None
    base = pollfiles.poll_dir(settings.of(env))
    url = env.get("SCRIPT_NAME", "") + env.get("PATH_INFO", "")
    if base is None or not pollfiles.url_ok(url):
        return None
    if pollfiles.current(base, gitdir, kind):
        trace["pollfile"] = "current"
        return None
    return Pending(base, gitdir, url, kind, pollfiles.generation(pollfiles.repo_dir(base, gitdir)), started_ns)


def finish(p: Pending, resp: Response, env: Mapping[str, str]) -> None:
    """Write the answer RESP as the poll file P, when it may be one; the result goes in its trace (`pollfile=`)."""
    if resp.status != 200 or not resp.trace.get("replayable"):
        return
    if not isinstance(resp.body, list) or len(resp.body) != 1 or not isinstance(resp.body[0], bytes):
        return
    inputs = replay.inputs_of(env, p.gitdir)
    if inputs is None:
        return
    body = resp.body[0]
    resp.trace["pollfile"] = pollfiles.publish(p.base, p.gitdir, p.url, p.kind, body, inputs, p.started_ns, p.gen,
                                               settings.of(env).poll_window)
