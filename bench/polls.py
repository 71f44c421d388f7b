"""`aspen-bench polls`: info/refs polls through nginx, answered from Aspen's
poll files (docs/polls.md) against Aspen and stock behind the same nginx.

One nginx (the machine's, `worker_processes auto` as Debian ships it) with
three server blocks, each on its own loopback port:

- `aspen-files`: nginx/aspen.conf as shipped, its placeholders filled in:
  a poll is answered from the file Aspen keeps, else by Aspen;
- `aspen`: the same gunicorn behind a server block that proxies every
  request (Aspen without the file route: every poll reaches Python);
- `stock`: stock `git http-backend` through fcgiwrap (nginx/README.md's
  "Going back to stock" block), over its own copy of the repository.

Aspen is gunicorn as nginx/aspen-gunicorn.service runs it (its ExecStart
and Environment lines: 2 workers x 16 threads, the poll directory and log),
on a unix socket. fcgiwrap gets 16 children (as many as gunicorn has
threads per worker), so that stock is not held to one request at a time.

For each target and protocol (v0: no Git-Protocol header; v2:
`Git-Protocol: version=2`), REQUESTS `GET .../info/refs?service=git-upload-pack`
(default 2,000) from THREADS client threads (default 16), each on a fresh
connection as a git client opens one, repeated REPS times (targets in a
rotated order each time): requests per second, p50/p99/max ms, and for
the Aspen targets the server CPU per request (nginx's and gunicorn's
processes; not for stock: fcgiwrap ignores SIGCHLD, so the CPU of the
git processes it starts reaches no parent that /proc shows).
Every answer must be 200 and byte-identical to Aspen's own answer (asked of
gunicorn directly), stock's to stock's first; `aspen-files` also reports
how many polls nginx answered from a file (its poll log).

Then PUSHES pushes (default 5) of one commit each through `aspen-files`
while 4 threads keep polling it; after each push is acknowledged, the next
v0 poll must show the new tip and the next v2 poll (the capability list,
which names no ref) must be Aspen's own answer: `stale_polls` counts the
ones that were not, `visible_ms` the time from the acknowledgement to the
end of those two polls.

Writes a results folder (raw.jsonl, tables.md, machine.json) like `run`.
fcgiwrap is installed with apt-get when missing and running as root, as
./run installs the deployment tests' packages."""

from __future__ import annotations

import argparse
import base64
import hashlib
import http.client
import os
import re
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

PROJECT = Path(__file__).resolve().parent.parent
CONF = PROJECT / "nginx" / "aspen.conf"
UNIT = PROJECT / "nginx" / "aspen-gunicorn.service"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
FCGIWRAP = "/usr/sbin/fcgiwrap"
STOCK = "/usr/lib/git-core/git-http-backend"
USER, PASSWORD = "bench", "bench"
PROTOCOLS = {"v0": {}, "v2": {"Git-Protocol": "version=2"}}
POLL_PATH = "/bench.git/info/refs?service=git-upload-pack"
TARGETS = ("aspen-files", "aspen", "stock")


# -- set-up ------------------------------------------------------------------------------------------

def need_fcgiwrap() -> None:
    """fcgiwrap, installed with apt-get when missing (as root), as ./run installs system packages."""
    if os.access(FCGIWRAP, os.X_OK):
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False, stdout=subprocess.DEVNULL)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "fcgiwrap"], env=env,
                       check=False, stdout=subprocess.DEVNULL)
    if not os.access(FCGIWRAP, os.X_OK):
        raise SystemExit("aspen-bench polls: fcgiwrap is missing (apt-get install fcgiwrap)")


def _nobody() -> tuple[str, str, int]:
    import grp
    import pwd
    pw = pwd.getpwnam("nobody")
    return pw.pw_name, grp.getgrgid(pw.pw_gid).gr_name, pw.pw_gid


def unit_command(sock: str, root: Path, poll_dir: str, poll_log: str) -> tuple[list[str], dict[str, str]]:
    """The shipped unit's ExecStart argv and Environment= settings, its placeholders and paths filled in."""
    subst = {"@VENV@": sys.prefix, "@GIT_PROJECT_ROOT@": str(root), "/run/aspen/gunicorn.sock": sock,
             "/run/aspen/polls": poll_dir, "/var/log/nginx/aspen-polls.log": poll_log}
    argv: list[str] = []
    env: dict[str, str] = {}
    for line in UNIT.read_text().splitlines():
        for k, v in subst.items():
            line = line.replace(k, v)
        if line.startswith("ExecStart="):
            argv = shlex.split(line[len("ExecStart="):])
        elif line.startswith("Environment="):
            k, _, v = line[len("Environment="):].partition("=")
            env[k] = v
    if not argv or "ASPEN_POLL_DIR" not in env:
        raise RuntimeError(f"{UNIT}: no ExecStart or no ASPEN_POLL_DIR")
    return argv, env


