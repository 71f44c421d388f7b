"""Push workloads: `push-history` (push latency in windows over a growing trunk
history, every push a real HTTP push of one commit) and `writers` (W writers
pushing to their own branches for S seconds while R readers poll `ls-remote`
and fetch: push latency, throughput, and push->visible latency)."""

from __future__ import annotations

import threading
import time

from .. import gitclient, stats
from ..model import Measurement
from .base import WorkloadContext, register
from .common import ServerUsage, copy_client, ordered, quiet_repo, repo_url, report, rmtree
from .storeprobe import wait_target_packs


@register("push-history")
def push_history(ctx: WorkloadContext) -> list[Measurement]:
    """params["pushes"] pushes to main (default 10000, quick 200) interleaved across
    targets push by push (order alternating); one row per target and window of
    params["window"] pushes (default 100, quick 50) with p50/p99, and one
    summary row (params {"window": "all"}) that also compares the p50 of the
    first and last 500 pushes (10% each with fewer than 5,000): first_p50_ms,
    last_p50_ms and last_first (1.0 = flat); each Aspen row notes the issue's
    target (last/first <= 1.2, p50 <= stock's). The summary row also has
    server_cpu_s, the CPU of the target's server tree over the whole history
    (its own pushes only, and for a target that builds version packs, the
    builds, waited for after the last push: packs_wait_ms, packs_settled,
    pack_files, packs_bytes)."""
    total = int(ctx.param("pushes", 10000, quick=200))
    window = int(ctx.param("window", 100, quick=50))
    state = {}
    for t in ctx.targets:
        d = ctx.workdir / "push-history" / t.name
        d.mkdir(parents=True, exist_ok=True)
        pusher = d / "pusher"
        if not gitclient.clone(repo_url(ctx, t), pusher, bare=True).ok:
            raise RuntimeError(f"push-history: cannot clone {t.name}")
        base = gitclient.rev_parse(pusher, ctx.trunk)
        ids = gitclient.fast_import_chain(pusher, base, total, "refs/bench/history", tag="history")
        state[t.name] = {"pusher": pusher, "ids": ids, "lat": [], "ok": []}
    usage = {t.name: ServerUsage(ctx, t).__enter__() for t in ctx.targets}
    settled = {}
    try:
        for k in range(total):
            for t in ordered(ctx, k):
                s = state[t.name]
                r = gitclient.push(s["pusher"], repo_url(ctx, t), s["ids"][k], ctx.trunk)
                s["lat"].append(r.wall_ms)
                s["ok"].append(r.ok)
            if k % 10 == 9 or k == total - 1:
                report(ctx, k + 1, total, "push-history")
        for t in ctx.targets:
            settled[t.name] = wait_target_packs(ctx, t, timeout=float(ctx.param("packs_timeout", 1800)))
    finally:
        for u in usage.values():
            u.__exit__(None, None, None)
    out = []
    for t in ctx.targets:
        s = state[t.name]
        for start in range(0, total, window):
            part = list(zip(s["lat"][start:start + window], s["ok"][start:start + window]))
            lat = [x for x, ok in part if ok]
            fails = len(part) - len(lat)
            m = {"after": min(total, start + window), "pushes": len(lat), "failures": fails}
            if lat:
                m.update({"p50_ms": stats.percentile(lat, 50), "p99_ms": stats.percentile(lat, 99)})
            out.append(Measurement("push-history", t.name, {"window": window, "from": start}, m, lat))
        ok = [x for x, good in zip(s["lat"], s["ok"]) if good]
        m = {"pushes": len(ok), "failures": total - len(ok)}
        m.update({f"{k}_ms": v for k, v in stats.summary(ok).items() if k != "n"})
        m.update(first_last(s["lat"], s["ok"]))
        m.update({k: v for k, v in usage[t.name].metrics().items() if k == "server_cpu_s"})
        m.update(settled.get(t.name, {}))
        out.append(Measurement("push-history", t.name, {"window": "all"}, m, ok))
        rmtree(ctx.workdir / "push-history" / t.name)
    _note_issue_target(out)
    return out


FIRST_LAST = 500        # pushes compared at each end of the history
FLAT_TARGET = 1.2       # the issue's bound on Aspen's last/first


