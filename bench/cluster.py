"""Aspen as a cluster (docs/cluster.md): the stack the bench's cluster
targets run, and the catch-up measurement.

A ClusterStack is a PostgreSQL of its own (tests/pgserver.py: initdb into a
temporary directory, `pg_ctl start` on loopback), a pack store directory, N
gunicorn nodes each over its own repository root (the first holds the
copy of the bench's repositories, the others start empty and make their
copies from the log at their first request), and nginx in front with the
shipped nginx/aspen-cluster.conf, its placeholders filled in.

The targets `aspen-cluster1` and `aspen-cluster3` (bench/targets.py) are
such a stack of 1 and 3 nodes behind the bench's counting proxy, so every
workload runs against them (`--targets aspen-cluster1,aspen-cluster3,stock`).
Their pids are every node's, so server CPU is the nodes' together.

    python -m bench.cluster catchup [--lags 10,100,1000] [--json]

measures how long a node that is LAG versions behind takes to answer its
first request (an `ls-remote` through it), for each lag: node B answers
once (it has its copy), B is stopped, LAG pushes of one commit each go
through node A (a third node takes their packs' second copies), B is
started again and asked: it fetches the packs it lacks from the others.

    python -m bench.cluster pushes [--nodes 1,3] [--packs peers,shared] [--count 50] [--json]

measures pushes through node 0, each then asked for through node 1 (the
push's wall time, the ls-remote's, whether it showed the push), and the
pack bytes the cluster keeps per push (its copies on every node).

    python -m bench.cluster outage [--nodes 3] [--preset small] [--rounds 20] [--json]

measures what a PostgreSQL outage costs clients: ROUNDS of `ls-remote` and
of full clones through nginx with PostgreSQL up, then with it stopped
(`pg_ctl stop -m fast`), each operation's wall time (p50, p99, max) and the
ratio away/up; a push during the outage (refused, with its wall time), and
how long after PostgreSQL is started again a push lands.
"""

from __future__ import annotations

import argparse
import base64
import grp
import hashlib
import json
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

PROJECT = Path(__file__).resolve().parent.parent
CONF = PROJECT / "nginx" / "aspen-cluster.conf"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
USER, PASSWORD = "bench", "bench"


