"""CGI start-up cost: wall time of one request run as a CGI program, the way
Apache runs it, by stock `git http-backend` and by `aspen-cgi`, against the
interpreter's floor (`python3 -I -S -c pass`, how aspen-cgi starts Python).
Medians and p90 over N runs, every case interleaved run by run so that machine
noise hits each alike.

Cases: `info/refs?service=git-upload-pack` and a v2 `ls-refs`, answered by
aspen-cgi from its recorded answers (http/replay.py) and, with an environment
of its own per run (never recorded), by its pipeline; a clone's fetch
request answered from the response cache, replayed and through the pipeline,
and planned from stored packs (the cache off). The pipeline runs in the
resident process aspen-cgi hands such requests to (aspen_cgi/resident.py),
as in the defaults; one case runs it in-process (ASPEN_CGI_RESIDENT=0), as
before the resident. The "served by" column counts the runs the access line
says were replayed or answered by the resident.

    python bench/cgi_startup.py [--runs 200] [--repo PATH] [--json]
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

from .progress import Progress

STOCK = "/usr/lib/git-core/git-http-backend"


def _pkt(text: str) -> bytes:
    return f"{len(text) + 4:04x}{text}".encode()


def _ls_refs_body() -> bytes:
    return (_pkt("command=ls-refs\n") + _pkt("agent=git/2.39.5\n") + _pkt("object-format=sha1\n") + b"0001"
            + _pkt("peel\n") + _pkt("symrefs\n") + _pkt("unborn\n") + _pkt("ref-prefix HEAD\n")
            + _pkt("ref-prefix refs/heads/\n") + _pkt("ref-prefix refs/tags/\n") + b"0000")


def _clone_body(repo: Path) -> bytes:
    """What `git clone` sends in v2 once it has the refs: a want per branch and tag tip, done."""
    tips = subprocess.run(["git", "for-each-ref", "--format=%(objectname)"], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.split()
    return (_pkt("command=fetch\n") + _pkt("agent=git/2.39.5\n") + _pkt("object-format=sha1\n") + b"0001"
            + _pkt("thin-pack\n") + _pkt("no-progress\n") + _pkt("ofs-delta\n")
            + b"".join(_pkt(f"want {t}\n") for t in sorted(set(tips))) + _pkt("done\n") + b"0000")


def _age(repo: Path) -> None:
    """Every file of the repository a second old: past the racy window that keeps answers from being recorded."""
    then = time.time_ns() - 1_000_000_000
    for dirpath, dirnames, filenames in os.walk(repo):
        for name in dirnames + filenames:
            os.utime(os.path.join(dirpath, name), ns=(then, then), follow_symlinks=False)


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
    ap.add_argument("--runs", type=int, default=200, help="runs per case (default 200)")
    ap.add_argument("--repo", help="bare repository to serve, copied first (default: a generated one with 60 refs)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ap.add_argument("--no-clone", action="store_true",
                    help="leave out the clone's fetch (on a large repository stock computes the whole pack each run)")
    args = ap.parse_args()
    aspen_cgi = str(Path(sys.executable).parent / "aspen-cgi")
    with tempfile.TemporaryDirectory() as tmp:
        if args.repo:
            repo = Path(tmp) / Path(args.repo).name
            subprocess.run(["cp", "-a", str(Path(args.repo).resolve()), str(repo)], check=True)
        else:
            repo = _demo_repo(Path(tmp))
        base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp, "GIT_CONFIG_NOSYSTEM": "1",
                "GIT_PROJECT_ROOT": str(repo.parent), "GIT_HTTP_EXPORT_ALL": "1", "ASPEN_ACCESS_LOG": "1",
                "GATEWAY_INTERFACE": "CGI/1.1", "SERVER_PROTOCOL": "HTTP/1.1", "REMOTE_ADDR": "127.0.0.1"}
        advert = {**base, "REQUEST_METHOD": "GET", "PATH_INFO": f"/{repo.name}/info/refs",
                  "QUERY_STRING": "service=git-upload-pack"}
        post = {**base, "REQUEST_METHOD": "POST", "PATH_INFO": f"/{repo.name}/git-upload-pack", "QUERY_STRING": "",
                "CONTENT_TYPE": "application/x-git-upload-pack-request", "HTTP_GIT_PROTOCOL": "version=2"}
        ls_refs, clone = _ls_refs_body(), _clone_body(repo)
        cases = {
            "python3 -I -S -c pass": ([sys.executable, "-I", "-S", "-c", "pass"], base, b"", False),
            "info/refs: stock": ([STOCK], advert, b"", False),
            "info/refs: aspen-cgi replayed": ([aspen_cgi], advert, b"", False),
            "info/refs: aspen-cgi pipeline": ([aspen_cgi], advert, b"", True),
            "ls-refs: stock": ([STOCK], post, ls_refs, False),
            "ls-refs: aspen-cgi replayed": ([aspen_cgi], post, ls_refs, False),
            "ls-refs: aspen-cgi pipeline": ([aspen_cgi], post, ls_refs, True),
            "clone fetch: stock": ([STOCK], post, clone, False),
            "clone fetch: aspen-cgi cache, replayed": ([aspen_cgi], post, clone, False),
            "clone fetch: aspen-cgi cache, pipeline": ([aspen_cgi], post, clone, True),
            "clone fetch: aspen-cgi stored packs, pipeline": ([aspen_cgi], {**post, "ASPEN_CACHE": "0"}, clone, True),
            "info/refs: aspen-cgi pipeline, no resident": ([aspen_cgi], {**advert, "ASPEN_CGI_RESIDENT": "0"}, b"",
                                                           True),
        }
        if args.no_clone:
            cases = {k: v for k, v in cases.items() if not k.startswith("clone")}

        def run(argv, env, body, fresh, i):
            env = dict(env, CONTENT_LENGTH=str(len(body))) if body else env
            if fresh:
                env = dict(env, ASPEN_BENCH_RUN=str(i))     # a key of its own: never replayed
            t0 = time.perf_counter()
            proc = subprocess.run(argv, env=env, input=body, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            how = "replayed" if b"replayed=1" in proc.stderr else "resident" if b"resident=1" in proc.stderr else ""
            return (time.perf_counter() - t0) * 1000, proc.stdout, how

        for argv, env, body, fresh in cases.values():    # record, and bring the cache up: cold, then a hit
            for i in range(3):
                run(argv, env, body, fresh, -1)
            _age(repo)
        times: dict[str, list[float]] = {k: [] for k in cases}
        outputs: dict[str, int] = {}
        served: dict[str, dict[str, int]] = {k: {} for k in cases}
        progress = Progress(args.runs * len(cases), "cgi start-up")
        for i in range(args.runs):
            for name, (argv, env, body, fresh) in cases.items():
                ms, out, how = run(argv, env, body, fresh, i)
                times[name].append(ms)
                outputs[name] = len(out)
                if how:
                    served[name][how] = served[name].get(how, 0) + 1
            progress(i * len(cases) + len(cases), args.runs * len(cases), "cgi start-up")
        progress.close()
        refs = len(subprocess.run(["git", "for-each-ref"], cwd=repo, capture_output=True, text=True).stdout.splitlines())
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "machine": {"cores": os.cpu_count(), "python": platform.python_version(),
                    "git": subprocess.run(["git", "--version"], capture_output=True, text=True).stdout.strip()},
        "runs": args.runs, "refs": refs,
        "median_ms": med,
        "p90_ms": {k: statistics.quantiles(v, n=10)[-1] for k, v in times.items()},
        "max_ms": {k: max(v) for k, v in times.items()},
        "response_bytes": outputs,
        "served_by": served,
    }
    if args.json:
        print(json.dumps(result))
        return 0
    floor = med["python3 -I -S -c pass"]
    print(f"CGI requests, {args.runs} interleaved runs of each case, {refs} refs ({result['machine']['git']}, "
          f"Python {result['machine']['python']}, {result['machine']['cores']} cores)")
    print("| case | median ms | p90 ms | max ms | over stock's median | over the Python floor (ms) | served by | bytes |")
    print("|---|---|---|---|---|---|---|---|")
    for k in cases:
        what = k.split(":")[0]
        stock = med.get(f"{what}: stock")
        ratio = f"{med[k] / stock:.2f}x" if stock and "aspen" in k else ""
        extra = f"{med[k] - floor:+.1f}" if "aspen" in k else ""
        replayed = ", ".join(f"{how} {n}/{args.runs}" for how, n in served[k].items())
        print(f"| {k} | {med[k]:.1f} | {result['p90_ms'][k]:.1f} | {result['max_ms'][k]:.1f} | {ratio} | {extra} "
              f"| {replayed} | {outputs[k]:,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
