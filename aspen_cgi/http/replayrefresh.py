"""Recorded listings brought up to a push, off every client's path.

Under CGI, pollers' `info/refs` advertisements and v2 `ls-refs` answers are
replayed from records (http/replay.py) until a ref changes. On a repository
pushed to every second, nearly every poll then found its record stale and
ran the whole pipeline through the resident (measured under Apache on the
medium preset's busy-repo: `info/refs` p50 25.4 ms against stock's 7.4).
After a push that updated refs, the resident's worker that answered it (its
client already has its answer) computes each stale listing recorded for
that repository again and records it, so that the next poll is replayed.

It waits first for the racy window of the ref files the push wrote
(model/racy.py: a record is refused while an input is that recent); when
the refs changed meanwhile (a burst: the next push has landed), it leaves
the listings to that push's worker. It takes each listing's flight without
waiting (a client computing the same listing is left to record it), and
never writes a log line: its output goes where the worker's does between
requests, nowhere."""

from __future__ import annotations

import io
import time
from typing import Mapping

from .. import settings
from ..model.racy import RACY_NS
from ..runtime.statedir import state_dir
from . import replay

SETTLE_S = RACY_NS / 1e9 + 0.01


def refresh(gitdir: str, env: Mapping[str, str]) -> int:
    """Compute again and record the stale listings recorded for GITDIR (ENV:
    the push's environment, for the settings); how many were recorded."""
    wanted = replay.listings(state_dir(gitdir, settings.of(env)))
    if not wanted:
        return 0
    before = replay.refs_stamp(gitdir)
    time.sleep(SETTLE_S)
    if replay.refs_stamp(gitdir) != before:
        return 0                                    # another push landed: its worker records them
    done = 0
    for request_env, body in wanted:
        if replay.lookup(request_env, body) is not None:
            continue                                # still current
        flight = replay.Flight.begin(request_env, body, wait=False)
        if flight is None:
            continue
        try:
            if replay.lookup(request_env, body) is None and _record(request_env, body):
                done += 1
        finally:
            flight.end()
    return done


def _record(env: dict, body: bytes) -> bool:
    from .backend import handle  # startup: only where a push landed
    from .limits import Limits  # startup
    from .message import Request  # startup
    started_ns = time.time_ns()
    limits = Limits.from_env(env)
    resp = handle(Request(env, io.BytesIO(body), None, limits))
    try:
        if resp.status != 200 or resp.log or not resp.trace.get("replayable") or "replay_file" in resp.trace:
            return False
        answer = bytearray()
        for chunk in resp.body:
            answer += chunk
            if len(answer) > replay.MAX_ANSWER:
                return False
    finally:
        resp.close()
    head = ("".join(f"{k}: {v}\r\n" for k, v in resp.headers) + "\r\n").encode("utf-8", "surrogateescape")
    return not replay.record(env, body, resp.trace["gitdir"], head, bytes(answer), resp.trace, started_ns)
