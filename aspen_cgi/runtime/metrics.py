"""The server's metrics for operators, opt-in with ASPEN_METRICS=1: counters
that every serving process adds to as each response closes, shared on disk,
and gauges read when they are asked for. `GET /_aspen/metrics` serves them
in Prometheus' text format (0.0.4); `aspen stats --server` prints them.

Where: `metrics/` under ASPEN_STATE_DIR when it is set (the server's state
directory), else under ASPEN_RUN_DIR (default /tmp/aspen-run-<uid>, where
admission keeps its slots): every process of one server must see the same
setting, as they must for admission.

How the counters are kept, across gunicorn workers, mod_wsgi daemons and
one process per CGI request, at a few system calls a request:

- A process takes a slot on its first counted request: the first
  `p<N>.0` it can flock() (LOCK_EX | LOCK_NB), kept for its life; the
  kernel drops the lock when the process ends, even by kill -9.
- Its counts are one `series value` line each, written whole after every
  request as one record (a header with a sequence number, the length and a
  CRC-32 of the lines) with one pwrite() at the start of `p<N>.0` and
  `p<N>.1` in turn: the other file always holds the previous whole record,
  so a process killed mid-write, or a reader that reads while a record is
  written, finds a whole record in one of them (the newer whole one wins).
  No rename: renaming a freshly written file over another makes ext4 write
  its data out, about 200 us a request; the pwrite() takes about 2.
- A new owner of a slot starts from its newest record: the counts of the
  processes that held the slot before, so nothing is lost and nothing is
  counted twice. A CGI process takes slot 0 when it is free; there are as
  many slots as processes ever counted at the same time.
- A scrape adds up every slot's newest record. Counters never go down while
  the files stay (a reboot that empties /tmp resets them, as Prometheus
  expects of a restart).

Gauges are read at scrape time: the admission queue's depth, cold
computations and pack builds running (admission.gauges, this machine), and
the version-pack backlog: versions without their pack in each repository
whose builds this server started (packs/background.kick marks the
repository in `metrics/backlog/`; a repository with nothing to build and
no build started for PRUNE_S is forgotten, one that is gone at once).

Counting never fails a request: a directory that cannot be written (another
user's run directory) leaves the request uncounted."""

from __future__ import annotations

import fcntl
import os
import threading
import time
import zlib
from typing import Mapping, Optional

from .. import settings

PATH = "/_aspen/metrics"
"""Where the endpoint answers: PATH_INFO exactly this. Stock's routes
(http/routes.py) are anchored at the end of the path and every one ends in
`/HEAD`, `/info/refs`, `/objects/...`, `/git-upload-pack` or
`/git-receive-pack`; a path ending in `/metrics` matches none, so stock
answers it `404 Request not supported` before it looks at the disk. No
repository request can have this path, whatever the repositories are named
(a repository at `<root>/_aspen/metrics` is reached through
`/_aspen/metrics/info/refs` and the like, which match a route first and are
served as ever). Only when no route matches and ASPEN_METRICS is on does the
backend look at this path; otherwise it is stock's 404, byte for byte."""
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SUBDIR = "metrics"
BACKLOG = "backlog"
MAX_SLOTS = 4096
REFRESH_S = 60.0        # a backlog mark is rewritten at most this often
PRUNE_S = 600.0         # a mark with nothing to build, untouched this long, is dropped
RETRY_S = 60.0          # a directory that could not be used is tried again after this long