def first_last_span(total: int) -> int:
    """Pushes compared at each end: the first and last 500, or 10% of the
    history when that is fewer (so the two ends never overlap); at least 1."""
    return max(1, min(FIRST_LAST, total // 10))


def first_last(lat: list[float], ok: list[bool]) -> dict:
    """p50 over the first SPAN pushes and over the last SPAN pushes (successful
    ones), and last_first = their ratio: 1.0 is a flat history."""
    total = len(lat)
    if not total:
        return {}
    span = first_last_span(total)
    first = [x for x, good in zip(lat[:span], ok[:span]) if good]
    last = [x for x, good in zip(lat[total - span:], ok[total - span:]) if good]
    m = {"span": span}
    if first:
        m["first_p50_ms"] = stats.percentile(first, 50)
    if last:
        m["last_p50_ms"] = stats.percentile(last, 50)
    if first and last and m["first_p50_ms"] > 0:
        m["last_first"] = round(m["last_p50_ms"] / m["first_p50_ms"], 3)
    return m


def _note_issue_target(rows: list[Measurement]) -> None:
    """On each Aspen summary row (aspen, aspen-packs, aspen-git): whether the issue's
    target holds (last/first <= 1.2 and its p50 <= stock's p50 over the whole
    history); for a target that builds version packs, how long its packs took
    to catch up after the last push."""
    summary = {r.target: r for r in rows if r.params.get("window") == "all"}
    b = summary.get("stock")
    for name, a in summary.items():
        if not (name == "aspen" or name.startswith("aspen-")) or "last_first" not in a.metrics:
            continue
        flat = a.metrics["last_first"] <= FLAT_TARGET
        text = (f"issue target: last/first {a.metrics['last_first']:.2f} <= {FLAT_TARGET} "
                f"{'met' if flat else 'MISSED'}")
        if b is not None and "p50_ms" in a.metrics and "p50_ms" in b.metrics:
            fast = a.metrics["p50_ms"] <= b.metrics["p50_ms"]
            text += (f"; p50 {a.metrics['p50_ms']:.1f} ms vs stock {b.metrics['p50_ms']:.1f} ms "
                     f"{'met' if fast else 'MISSED'}")
        if "packs_wait_ms" in a.metrics:
            text += (f"; version packs {'caught up' if a.metrics.get('packs_settled') else 'NOT caught up'} "
                     f"{a.metrics['packs_wait_ms'] / 1000:.1f} s after the last push")
        a.notes = (a.notes + " " if a.notes else "") + text


def _writers_on(ctx: WorkloadContext, t, writers: int, readers: int, seconds: float, rep: int) -> Measurement:
    url = repo_url(ctx, t)
    d = ctx.workdir / "writers" / t.name / str(rep)
    d.mkdir(parents=True, exist_ok=True)
    base_client = d / "base"
    if not gitclient.clone(url, base_client, bare=True).ok:
        raise RuntimeError(f"writers: cannot clone {t.name}")
    quiet_repo(base_client)
    base = gitclient.rev_parse(base_client, ctx.trunk)
    cap = int(min(5000, max(50, seconds * 40)))   # upper bound on pushes one writer can make
    chains = []
    for i in range(writers):
        wdir = d / f"w{i}"
        copy_client(base_client, wdir)
        chains.append((wdir, gitclient.fast_import_chain(wdir, base, cap, f"refs/bench/w{i}", tag=f"writer{i}-{rep}")))
    for i in range(readers):
        copy_client(base_client, d / f"r{i}")

    lock = threading.Lock()
    acked: dict[str, tuple[int, int, float]] = {}    # commit -> (writer, index, ack time)
    visible: dict[tuple[int, int], float] = {}      # (writer, index) -> ms from ack to first seen
    push_lat: list[float] = []
    counts = {"push_failures": 0, "reads": 0, "read_failures": 0, "fetches": 0, "fetch_failures": 0}
    failed: list[str] = []      # the failed pushes' messages
    stop_at = time.monotonic() + seconds

    def writer(i: int) -> None:
        wdir, ids = chains[i]
        for j, sha in enumerate(ids):
            if time.monotonic() >= stop_at:
                return
            r = gitclient.push(wdir, url, sha, f"refs/heads/writers/{rep}/w{i}", timeout=120)
            now = time.monotonic()
            with lock:
                if r.ok:
                    push_lat.append(r.wall_ms)
                    acked[sha] = (i, j, now)
                else:
                    counts["push_failures"] += 1
                    failed.append(r.stderr_tail)

    def reader(i: int, fetching: bool = True) -> None:
        rdir = d / f"r{i}"
        last: dict[str, str] = {}
        while time.monotonic() < stop_at + 2.0:
            r = gitclient.ls_remote(url, timeout=60)
            seen_at = time.monotonic()
            with lock:
                counts["reads"] += 1
                if not r.ok:
                    counts["read_failures"] += 1
                    continue
                refs = gitclient.parse_refs(r.stdout)
                for sha in refs.values():
                    hit = acked.get(sha)
                    if hit is None:
                        continue
                    w, j, ack = hit
                    for k in range(j, -1, -1):   # an ancestor push of the same writer is visible too
                        if (w, k) in visible:
                            break
                        sha_k = chains[w][1][k]
                        if sha_k in acked:
                            visible[(w, k)] = max(0.0, (seen_at - acked[sha_k][2]) * 1000)
            if fetching and refs != last:
                last = refs
                f = gitclient.fetch(rdir, url, ["+refs/heads/*:refs/remotes/origin/*"], timeout=120)
                with lock:
                    counts["fetches"] += 1
                    counts["fetch_failures"] += not f.ok
            if time.monotonic() > stop_at and all(s in {v for v in refs.values()} for s in
                                                   [chains[w][1][j] for (w, j) in _latest(acked)]):
                return

    threads = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(writers)]
    threads += [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(readers)]
    threads.append(threading.Thread(target=reader, args=(readers, False), daemon=True))   # the watcher
    t0 = time.monotonic()
    for th in threads:
        th.start()
    while any(th.is_alive() for th in threads):
        report(ctx, min(int(seconds), int(time.monotonic() - t0)), int(seconds), f"writers {t.name}")
        time.sleep(0.5)
        if time.monotonic() > stop_at + 180:
            break
    elapsed = max(seconds, 1e-9)
    vis = list(visible.values())
    m = {"writers": writers, "readers": readers, "seconds": seconds, "pushes": len(push_lat),
         "pushes_per_s": len(push_lat) / elapsed, **counts, "visible_samples": len(vis),
         "not_seen": len(acked) - len(vis)}
    if push_lat:
        m.update({"push_p50_ms": stats.percentile(push_lat, 50), "push_p99_ms": stats.percentile(push_lat, 99)})
    if vis:
        m.update({"visible_p50_ms": stats.percentile(vis, 50), "visible_p99_ms": stats.percentile(vis, 99)})
    rmtree(d)
    return Measurement("writers", t.name, {"writers": writers, "readers": readers, "seconds": seconds, "rep": rep},
                       m, push_lat, "samples: push latency ms"
                       + (f"; first failed push: {failed[0].strip()[-300:]}" if failed else ""))


def _latest(acked: dict) -> list[tuple[int, int]]:
    best: dict[int, int] = {}
    for w, j, _ in acked.values():
        best[w] = max(best.get(w, -1), j)
    return list(best.items())


@register("writers")
def writers(ctx: WorkloadContext) -> list[Measurement]:
    """W writers (params writers, default 16, quick 4) push one commit at a time to
    `writers/wI` for S seconds (params seconds, default 30, quick 5) while R readers
    (params readers, default 4, quick 2) poll `ls-remote` and fetch on change, and
    one watcher polls `ls-remote` only. Push->visible is the time from a push's
    acknowledgement to the end of the first poll (any reader's or the watcher's)
    that shows it or a later push of the same writer; `reads` counts all polls.
    Targets run one after the other (order alternating per repetition)."""
    w = int(ctx.param("writers", 16, quick=4))
    r = int(ctx.param("readers", 4, quick=2))
    s = float(ctx.param("seconds", 30, quick=5))
    reps = int(ctx.param("reps", 1))
    return [_writers_on(ctx, t, w, r, s, rep) for rep in range(reps) for t in ordered(ctx, rep)]
