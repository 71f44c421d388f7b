"""`ref-advertisement`: the cost of listing many refs. A repository with
params["refs"] extra refs (default 5,000; quick 500), nine in ten branches and
one in ten annotated tags, written into every local target's copy with one
`git fast-import` (loose refs), is asked for its refs with a v0
`GET /info/refs?service=git-upload-pack` and a v2 `ls-refs` POST, R times
per target (params reps, default 30, quick 5), targets interleaved request by
request; then `git pack-refs --all` packs them and the same is measured again.
Every target must list the same refs as stock (parsed, compared), else the
workload fails."""

from __future__ import annotations

import base64
import http.client
import time
import urllib.parse
from typing import Optional

from .. import gitclient, stats
from ..model import Measurement, TargetInfo
from .base import WorkloadContext, register
from .common import Wire, ordered, repo_url, report, rmtree

TAG_EVERY = 10          # one ref in TAG_EVERY is an annotated tag
PREFIX = "adv"          # refs/heads/adv/bNNNNN, refs/tags/adv/tNNNNN
PROTOCOLS = ("v0", "v2")
AGENT = "git/2.39.5"


# ---------------------------------------------------------------- the refs

def refs_stream(commits: list[str], count: int) -> bytes:
    """A fast-import stream creating COUNT refs over COMMITS (round robin):
    annotated tags for every TAG_EVERY-th ref, branches otherwise. Deterministic."""
    out = []
    for i in range(count):
        sha = commits[(i * 7919) % len(commits)]
        if i % TAG_EVERY == TAG_EVERY - 1:
            msg = f"bench tag {i}\n".encode()
            out.append(f"tag {PREFIX}/t{i:05d}\nfrom {sha}\n"
                       f"tagger {gitclient.IDENT_NAME} <{gitclient.IDENT_EMAIL}> {gitclient.BASE_TIME + i} +0000\n"
                       .encode() + b"data %d\n" % len(msg) + msg + b"\n")
        else:
            out.append(f"reset refs/heads/{PREFIX}/b{i:05d}\nfrom {sha}\n\n".encode())
    return b"".join(out) + b"done\n"


def add_refs(gitdir, count: int) -> None:
    """Write COUNT refs into GITDIR (loose, as fast-import writes them)."""
    r = gitclient.run(["rev-list", "--all"], cwd=gitdir)
    commits = sorted(set(r.stdout.split())) if r.ok else []
    if not commits:
        raise RuntimeError(f"ref-advertisement: no commits in {gitdir}: {r.stderr_tail}")
    f = gitclient.run(["fast-import", "--quiet", "--done"], cwd=gitdir, input=refs_stream(commits, count))
    if not f.ok:
        raise RuntimeError(f"ref-advertisement: fast-import failed in {gitdir}: {f.stderr_tail}")


def push_refs(ctx: WorkloadContext, t: TargetInfo, count: int) -> None:
    """For a target without a local copy: make the refs in a clone and push them."""
    d = ctx.workdir / "ref-advertisement" / t.name
    d.mkdir(parents=True, exist_ok=True)
    clone = d / "pusher"
    if not gitclient.clone(repo_url(ctx, t), clone, bare=True).ok:
        raise RuntimeError(f"ref-advertisement: cannot clone {t.name}")
    add_refs(clone, count)
    p = gitclient.run(["push", repo_url(ctx, t), f"refs/heads/{PREFIX}/*:refs/heads/{PREFIX}/*",
                       f"refs/tags/{PREFIX}/*:refs/tags/{PREFIX}/*"], cwd=clone)
    if not p.ok:
        raise RuntimeError(f"ref-advertisement: cannot push the refs to {t.name}: {p.stderr_tail}")
    rmtree(d)


# ---------------------------------------------------------------- the requests

def pkt(line: str) -> bytes:
    data = line.encode()
    return b"%04x" % (len(data) + 4) + data


LS_REFS = (pkt("command=ls-refs\n") + pkt(f"agent={AGENT}\n") + pkt("object-format=sha1\n") + b"0001"
           + pkt("peel\n") + pkt("symrefs\n") + b"0000")