# (name, type, title for `aspen stats --server`, HELP)
FAMILIES: tuple[tuple[str, str, str, str], ...] = (
    ("aspen_requests_total", "counter", "requests (service method status)",
     "Requests answered, by service (upload-pack, receive-pack; none for the dumb protocol's files and "
     "requests no service took; metrics for this endpoint), method and HTTP status."),
    ("aspen_response_bytes_total", "counter", "response body bytes (service)",
     "Response body bytes sent, by service."),
    ("aspen_requests_ended_early_total", "counter", "responses cut short (ended)",
     "Responses cut short, by why (client-gone, idle-timeout, request-timeout)."),
    ("aspen_fetch_plans_total", "counter", "fetches by plan (plan why)",
     "Upload-pack fetch responses by plan: planned (spliced from stored packs), fallback (git's "
     "upload-pack) or refused, and why (the access line's plan= and why=)."),
    ("aspen_fetch_cache_total", "counter", "fetches by response-cache result (result)",
     "Upload-pack fetch responses by response-cache result: hit, shared, cold, uncached, overloaded "
     "(refused with 503)."),
    ("aspen_fetch_bytes_total", "counter", "upload-pack response bytes (source)",
     "Upload-pack response bytes by source: stored (spliced from stored packs), git (computed by git "
     "upload-pack), cache (served from the response cache), other (ls-refs, refusals, other commands)."),
    ("aspen_offload_answers_total", "counter", "fetch answers naming stored packs by URI",
     "Protocol v2 fetch answers that named stored packs by URI (packfile-uris, fetch/offload.py) instead of "
     "sending them inline."),
    ("aspen_offload_bytes_total", "counter", "stored pack bytes named by URI",
     "Bytes of the stored packs those answers named by URI (the client downloads them from the URI: Aspen's "
     "`aspen/pack/` route, counted in aspen_response_bytes_total{service=\"pack\"}, or ASPEN_OFFLOAD_URL's "
     "server)."),
    ("aspen_bundle_uri_answers_total", "counter", "bundle-uri commands answered (bundle)",
     "Protocol v2 bundle-uri commands answered, by whether a bundle was named (advertised) or none."),
    ("aspen_admission_rejected_total", "counter", "fetches refused with 503 by admission",
     "Fetches refused with 503 because the admission queue was full or its wait ran out."),
    ("aspen_admission_queued_total", "counter", "fetches that waited in the admission queue",
     "Fetches that waited in the admission queue before git upload-pack ran."),
    ("aspen_admission_wait_seconds_total", "counter", "seconds waited in the admission queue",
     "Seconds those fetches waited in the admission queue."),
    ("aspen_admission_client_waits_total", "counter", "fetches that waited past their client's share",
     "Fetches that waited in the admission queue while their client held its share of the upload-pack slots "
     "(ASPEN_CLIENT_SHARE)."),
    ("aspen_admission_client_wait_seconds_total", "counter", "seconds waited past their client's share",
     "Seconds those fetches waited in the admission queue."),
    ("aspen_admission_client_rejected_total", "counter", "fetches refused with 503 for their client's share",
     "Fetches refused with 503 because their client held its share of the admission queue, or its wait ran out "
     "while the client held its share of the slots (counted in aspen_admission_rejected_total as well)."),
    ("aspen_push_versions_total", "counter", "ref-store versions pushed",
     "Ref-store versions committed by pushes."),
    ("aspen_push_ref_updates_total", "counter", "pushed ref updates (result)",
     "Ref updates pushes asked for, by result (ok, rejected)."),
    ("aspen_poll_files_total", "counter", "poll files by result (result)",
     "info/refs polls Aspen answered that could be kept as poll files for nginx, by what happened: written, "
     "current (this second's file was there), racy (an input changed too recently), moved (refs changed "
     "meanwhile), error (the directory could not be written)."),
    ("aspen_polls_from_files_total", "counter", "polls nginx answered from poll files",
     "info/refs polls nginx answered from poll files, never reaching Aspen (the size of nginx's ASPEN_POLL_LOG "
     "over two bytes a poll; absent without it)."),
    ("aspen_admission_queue_depth", "gauge", "admission queue depth now",
     "Fetches waiting in the admission queue now (this machine's ASPEN_RUN_DIR)."),
    ("aspen_admission_cold_running", "gauge", "git upload-pack computations running now",
     "git upload-pack computations holding an admission slot now (this machine)."),
    ("aspen_pack_builds_running", "gauge", "pack builds running now",
     "Version and segment pack builds holding a build slot now (this machine)."),
    ("aspen_version_pack_backlog", "gauge", "versions waiting for their version pack",
     "Ref-store versions without their version pack, over the repositories whose builds this server "
     "started."),
    ("aspen_version_pack_backlog_repositories", "gauge", "repositories with versions waiting for a pack",
     "Repositories with at least one version without its version pack."),
)
COUNTERS = tuple(name for name, kind, _, _ in FAMILIES if kind == "counter")
UNLABELLED = ("aspen_offload_answers_total", "aspen_offload_bytes_total", "aspen_admission_rejected_total",
              "aspen_admission_queued_total", "aspen_admission_wait_seconds_total", "aspen_admission_client_waits_total",
              "aspen_admission_client_wait_seconds_total", "aspen_admission_client_rejected_total",
              "aspen_push_versions_total")