def shipped_block(listen: str, upstream: str, htpasswd: str, poll_dir: str, poll_log: str) -> str:
    text = CONF.read_text()
    for k, v in {"@LISTEN@": listen, "@UPSTREAM@": upstream, "@HTPASSWD@": htpasswd, "@POLL_DIR@": poll_dir,
                 "@POLL_LOG@": poll_log}.items():
        if k not in text:
            raise RuntimeError(f"{CONF}: no {k}")
        text = text.replace(k, v)
    if re.search(r"@[A-Z_]+@", text):
        raise RuntimeError(f"{CONF}: a placeholder left")
    return text


def proxy_block(listen: str) -> str:
    """Aspen without the file route: the shipped block's proxying, every request to gunicorn."""
    return f"""
server {{
    listen {listen};
    proxy_http_version 1.1;
    proxy_buffering    off;
    location / {{
        proxy_pass http://aspen_gunicorn;
        proxy_set_header Connection        "";
        proxy_set_header Host              $http_host;
        proxy_set_header Git-Protocol      $http_git_protocol;
        proxy_set_header X-Remote-User     "";
    }}
}}
"""


def stock_block(listen: str, sock: str, root: Path) -> str:
    """nginx/README.md's block for stock through fcgiwrap."""
    return f"""
server {{
    listen {listen};
    location / {{
        fastcgi_pass  unix:{sock};
        include       /etc/nginx/fastcgi_params;
        fastcgi_param SCRIPT_FILENAME     {STOCK};
        fastcgi_param GIT_PROJECT_ROOT    {root};
        fastcgi_param GIT_HTTP_EXPORT_ALL "";
        fastcgi_param PATH_INFO           $uri;
        fastcgi_param REMOTE_USER         $remote_user;
        fastcgi_param GIT_PROTOCOL        $http_git_protocol;
        fastcgi_buffering off;
        fastcgi_read_timeout 3600s;
        fastcgi_send_timeout 3600s;
    }}
}}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(cond, what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"aspen-bench polls: {what} did not start")
        time.sleep(0.05)


def _connects(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


class Stack:
    """gunicorn (the shipped unit), fcgiwrap and nginx with the three server blocks, under WORK."""

    def __init__(self, work: Path, aspen_root: Path, stock_root: Path):
        self.work = work
        self.procs: dict[str, subprocess.Popen] = {}
        self.sock = str(work / "gunicorn.sock")
        self.fcgi_sock = str(work / "fcgiwrap.sock")
        self.poll_dir, self.poll_log = str(work / "polls"), str(work / "aspen-polls.log")
        self.aspen_root, self.stock_root = aspen_root, stock_root
        self.ports: dict[str, int] = {}

    def start(self) -> "Stack":
        w = self.work
        argv, env = unit_command(self.sock, self.aspen_root, self.poll_dir, self.poll_log)
        full = dict(os.environ)
        full.update(env)
        preexec = None
        if os.geteuid() == 0:
            gid = _nobody()[2]
            preexec = lambda: os.setgid(gid)     # noqa: E731  the unit's Group=: nginx's workers' group
        glog = open(w / "gunicorn.log", "wb")
        self.procs["gunicorn"] = subprocess.Popen(argv, env=full, cwd=str(PROJECT), stdout=glog,
                                                  stderr=subprocess.STDOUT, preexec_fn=preexec,
                                                  start_new_session=True)
        _wait(lambda: os.path.exists(self.sock), "gunicorn")
        self.procs["fcgiwrap"] = subprocess.Popen([FCGIWRAP, "-c", "16", "-s", f"unix:{self.fcgi_sock}"],
                                                  stdout=subprocess.DEVNULL, stderr=open(w / "fcgiwrap.log", "wb"),
                                                  start_new_session=True)
        _wait(lambda: os.path.exists(self.fcgi_sock), "fcgiwrap")
        os.chmod(self.fcgi_sock, 0o777)          # nginx's workers (nobody) connect to it
        htpasswd = w / "htpasswd"
        htpasswd.write_text(f"{USER}:{{SHA}}{base64.b64encode(hashlib.sha1(PASSWORD.encode()).digest()).decode()}\n")
        htpasswd.chmod(0o644)
        self.ports = {t: _free_port() for t in TARGETS}
        blocks = (shipped_block(f"127.0.0.1:{self.ports['aspen-files']}", f"unix:{self.sock}", str(htpasswd),
                                self.poll_dir, self.poll_log)
                  + proxy_block(f"127.0.0.1:{self.ports['aspen']}")
                  + stock_block(f"127.0.0.1:{self.ports['stock']}", self.fcgi_sock, self.stock_root))
        (w / "sites.conf").write_text(blocks)
        user = "user {} {};\n".format(*_nobody()[:2]) if os.geteuid() == 0 else ""
        (w / "nginx.conf").write_text(
            f"{user}worker_processes auto;\npid {w}/nginx.pid;\nerror_log {w}/error.log;\n"
            f"events {{ worker_connections 4096; }}\nhttp {{\n"
            f"    access_log {w}/access.log;\n    client_body_temp_path {w}/body;\n    proxy_temp_path {w}/proxy;\n"
            f"    fastcgi_temp_path {w}/fastcgi;\n    uwsgi_temp_path {w}/uwsgi;\n    scgi_temp_path {w}/scgi;\n"
            f"    include {w}/sites.conf;\n}}\n")
        self.procs["nginx"] = subprocess.Popen([NGINX, "-p", str(w), "-c", str(w / "nginx.conf"), "-e",
                                                str(w / "error.log"), "-g", "daemon off;"],
                                               stdout=subprocess.DEVNULL, stderr=open(w / "nginx.out", "wb"),
                                               start_new_session=True)
        for port in self.ports.values():
            _wait(lambda port=port: _connects(port), "nginx")
        return self

    def pids(self, target: str) -> list[int]:
        backend = "fcgiwrap" if target == "stock" else "gunicorn"
        return [self.procs["nginx"].pid, self.procs[backend].pid]

    def served(self) -> int:
        try:
            return os.stat(self.poll_log).st_size // 2
        except FileNotFoundError:
            return 0

    def stop(self) -> None:
        import signal
        for name in ("nginx", "fcgiwrap", "gunicorn"):
            p = self.procs.get(name)
            if p is None:
                continue
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    pass
            try:        # each started in a session of its own: what is left of it (fcgiwrap's -c children)
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


# -- the client ---------------------------------------------------------------------------------------

def get(port: int, path: str, headers: dict) -> tuple[int, bytes, float]:
    """One GET on a fresh connection, as a git client sends it (HTTP/1.1; `Connection: close`: one
    request per connection, as each `git ls-remote` makes): (status, body, wall ms). A raw socket,
    so that the client threads, on the same cores as the servers, cost little beside them."""
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    req = (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: git/2.39.5\r\nAccept: */*\r\n"
           f"Pragma: no-cache\r\n{extra}Connection: close\r\n\r\n").encode()
    t0 = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(req)
        chunks = []
        while True:
            data = s.recv(65536)
            if not data:
                break
            chunks.append(data)
    ms = (time.perf_counter() - t0) * 1000
    raw = b"".join(chunks)
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        raise OSError("no complete response")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    fields = {k.strip().lower(): v.strip() for k, _, v in (x.partition(b":") for x in lines[1:])}
    if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
        body = _unchunk(body)
    elif b"content-length" in fields and len(body) != int(fields[b"content-length"]):
        raise OSError("a short response")
    return status, body, ms


def _unchunk(data: bytes) -> bytes:
    out, pos = [], 0
    while True:
        end = data.index(b"\r\n", pos)
        size = int(data[pos:end].split(b";")[0], 16)
        if size == 0:
            return b"".join(out)
        out.append(data[end + 2:end + 2 + size])
        pos = end + 2 + size + 2


def aspen_direct(sock: str, path: str, headers: dict) -> bytes:
    """Aspen's own answer, from gunicorn's socket."""
    class Unix(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(sock)
    c = Unix("localhost", timeout=60)
    try:
        c.request("GET", path, headers=headers)
        r = c.getresponse()
        body = r.read()
        if r.status != 200:
            raise RuntimeError(f"aspen-bench polls: Aspen answered {r.status}")
        return body
    finally:
        c.close()


def storm(port: int, headers: dict, requests: int, threads: int, expect: bytes) -> dict:
    """REQUESTS polls from THREADS threads: latencies, failures (not 200), mismatches (not EXPECT), wall s."""
    lat: list[float] = []
    counts = {"failures": 0, "mismatches": 0}
    left = [requests]
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            try:
                status, body, ms = get(port, POLL_PATH, headers)
            except (OSError, ValueError):
                with lock:
                    counts["failures"] += 1
                continue
            with lock:
                if status != 200:
                    counts["failures"] += 1
                else:
                    lat.append(ms)
                    if body != expect:
                        counts["mismatches"] += 1
    t0 = time.perf_counter()
    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return {"lat": lat, "wall": time.perf_counter() - t0, **counts}


def _git(*args: str, cwd: Optional[Path] = None) -> str:
    p = subprocess.run(["git", *args], cwd=str(cwd) if cwd else None, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {p.stderr.strip()}")
    return p.stdout.strip()


def pushes(stack: Stack, count: int, scratch: Path) -> dict:
    """COUNT pushes through aspen-files while 4 threads poll it; after each, the next polls (v0, v2)."""
    port = stack.ports["aspen-files"]
    url = f"http://127.0.0.1:{port}/bench.git"
    work = scratch / "pusher"
    _git("clone", "-q", url, str(work))
    _git("config", "user.email", "bench@example.com", cwd=work)
    _git("config", "user.name", "bench", cwd=work)
    stop = threading.Event()
    background = [0]

    def poller() -> None:
        i = 0
        while not stop.is_set():
            try:
                get(port, POLL_PATH, list(PROTOCOLS.values())[i % 2])
                background[0] += 1
            except OSError:
                pass
            i += 1
    pool = [threading.Thread(target=poller) for _ in range(4)]
    for t in pool:
        t.start()
    stale, visible, files_before = 0, [], stack.served()
    try:
        for i in range(count):
            (work / f"poll-{i}.txt").write_text(f"push {i}\n")
            _git("add", "-A", cwd=work)
            _git("commit", "-q", "-m", f"poll push {i}", cwd=work)
            tip = _git("rev-parse", "HEAD", cwd=work)
            auth = f"http://{USER}:{PASSWORD}@127.0.0.1:{port}/bench.git"
            _git("push", "-q", auth, "HEAD:refs/heads/main", cwd=work)
            acked = time.perf_counter()
            # v0 lists the refs; v2's info/refs is the capability list, which must be Aspen's own
            for p, headers in PROTOCOLS.items():
                status, body, _ = get(port, POLL_PATH, headers)
                want = tip.encode() in body if p == "v0" else body == aspen_direct(stack.sock, POLL_PATH, headers)
                if status != 200 or not want:
                    stale += 1
            visible.append((time.perf_counter() - acked) * 1000)
            time.sleep(0.3)       # the pollers find files again (the racy window, then one write)
    finally:
        stop.set()
        for t in pool:
            t.join()
    return {"pushes": count, "stale_polls": stale, "visible_p50_ms": statistics.median(visible),
            "visible_max_ms": max(visible), "background_polls": background[0],
            "from_files": stack.served() - files_before}


# -- the command ----------------------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def run(args) -> int:
    from . import machine as machine_mod
    from . import repogen, results
    from .model import Measurement
    from .procstats import ProcTree
    if not os.access(NGINX, os.X_OK):
        raise SystemExit("aspen-bench polls: nginx is missing (apt-get install nginx)")
    need_fcgiwrap()
    info = machine_mod.collect(args.machine)
    folder = args.out or PROJECT / "bench" / "results" / f"{time.strftime('%Y-%m-%d')}-polls"
    scratch = Path(tempfile.mkdtemp(prefix="aspen-bench-polls-"))
    scratch.chmod(0o755)
    stack = None
    try:
        aspen_root, stock_root = scratch / "aspen", scratch / "stock"
        aspen_root.mkdir()
        stock_root.mkdir()
        repo = repogen.generate(repogen.spec_for(args.preset), aspen_root / "bench.git")
        shutil.copytree(aspen_root / "bench.git", stock_root / "bench.git", symlinks=True)
        stack = Stack(scratch, aspen_root, stock_root).start()
        expect = {p: aspen_direct(stack.sock, POLL_PATH, h) for p, h in PROTOCOLS.items()}
        stock_expect = {p: get(stack.ports["stock"], POLL_PATH, h)[1] for p, h in PROTOCOLS.items()}
        for t in TARGETS:           # untimed: each path once (Aspen's first poll imports the repository)
            for h in PROTOCOLS.values():
                get(stack.ports[t], POLL_PATH, h)
        time.sleep(0.3)             # past the racy window of the import, so that files can be written
        data: dict[tuple[str, str], dict] = {(t, p): {"lat": [], "rps": [], "cpu": [], "failures": 0,
                                                      "mismatches": 0, "files": 0}
                                              for t in TARGETS for p in PROTOCOLS}
        for rep in range(args.reps):
            order = TARGETS[rep % len(TARGETS):] + TARGETS[:rep % len(TARGETS)]
            for t in order:
                for p, h in PROTOCOLS.items():
                    want = stock_expect[p] if t == "stock" else expect[p]
                    files0 = stack.served()
                    tree = ProcTree(stack.pids(t)).start()
                    got = storm(stack.ports[t], h, args.requests, args.threads, want)
                    cpu = tree.stop().cpu_s
                    d = data[(t, p)]
                    d["lat"] += got["lat"]
                    d["rps"].append(len(got["lat"]) / got["wall"])
                    d["cpu"].append(cpu / args.requests)
                    d["failures"] += got["failures"]
                    d["mismatches"] += got["mismatches"]
                    d["files"] += stack.served() - files0
                    print(f"aspen-bench polls: rep {rep + 1}/{args.reps} {t} {p}: "
                          f"{len(got['lat']) / got['wall']:.0f} req/s, {cpu:.2f} s CPU", file=sys.stderr)
        push = pushes(stack, args.pushes, scratch)
        print(f"aspen-bench polls: pushes {push}", file=sys.stderr)
        writer = results.ResultsWriter(folder, info, {
            "argv": sys.argv[1:], "workloads": ["polls"], "targets": list(TARGETS), "preset": args.preset,
            "repo_path": None, "seed": None, "quick": False,
            "knobs": {"requests": args.requests, "threads": args.threads, "reps": args.reps, "pushes": args.pushes},
            "repo": {"commits": repo.commits, "objects": repo.objects, "refs": repo.refs}})
        rows = []
        for t in TARGETS:
            for p in PROTOCOLS:
                d = data[(t, p)]
                m = {"requests": args.requests, "threads": args.threads, "reps": args.reps,
                     "failures": d["failures"], "mismatches": d["mismatches"],
                     "req_per_s": statistics.median(d["rps"]),
                     "p50_ms": percentile(d["lat"], 50), "p99_ms": percentile(d["lat"], 99),
                     "max_ms": max(d["lat"])}
                if t != "stock":        # fcgiwrap ignores SIGCHLD: its CGI children's CPU reaches no parent
                    m["server_cpu_us_per_request"] = statistics.median(d["cpu"]) * 1e6
                if t == "aspen-files":
                    m["from_files"] = d["files"]
                rows.append(Measurement("polls", t, {"protocol": p, "threads": args.threads}, m, d["lat"]))
        rows.append(Measurement("polls-push", "aspen-files", {"pushes": args.pushes}, push))
        writer.add(rows)
        tables = results.write_report(folder, plots=not args.no_plots)
        sys.stdout.write(tables.read_text())
        return 1 if push["stale_polls"] or any(r.metrics.get("mismatches") or r.metrics.get("failures")
                                              for r in rows) else 0
    finally:
        if stack is not None:
            stack.stop()
        if args.keep:
            print(f"aspen-bench polls: kept {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)


def add_parser(sub) -> None:
    p = sub.add_parser("polls", help="info/refs polls through nginx: from Aspen's poll files, Aspen, stock",
                       description=(__doc__ or "").split("\n\n", 1)[0].replace("\n", " "))
    p.add_argument("--requests", type=int, default=2000, help="polls per target, protocol and repetition "
                                                              "(default %(default)s)")
    p.add_argument("--threads", type=int, default=16, help="client threads (default %(default)s)")
    p.add_argument("--reps", type=int, default=3, help="repetitions; medians reported (default %(default)s)")
    p.add_argument("--pushes", type=int, default=5, help="pushes, each followed by polls (default %(default)s)")
    p.add_argument("--preset", default="small", help="generated repository (default %(default)s)")
    p.add_argument("--machine", help="machine tag (default: $ASPEN_BENCH_MACHINE or hostname)")
    p.add_argument("--out", type=Path, help="results folder (default bench/results/<date>-polls)")
    p.add_argument("--no-plots", action="store_true", help="tables only")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory")
    p.set_defaults(func=run)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.polls")
    add_parser(parser.add_subparsers(dest="command", required=True))
    a = parser.parse_args(["polls", *sys.argv[1:]])
    sys.exit(a.func(a))