def pkt_lines(body: bytes) -> list[Optional[bytes]]:
    """The payloads of BODY's pkt-lines; None for flush/delim/response-end."""
    out, i = [], 0
    while i + 4 <= len(body):
        n = int(body[i:i + 4], 16)
        if n < 4:
            out.append(None)
            i += 4
            continue
        out.append(body[i + 4:i + n])
        i += n
    if i != len(body):
        raise ValueError(f"truncated pkt-line at byte {i} of {len(body)}")
    return out


def parse_v0(body: bytes) -> tuple[dict[str, str], dict[str, str]]:
    """(name -> id, with `name^{}` for peeled tags; symref -> target) of a v0 advertisement."""
    refs, syms = {}, {}
    lines = pkt_lines(body)
    if lines and lines[0] is not None and lines[0].startswith(b"# service="):
        lines = lines[2:]   # the service line and its flush
    for i, line in enumerate(lines):
        if line is None:
            continue
        line = line.rstrip(b"\n")
        if i == 0 and b"\0" in line:
            line, caps = line.split(b"\0", 1)
            for cap in caps.decode().split():
                if cap.startswith("symref="):
                    name, _, target = cap[len("symref="):].partition(":")
                    syms[name] = target
        oid, _, name = line.decode().partition(" ")
        if name != "capabilities^{}":
            refs[name] = oid
    return refs, syms


def parse_v2(body: bytes) -> tuple[dict[str, str], dict[str, str]]:
    """The same of a v2 ls-refs response (`peeled:`/`symref-target:` attributes)."""
    refs, syms = {}, {}
    for line in pkt_lines(body):
        if line is None:
            continue
        oid, name, *attrs = line.rstrip(b"\n").decode().split(" ")
        refs[name] = oid
        for a in attrs:
            if a.startswith("peeled:"):
                refs[name + "^{}"] = a[len("peeled:"):]
            elif a.startswith("symref-target:"):
                syms[name] = a[len("symref-target:"):]
    return refs, syms


PARSE = {"v0": parse_v0, "v2": parse_v2}


def request(url: str, proto: str, timeout: float = 120) -> tuple[int, bytes, float]:
    """One advertisement request to URL (the repository's URL); (status, body, wall ms),
    on a fresh connection as a git client makes it."""
    parts = urllib.parse.urlsplit(url)
    headers = {"User-Agent": AGENT, "Pragma": "no-cache"}
    if parts.username:
        cred = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(cred.encode()).decode()
    conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    path = parts.path.rstrip("/")
    t0 = time.perf_counter()
    conn = conn_cls(parts.hostname, parts.port, timeout=timeout)
    try:
        if proto == "v0":
            conn.request("GET", f"{path}/info/refs?service=git-upload-pack", headers=headers)
        else:
            headers.update({"Git-Protocol": "version=2", "Content-Type": "application/x-git-upload-pack-request",
                            "Accept": "application/x-git-upload-pack-result"})
            conn.request("POST", f"{path}/git-upload-pack", body=LS_REFS, headers=headers)
        resp = conn.getresponse()
        body = resp.read()
        status = resp.status
    finally:
        conn.close()
    return status, body, (time.perf_counter() - t0) * 1000


def compare(a: tuple[dict, dict], b: tuple[dict, dict]) -> str:
    """'' when the parsed listings A and B agree, else a short description."""
    (ra, sa), (rb, sb) = a, b
    problems = []
    only_a, only_b = sorted(set(ra) - set(rb)), sorted(set(rb) - set(ra))
    differ = sorted(n for n in set(ra) & set(rb) if ra[n] != rb[n])
    if only_a:
        problems.append(f"{len(only_a)} refs only in the first (e.g. {only_a[:3]})")
    if only_b:
        problems.append(f"{len(only_b)} refs only in the second (e.g. {only_b[:3]})")
    if differ:
        problems.append(f"{len(differ)} refs differ (e.g. {differ[0]}: {ra[differ[0]]} vs {rb[differ[0]]})")
    if sa != sb:
        problems.append(f"symrefs differ: {sa} vs {sb}")
    return "; ".join(problems)


# ---------------------------------------------------------------- the workload