def _base(s: settings.Settings) -> tuple[str, bool]:
    """(the directory metrics/ goes in, whether it is the run directory)."""
    if s.state_dir:
        return s.state_dir, False
    return s.run_dir, True


def directory(s: settings.Settings) -> str:
    return os.path.join(_base(s)[0], SUBDIR)


_made: set[str] = set()


def prepare(s: settings.Settings) -> str:
    """The directory this server counts in, made if missing: a missing run
    directory as admission makes it (sticky, open to every user: mod_wsgi's
    and Apache's users share it), a missing state directory for this user
    only (it holds ref stores)."""
    where = directory(s)
    if where not in _made:
        try:
            if not os.path.isdir(where):
                base, run = _base(s)
                if not os.path.isdir(base):
                    os.makedirs(base, mode=0o1777 if run else 0o755, exist_ok=True)
                os.makedirs(where, exist_ok=True)
            _made.add(where)
        except OSError:
            pass              # counting will find it missing and leave the request uncounted
    return where


# -- series -----------------------------------------------------------------------------------------

def _escape(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def key(name: str, **labels: object) -> str:
    """One series as the exposition writes it: `name{label="value",...}` (empty labels left out)."""
    parts = [f'{k}="{_escape(v)}"' for k, v in labels.items() if v not in (None, "")]
    return f"{name}{{{','.join(parts)}}}" if parts else name


def _ref_updates(push: str) -> tuple[int, int]:
    ok = ng = 0
    for part in push.split(","):
        name, _, n = part.partition("=")
        if n.isdigit():
            if name == "ok":
                ok = int(n)
            elif name == "ng":
                ng = int(n)
    return ok, ng


def series(method: str, status: int, nbytes: int, trace: Mapping) -> list[tuple[str, float]]:
    """What one response adds, from its access-line trace."""
    service = trace.get("service") or "none"
    out: list[tuple[str, float]] = [(key("aspen_requests_total", service=service, method=method, status=status), 1),
                                    (key("aspen_response_bytes_total", service=service), nbytes)]
    if "ended" in trace:
        out.append((key("aspen_requests_ended_early_total", ended=trace["ended"]), 1))
    if status == 503:
        out.append(("aspen_admission_rejected_total", 1))
        if service == "upload-pack":
            out.append((key("aspen_fetch_cache_total", result="overloaded"), 1))
    if "queued_ms" in trace:
        out.append(("aspen_admission_queued_total", 1))
        out.append(("aspen_admission_wait_seconds_total", round(float(trace["queued_ms"]) / 1000, 3)))
        if trace.get("over_share") == "waited":
            out.append(("aspen_admission_client_waits_total", 1))
            out.append(("aspen_admission_client_wait_seconds_total", round(float(trace["queued_ms"]) / 1000, 3)))
    if status == 503 and trace.get("over_share") == "refused":
        out.append(("aspen_admission_client_rejected_total", 1))
    if service == "upload-pack" and method == "POST" and status == 200:
        plan, cache = trace.get("plan"), trace.get("cache")
        if plan:
            out.append((key("aspen_fetch_plans_total", plan=plan, why=trace.get("why")), 1))
        if cache:
            out.append((key("aspen_fetch_cache_total", result=cache), 1))
        source = ("stored" if plan == "planned" else "cache" if cache in ("hit", "shared")
                  else "git" if plan == "fallback" or cache in ("cold", "uncached", "prewarm") else "other")
        out.append((key("aspen_fetch_bytes_total", source=source), nbytes))
    if "pollfile" in trace:
        out.append((key("aspen_poll_files_total", result=trace["pollfile"]), 1))
    if trace.get("offload") == "uri":
        out.append(("aspen_offload_answers_total", 1))
        out.append(("aspen_offload_bytes_total", int(trace.get("offload_bytes") or 0)))
    if trace.get("plan") == "bundle-uri" and status == 200:
        out.append((key("aspen_bundle_uri_answers_total", bundle=trace.get("why") or "none"), 1))
    if trace.get("pushed_versions"):
        out.append(("aspen_push_versions_total", int(trace["pushed_versions"])))
    if "push" in trace:
        ok, ng = _ref_updates(str(trace["push"]))
        out.append((key("aspen_push_ref_updates_total", result="ok"), ok))
        out.append((key("aspen_push_ref_updates_total", result="rejected"), ng))
    return out


def family(series_key: str) -> str:
    return series_key.split("{", 1)[0]


def _number(text: str) -> Optional[float]:
    try:
        return int(text) if text.isdigit() else float(text)
    except ValueError:
        return None


def number_text(value: float) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(round(float(value), 6))


def parse(text: str) -> dict[str, float]:
    """`series value` lines (a slot file, or an exposition's samples) into {series: value}; other lines skipped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.rpartition(" ")
        n = _number(value) if sep else None
        if n is not None and name:
            out[name] = out.get(name, 0) + n
    return out


# -- the process's slot -----------------------------------------------------------------------------

class _Slot:
    """This process's slot: `p<N>.0` (flock()ed for the process's life) and
    `p<N>.1`, the two files its records alternate between."""

    def __init__(self, fds: tuple[int, int], seq: int, latest: int, counts: dict[str, float]):
        self.fds = fds
        self.seq = seq              # the latest record's number
        self.latest = latest        # which file holds it
        self.counts = counts
        self.pid = os.getpid()

    @classmethod
    def claim(cls, where: str) -> Optional["_Slot"]:
        """The first free slot in WHERE (made by prepare()), or None."""
        i = 0
        while i < MAX_SLOTS:
            try:
                fd = os.open(os.path.join(where, f"p{i}.0"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError:
                return None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                i += 1
                continue
            try:
                other = os.open(os.path.join(where, f"p{i}.1"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError:
                os.close(fd)
                return None
            seq, latest, counts = _load([_pread(fd), _pread(other)])   # what the slot's earlier owners counted
            return cls((fd, other), seq, latest, counts)
        return None

    def save(self) -> None:
        body = "".join(f"{k} {number_text(v)}\n" for k, v in sorted(self.counts.items())).encode()
        target = 1 - self.latest
        os.pwrite(self.fds[target], _record(self.seq + 1, body), 0)
        self.seq += 1
        self.latest = target


MAGIC = b"aspen-metrics"


def _record(seq: int, body: bytes) -> bytes:
    return b"%s %d %d %d\n" % (MAGIC, seq, len(body), zlib.crc32(body)) + body


def _parse_record(data: bytes) -> Optional[tuple[int, bytes]]:
    """(seq, body) of a whole record; None for a torn or foreign one."""
    head, sep, rest = data.partition(b"\n")
    fields = head.split()
    if not sep or len(fields) != 4 or fields[0] != MAGIC or not all(f.isdigit() for f in fields[1:]):
        return None
    seq, length, crc = (int(f) for f in fields[1:])
    body = rest[:length]
    if len(body) != length or zlib.crc32(body) != crc:
        return None
    return seq, body


def _pread(fd: int) -> bytes:
    return os.pread(fd, max(os.fstat(fd).st_size, 0), 0)


def _load(contents: list[Optional[bytes]]) -> tuple[int, int, dict[str, float]]:
    """(seq, index, counts) of the newest whole record among a slot's two files'
    CONTENTS; (0, 1, {}) when neither holds one."""
    best: Optional[tuple[int, int, bytes]] = None
    for index, data in enumerate(contents):
        rec = _parse_record(data) if data else None
        if rec is not None and (best is None or rec[0] > best[0]):
            best = (rec[0], index, rec[1])
    if best is None:
        return 0, 1, {}
    return best[0], best[1], parse(best[2].decode("utf-8", "replace"))


def _read_slot(where: str, n: str) -> dict[str, float]:
    """A slot's counts as of its newest whole record. A record being written
    as it is read is torn (its checksum fails) and the other file's is
    taken; only when both are (the writer wrote twice while this read) is
    it read again."""
    for _ in range(20):
        contents: list[Optional[bytes]] = []
        for index in (0, 1):
            try:
                with open(os.path.join(where, f"p{n}.{index}"), "rb") as f:
                    contents.append(f.read())
            except OSError:
                contents.append(None)
        whole = [c for c in contents if c and _parse_record(c) is not None]
        if whole or not any(contents):
            return _load(contents)[2]
        time.sleep(0.001)
    return {}


_lock = threading.Lock()
_slots: dict[str, object] = {}      # directory -> _Slot, or the monotonic time a claim failed


def count(where: str, method: str, status: int, nbytes: int, trace: Mapping) -> None:
    """Add one response (its access-line trace) to this process's counters in WHERE; never raises."""
    try:
        adds = series(method, status, nbytes, trace)
        with _lock:
            slot = _slots.get(where)
            if isinstance(slot, float) and time.monotonic() - slot < RETRY_S:
                return
            if not isinstance(slot, _Slot) or slot.pid != os.getpid():      # first use, or a forked child
                slot = _Slot.claim(where)
                if slot is None:
                    _slots[where] = time.monotonic()
                    return
                _slots[where] = slot
            for k, v in adds:
                slot.counts[k] = slot.counts.get(k, 0) + v
            slot.save()
    except Exception:   # noqa: BLE001  (counting never fails a request)
        pass


