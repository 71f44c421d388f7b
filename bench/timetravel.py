"""Time-travel fetch, undo and restore (docs/time-travel.md): what they cost.

A clone of the repository as it was PUSHES pushes ago (`repo.git@V`)
against a clone of its current refs, both from the same Aspen server
(gunicorn, version packs on, the response cache off so that each clone is
answered anew), interleaved run by run: wall time, bytes on the wire and
how each was answered. Then `aspen undo` of the latest version, REPS times
(each undoing the one before: undo, redo, ...), and `aspen restore` of
main to the pinned version and back, REPS times: the command's wall time
and its own (`ms` in its JSON). Last, a branch pushed before the pinned
version is deleted, `git gc --prune=now` runs, and `aspen restore` brings
it back from the version packs, once.

The repository is the bench's preset (the import), then PUSHES + 10 pushes
of one commit each through the server, so the pinned version is a push
version with the import and the pushes before it behind it.

    python -m bench.timetravel [--preset small] [--pushes 1000] [--reps 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aspen_cgi.runtime.repository import Repository

from . import repogen
from .progress import Progress
from .targets import start_target

GIT_ENV = dict(os.environ, GIT_AUTHOR_NAME="b", GIT_AUTHOR_EMAIL="b@b", GIT_COMMITTER_NAME="b",
               GIT_COMMITTER_EMAIL="b@b", GIT_TERMINAL_PROMPT="0")


def _git(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, check=True, capture_output=True).stdout.decode()


def _latest(repo: Path) -> int:
    from aspen_cgi.refstore.store import RefStore
    store = RefStore.open(Repository.of(str(repo), dict(os.environ)), create=False)
    return store.latest()


def _wait_built(repo: Path, timeout: float = 1800) -> None:
    from aspen_cgi.refstore.store import RefStore
    store = RefStore.open(Repository.of(str(repo), dict(os.environ)), create=False)
    deadline = time.monotonic() + timeout
    while not store.all_packs_built():
        if time.monotonic() > deadline:
            raise SystemExit(f"version packs of {repo} not built in {timeout} s")
        time.sleep(0.2)


def _clone(url: str, dest: Path, target) -> dict:
    shutil.rmtree(dest, ignore_errors=True)
    mark = target.proxy.mark()
    t = time.perf_counter()
    _git("-c", "protocol.version=2", "clone", "-q", "--mirror", url, str(dest))
    wall = time.perf_counter() - t
    recs = target.proxy.since(mark)
    return {"wall_s": wall, "bytes": sum(r.response_bytes + r.request_bytes for r in recs),
            "pack_bytes": sum(r.pack_bytes for r in recs)}


def _plan_of(log: str, path_part: str) -> str:
    lines = [line for line in log.splitlines() if "method=POST" in line and path_part in line]
    m = re.search(r"plan=(\S+)(?: why=(\S+))?", lines[-1]) if lines else None
    return "-" if m is None else m.group(1) + (f" ({m.group(2)})" if m.group(2) else "")


def _aspen(*args: str) -> tuple[float, dict]:
    t = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "aspen_cgi.cli", *args, "--json"], capture_output=True)
    wall = time.perf_counter() - t
    if res.returncode != 0:
        raise SystemExit(f"aspen {' '.join(args)} failed: {res.stdout.decode()}{res.stderr.decode()}")
    return wall, json.loads(res.stdout)


def _dist(values: list[float]) -> dict:
    v = sorted(values)
    return {"p50": round(statistics.median(v), 1), "max": round(v[-1], 1), "n": len(v)}


def _undo_restore(repo: Path, branch: str, pinned: int, reps: int) -> dict:
    undo_wall, undo_ms, rest_wall, rest_ms = [], [], [], []
    for _ in range(reps):
        wall, got = _aspen("undo", str(repo), str(_latest(repo)))
        undo_wall.append(wall * 1000)
        undo_ms.append(got["ms"])
    latest = _latest(repo)
    for i in range(reps):
        wall, got = _aspen("restore", str(repo), f"refs/heads/{branch}", "--at", str(pinned if i % 2 == 0 else latest))
        rest_wall.append(wall * 1000)
        rest_ms.append(got["ms"])
    return {"undo_cli_ms": _dist(undo_wall), "undo_own_ms": _dist(undo_ms),
            "restore_cli_ms": _dist(rest_wall), "restore_own_ms": _dist(rest_ms)}


def _restore_pruned(repo: Path, work: Path, version: int) -> dict:
    _git("push", "-q", "origin", ":refs/heads/old", cwd=work)
    _git("-c", "gc.reflogExpire=now", "-c", "gc.reflogExpireUnreachable=now", "gc", "-q", "--prune=now", cwd=repo)
    wall, got = _aspen("restore", str(repo), "refs/heads/old", "--at", str(version))
    return {"cli_ms": round(wall * 1000, 1), "own_ms": got["ms"], "reinjected": got["reinjected"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="small", choices=sorted(repogen.PRESETS), help="the imported repository")
    ap.add_argument("--pushes", type=int, default=1000, help="how many pushes ago the pinned version is")
    ap.add_argument("--reps", type=int, default=5, help="clones of each kind, interleaved")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="aspen-bench-tt-") as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        repo = root / "r.git"
        repogen.generate(repogen.PRESETS[args.preset], repo)
        _git("config", "http.receivepack", "true", cwd=repo)
        target = start_target("aspen", root, Path(tmp) / "work", env={"ASPEN_CACHE": "off"})
        try:
            served = Path(target.info.root) / "r.git"
            url = f"{target.info.url}/r.git"
            work = Path(tmp) / "w"
            _git("clone", "-q", url, str(work))
            branch = _git("symbolic-ref", "--short", "HEAD", cwd=work).strip()
            total = args.pushes + 10
            bar = Progress(total, "pushes", stream=sys.stderr)
            pinned = pinned_old = 0
            t0 = time.perf_counter()
            for i in range(total):
                (work / "tt.txt").write_text("".join(f"push {i} line {n}\n" for n in range(40)))
                (work / f"d{i % 17}.txt").write_text(f"{i}\n" * (i % 50 + 1))
                _git("add", "-A", cwd=work)
                _git("commit", "-q", "-m", f"push {i}", cwd=work)
                _git("push", "-q", "origin", f"HEAD:{branch}", cwd=work)
                if i == 8:          # a branch of its own: once deleted, gc prunes its commit
                    _git("checkout", "-q", "-b", "old", cwd=work)
                    (work / "old.txt").write_text("".join(f"only on old {n}\n" for n in range(200)))
                    _git("add", "-A", cwd=work)
                    _git("commit", "-q", "-m", "only on old", cwd=work)
                    _git("push", "-q", "origin", "HEAD:refs/heads/old", cwd=work)
                    _git("checkout", "-q", branch, cwd=work)
                    pinned_old = _latest(served)
                if i == 9:
                    pinned = _latest(served)
                bar.update(i + 1)
            bar.close()
            push_s = time.perf_counter() - t0
            _wait_built(served)
            latest = _latest(served)
            rows: dict[str, list[dict]] = {"pinned": [], "current": []}
            for rep in range(args.reps):
                for kind in (("pinned", "current") if rep % 2 == 0 else ("current", "pinned")):
                    u = f"{url}@{pinned}" if kind == "pinned" else url
                    got = _clone(u, Path(tmp) / f"c-{kind}", target)
                    got["plan"] = _plan_of(target.log_text(), f"r.git@{pinned}/" if kind == "pinned" else "r.git/")
                    rows[kind].append(got)
            log = target.log_text()
            undo_rows = _undo_restore(served, branch, pinned, args.reps)
            undo_rows["restore_pruned"] = _restore_pruned(served, work, pinned_old)
        finally:
            target.stop()
    out = {"preset": args.preset, "pushes_ago": latest - pinned, "pinned_version": pinned, "latest": latest,
           "push_s": round(push_s, 1), "reps": args.reps}
    for kind, rs in rows.items():
        walls = sorted(r["wall_s"] for r in rs)
        out[kind] = {"wall_p50_s": round(statistics.median(walls), 3), "wall_max_s": round(walls[-1], 3),
                     "bytes": rs[-1]["bytes"], "pack_bytes": rs[-1]["pack_bytes"],
                     "plans": sorted({r["plan"] for r in rs})}
    out["wall_ratio_p50"] = round(out["pinned"]["wall_p50_s"] / out["current"]["wall_p50_s"], 2)
    out["bytes_ratio"] = round(out["pinned"]["bytes"] / out["current"]["bytes"], 2)
    out["tracebacks"] = log.count("Traceback")
    out.update(undo_rows)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{args.preset} preset + {total} pushes; pinned version {pinned} is {latest - pinned} versions old "
          f"(latest {latest}); {args.reps} clones each, interleaved")
    print("| clone | wall p50 s | wall max s | bytes | pack bytes | answered |")
    print("|---|---|---|---|---|---|")
    for kind in ("pinned", "current"):
        r = out[kind]
        label = f"`r.git@{pinned}`" if kind == "pinned" else "`r.git` (current)"
        print(f"| {label} | {r['wall_p50_s']} | {r['wall_max_s']} | {r['bytes']} | {r['pack_bytes']} | "
              f"{', '.join(r['plans'])} |")
    print(f"pinned/current: wall {out['wall_ratio_p50']}, bytes {out['bytes_ratio']}")
    print()
    print("| command | wall p50 ms | wall max ms | own p50 ms | own max ms | n |")
    print("|---|---|---|---|---|---|")
    for name, key in (("`aspen undo` (latest version)", "undo"), ("`aspen restore` (main, by version)", "restore")):
        w, o = out[f"{key}_cli_ms"], out[f"{key}_own_ms"]
        print(f"| {name} | {w['p50']} | {w['max']} | {o['p50']} | {o['max']} | {w['n']} |")
    r = out["restore_pruned"]
    print(f"| `aspen restore` of a branch deleted and pruned by gc (versions {r['reinjected']} put back) | "
          f"{r['cli_ms']} | | {r['own_ms']} | | 1 |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
