"""CGI start-up cost: wall time of one `info/refs?service=git-upload-pack`
request run as a CGI by Aspen (`aspen-cgi`) and by stock `git http-backend`,
against `python3 -c pass` (the interpreter's floor). Medians over N runs,
interleaved so that machine noise hits every program alike.

    python bench/cgi_startup.py [--runs 200] [--repo PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STOCK = "/usr/lib/git-core/git-http-backend"


def _progress(i: int, n: int) -> None:
    width = 30
    done = int(width * i / n)
    sys.stderr.write(f"\r[{'#' * done}{'.' * (width - done)}] {i}/{n}")
    sys.stderr.flush()


def _demo_repo(where: Path) -> Path:
    repo = where / "repo.git"
    work = where / "work"
    env = dict(os.environ, GIT_AUTHOR_NAME="b", GIT_AUTHOR_EMAIL="b@b", GIT_COMMITTER_NAME="b", GIT_COMMITTER_EMAIL="b@b")
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True, env=env)
    for i in range(20):
        (work / f"f{i}").write_text(str(i))
        subprocess.run(["git", "add", "."], cwd=work, check=True, env=env)
        subprocess.run(["git", "commit", "-qm", f"c{i}"], cwd=work, check=True, env=env)
        subprocess.run(["git", "branch", f"b{i}"], cwd=work, check=True, env=env)
        subprocess.run(["git", "tag", "-a", f"v{i}", "-m", "t"], cwd=work, check=True, env=env)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(repo)], check=True, env=env)
    return repo


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=200, help="runs per program (default 200)")
    ap.add_argument("--repo", help="bare repository to serve (default: a generated one with 60 refs)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args()
    aspen_cgi = str(Path(sys.executable).parent / "aspen-cgi")
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(args.repo).resolve() if args.repo else _demo_repo(Path(tmp))
        env = dict(os.environ, GIT_PROJECT_ROOT=str(repo.parent), GIT_HTTP_EXPORT_ALL="1", REQUEST_METHOD="GET",
                   PATH_INFO=f"/{repo.name}/info/refs", QUERY_STRING="service=git-upload-pack",
                   ASPEN_ACCESS_LOG="0")
        programs = {
            "python3 -c pass": [sys.executable, "-c", "pass"],
            "stock git http-backend": [STOCK],
            "aspen-cgi": [aspen_cgi],
        }
        times: dict[str, list[float]] = {k: [] for k in programs}
        outputs = {}
        for i in range(args.runs):
            for name, argv in programs.items():
                t0 = time.perf_counter()
                proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL)
                times[name].append((time.perf_counter() - t0) * 1000)
                outputs[name] = len(proc.stdout)
            _progress(i + 1, args.runs)
        sys.stderr.write("\n")
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "machine": {"cores": os.cpu_count(), "python": platform.python_version(),
                    "git": subprocess.run(["git", "--version"], capture_output=True, text=True).stdout.strip()},
        "runs": args.runs,
        "median_ms": med,
        "p90_ms": {k: statistics.quantiles(v, n=10)[-1] for k, v in times.items()},
        "aspen_over_stock": med["aspen-cgi"] / med["stock git http-backend"],
        "aspen_minus_python_floor_ms": med["aspen-cgi"] - med["python3 -c pass"],
        "response_bytes": outputs,
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"CGI info/refs start-up, {args.runs} interleaved runs each ({result['machine']['git']}, "
          f"Python {result['machine']['python']}, {result['machine']['cores']} cores)")
    print("| program | median ms | p90 ms |")
    print("|---|---|---|")
    for k in programs:
        print(f"| {k} | {med[k]:.1f} | {result['p90_ms'][k]:.1f} |")
    print(f"aspen-cgi / stock = {result['aspen_over_stock']:.2f}x; aspen-cgi - python floor = "
          f"{result['aspen_minus_python_floor_ms']:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