def totals(where: str) -> dict[str, float]:
    """Every process's counters in WHERE, added up."""
    out: dict[str, float] = {}
    try:
        names = [e.name for e in os.scandir(where)]
    except OSError:
        return out
    slots = {name[1:-2] for name in names if name.startswith("p") and name[-2:] in (".0", ".1")
             and name[1:-2].isdigit()}
    for n in sorted(slots):
        for k, v in _read_slot(where, n).items():
            out[k] = out.get(k, 0) + v
    return out


# -- the version-pack backlog ---------------------------------------------------------------------

def note_backlog(where: str, store_path: str) -> None:
    """Remember that the store at STORE_PATH (its aspen.sqlite3) has versions to
    build, so that scrapes count them; cheap when remembered recently."""
    import hashlib  # startup
    try:
        name = hashlib.sha256(store_path.encode("utf-8", "surrogateescape")).hexdigest()[:24]
        mark = os.path.join(where, BACKLOG, name)
        try:
            if time.time() - os.stat(mark).st_mtime < REFRESH_S:
                return
        except FileNotFoundError:
            try:
                os.mkdir(os.path.dirname(mark))      # one level: WHERE is prepare()'s
            except FileExistsError:
                pass
        tmp = f"{mark}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(store_path + "\n")
        os.replace(tmp, mark)
    except OSError:
        pass


