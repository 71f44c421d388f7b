"""Clones whose bulk the edge carries (docs/offload.md, fetch/offload.py)
against the same clones from Aspen's answer, from one Aspen server
(gunicorn with the product's defaults: response cache on, offload on; the
repository imported first, its packs built), interleaved run by run:

- `inline`: `git clone --mirror URL` over protocol v2, the client asking
  for nothing (git's default): the whole pack in Aspen's answer;
- `uris`: the same with `fetch.uriProtocols=http` (git >= 2.28): the import
  pack downloaded from Aspen's static route `aspen/pack/`, the rest inline;
- `bundle-uri` (only with `--git PATH`, a git >= 2.49 client: git 2.39 never
  asks): the same with `transfer.bundleURI=true`: the bundle the server
  names, then a fetch of what came since.

Each clone: wall time, the server's CPU seconds (its process tree,
bench/procstats.py), bytes on the wire split into Aspen's answers
(upload-pack) and the static files (`aspen/pack/`, `aspen/bundle`), and
correctness (`git fsck --strict`, refs equal to the server's).

Then a storm: `--storm N` clones, `--jobs K` at a time, inline then with
`fetch.uriProtocols=http`, on the same server: its CPU, the storm's wall,
bytes by kind; every clone's refs checked, the last of each kind fsck'd.

With `--raw` the storm's clients send the request `git clone --mirror`
sends and download every pack the answer names, but index nothing: the
server's side of N clones without N index-packs on the bench machine
(a 100-clone storm of git.git would be hours of client CPU on 2 cores).

    python -m bench.offload_clone --repo /tmp/gitgit.git [--reps 3] [--git PATH] [--storm 20 --jobs 10 [--raw]] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

from . import repogen
from .procstats import ProcTree
from .targets import copy_root, start_target

GIT_ENV = dict(os.environ, GIT_TERMINAL_PROMPT="0")
STATIC = ("/aspen/pack/", "/aspen/bundle")


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=GIT_ENV, check=True, capture_output=True, timeout=3600)


def _refs(gitdir: Path, git: str = "git") -> dict[str, str]:
    out = _run(git, "-C", str(gitdir), "for-each-ref", "--format=%(objectname) %(refname)").stdout.decode()
    # refs/bundles/*: what a bundle-uri clone keeps of the bundle's refs (git's bundle-uri.c), not the server's
    return {name: oid for oid, name in (line.split(" ", 1) for line in out.splitlines())
            if not name.startswith("refs/bundles/")}


def _clone_argv(kind: str, url: str, dest: Path, git: str) -> list[str]:
    conf = {"inline": [], "uris": ["-c", "fetch.uriProtocols=http"],
            "bundle-uri": ["-c", "transfer.bundleURI=true"]}[kind]
    return [git, "-c", "protocol.version=2", *conf, "clone", "-q", "--mirror", url, str(dest)]


def _bytes(recs) -> dict[str, int]:
    static = sum(r.request_bytes + r.response_bytes for r in recs if any(s in r.path for s in STATIC))
    total = sum(r.request_bytes + r.response_bytes for r in recs)
    return {"bytes": total, "answer_bytes": total - static, "static_bytes": static}


class Nginx:
    """nginx/aspen-offload.conf (placeholders filled in) serving the target's
    packs from disk, for ASPEN_OFFLOAD_URL: its bytes from its access log,
    its CPU from its process tree."""

    def __init__(self, base: Path, packs_root: Path):
        self.base, self.port = base, _free_port()
        base.mkdir(parents=True, exist_ok=True)
        conf = (Path(__file__).resolve().parent.parent / "nginx" / "aspen-offload.conf").read_text()
        (base / "offload.conf").write_text(conf.replace("@LISTEN@", f"127.0.0.1:{self.port}")
                                           .replace("@PACKS_ROOT@", str(packs_root)))
        user = "user root root;\n" if os.geteuid() == 0 else ""
        (base / "nginx.conf").write_text(
            f"{user}worker_processes 1;\npid {base}/nginx.pid;\nerror_log {base}/error.log;\nevents {{}}\n"
            f"http {{\n    log_format bytes '$status $body_bytes_sent $request_uri';\n"
            f"    access_log {base}/access.log bytes;\n    client_body_temp_path {base}/body;\n"
            f"    proxy_temp_path {base}/proxy;\n    fastcgi_temp_path {base}/fastcgi;\n"
            f"    uwsgi_temp_path {base}/uwsgi;\n    scgi_temp_path {base}/scgi;\n"
            f"    include {base}/offload.conf;\n}}\n")
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/offload"

    def start(self) -> "Nginx":
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        self.proc = subprocess.Popen([nginx, "-p", str(self.base), "-c", str(self.base / "nginx.conf"), "-e",
                                      str(self.base / "error.log"), "-g", "daemon off;"])
        deadline = time.time() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError("nginx did not start") from None
                time.sleep(0.05)

    def mark(self) -> int:
        log = self.base / "access.log"
        return log.stat().st_size if log.exists() else 0

    def bytes_since(self, mark: int) -> int:
        log = self.base / "access.log"
        if not log.exists():
            return 0
        with open(log, "rb") as f:
            f.seek(mark)
            return sum(int(line.split()[1]) for line in f.read().decode().splitlines() if line.strip())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=15)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _case(kind: str, url: str, tmp: Path, target, server_refs: dict[str, str], git: str, fsck: bool,
          edge: Optional[Nginx] = None) -> dict:
    dest = tmp / f"c-{kind}"
    shutil.rmtree(dest, ignore_errors=True)
    mark = target.proxy.mark()
    edge_mark = edge.mark() if edge is not None else 0
    tree = ProcTree(target.info.pids).start()
    edge_tree = ProcTree(edge.proc.pid).start() if edge is not None and edge.proc is not None else None
    t = time.perf_counter()
    _run(*_clone_argv(kind, url, dest, git))
    wall = time.perf_counter() - t
    cpu = tree.stop().cpu_s
    recs = target.proxy.since(mark)
    row = {"wall_s": wall, "cpu_s": cpu, "requests": len(recs), **_bytes(recs)}
    if edge is not None and edge_tree is not None:
        row["edge_cpu_s"] = edge_tree.stop().cpu_s
        row["edge_bytes"] = edge.bytes_since(edge_mark)
    if fsck:
        _run("git", "-C", str(dest), "fsck", "--strict", "--no-progress")
    refs = _refs(dest)
    row["refs_equal"] = refs == server_refs
    row["fsck"] = "ok" if fsck else "not run"
    shutil.rmtree(dest, ignore_errors=True)
    return row


def _storm(kind: str, url: str, tmp: Path, target, server_refs: dict[str, str], n: int, jobs: int,
           edge: Optional[Nginx] = None) -> dict:
    mark = target.proxy.mark()
    edge_mark = edge.mark() if edge is not None else 0
    tree = ProcTree(target.info.pids).start()
    edge_tree = ProcTree(edge.proc.pid).start() if edge is not None and edge.proc is not None else None
    ok = [0]
    lock = threading.Lock()
    last: list[Path] = []

    def one(i: int) -> None:
        dest = tmp / f"s-{kind}-{i}"
        _run(*_clone_argv(kind, url, dest, "git"))
        same = _refs(dest) == server_refs
        with lock:
            ok[0] += same
            if i == n - 1:
                last.append(dest)
        if i != n - 1:
            shutil.rmtree(dest, ignore_errors=True)

    t = time.perf_counter()
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(one, range(n)))
    wall = time.perf_counter() - t
    cpu = tree.stop().cpu_s
    recs = target.proxy.since(mark)
    edge_figures = {}
    if edge is not None and edge_tree is not None:
        edge_figures = {"edge_cpu_s": round(edge_tree.stop().cpu_s, 2), "edge_bytes": edge.bytes_since(edge_mark)}
    for dest in last:
        _run("git", "-C", str(dest), "fsck", "--strict", "--no-progress")
        shutil.rmtree(dest, ignore_errors=True)
    return {"clones": n, "jobs": jobs, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "check": f"{ok[0]}/{n} refs equal, fsck (last) ok", **_bytes(recs), **edge_figures}


def _raw_storm(kind: str, url: str, target, server_refs: dict[str, str], n: int, jobs: int,
               edge: Optional[Nginx] = None) -> dict:
    """N clients at once (JOBS at a time) sending the fetch a `git clone --mirror`
    sends, reading the whole answer and downloading every pack it names by
    URI, as git would, but indexing nothing: the server's side of a storm of N
    clones without N index-packs on this machine. Every answer of a kind
    must be as long as the first (cached and planned answers are the same
    bytes each time); the single clones before it are the fsck'd ones."""
    from . import rawclone
    body = rawclone.fetch_body(sorted(set(server_refs.values())), "http" if kind == "uris" else None)
    mark = target.proxy.mark()
    edge_mark = edge.mark() if edge is not None else 0
    tree = ProcTree(target.info.pids).start()
    edge_tree = ProcTree(edge.proc.pid).start() if edge is not None and edge.proc is not None else None
    sizes: list[tuple[int, int]] = []
    lock = threading.Lock()
    walls: list[float] = []

    def one(i: int) -> None:
        got = rawclone.clone(url, body)
        with lock:
            sizes.append((got.answer_bytes, got.static_bytes))
            walls.append(got.wall_s)

    t = time.perf_counter()
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(one, range(n)))
    wall = time.perf_counter() - t
    cpu = tree.stop().cpu_s
    recs = target.proxy.since(mark)
    edge_figures = {}
    if edge is not None and edge_tree is not None:
        edge_figures = {"edge_cpu_s": round(edge_tree.stop().cpu_s, 2), "edge_bytes": edge.bytes_since(edge_mark)}
    same = sum(1 for s in sizes if s == sizes[0])
    walls.sort()
    return {"clones": n, "jobs": jobs, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "clone_wall_p50_s": round(walls[len(walls) // 2], 2), "clone_wall_max_s": round(walls[-1], 2),
            "check": f"raw clients: {same}/{n} answers of the first's length", **_bytes(recs), **edge_figures}


def _git_version(git: str) -> str:
    return _run(git, "--version").stdout.decode().strip()


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, help="a bare repository to copy (kept as it is: an Aspen state in it is"
                                              " used); default: --preset's generated one")
    ap.add_argument("--preset", default="medium", choices=sorted(repogen.PRESETS))
    ap.add_argument("--reps", type=int, default=3, help="clones of each kind, interleaved")
    ap.add_argument("--git", help="a git >= 2.49 client for the bundle-uri case (not run without it)")
    ap.add_argument("--no-fsck", action="store_true", help="skip git fsck --strict of the single clones")
    ap.add_argument("--storm", type=int, default=0, help="clones in the storm of each kind (0: no storm)")
    ap.add_argument("--jobs", type=int, default=10, help="the storm's clones at once")
    ap.add_argument("--raw", action="store_true", help="the storm's clients send git's requests and download "
                    "what they are named, but index nothing (no client CPU: a 100-clone storm of git.git on 2 cores)")
    ap.add_argument("--nginx", action="store_true", help="the packs by ASPEN_OFFLOAD_URL from nginx "
                    "(nginx/aspen-offload.conf over the server's repositories) instead of Aspen's own route")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    args = ap.parse_args(argv)
    kinds = ["inline", "uris"] + (["bundle-uri"] if args.git else [])
    with tempfile.TemporaryDirectory(prefix="aspen-bench-offload-") as tmp_s:
        tmp = Path(tmp_s)
        root = tmp / "root"
        if args.repo:
            copy_root(args.repo, root / args.repo.name)
            name = args.repo.name
        else:
            root.mkdir()
            repogen.generate(repogen.PRESETS[args.preset], root / "r.git")
            name = "r.git"
        # the product's defaults (the bench's targets turn the response cache off)
        env = {"ASPEN_CACHE": "1"}
        edge = None
        if args.nginx:      # the target's repositories: start_target copies ROOT to WORKDIR/<name>/repos
            edge = Nginx(tmp / "nginx", tmp / "work" / "aspen-packs" / "repos")
            env["ASPEN_OFFLOAD_URL"] = edge.url
        target = start_target("aspen-packs", root, tmp / "work", env=env)
        try:
            if edge is not None:
                edge.start()
            url = f"{target.info.url}/{name}"
            gitdir = Path(target.info.root) / name
            server_refs = _refs(gitdir)
            largest = max((p.stat().st_size for p in (gitdir / "aspen" / "packs").glob("pack-*.pack")), default=0)
            rows: dict[str, list[dict]] = {k: [] for k in kinds}
            for rep in range(args.reps):
                order = kinds[rep % len(kinds):] + kinds[:rep % len(kinds)]
                for kind in order:
                    rows[kind].append(_case(kind, url, tmp, target, server_refs,
                                            args.git if kind == "bundle-uri" else "git", not args.no_fsck, edge))
            storms = {}
            if args.storm:
                for kind in ("inline", "uris"):
                    storms[kind] = (_raw_storm(kind, url, target, server_refs, args.storm, args.jobs, edge) if args.raw
                                    else _storm(kind, url, tmp, target, server_refs, args.storm, args.jobs, edge))
            log = target.log_text()
        finally:
            target.stop()
            if edge is not None:
                edge.stop()
    out: dict = {"repo": str(args.repo) if args.repo else f"preset {args.preset}", "reps": args.reps,
                 "client": _git_version("git"), "bundle_client": _git_version(args.git) if args.git else "not run",
                 "largest_stored_pack": largest,
                 "offloaded_answers": log.count("offload=uri"), "tracebacks": log.count("Traceback")}
    for kind, rs in rows.items():
        out[kind] = {m: round(statistics.median(r[m] for r in rs), 3) for m in ("wall_s", "cpu_s")}
        out[kind].update({m: int(statistics.median(r[m] for r in rs)) for m in ("bytes", "answer_bytes", "static_bytes")})
        out[kind]["wall_max_s"] = round(max(r["wall_s"] for r in rs), 3)
        out[kind]["requests"] = rs[-1]["requests"]
        out[kind]["correct"] = f"{sum(r['refs_equal'] for r in rs)}/{len(rs)} refs equal, fsck {rs[-1]['fsck']}"
        if args.nginx:
            out[kind]["edge_cpu_s"] = round(statistics.median(r["edge_cpu_s"] for r in rs), 3)
            out[kind]["edge_bytes"] = int(statistics.median(r["edge_bytes"] for r in rs))
    for kind in kinds[1:]:
        out[f"{kind}_vs_inline"] = {m: round(out[kind][m] / out["inline"][m], 3) if out["inline"][m] else None
                                    for m in ("wall_s", "cpu_s", "bytes", "answer_bytes")}
    if storms:
        out["storm"] = storms
        out["storm_uris_vs_inline"] = {m: round(storms["uris"][m] / storms["inline"][m], 3)
                                       if storms["inline"][m] else None
                                       for m in ("wall_s", "cpu_s", "answer_bytes")}
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{out['repo']}, {args.reps} clones of each kind, interleaved; client {out['client']}, bundle-uri client "
          f"{out['bundle_client']}; largest stored pack {out['largest_stored_pack']} bytes; packs by "
          f"{'nginx (ASPEN_OFFLOAD_URL)' if args.nginx else 'Aspen`s own route'}")
    print("| clone | wall p50 s | wall max s | server CPU s | bytes | of which Aspen's answers | of which static files "
          "| requests | correct | wall / inline | CPU / inline | answer bytes / inline |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for kind in kinds:
        r = out[kind]
        ratio = out.get(f"{kind}_vs_inline", {"wall_s": 1.0, "cpu_s": 1.0, "answer_bytes": 1.0})
        print(f"| {kind} | {r['wall_s']} | {r['wall_max_s']} | {r['cpu_s']} | {r['bytes']} | {r['answer_bytes']} | "
              f"{r['static_bytes']} | {r['requests']} | {r['correct']} | {ratio['wall_s']} | {ratio['cpu_s']} | "
              f"{ratio['answer_bytes']} |")
    if args.nginx:
        print("\nnginx (the packs by URI): " + ", ".join(
            f"{k} {out[k]['edge_bytes']} bytes, CPU {out[k]['edge_cpu_s']} s" for k in kinds))
    if storms:
        print()
        print("| storm | clones | at once | wall s | server CPU s | bytes | of which Aspen's answers | of which static "
              "files | checked |")
        print("|---|---|---|---|---|---|---|---|---|")
        for kind, s in storms.items():
            static = f"{s['static_bytes']}" + (f" (+ nginx {s['edge_bytes']}, CPU {s['edge_cpu_s']} s)"
                                               if "edge_bytes" in s else "")
            print(f"| {kind} | {s['clones']} | {s['jobs']} | {s['wall_s']} | {s['cpu_s']} | {s['bytes']} | "
                  f"{s['answer_bytes']} | {static} | {s['check']} |")
        r = out["storm_uris_vs_inline"]
        print(f"\nstorm, uris / inline: wall {r['wall_s']}, server CPU {r['cpu_s']}, Aspen's answer bytes "
              f"{r['answer_bytes']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
