"""One greppable line per request: repo, service, status, bytes, ms, and the
plan or fallback; and for every upload-pack fetch response, one JSON line
(`aspen-plan {...}`) with the planner's trace, which the bench reads. With
ASPEN_METRICS=1 the same trace is added to the server's counters
(metrics.py) as the response closes."""

from __future__ import annotations

import time

TYPE_CHECKING = False   # typing itself costs a CGI start-up milliseconds
if TYPE_CHECKING:
    from typing import IO, Iterable, Iterator


METRICS_KEY = "metrics_dir"     # in a response's trace: count it in this metrics directory (metrics.py)


def line(method: str, path: str, status: int, nbytes: int, started: float, trace: dict) -> str:
    ms = (time.monotonic() - started) * 1000
    fields = [f"repo={trace.get('repo', '-')}", f"service={trace.get('service', '-')}",
              f"method={method}", f"path={path or '-'}", f"status={status}", f"bytes={nbytes}", f"ms={ms:.1f}"]
    for key in ("version", "pin", "reinjected", "cache", "entry", "depth1", "client", "queued_ms", "over_share", "behind", "plan", "why", "unproved",
                "build_wait_ms", "plan_us", "checked", "ready_by", "check_us", "visits", "extents", "span", "commands",
                "objects", "offload", "offload_bytes", "offload_chain", "bundle", "push", "proc_receive", "adopted", "phases",
                "replayed", "unrecorded", "resident", "pollfile", "ended"):
        if key in trace:
            fields.append(f"{key}={trace[key]}")
    return "aspen: " + " ".join(fields) + "\n"


PLAN_KEYS = ("protocol", "cache", "entry", "depth1", "plan", "why", "unproved", "build_wait_ms", "versions_visited", "segments_visited", "lookups", "extents",
             "span", "objects", "offload", "offload_bytes", "offload_chain", "plan_us", "checked", "ready_by", "check_us")


def plan_line(status: int, nbytes: int, started: float, trace: dict) -> str:
    """The plan trace of one fetch response as JSON: repo, ref-store version,
    plan or fallback and why, visits, extents, objects, response bytes,
    planning µs and serving ms."""
    import json  # startup: a CGI request that writes no plan line never loads it
    record = {"repo": trace.get("repo"), "version": trace.get("version"), "status": status, "bytes": nbytes,
              "serve_ms": round((time.monotonic() - started) * 1000, 2)}
    for key in PLAN_KEYS:
        if key in trace:
            record[key] = trace[key]
    return "aspen-plan " + json.dumps(record, separators=(",", ":"), sort_keys=True) + "\n"


class Counted:
    """Wraps a response body, counts its bytes, and writes the access line once it is done."""

    def __init__(self, body: Iterable[bytes], errors: IO[str], method: str, path: str, status: int,
                 trace: dict, started: float, log: bool, late=None):
        self.body = body
        self.late = late
        self.errors = errors
        self.head = (method, path, status)
        self.trace = trace
        self.started = started
        self.nbytes = 0
        self.log = log
        self._done = False
        self._body_closed = False

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.body:
            self.nbytes += len(chunk)
            yield chunk

    def close_body(self) -> None:
        """End the body (its own close: a cache entry is completed there) and
        write its late messages, without the access line yet."""
        if self._body_closed:
            return
        self._body_closed = True
        close = getattr(self.body, "close", None)
        if close is not None:
            close()
        if self.late is not None:
            late, self.late = self.late, None
            write_messages(self.errors, late())
            try:
                self.errors.flush()
            except (OSError, ValueError):
                pass

    def close(self) -> None:
        self.close_body()
        if self._done:
            return
        self._done = True
        method, path, status = self.head
        where = self.trace.get(METRICS_KEY)
        if where:
            # ASPEN_METRICS=1 (http/backend.handle put the directory here): both adapters close
            # through here, so every response is counted once; the module loads only then
            from ..runtime import metrics  # startup
            metrics.count(where, method, status, self.nbytes, self.trace)
        if self.log:
            try:
                self.errors.write(line(method, path, status, self.nbytes, self.started, self.trace))
                if "plan" in self.trace:
                    self.errors.write(plan_line(status, self.nbytes, self.started, self.trace))
                self.errors.flush()
            except (OSError, ValueError):
                pass


class CountedFile:
    """A file body for wsgi.file_wrapper (sendfile) that writes the access
    line when the server closes it: wrapping it in Counted would hide the
    file from the server."""

    def __init__(self, file, size: int, counted: "Counted"):
        self.file = file
        self.size = size
        self.counted = counted
        self._left = size

    def fileno(self) -> int:
        return self.file.fileno()

    def read(self, n: int = -1) -> bytes:
        """At most SIZE bytes in all (a range of the file, where a server reads rather than sendfile()s)."""
        n = self._left if n < 0 else min(n, self._left)
        data = self.file.read(n) if n > 0 else b""
        self._left -= len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.file.seek(offset, whence)

    def tell(self) -> int:
        return self.file.tell()

    def close(self) -> None:
        self.file.close()
        self.counted.nbytes = self.size
        self.counted.body = ()
        self.counted.close()


def write_messages(errors: IO[str], messages: Iterable[str]) -> None:
    for msg in messages:
        try:
            errors.write(msg if msg.endswith("\n") else msg + "\n")
        except (OSError, ValueError):
            pass
