"""Bundle clones (docs/time-travel.md, fetch/bundle.py) against normal
clones, from one Aspen server (gunicorn, the repository imported before it
starts, the response cache off so that each clone is answered anew),
interleaved run by run:

- `normal`: `git clone --mirror URL` (protocol v2);
- `bundle`: `git clone --bundle-uri=URL/aspen/bundle URL` (the bundle is a
  static file, built by the first request, which is timed apart);
- `resumed`: the bundle's download cut at half its bytes (the connection
  closed), resumed with `curl -C -`, then `git clone --bundle-uri=FILE URL`.

Each case: wall time, bytes on the wire (both directions, every request),
and the server's CPU seconds (its process tree, bench/procstats.py).

    python -m bench.bundle_clone [--preset large] [--reps 3] [--json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

from . import repogen
from .procstats import ProcTree
from .targets import start_target

GIT_ENV = dict(os.environ, GIT_TERMINAL_PROMPT="0")


def _run(*argv: str) -> None:
    subprocess.run(argv, env=GIT_ENV, check=True, capture_output=True, timeout=3600)


def _cut(url: str, dest: Path, fraction: float) -> int:
    """Download URL and break the connection after FRACTION of its body."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
    conn.request("GET", parts.path)
    resp = conn.getresponse()
    size = int(resp.getheader("Content-Length"))
    keep = int(size * fraction)
    with open(dest, "wb") as f:
        left = keep
        while left:
            chunk = resp.read(min(left, 1 << 16))
            if not chunk:
                break
            f.write(chunk)
            left -= len(chunk)
    conn.close()
    return size


def _case(kind: str, url: str, tmp: Path, target) -> dict:
    dest = tmp / f"c-{kind}"
    shutil.rmtree(dest, ignore_errors=True)
    bundle = tmp / "resumed.bundle"
    bundle.unlink(missing_ok=True)
    mark = target.proxy.mark()
    tree = ProcTree(target.info.pids).start()
    t = time.perf_counter()
    if kind == "normal":
        _run("git", "-c", "protocol.version=2", "clone", "-q", "--mirror", url, str(dest))
    elif kind == "bundle":
        _run("git", "-c", "protocol.version=2", "clone", "-q", f"--bundle-uri={url}/aspen/bundle", url, str(dest))
    else:
        _cut(f"{url}/aspen/bundle", bundle, 0.5)
        _run("curl", "-sS", "-f", "-C", "-", "-o", str(bundle), f"{url}/aspen/bundle")
        _run("git", "-c", "protocol.version=2", "clone", "-q", f"--bundle-uri={bundle}", url, str(dest))
    wall = time.perf_counter() - t
    cpu = tree.stop().cpu_s
    recs = target.proxy.since(mark)
    return {"wall_s": wall, "cpu_s": cpu, "bytes": sum(r.request_bytes + r.response_bytes for r in recs),
            "requests": len(recs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="large", choices=sorted(repogen.PRESETS), help="the repository")
    ap.add_argument("--reps", type=int, default=3, help="clones of each kind, interleaved")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args()
    kinds = ("normal", "bundle", "resumed")
    with tempfile.TemporaryDirectory(prefix="aspen-bench-bundle-") as tmp_s:
        tmp = Path(tmp_s)
        root = tmp / "root"
        root.mkdir()
        info = repogen.generate(repogen.PRESETS[args.preset], root / "r.git")
        target = start_target("aspen-packs", root, tmp / "work", env={"ASPEN_CACHE": "off"})
        try:
            url = f"{target.info.url}/r.git"
            tree = ProcTree(target.info.pids).start()
            t = time.perf_counter()
            _run("curl", "-sS", "-f", "-o", str(tmp / "first.bundle"), f"{url}/aspen/bundle")
            first = {"wall_s": time.perf_counter() - t, "cpu_s": tree.stop().cpu_s,
                     "bytes": (tmp / "first.bundle").stat().st_size}
            rows: dict[str, list[dict]] = {k: [] for k in kinds}
            for rep in range(args.reps):
                order = kinds[rep % 3:] + kinds[:rep % 3]
                for kind in order:
                    rows[kind].append(_case(kind, url, tmp, target))
            log = target.log_text()
        finally:
            target.stop()
    out: dict = {"preset": args.preset, "commits": info.commits, "objects": info.objects, "reps": args.reps,
                 "first_bundle": {k: round(v, 3) for k, v in first.items()}, "tracebacks": log.count("Traceback")}
    for kind, rs in rows.items():
        out[kind] = {m: round(statistics.median(r[m] for r in rs), 3) for m in ("wall_s", "cpu_s", "bytes")}
        out[kind]["wall_max_s"] = round(max(r["wall_s"] for r in rs), 3)
        out[kind]["requests"] = rs[-1]["requests"]
    for kind in ("bundle", "resumed"):
        out[f"{kind}_vs_normal"] = {m: round(out[kind][m] / out["normal"][m], 2) if out["normal"][m] else None
                                    for m in ("wall_s", "cpu_s", "bytes")}
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{args.preset} preset ({info.commits} commits, {info.objects} objects), {args.reps} clones of each kind, "
          f"interleaved; first bundle request (built then): {first['wall_s']:.2f} s, server CPU "
          f"{first['cpu_s']:.2f} s, {first['bytes']} bytes")
    print("| clone | wall p50 s | wall max s | server CPU s | bytes | requests | wall / normal | CPU / normal | "
          "bytes / normal |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind in kinds:
        r = out[kind]
        ratio = out.get(f"{kind}_vs_normal", {"wall_s": 1.0, "cpu_s": 1.0, "bytes": 1.0})
        print(f"| {kind} | {r['wall_s']} | {r['wall_max_s']} | {r['cpu_s']} | {r['bytes']} | {r['requests']} | "
              f"{ratio['wall_s']} | {ratio['cpu_s']} | {ratio['bytes']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
