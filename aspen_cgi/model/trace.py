"""The trace of one request: what the access line, the plan line
(http/accesslog.py), the metrics (runtime/metrics.py) and a recorded answer
(http/replay.py) say about it. A closed vocabulary: FIELDS names every key
and what it holds; writing any other key is a KeyError, so no part of the
code invents a key nothing reads. A dict underneath: the CGI program's
replay path reads recorded traces back as plain dicts, without this module.
Imports nothing."""

from __future__ import annotations

TYPE_CHECKING = False   # typing itself costs a CGI start-up milliseconds
if TYPE_CHECKING:
    from typing import Any
    _Dict = dict[str, Any]
else:
    _Dict = dict

FIELDS = {
    # the request
    "repo": "the repository as stock names it in messages",
    "gitdir": "its git directory",
    "service": "upload-pack, receive-pack, bundle, pack (a stored pack by URI) or metrics",
    "protocol": "the protocol version of an upload-pack request",
    "version": "the ref-store version the request read (`-`: no store)",
    "pin": "the version a time-travel request reads the repository at (model/pin.py)",
    "reinjected": "versions whose packs a time-travel fetch put back into the repository (packs/reinject.py)",
    "ended": "why the response ended before its end: client-gone, idle-timeout, request-timeout",
    "metrics_dir": "where the response is counted (ASPEN_METRICS=1)",
    # the response cache and depth-1 clones
    "cache": "hit, shared, cold, prewarm, overloaded, ...",
    "depth1": "a depth-1 clone's answer: stock or wide",
    "entry": "what made the cache entry served: planned, git, git-unbuilt (git's while packs were unbuilt);"
             " superseded: such an entry was dropped, the packs being built now, and the answer computed again",
    "queued_ms": "how long admission queued the cold computation",
    "client": "who admission counted the cold computation to (model/client.py): user:NAME or addr:ADDRESS",
    "over_share": "the client held its share of the slots or of the queue (ASPEN_CLIENT_SHARE): waited or refused",
    "behind": "the client held another computation on this machine: git ran this much nicer (admission.BEHIND_NICE)",
    "replayable": "the answer may be recorded for the CGI program's replay",
    "replay_file": "the cache entry a recorded answer is sent from",
    "replay_effects": "what a replay of the answer does beside sending it",
    "replayed": "the CGI program sent a recorded answer",
    "unrecorded": "why a replayable answer was not recorded (http/replay.record): racy:PATH (an input changed "
                  "while it was computed or just before), large, path, gone, unwritable",
    "resident": "the CGI program handed the request to its resident process (aspen_cgi/resident.py)",
    "pollfile": "an info/refs poll's answer kept for nginx (runtime/pollfiles.py): written, current, racy, moved, "
                "error",
    # the planner
    "plan": "planned, fallback or refused",
    "why": "why git answers, or how a planned v0 round ended",
    "unproved": "the haves the planner could not prove",
    "plan_us": "planning time",
    "build_wait_ms": "how long a fetch waited for its versions' packs (packs/background.await_built), when it found any unbuilt",
    "visits": "versions+segments the plan's history queries read",
    "versions_visited": "versions the plan's history queries read",
    "segments_visited": "segment nodes the plan's history queries read",
    "lookups": "history lookups the plan made",
    "checked": "a refused plan's check against git's walk: ok, a reason, ready, not-ready",
    "ready_by": "who judged an open round ready: store or git",
    "check_us": "the check's time",
    "extents": "the stored packs a planned answer splices",
    "span": "a span pack: built, kept or spliced",
    "objects": "objects in a planned answer",
    "offload": "a packfile-uris client's answer: uri (stored packs named by URI) or inline (fetch/offload.py)",
    "offload_bytes": "bytes of the stored packs the answer named by URI",
    "offload_chain": "objects of the import pack sent inline too (delta chains the inline pack's deltas need)",
    "bundle": "the version whose bundle a bundle-uri answer named",
    # pushes
    "commands": "ref updates a push asked for",
    "push": "ok=N,ng=M: the push's ref results",
    "proc_receive": "the proc-receive hook's outcome: ok or failed",
    "pushed_versions": "ref-store versions the push made",
    "adopted": "yes or no, and the time: every version had its pack when the push was reported (its client's"
               " pack adopted, packs/background.adopt_now)",
    "phases": "a push's time by phase, in ms: intake (the pack), check (connectivity), migrate (pre-receive"
              " hook, the quarantine's objects moved in), refs (ref checks, update hooks, the writes and the"
              " store), adopt, after (what ran after the report: hooks, gc --auto, starting background work)",
}


class Trace(_Dict):
    """One request's trace: a dict whose keys are FIELDS only."""
    __slots__ = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.update(*args, **kwargs)

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in FIELDS:
            raise KeyError(f"not a trace field: {key!r} (model/trace.py)")
        dict.__setitem__(self, key, value)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]
