"""`memory`: the server's peak RSS for a big push and a full clone, per target,
at two sizes, to show whether it grows with the pack.

Per target: a full bare clone of the repository (`clone`), then one push per
size in `push_mb` (default 100,1024 [5,20]) of a commit adding one file of
that many random bytes (the same bytes and commit on every target, each to
its own branch, so each pack holds one big blob), then a full clone again
(`clone-after`, the repository now holding the pushed blobs too). Each step
is measured alone: `server_peak_rss_bytes` is the largest RSS sum over the
server's process tree (workers and git children) sampled every 50 ms,
`server_frontend_peak_rss_bytes` the same over the server's Python processes
only (gunicorn: Aspen itself, or the CGI bridge in front of stock), and
`server_idle_rss_bytes` the tree just before the step."""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path

from .. import gitclient
from ..model import Measurement, TargetInfo
from ..procstats import tree_stats
from .base import WorkloadContext, register
from .common import ordered, repo_url, report, rmtree

MIB = 1 << 20


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


class Peak:
    """Samples a process tree's RSS (all of it, and its Python processes) until stopped."""

    def __init__(self, roots: list[int], interval: float = 0.05):
        self.roots = roots
        self.interval = interval
        self.peak = self.frontend = self.idle = 0
        self._stop = threading.Event()

    def _sample(self) -> tuple[int, int]:
        stats = tree_stats(self.roots)
        total = sum(s.rss_bytes for s in stats.values())
        front = sum(s.rss_bytes for pid, s in stats.items() if _comm(pid).startswith(("gunicorn", "python")))
        return total, front

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            total, front = self._sample()
            self.peak, self.frontend = max(self.peak, total), max(self.frontend, front)

    def __enter__(self) -> "Peak":
        self.idle, _ = self._sample()
        self.peak, self.frontend = self._sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def metrics(self) -> dict:
        return {"server_peak_rss_bytes": self.peak, "server_frontend_peak_rss_bytes": self.frontend,
                "server_idle_rss_bytes": self.idle}


def _random_file(path: Path, mib: int, seed: int) -> None:
    rnd = random.Random(seed)
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(rnd.randbytes(MIB))


def _big_commit(client: Path, scratch: Path, mib: int, seed: int) -> str:
    """A commit on main adding big-<mib>m.bin of MIB random MiB; the data file is removed once stored."""
    data = scratch / f"big-{mib}m.bin"
    _random_file(data, mib, seed + mib)
    blob = gitclient.run(["hash-object", "-w", str(data)], cwd=client, timeout=3600)
    data.unlink()
    if not blob.ok:
        raise RuntimeError(f"memory: hash-object failed: {blob.stderr_tail}")
    sha = gitclient._commit_with(client, gitclient.rev_parse(client, "refs/heads/main"),
                                 {f"big-{mib}m.bin": blob.stdout.strip()}, f"big {mib} MiB\n",
                                 gitclient.BASE_TIME + mib)
    if not sha:
        raise RuntimeError("memory: cannot make the big commit")
    return sha


def _measure(ctx: WorkloadContext, t: TargetInfo, step: str, params: dict, fn) -> Measurement:
    roots = list(ctx.procs.get(t.name) or t.pids or [])
    with Peak(roots) as peak:
        r = fn()
    m = {"wall_ms": round(r.wall_ms, 1), "failures": 0 if r.ok else 1, **peak.metrics()}
    return Measurement("memory", t.name, {"step": step, **params}, m, [r.wall_ms],
                       "" if r.ok else r.stderr_tail[-400:])


@register("memory")
def memory(ctx: WorkloadContext) -> list[Measurement]:
    """Server peak RSS for a full clone and for pushes of 100 MiB and 1 GiB of random data (quick: 5 and 20 MiB)."""
    sizes = [int(x) for x in str(ctx.param("push_mb", "100,1024", quick="5,20")).split(",") if x.strip()]
    seed = int(ctx.param("seed", 1))
    out: list[Measurement] = []
    client = ctx.workdir / "client.git"
    commits: dict[int, str] = {}
    for i, t in enumerate(ordered(ctx, 0)):
        url = repo_url(ctx, t)
        dest = ctx.workdir / f"clone-{t.name}.git"
        out.append(_measure(ctx, t, "clone", {}, lambda: gitclient.clone(url, dest, bare=True, timeout=3600)))
        report(ctx, i, len(ctx.targets), f"memory {t.name} cloned")
        if i == 0:
            os.replace(dest, client)
            gitclient.run(["config", "gc.auto", "0"], cwd=client)
            for mib in sizes:
                commits[mib] = _big_commit(client, ctx.workdir, mib, seed)
        else:
            rmtree(dest)
        for mib in sizes:
            out.append(_measure(ctx, t, "push", {"mib": mib},
                                lambda mib=mib: gitclient.push(client, url, commits[mib], f"refs/heads/big-{mib}m",
                                                               timeout=3600)))
            report(ctx, i, len(ctx.targets), f"memory {t.name} pushed {mib} MiB")
        after = ctx.workdir / f"after-{t.name}.git"
        out.append(_measure(ctx, t, "clone-after", {"mib": sum(sizes)},
                            lambda: gitclient.clone(url, after, bare=True, timeout=3600)))
        rmtree(after)
    rmtree(client)
    return out