def exposition(values: Mapping[str, float]) -> str:
    """VALUES in Prometheus' text exposition format 0.0.4: HELP and TYPE for every family."""
    by_family: dict[str, list[str]] = {}
    for k in values:
        by_family.setdefault(family(k), []).append(k)
    lines = []
    for name, kind, _, help_text in FAMILIES:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for k in sorted(by_family.get(name, ())):
            lines.append(f"{k} {number_text(values[k])}")
    return "\n".join(lines) + "\n"


def labels_of(series_key: str) -> dict[str, str]:
    """The labels of one series (values unescaped)."""
    _, _, inner = series_key.partition("{")
    out: dict[str, str] = {}
    inner = inner[:-1] if inner.endswith("}") else inner
    i = 0
    while i < len(inner):
        eq = inner.index("=", i)
        name = inner[i:eq].lstrip(",")
        j = eq + 2
        value = []
        while inner[j] != '"':
            if inner[j] == "\\":
                j += 1
                value.append({"n": "\n"}.get(inner[j], inner[j]))
            else:
                value.append(inner[j])
            j += 1
        out[name] = "".join(value)
        i = j + 1
    return out


def families(values: Mapping[str, float]) -> dict[str, list[dict]]:
    """VALUES grouped for JSON: {family: [{"labels": {...}, "value": n}, ...]} in FAMILIES order."""
    out: dict[str, list[dict]] = {name: [] for name, _, _, _ in FAMILIES}
    for k in sorted(values):
        name = family(k)
        if name in out:
            out[name].append({"labels": labels_of(k), "value": values[k]})
    return out