def _measure(ctx: WorkloadContext, variant: str, reps: int, count: int, step0: int, steps: int) -> tuple[list, list]:
    """Warm up, then REPS rounds of (v0, v2) per target, interleaved. Rows and problems."""
    urls = {t.name: repo_url(ctx, t) for t in ctx.targets}
    data = {(t.name, p): {"lat": [], "bytes": [], "body": [], "fail": 0, "err": "", "parsed": None}
            for t in ctx.targets for p in PROTOCOLS}
    for t in ctx.targets:            # untimed: the first request after the refs changed pays a resync
        for p in PROTOCOLS:
            request(urls[t.name], p)
    for rep in range(reps):
        for t in ordered(ctx, rep):
            for p in (PROTOCOLS if rep % 2 == 0 else tuple(reversed(PROTOCOLS))):
                d = data[(t.name, p)]
                with Wire(ctx, t) as w:
                    try:
                        status, body, ms = request(urls[t.name], p)
                    except (OSError, http.client.HTTPException) as e:
                        status, body, ms = 0, b"", 0.0
                        d["err"] = f"{type(e).__name__}: {e}"
                if status != 200:
                    d["fail"] += 1
                    d["err"] = d["err"] or f"HTTP {status}: {body[:200]!r}"
                    continue
                d["lat"].append(ms)
                d["body"].append(len(body))
                wm = w.metrics()
                if "bytes" in wm:
                    d["bytes"].append(wm["bytes"])
                if rep == reps - 1 or d["parsed"] is None:
                    try:
                        d["parsed"] = PARSE[p](body)
                    except (ValueError, UnicodeDecodeError) as e:
                        d["fail"] += 1
                        d["err"] = f"unparsable {p} response: {e}"
        report(ctx, step0 + rep + 1, steps, f"ref-advertisement {variant}")
    problems = []
    names = [t.name for t in ctx.targets]
    base = "stock" if "stock" in names else names[0]
    for p in PROTOCOLS:
        ref = data[(base, p)]["parsed"]
        if ref is None:
            problems.append(f"{variant} {p}: {base} gave no parsable listing: {data[(base, p)]['err']}")
            continue
        if len([n for n in ref[0] if n.startswith(("refs/heads/adv/", "refs/tags/adv/")) and not n.endswith("^{}")]) != count:
            problems.append(f"{variant} {p}: {base} lists {len(ref[0])} refs, not the {count} made")
        for t in names:
            got = data[(t, p)]["parsed"]
            if t == base:
                continue
            diff = "no parsable listing: " + data[(t, p)]["err"] if got is None else compare(got, ref)
            if diff:
                problems.append(f"{variant} {p}: {t} vs {base}: {diff}")
    rows = []
    for t in ctx.targets:
        for p in PROTOCOLS:
            d = data[(t.name, p)]
            m = {"reps": reps, "failures": d["fail"]}
            if d["lat"]:
                s = stats.summary(d["lat"])
                m.update({"p50_ms": s["p50"], "p90_ms": stats.percentile(d["lat"], 90), "min_ms": s["min"],
                          "max_ms": s["max"], "body_bytes": stats.median(d["body"])})
            if d["bytes"]:
                m["bytes"] = stats.median(d["bytes"])
            if d["parsed"] is not None:
                m["refs"] = sum(1 for n in d["parsed"][0] if not n.endswith("^{}") and n != "HEAD")
            rows.append(Measurement("ref-advertisement", t.name, {"refs": count, "storage": variant, "protocol": p},
                                    m, d["lat"], d["err"]))
    return rows, problems