def server_block(listen: str, nodes: list[str], htpasswd: str) -> str:
    """nginx/aspen-cluster.conf with its placeholders filled in (NODES: HOST:PORT each)."""
    text = CONF.read_text()
    lines = " ".join(f"server {n} max_fails=1 fail_timeout=5s;" for n in nodes)
    for k, v in {"@LISTEN@": listen, "@NODES@": lines, "@HTPASSWD@": htpasswd}.items():
        if k not in text:
            raise RuntimeError(f"{CONF}: no {k}")
        text = text.replace(k, v)
    if re.search(r"@[A-Z_]+@", text):
        raise RuntimeError(f"{CONF}: a placeholder left")
    return text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_nginx(nodes: list[str], user: str = USER, password: str = PASSWORD) -> tuple[subprocess.Popen, int, Path]:
    """nginx over NODES (HOST:PORT each) on a free loopback port: (process, port, its directory)."""
    b = Path(tempfile.mkdtemp(prefix="aspen-cluster-nginx-"))
    b.chmod(0o755)       # its workers (nobody when started as root) read htpasswd
    htpasswd = b / "htpasswd"
    htpasswd.write_text(f"{user}:{{SHA}}{base64.b64encode(hashlib.sha1(password.encode()).digest()).decode()}\n")
    htpasswd.chmod(0o644)
    for _ in range(5):
        port = _free_port()
        (b / "cluster.conf").write_text(server_block(f"127.0.0.1:{port}", nodes, str(htpasswd)))
        who = ""
        if os.geteuid() == 0:
            pw = pwd.getpwnam("nobody")
            who = f"user {pw.pw_name} {grp.getgrgid(pw.pw_gid).gr_name};\n"
        (b / "nginx.conf").write_text(
            f"{who}worker_processes 1;\npid {b}/nginx.pid;\nerror_log {b}/error.log info;\n"
            f"events {{ worker_connections 4096; }}\nhttp {{\n    access_log {b}/access.log;\n"
            f"    client_body_temp_path {b}/body;\n    proxy_temp_path {b}/proxy;\n"
            f"    fastcgi_temp_path {b}/fastcgi;\n    uwsgi_temp_path {b}/uwsgi;\n"
            f"    scgi_temp_path {b}/scgi;\n    include {b}/cluster.conf;\n}}\n")
        proc = subprocess.Popen([NGINX, "-p", str(b), "-c", str(b / "nginx.conf"), "-e", str(b / "error.log"),
                                 "-g", "daemon off;"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.time() + 15
        while time.time() < deadline and proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return proc, port, b
            except OSError:
                time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
        output = proc.communicate()[0].decode(errors="replace")
        if "Address already in use" not in output:
            raise RuntimeError(f"nginx did not start:\n{output}")
    raise RuntimeError("nginx: no free port after 5 attempts")


class ClusterStack:
    """PostgreSQL, N gunicorn nodes (own roots) and nginx, under WORKDIR; the
    packs pass between the nodes (PACKS "peers": ASPEN_NODE_URL) or live in
    one pack store directory ("shared")."""

    def __init__(self, workdir: Path, n: int, root: Optional[Path], env: Optional[dict] = None,
                 workers: int = 2, threads: int = 16, timeout: float = 60.0, packs: str = "peers"):
        sys.path.insert(0, str(PROJECT))
        from tests import pgserver  # the tests' PostgreSQL starter: initdb, pg_ctl, as postgres when root

        from .targets import _gunicorn, copy_root, repositories
        self._pgserver = pgserver
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.pg = pgserver.private()
        self.nodes: list[tuple[subprocess.Popen, int, Path, Path]] = []     # (proc, port, log, root)
        self.nginx: Optional[subprocess.Popen] = None
        self.nginx_dir: Optional[Path] = None
        try:
            self.url = self.pg.create_database("cluster")
            self.packs = self.workdir / "packstore"
            self.packs.mkdir(exist_ok=True)
            self.mode = packs
            where = ({"ASPEN_PACK_STORE": str(self.packs)} if packs == "shared" else
                     {"ASPEN_CLUSTER_SECRET": "bench-" + os.urandom(12).hex()})
            self.env = {"ASPEN_REFSTORE_URL": self.url, **where, "ASPEN_CLUSTER": "bench",
                        "ASPEN_REMOTE_USER_HEADER": "X-Remote-User", "ASPEN_ACCESS_LOG": "1",
                        "ASPEN_RUN_DIR": str(self.workdir / "run"), **(env or {})}
            self._gunicorn = _gunicorn
            self.opts = (workers, threads, timeout)
            for i in range(n):
                node_root = self.workdir / f"node{i}" / "repos"
                if i == 0 and root is not None:
                    copy_root(Path(root), node_root)
                else:
                    node_root.mkdir(parents=True, exist_ok=True)
                self.nodes.append(self._start_node(i, node_root))
            self.nginx, self.port, self.nginx_dir = start_nginx([f"127.0.0.1:{p}" for _, p, _, _ in self.nodes])
            if root is not None:
                self._join(repositories(Path(root)))
        except BaseException:
            self.stop()
            raise

    def _join(self, repos: list[str]) -> None:
        """Each repository recorded (node 0's first request imports it) and every other
        node's copy made, as an operator adds a node before it takes traffic."""
        for i in range(len(self.nodes)):
            for name in repos:
                subprocess.run(["git", "ls-remote", f"{self.node_url(i)}/{name}"], check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=600)

    def _start_node(self, i: int, node_root: Path, port: int = 0) -> tuple[subprocess.Popen, int, Path, Path]:
        workers, threads, timeout = self.opts
        node_dir = self.workdir / f"node{i}"
        env = dict(self.env, ASPEN_RUN_DIR=str(node_dir / "run"))
        if self.mode == "peers":
            port = port or _free_port()          # its address is its name among the nodes
            env["ASPEN_NODE_URL"] = f"http://127.0.0.1:{port}"
        proc, port, log = self._gunicorn(f"node{i}", "aspen_cgi.wsgi:application", node_root, node_dir, env,
                                         workers, threads, timeout, unset=("ASPEN_VERSION_PACKS",), port=port)
        return proc, port, log, node_root

    def stop_node(self, i: int) -> None:
        from .targets import _terminate
        _terminate(self.nodes[i][0])

    def start_node(self, i: int) -> None:
        self.nodes[i] = self._start_node(i, self.nodes[i][3], self.nodes[i][1] if self.mode == "peers" else 0)

    def node_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.nodes[i][1]}"

    @property
    def front(self) -> str:
        return f"http://{USER}:{PASSWORD}@127.0.0.1:{self.port}"

    @property
    def pids(self) -> list[int]:
        return [p.pid for p, _, _, _ in self.nodes]

    def stop(self) -> None:
        from .targets import _terminate
        if self.nginx is not None and self.nginx.poll() is None:
            self.nginx.terminate()
            try:
                self.nginx.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.nginx.kill()
        for proc, _, _, _ in self.nodes:
            _terminate(proc)
        if self.nginx_dir is not None:
            shutil.rmtree(self.nginx_dir, ignore_errors=True)
        self._pgserver.remove(self.pg)


# -- catch-up ----------------------------------------------------------------------------------

GIT_ENV = dict(os.environ, GIT_AUTHOR_NAME="b", GIT_AUTHOR_EMAIL="b@b", GIT_COMMITTER_NAME="b",
               GIT_COMMITTER_EMAIL="b@b", GIT_TERMINAL_PROMPT="0")


def _git(*args: str, cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, check=True, capture_output=True)


def catchup(lags: list[int], workdir: Path, progress=None, packs: str = "peers") -> list[dict]:
    """For each lag: ms for node 1's first answer after LAG pushes through node 0."""
    from . import repogen
    src = workdir / "src"
    src.mkdir(parents=True)
    repogen.generate(repogen.PRESETS["tiny"], src / "bench.git")
    # three nodes: while node 1 is stopped, node 2 takes each push's second copy (ASPEN_REPLICAS=2)
    stack = ClusterStack(workdir / "stack", 3, src, workers=1, threads=4, packs=packs)
    out = []
    try:
        url0, url1 = stack.node_url(0) + "/bench.git", stack.node_url(1) + "/bench.git"
        work = workdir / "work"
        _git("clone", "-q", url0, str(work))
        branch = _git("symbolic-ref", "--short", "HEAD", cwd=work).stdout.decode().strip()
        done = 0
        for lag in lags:
            _git("ls-remote", url1)                 # node 1 has its copy, at the log's latest version
            stack.stop_node(1)
            for k in range(lag):
                (work / "lag.txt").write_text(f"{lag} {k}\n")
                _git("add", "lag.txt", cwd=work)
                _git("commit", "-q", "-m", f"lag {lag} {k}", cwd=work)
                _git("push", "-q", url0, f"HEAD:{branch}", cwd=work)
                done += 1
                if progress:
                    progress(done, sum(lags), f"lag {lag}")
            stack.start_node(1)
            url1 = stack.node_url(1) + "/bench.git"
            t0 = time.monotonic()
            r = _git("ls-remote", url1)
            ms = (time.monotonic() - t0) * 1000
            tip = _git("rev-parse", "HEAD", cwd=work).stdout.decode().strip()
            ok = f"{tip}\trefs/heads/{branch}" in r.stdout.decode()
            t1 = time.monotonic()
            _git("ls-remote", url1)
            again = (time.monotonic() - t1) * 1000
            out.append({"lag": lag, "first_answer_ms": round(ms, 1), "caught_up": ok,
                        "next_answer_ms": round(again, 1),
                        "per_version_ms": round(ms / lag, 2) if lag else None})
    finally:
        stack.stop()
    return out


def _timed(*args: str, cwd: Optional[Path] = None, check: bool = True) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.monotonic()
    r = subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, capture_output=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {r.stderr.decode(errors='replace')}")
    return (time.monotonic() - t0) * 1000, r


def outage(workdir: Path, nodes: int, preset: str, rounds: int, progress=None, packs: str = "peers") -> dict:
    """ls-remote and clone wall times through nginx with PostgreSQL up, then away; a push while away."""
    from . import repogen
    from .stats import percentile
    src = workdir / "src"
    src.mkdir(parents=True)
    repogen.generate(repogen.PRESETS[preset], src / "bench.git")
    stack = ClusterStack(workdir / "stack", nodes, src, workers=1, threads=8, packs=packs)
    done = 0

    def step(what: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, 4 * rounds, what)

    try:
        url = f"{stack.front}/bench.git"
        times: dict[str, dict[str, list[float]]] = {"up": {"ls-remote": [], "clone": []},
                                                    "away": {"ls-remote": [], "clone": []}}
        refs: dict[str, set[str]] = {}
        for state in ("up", "away"):
            if state == "away":
                stack.pg.stop("fast")
            for i in range(rounds):
                ms, r = _timed("ls-remote", url)
                times[state]["ls-remote"].append(ms)
                refs.setdefault(state, set()).add(r.stdout.decode())
                step(f"{state} ls-remote")
                dest = workdir / f"clone-{state}-{i}"
                ms, _ = _timed("clone", "-q", "--bare", url, str(dest))
                times[state]["clone"].append(ms)
                shutil.rmtree(dest)
                step(f"{state} clone")
        work = workdir / "work"
        _git("clone", "-q", url, str(work))
        _git("commit", "-q", "--allow-empty", "-m", "during the outage", cwd=work)
        push_away_ms, r = _timed("push", "-q", "origin", "HEAD", cwd=work, check=False)
        refused = r.returncode != 0
        stack.pg.up()
        t0 = time.monotonic()
        while True:
            _, r = _timed("push", "-q", "origin", "HEAD", cwd=work, check=False)
            if r.returncode == 0 or time.monotonic() - t0 > 120:
                break
            time.sleep(0.1)
        landed_s = time.monotonic() - t0 if r.returncode == 0 else None
    finally:
        stack.stop()
    out: dict = {"nodes": nodes, "packs": packs, "preset": preset, "rounds": rounds, "same_refs_away": refs["up"] == refs["away"],
                 "push_away_ms": round(push_away_ms, 1), "push_away_refused": refused,
                 "push_lands_after_up_s": None if landed_s is None else round(landed_s, 2), "ops": {}}
    for op in ("ls-remote", "clone"):
        row = {}
        for state in ("up", "away"):
            xs = times[state][op]
            row[state] = {"p50": round(percentile(xs, 50), 1), "p99": round(percentile(xs, 99), 1),
                          "max": round(max(xs), 1)}
        row["ratio_p50"] = round(row["away"]["p50"] / row["up"]["p50"], 2)
        row["ratio_p99"] = round(row["away"]["p99"] / row["up"]["p99"], 2)
        out["ops"][op] = row
    return out


def pushes(workdir: Path, n: int, packs: str, count: int, size: int, progress=None, down: int = 0) -> dict:
    """COUNT pushes of one commit (a new file of SIZE random bytes) through
    node 0, with the last DOWN nodes stopped; after each, an ls-remote
    through node 1 must show it. Push and visibility wall times, and the
    pack bytes the nodes keep per push."""
    from . import repogen
    from .stats import percentile
    src = workdir / "src"
    src.mkdir(parents=True)
    repogen.generate(repogen.PRESETS["tiny"], src / "bench.git")
    stack = ClusterStack(workdir / "stack", n, src, workers=1, threads=8, packs=packs)
    push_ms, visible_ms, stale = [], [], 0
    try:
        url0, url1 = stack.node_url(0) + "/bench.git", stack.node_url(min(1, n - 1)) + "/bench.git"
        work = workdir / "work"
        _git("clone", "-q", url0, str(work))
        branch = _git("symbolic-ref", "--short", "HEAD", cwd=work).stdout.decode().strip()

        def kept() -> int:
            roots = [stack.packs] if packs == "shared" else [r / ".aspen-packs" for _, _, _, r in stack.nodes]
            return sum(f.stat().st_size for r in roots if r.exists() for f in r.rglob("*.pack")
                       if not f.name.startswith(("pack-", "tmp-")))
        for i in range(n - down, n):
            stack.stop_node(i)
        before = kept()
        for k in range(count):
            (work / f"p{k}.bin").write_bytes(os.urandom(size))
            _git("add", ".", cwd=work)
            _git("commit", "-q", "-m", f"push {k}", cwd=work)
            tip = _git("rev-parse", "HEAD", cwd=work).stdout.decode().strip()
            ms, _ = _timed("push", "-q", url0, f"HEAD:{branch}", cwd=work)
            push_ms.append(ms)
            ms, r = _timed("ls-remote", url1)
            visible_ms.append(ms)
            stale += f"{tip}\trefs/heads/{branch}" not in r.stdout.decode()
            if progress:
                progress(k + 1, count, f"{n} nodes, {packs}")
        per_push = (kept() - before) / count
    finally:
        stack.stop()

    def dist(xs: list[float]) -> dict:
        return {"p50": round(percentile(xs, 50), 1), "p99": round(percentile(xs, 99), 1), "max": round(max(xs), 1)}
    return {"nodes": n, "down": down, "packs": packs, "pushes": count, "size": size, "push_ms": dist(push_ms),
            "visible_ms": dist(visible_ms), "not_visible": stale, "kept_bytes_per_push": round(per_push)}


def _packs_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--packs", default="peers", choices=("peers", "shared"),
                        help="packs between the nodes or in a pack store (default %(default)s)")


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cluster",
                                description="Aspen as a cluster: how long a node LAG versions behind takes "
                                            "to answer its first request (catch-up), for each lag.")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("catchup", help="a node's first answer after LAG pushes through another node",
                       description="Three nodes over one PostgreSQL (tiny preset). For each lag: node 1 "
                                   "answers once, is stopped, LAG pushes of one commit go through node 0, node 1 "
                                   "is started and asked (ls-remote): that answer's wall time.")
    c.add_argument("--lags", default="0,10,100,1000",
                   help="comma-separated lags (default %(default)s; 0: the restarted node's first answer alone)")
    _packs_option(c)
    c.add_argument("--json", action="store_true", help="one JSON line per lag")
    o = sub.add_parser("outage", help="ls-remote and clones through nginx with PostgreSQL up, then stopped",
                       description="N nodes over one PostgreSQL and pack store behind nginx. ROUNDS of "
                                   "ls-remote and full clones with PostgreSQL up, then stopped; a push while "
                                   "it is away (refused), and how soon a push lands once it is back.")
    o.add_argument("--nodes", type=int, default=3, help="nodes (default %(default)s)")
    o.add_argument("--preset", default="small", help="the repository's preset (bench/repogen.py; default "
                                                     "%(default)s)")
    o.add_argument("--rounds", type=int, default=20, help="operations of each kind per state (default %(default)s)")
    _packs_option(o)
    o.add_argument("--json", action="store_true", help="the result as one JSON object")
    q = sub.add_parser("pushes", help="pushes through one node, each then asked through another",
                       description="COUNT pushes of one commit through node 0 of N nodes (packs between the "
                                   "nodes, or a pack store), each then asked for through node 1 (ls-remote): "
                                   "push and visibility wall times, pack bytes the cluster keeps per push.")
    q.add_argument("--nodes", default="1,3", help="comma-separated node counts (default %(default)s)")
    q.add_argument("--packs", default="peers,shared", help="comma-separated: peers, shared (default %(default)s)")
    q.add_argument("--count", type=int, default=50, help="pushes per stack (default %(default)s)")
    q.add_argument("--size", type=int, default=65536, help="random bytes per push (default %(default)s)")
    q.add_argument("--down", type=int, default=0, help="nodes stopped before the pushes (the last ones; "
                                                         "default %(default)s)")
    q.add_argument("--json", action="store_true", help="one JSON line per stack")
    args = p.parse_args(argv)
    from .progress import Progress
    if args.command == "pushes":
        rows = []
        for n in [int(x) for x in args.nodes.split(",") if x]:
            for mode in [m for m in args.packs.split(",") if m]:
                workdir = Path(tempfile.mkdtemp(prefix="aspen-bench-pushes-"))
                try:
                    bar = Progress(args.count, f"{n} nodes, {mode}")
                    rows.append(pushes(workdir, n, mode, args.count, args.size, bar.update,
                                       min(args.down, max(0, n - 2))))
                    bar.close()
                finally:
                    shutil.rmtree(workdir, ignore_errors=True)
        if args.json:
            for r in rows:
                print(json.dumps(r))
        else:
            print("| nodes | packs | push p50 / p99 / max ms | visible through another node p50 / p99 ms | "
                  "not visible | pack bytes kept per push |")
            print("|---:|---|---|---|---:|---:|")
            for r in rows:
                pm, vm = r["push_ms"], r["visible_ms"]
                print(f"| {r['nodes']} | {r['packs']} | {pm['p50']} / {pm['p99']} / {pm['max']} | {vm['p50']} / "
                      f"{vm['p99']} | {r['not_visible']} | {r['kept_bytes_per_push']:,} |")
        return 0 if all(r["not_visible"] == 0 for r in rows) else 1
    if args.command == "outage":
        workdir = Path(tempfile.mkdtemp(prefix="aspen-bench-outage-"))
        try:
            bar = Progress(4 * args.rounds, "outage")
            res = outage(workdir, args.nodes, args.preset, args.rounds, bar.update, args.packs)
            bar.close()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        if args.json:
            print(json.dumps(res))
        else:
            print(f"{res['nodes']} nodes ({res['packs']}), preset {res['preset']}, {res['rounds']} of each; "
                  "PostgreSQL up, then away")
            print("| operation | up p50 / p99 / max ms | away p50 / p99 / max ms | away/up p50 | away/up p99 |")
            print("|---|---|---|---:|---:|")
            for op, row in res["ops"].items():
                up, away = row["up"], row["away"]
                print(f"| {op} | {up['p50']} / {up['p99']} / {up['max']} | {away['p50']} / {away['p99']} / "
                      f"{away['max']} | {row['ratio_p50']} | {row['ratio_p99']} |")
            print(f"refs while away equal to refs while up: {'yes' if res['same_refs_away'] else 'NO'}")
            print(f"a push while away: {'refused' if res['push_away_refused'] else 'ACCEPTED'} in "
                  f"{res['push_away_ms']} ms; a push landed {res['push_lands_after_up_s']} s after PostgreSQL "
                  f"was started again")
        return 0 if res["same_refs_away"] and res["push_away_refused"] and res["push_lands_after_up_s"] else 1
    lags = [int(x) for x in args.lags.split(",") if x]
    workdir = Path(tempfile.mkdtemp(prefix="aspen-bench-cluster-"))
    try:
        bar = Progress(sum(lags), "catch-up")
        rows = catchup(lags, workdir, bar.update, args.packs)
        bar.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        for r in rows:
            print(json.dumps(r))
    else:
        print("| lag (versions) | first answer | per version | next answer | caught up |")
        print("|---:|---:|---:|---:|:---|")
        for r in rows:
            per = "-" if r["per_version_ms"] is None else f"{r['per_version_ms']:.1f} ms"
            print(f"| {r['lag']} | {r['first_answer_ms']:.0f} ms | {per} "
                  f"| {r['next_answer_ms']:.0f} ms | {'yes' if r['caught_up'] else 'NO'} |")
    return 0 if all(r["caught_up"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