@register("ref-advertisement")
def ref_advertisement(ctx: WorkloadContext) -> list[Measurement]:
    """v0 `GET /info/refs` and v2 `ls-refs` on a repository with params["refs"] more refs
    (default 5000, quick 500; one in ten an annotated tag), timed R times per target (params
    reps, default 30, quick 5), interleaved, refs loose then packed (`git pack-refs
    --all`; URL targets are measured as they are). p50/p90 wall ms of the HTTP exchange
    (fresh connection each), bytes on the wire, refs listed; the listings of every
    target must equal stock's, else the workload fails."""
    count = int(ctx.param("refs", 5000, quick=500))
    reps = int(ctx.param("reps", 30, quick=5))
    for t in ctx.targets:
        root = ctx.roots.get(t.name) or t.root
        if root:
            add_refs(root / ctx.repo, count)
        else:
            push_refs(ctx, t, count)
    out, problems = [], []
    for i, variant in enumerate(("loose", "packed")):
        if variant == "packed":
            for t in ctx.targets:
                root = ctx.roots.get(t.name) or t.root
                if root:
                    r = gitclient.run(["pack-refs", "--all"], cwd=root / ctx.repo)
                    if not r.ok:
                        raise RuntimeError(f"ref-advertisement: pack-refs failed for {t.name}: {r.stderr_tail}")
        rows, probs = _measure(ctx, variant, reps, count, i * reps, 2 * reps)
        out += rows
        problems += probs
    if problems:
        raise RuntimeError("ref-advertisement: listings differ: " + " | ".join(problems))
    return out


# ---------------------------------------------------------------- pollers

def _storm(url: str, proto: str, requests: int, threads: int) -> tuple[list[float], int, float, str]:
    """REQUESTS advertisement requests from THREADS threads at once; (latencies, failures, wall s, last error)."""
    import threading
    lat: list[float] = []
    fails = [0]
    err = [""]
    lock = threading.Lock()
    left = [requests]

    def worker() -> None:
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            try:
                status, body, ms = request(url, proto)
                ok = status == 200 and body.endswith(b"0000")
            except (OSError, http.client.HTTPException) as e:
                ok, ms, status = False, 0.0, f"{type(e).__name__}: {e}"
            with lock:
                if ok:
                    lat.append(ms)
                else:
                    fails[0] += 1
                    err[0] = f"{status}"
    t0 = time.perf_counter()
    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return lat, fails[0], time.perf_counter() - t0, err[0]


@register("poll-storm")
def poll_storm(ctx: WorkloadContext) -> list[Measurement]:
    """What CI pollers and ArgoCD send: params requests R advertisement requests
    (default 500, quick 100) from params threads T at once (default 16, quick
    8), v0 `GET /info/refs` and v2 `ls-refs` in turn, on the repository as it
    is, targets one after the other, repeated params reps times (default 3,
    quick 1; the order reversed on odd ones). Requests per second, p50/p99/max
    wall ms of one request (fresh connection each); every response must be 200
    and end with a flush."""
    requests = int(ctx.param("requests", 500, quick=100))
    threads = int(ctx.param("threads", 16, quick=8))
    reps = int(ctx.param("reps", 3, quick=1))
    data = {(t.name, p): {"lat": [], "rps": [], "fail": 0, "err": ""} for t in ctx.targets for p in PROTOCOLS}
    urls = {t.name: repo_url(ctx, t) for t in ctx.targets}
    for t in ctx.targets:           # untimed: the first request after a change pays a resync
        for p in PROTOCOLS:
            request(urls[t.name], p)
    step = 0
    for rep in range(reps):
        for t in ordered(ctx, rep):
            for p in PROTOCOLS:
                lat, fails, wall, err = _storm(urls[t.name], p, requests, threads)
                d = data[(t.name, p)]
                d["lat"] += lat
                d["rps"].append(len(lat) / wall if wall > 0 else 0.0)
                d["fail"] += fails
                d["err"] = err or d["err"]
                step += 1
                report(ctx, step, reps * len(ctx.targets) * len(PROTOCOLS), f"poll-storm {t.name} {p}")
    rows = []
    for t in ctx.targets:
        for p in PROTOCOLS:
            d = data[(t.name, p)]
            m = {"reps": reps, "requests": requests, "threads": threads, "failures": d["fail"],
                 "req_per_s": stats.median(d["rps"])}
            if d["lat"]:
                m.update({"p50_ms": stats.percentile(d["lat"], 50), "p99_ms": stats.percentile(d["lat"], 99),
                          "max_ms": max(d["lat"])})
            rows.append(Measurement("poll-storm", t.name, {"protocol": p, "threads": threads}, m, d["lat"], d["err"]))
    return rows
