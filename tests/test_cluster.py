"""Aspen as a cluster (docs/cluster.md, issue 20): a real PostgreSQL of the
module's own (it is stopped and started here), 3 gunicorn nodes each over
its own repository root, each node and PostgreSQL on a test host of its own
(a network namespace, tests/netns.py), the packs passing between the nodes
or in a pack store directory (each test runs in both), and nginx in front with
nginx/aspen-cluster.conf, its placeholders filled in (bench/cluster.py's
start_nginx, which the bench's cluster targets use too). Real git clients
push through one node and fetch through the others; a node is killed with
kill -9 in the middle of pushes; PostgreSQL goes away for 10 s; a node
loses a repository's directory; a new, empty node joins."""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, Optional

import pytest

from aspen_cgi.refstore import pgconn
from bench import cluster as cluster_bench

from . import harness as h
from . import netns, pgserver

pytestmark = [pytest.mark.timeout(600),
              pytest.mark.aspen_store_unchecked("each node's copies are verified here, with the cluster's settings")]

REPO_DIR = Path(__file__).resolve().parent.parent
NGINX = cluster_bench.NGINX
USER, PASSWORD = "alice", "s3cret-pw"
STORE_WAIT = "3"
SECRET = "a-cluster-secret-of-the-tests"


class Alone(netns.Host):
    """A node's test host that also sees, of the cluster's directory BASE, only
    SEEN (its root, its run directory, and in "shared" mode the pack store):
    its own mount namespace, a tmpfs over BASE with those bound back in."""

    def __init__(self, host: netns.Host, base: Path, seen: list[Path]):
        super().__init__(host.name, host.address)
        self.base, self.seen = base, seen

    def argv(self, argv: list[str]) -> list[str]:
        binds = " ".join(f"{p.name}" for p in self.seen)
        script = ('set -e; t=$(mktemp -d); for d in ' + binds + '; do mkdir "$t/$d"; '
                  'mount --bind "$BASE/$d" "$t/$d"; done; mount -t tmpfs tmpfs "$BASE"; '
                  'for d in ' + binds + '; do mkdir "$BASE/$d"; mount --bind "$t/$d" "$BASE/$d"; '
                  'umount "$t/$d"; rmdir "$t/$d"; done; rmdir "$t"; exec "$@"')
        return super().argv(["unshare", "--mount", "--propagation", "private", "env", f"BASE={self.base}",
                             "sh", "-c", script, "sh", *argv])


class Cluster:
    """MODE "peers": each node keeps its packs on its own disk and they pass
    between nodes (ASPEN_NODE_URL); "shared": one pack store directory."""

    def __init__(self, base: Path, mode: str):
        self.base = base
        self.mode = mode
        netns.need()
        self.net = netns.Network()
        try:
            self.pg = pgserver.private(self.net.host(), self.net.subnet)
        except BaseException:
            self.net.close()
            raise
        self.url = self.pg.create_database("cluster")
        self.packs = base / "packstore"
        self.packs.mkdir()
        self.nodes: list[h.Server] = []
        self.nginx = None
        self.nginx_dir: Optional[Path] = None
        self.port = 0

    def env(self, node: Optional[h.Server] = None) -> dict:
        where = ({"ASPEN_PACK_STORE": str(self.packs)} if self.mode == "shared" else
                 {"ASPEN_NODE_URL": node.url if node is not None else "", "ASPEN_CLUSTER_SECRET": SECRET})
        return {"ASPEN_REFSTORE_URL": self.url, **where, "ASPEN_CLUSTER": "c",
                "ASPEN_STORE_WAIT": STORE_WAIT, "ASPEN_ACCESS_LOG": "1",
                "ASPEN_REMOTE_USER_HEADER": "X-Remote-User",
                "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "http.receivepack", "GIT_CONFIG_VALUE_0": "true"}

    def _server(self, root: Path, host: "netns.Host", port: int = 0, code: Optional[Path] = None,
                **extra: str) -> h.Server:
        """A node on its test host HOST, at PORT (0: a new one); its address is its name among the nodes.
        CODE: the checkout of another Aspen to run (harness.Server.code)."""
        node = h.Server(root, port=port or h.free_port(), threads=4, host=host, code=code)
        node.env = dict(self.env(node), ASPEN_RUN_DIR=str(self.run_dir(root)), **extra)
        return node.start()

    def run_dir(self, root: Path) -> Path:
        return root.parent / f"run-{root.name}"

    def add_node(self, root: Path) -> h.Server:
        root.mkdir(parents=True, exist_ok=True)
        self.run_dir(root).mkdir(exist_ok=True)
        seen = [root, self.run_dir(root)] + ([self.packs] if self.mode == "shared" else [])
        node = self._server(root, Alone(self.net.host(), self.base, seen))
        self.nodes.append(node)
        return node

    def restart(self, i: int, code: Optional[Path] = None, **extra: str) -> h.Server:
        old = self.nodes[i]
        old.stop()
        self.nodes[i] = self._server(old.root, old.host, old.port, code, **extra)
        return self.nodes[i]

    def start_nginx(self, nodes: list[h.Server]) -> None:
        self.nginx, self.port, self.nginx_dir = cluster_bench.start_nginx([f"{n.address}:{n.port}" for n in nodes], USER,
                                                             PASSWORD)

    def front(self, repo: str, auth: bool = False) -> str:
        cred = f"{USER}:{PASSWORD}@" if auth else ""
        return f"http://{cred}127.0.0.1:{self.port}/{repo}"

    def stop(self) -> None:
        try:
            if self.nginx is not None and self.nginx.poll() is None:
                self.nginx.terminate()
                self.nginx.wait(timeout=15)
            for n in self.nodes:
                n.stop()
            pgserver.remove(self.pg)
        finally:
            self.net.close()
            if self.nginx_dir is not None:
                shutil.rmtree(self.nginx_dir, ignore_errors=True)


def three_nodes(base: Path, mode: str) -> Iterator[Cluster]:
    """A module's cluster: PostgreSQL, 3 nodes and nginx under BASE, gone at its end."""
    h.need_system("nginx", NGINX)
    c = Cluster(base, mode)
    try:
        for i in range(3):
            c.add_node(base / f"node{i}")
        c.start_nginx(c.nodes)
        yield c
    finally:
        c.stop()
        h.forget_stopped_servers()


@pytest.fixture(scope="module", params=["peers", "shared"])
def cluster(request, tmp_path_factory):
    yield from three_nodes(tmp_path_factory.mktemp("cluster"), request.param)


def run(*args: str, cwd=None, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def ls_remote(url: str) -> dict[str, str]:
    r = run("ls-remote", url)
    assert r.returncode == 0, r.stderr
    return {ref: oid for oid, ref in (line.split("\t") for line in r.stdout.splitlines()) if ref != "HEAD" and not ref.endswith("^{}")}


def new_repo(c: Cluster, name: str, tmp: Path) -> Path:
    """A repository with history on node 0 (the log learns it at node 0's first request)."""
    repo = h.make_history(c.nodes[0].root / name)
    assert run("ls-remote", f"{c.nodes[0].url}/{name}").returncode == 0
    return repo


def new_work(c: Cluster, name: str, tmp: Path) -> Path:
    """new_repo(), and a work tree cloned from node 0."""
    new_repo(c, name, tmp)
    work = tmp / "w"
    assert run("clone", "-q", f"{c.nodes[0].url}/{name}", str(work)).returncode == 0
    return work


def commit(work: Path, text: str, size: int = 0) -> str:
    (work / f"{text}.txt").write_bytes(text.encode() + (os.urandom(size) if size else b"") + b"\n")
    h.git("add", ".", cwd=str(work))
    h.git("commit", "-q", "-m", text, cwd=str(work))
    return h.out("rev-parse", "HEAD", cwd=str(work))


def check_clone(url: str, dest: Path, want: dict[str, str]) -> None:
    r = run("clone", "-q", "--mirror", url, str(dest))
    assert r.returncode == 0, r.stderr
    h.fsck_strict(str(dest))
    assert h.refs_of(str(dest)) == want


def node_refs(node: h.Server, name: str) -> dict[str, str]:
    return ls_remote(f"{node.url}/{name}")


def test_the_nodes_and_postgresql_are_hosts_of_their_own(cluster):
    """Each node and PostgreSQL run in a network namespace of their own: a
    node reaches PostgreSQL at its host's address, and nothing at its own
    loopback (where a node sharing the machine's would have found it); and
    each node sees no other node's files."""
    c = cluster
    addresses = [n.address for n in c.nodes] + [c.pg.address]
    assert len(set(addresses)) == len(addresses) and "127.0.0.1" not in addresses
    probe = ("import socket, sys\n"
             "def ok(a):\n"
             "    try:\n"
             "        socket.create_connection((a, %d), timeout=5).close(); return True\n"
             "    except OSError:\n"
             "        return False\n"
             "print(ok(sys.argv[1]), ok('127.0.0.1'))\n") % c.pg.port
    for n in c.nodes:
        r = subprocess.run(n.host.argv([sys.executable, "-c", probe, c.pg.address]), capture_output=True, text=True,
                           timeout=30)
        assert r.stdout.split() == ["True", "False"], (r.stdout, r.stderr)
        # and of the cluster's files it sees its own root and run directory (and the shared pack store) only
        seen = subprocess.run(["nsenter", "-t", str(n.proc.pid), "-m", "ls", "-A", str(c.base)],
                              capture_output=True, text=True, timeout=30).stdout.split()
        assert sorted(seen) == sorted([n.root.name, c.run_dir(n.root).name] +
                                      (["packstore"] if c.mode == "shared" else [])), seen
        others = [str(m.root) for m in c.nodes if m is not n]
        r = subprocess.run(["nsenter", "-t", str(n.proc.pid), "-m", "ls", *others], capture_output=True, timeout=30)
        assert r.returncode != 0


def test_a_push_through_one_node_is_fetched_at_once_through_the_others(cluster, tmp_path):
    c = cluster
    work = new_work(c, "a.git", tmp_path)
    for i in range(3):
        tip = commit(work, f"a{i}")
        r = run("push", c.nodes[i].url + "/a.git", "HEAD:main", cwd=str(work))
        assert r.returncode == 0, r.stderr
        want = node_refs(c.nodes[i], "a.git")
        assert want["refs/heads/main"] == tip
        for j in range(3):            # at once, through every node (read-your-writes)
            check_clone(f"{c.nodes[j].url}/a.git", tmp_path / f"m{i}{j}", want)
    check_clone(c.front("a.git"), tmp_path / "front", want)
    r = run("push", c.front("a.git", auth=True), "HEAD:refs/heads/via-nginx", cwd=str(work))
    assert r.returncode == 0, r.stderr
    for n in c.nodes:
        assert node_refs(n, "a.git")["refs/heads/via-nginx"] == tip


def test_concurrent_pushers_on_three_nodes_one_order_every_acknowledged_push_everywhere(cluster, tmp_path):
    """12 pushers at once, 4 per node: 6 onto main from one old value (one
    wins), 6 onto branches of their own (all land). Every node then holds
    every acknowledged push, and the log's order is one order."""
    c = cluster
    new_repo(c, "b.git", tmp_path)
    base = node_refs(c.nodes[0], "b.git")["refs/heads/main"]
    works = []
    for i in range(12):
        w = tmp_path / f"w{i}"
        assert run("clone", "-q", f"{c.nodes[i % 3].url}/b.git", str(w)).returncode == 0
        commit(w, f"writer{i}")
        works.append(w)
    results: list = [None] * 12
    gate = threading.Barrier(12)

    def push(i: int) -> None:
        gate.wait(timeout=30)
        target = "HEAD:main" if i < 6 else f"HEAD:refs/heads/own{i}"
        results[i] = run("push", f"{c.nodes[i % 3].url}/b.git", target, cwd=str(works[i]))
    threads = [threading.Thread(target=push, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    won = [i for i in range(6) if results[i].returncode == 0]
    assert len(won) == 1, [r.stderr for r in results[:6]]
    for i in range(6):
        if i not in won:
            assert re.search(r"\[rejected\]|\[remote rejected\]|failed to push", results[i].stderr), results[i].stderr
            assert not re.search(r"HTTP 5\d\d|Traceback|internal error", results[i].stderr), results[i].stderr
    assert all(results[i].returncode == 0 for i in range(6, 12)), [r.stderr for r in results[6:]]
    want = {"refs/heads/main": h.out("rev-parse", "HEAD", cwd=str(works[won[0]]))}
    want.update({f"refs/heads/own{i}": h.out("rev-parse", "HEAD", cwd=str(works[i])) for i in range(6, 12)})
    views = [node_refs(n, "b.git") for n in c.nodes]
    for v in views:
        assert {k: v.get(k) for k in want} == want
        assert v == views[0]
    order = _log_refs(c, 0, "b.git")
    assert order[0] == "import" and sorted(order[1:]) == sorted(["refs/heads/main"] + [f"refs/heads/own{i}" for i in range(6, 12)])
    assert base != want["refs/heads/main"]
    for j, n in enumerate(c.nodes):
        check_clone(f"{n.url}/b.git", tmp_path / f"m{j}", views[0])
        assert _aspen(c, j, "verify", str(n.root / "b.git")).returncode == 0


def _aspen(c: Cluster, i: int, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, **c.env(c.nodes[i]), GIT_PROJECT_ROOT=str(c.nodes[i].root))
    return subprocess.run([sys.executable, "-m", "aspen_cgi.cli", *args], env=env, capture_output=True, text=True,
                          timeout=300, cwd=str(REPO_DIR))


def _log_refs(c: Cluster, i: int, name: str) -> list[str]:
    """Oldest first: "import", then each version's one ref."""
    r = _aspen(c, i, "log", "--json", str(c.nodes[i].root / name))
    assert r.returncode == 0, r.stderr
    import json
    out = []
    for v in reversed([json.loads(line) for line in r.stdout.splitlines() if line]):
        out.append(v["kind"] if v["kind"] == "import" else ",".join(u["ref"] for u in v["updates"]))
    return out


def _kill_tree(pid: int) -> None:
    kids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        kids.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    for p in [pid] + kids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_kill_9_of_a_node_mid_push_loses_no_acknowledged_push(cluster, tmp_path):
    """Three rounds: pushes of 1-2 MiB through node 2 while clones go
    through node 0 or 1 and fetches through the other; node 2 is killed with kill -9 at a
    random moment, then restarted. Every push a client was told landed is
    on every node afterwards; the restarted node catches up; verify clean."""
    c = cluster
    new_repo(c, "k.git", tmp_path)
    rnd = random.Random(20)
    acked: dict[str, str] = {}
    stop = threading.Event()
    load_errors: list[str] = []

    def load() -> None:
        k = 0
        while not stop.is_set():
            dest = tmp_path / f"load{k}"
            r = run("clone", "-q", f"{c.nodes[k % 2].url}/k.git", str(dest))
            if r.returncode == 0:          # and a fetch through the other node
                r = run("fetch", "-q", f"{c.nodes[(k + 1) % 2].url}/k.git", "+refs/heads/*:refs/remotes/o/*",
                        cwd=str(dest))
            if r.returncode != 0:
                load_errors.append(r.stderr)
            shutil.rmtree(dest, ignore_errors=True)
            k += 1
    loader = threading.Thread(target=load)
    loader.start()
    try:
        for rnd_i in range(3):
            works = []
            for j in range(3):
                w = tmp_path / f"r{rnd_i}w{j}"
                assert run("clone", "-q", f"{c.nodes[0].url}/k.git", str(w)).returncode == 0
                commit(w, f"r{rnd_i}w{j}", size=(1 << 20) + rnd.randrange(1 << 20))
                works.append(w)
            results: list = [None] * 3

            def push(j: int) -> None:
                results[j] = run("push", f"{c.nodes[2].url}/k.git", f"HEAD:refs/heads/r{rnd_i}w{j}",
                                 cwd=str(works[j]))
            threads = [threading.Thread(target=push, args=(j,)) for j in range(3)]
            for t in threads:
                t.start()
            time.sleep(rnd.uniform(0.05, 0.6))
            _kill_tree(c.nodes[2].proc.pid)
            for t in threads:
                t.join(timeout=200)
            for j, r in enumerate(results):
                if r.returncode == 0:
                    acked[f"refs/heads/r{rnd_i}w{j}"] = h.out("rev-parse", "HEAD", cwd=str(works[j]))
            c.restart(2)
    finally:
        stop.set()
        loader.join(timeout=200)
    assert not load_errors, load_errors[:3]
    for i, n in enumerate(c.nodes):
        refs = node_refs(n, "k.git")
        assert {k: refs.get(k) for k in acked} == acked
        assert _aspen(c, i, "verify", str(n.root / "k.git")).returncode == 0
        check_clone(f"{n.url}/k.git", tmp_path / f"after{i}", refs)


@pytest.mark.parametrize("point", ["after-intake", "refs-locked", "store-committed"])
def test_a_node_killed_at_each_step_of_a_push_leaves_every_node_on_the_log(cluster, tmp_path, point):
    """The push's worker on node 2 kills itself (SIGKILL) with its pack in
    the pack store and nothing committed (after-intake), with the disk's
    ref locked (refs-locked), or with the version committed in the log and
    the node's own disk not yet written (store-committed). curl sends the
    request again on a fresh connection when a kept-alive one dies before
    any answer, and the new worker runs clean: the second attempt may
    land (then the client is told so), except after store-committed, where
    the log already moved the ref and the attempt is refused by its
    compare-and-swap. Afterwards every node, node 2 included, shows the
    log: the ref moved exactly when the log has one version of it."""
    c = cluster
    name = f"f-{point}.git"
    work = new_work(c, name, tmp_path)
    tip = commit(work, point)
    once = tmp_path / "once"
    once.write_text("")
    c.restart(2, ASPEN_FAULT=point, ASPEN_FAULT_ONCE=str(once))
    try:
        r = run("push", f"{c.nodes[2].url}/{name}", "HEAD:main", cwd=str(work))
        assert not once.exists()                # the worker was killed at POINT
        assert "was sent SIGKILL" in c.nodes[2].log_text()
    finally:
        c.restart(2)
    assert not re.search(r"Traceback|internal error", r.stderr), r.stderr
    views = [node_refs(n, name) for n in c.nodes]
    assert views[1] == views[0] and views[2] == views[0]
    moved = views[0]["refs/heads/main"] == tip
    if point == "store-committed":
        assert moved and r.returncode != 0
    else:
        assert moved == (r.returncode == 0)
    assert _log_refs(c, 0, name) == ["import"] + (["refs/heads/main"] if moved else [])
    assert _aspen(c, 2, "verify", str(c.nodes[2].root / name)).returncode == 0
    r = run("push", f"{c.nodes[2].url}/{name}", "HEAD:main", cwd=str(work))
    assert r.returncode == 0, r.stderr
    for j, n in enumerate(c.nodes):
        check_clone(f"{n.url}/{name}", tmp_path / f"m{j}", views[0] | {"refs/heads/main": tip})


def test_postgresql_away_fetches_are_served_pushes_fail_cleanly_then_land(cluster, tmp_path):
    c = cluster
    work = new_work(c, "p.git", tmp_path)
    before = node_refs(c.nodes[1], "p.git")
    assert all(node_refs(n, "p.git") == before for n in c.nodes)   # every node has its copy
    c.pg.stop("fast")
    try:
        t0 = time.monotonic()
        commit(work, "during")
        r = run("push", f"{c.nodes[1].url}/p.git", "HEAD:main", cwd=str(work))
        took = time.monotonic() - t0
        assert r.returncode != 0
        assert not re.search(r"Traceback|HTTP 5\d\d", r.stderr), r.stderr
        assert "failed to update ref" in r.stderr, r.stderr
        assert took < float(STORE_WAIT) + 30
        # found away once, then known: the push was refused without a pool wait or retries
        assert "the database server is away" in c.nodes[1].log_text()
        while time.monotonic() - t0 < 10:                 # 10 s away: every node still answers
            for j, n in enumerate(c.nodes):
                assert node_refs(n, "p.git") == before
        for j, n in enumerate(c.nodes):
            check_clone(f"{n.url}/p.git", tmp_path / f"away{j}", before)
    finally:
        c.pg.up()
    # a node learns it is back within its probe's period (pgconn.PROBE_EVERY): until then it serves
    # its disk's refs, so read-your-writes holds from then on
    deadline = time.monotonic() + 30
    while not pgconn.reachable(c.url) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(2 * pgconn.PROBE_EVERY + 0.5)
    tip = h.out("rev-parse", "HEAD", cwd=str(work))
    deadline = time.monotonic() + 60
    while True:
        r = run("push", f"{c.nodes[1].url}/p.git", "HEAD:main", cwd=str(work))
        if r.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert r.returncode == 0, r.stderr
    for n in c.nodes:
        assert node_refs(n, "p.git")["refs/heads/main"] == tip
    assert "refused" in c.nodes[1].log_text()
    for n in c.nodes:
        assert "Traceback" not in n.log_text()
        assert "PoolTimeout" not in n.log_text(), n.log_text()


def test_a_lost_repository_directory_is_rebuilt_by_replica_sync(cluster, tmp_path):
    c = cluster
    work = new_work(c, "l.git", tmp_path)
    for i in range(3):
        commit(work, f"l{i}")
        assert run("push", f"{c.nodes[0].url}/l.git", f"HEAD:refs/heads/l{i}", cwd=str(work)).returncode == 0
    want = node_refs(c.nodes[0], "l.git")
    gone = c.nodes[1].root / "l.git"
    assert run("ls-remote", f"{c.nodes[1].url}/l.git").returncode == 0
    shutil.rmtree(gone)
    r = _aspen(c, 1, "replica", "sync", str(gone))
    assert r.returncode == 0, r.stderr
    assert "version 0 ->" in r.stdout
    assert h.refs_of(str(gone)) == want
    h.fsck_strict(str(gone))
    assert node_refs(c.nodes[1], "l.git") == want
    check_clone(f"{c.nodes[1].url}/l.git", tmp_path / "m", want)


def test_a_new_empty_node_is_correct_at_its_first_answer(cluster, tmp_path):
    c = cluster
    work = new_work(c, "n.git", tmp_path)
    commit(work, "n1")
    assert run("push", f"{c.nodes[0].url}/n.git", "HEAD:main", cwd=str(work)).returncode == 0
    want = node_refs(c.nodes[0], "n.git")
    node = c.add_node(c.base / "node-new")
    assert not (node.root / "n.git").exists()
    check_clone(f"{node.url}/n.git", tmp_path / "first", want)          # its very first request
    head = run("ls-remote", "--symref", f"{node.url}/n.git", "HEAD")
    assert "ref: refs/heads/main\tHEAD" in head.stdout
    r = run("ls-remote", f"{node.url}/never.git")
    assert r.returncode != 0 and not (node.root / "never.git").exists()
    # 12 first requests at once to a repository the new node lacks: one makes it, all are answered
    new_repo(c, "n2.git", tmp_path)
    want2 = node_refs(c.nodes[0], "n2.git")
    results: list = [None] * 12
    gate = threading.Barrier(12)

    def clone(i: int) -> None:
        gate.wait(timeout=30)
        results[i] = run("clone", "-q", "--mirror", f"{node.url}/n2.git", str(tmp_path / f"storm{i}"))
    threads = [threading.Thread(target=clone, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=200)
    assert [r.returncode for r in results] == [0] * 12, [r.stderr for r in results if r.returncode]
    for i in range(12):
        assert h.refs_of(str(tmp_path / f"storm{i}")) == want2
    assert not [p for p in node.root.iterdir() if ".aspen-new-" in p.name]


def test_db_drop_removes_a_store_and_the_next_request_starts_a_new_log(cluster, tmp_path):
    c = cluster
    work = new_work(c, "d.git", tmp_path)
    commit(work, "d1")
    assert run("push", f"{c.nodes[0].url}/d.git", "HEAD:main", cwd=str(work)).returncode == 0
    assert "c:d.git" in _aspen(c, 0, "db", "list").stdout
    assert _log_refs(c, 0, "d.git") == ["import", "refs/heads/main"]
    r = _aspen(c, 0, "db", "drop", "--repo", "c:d.git")
    assert r.returncode == 0 and "dropped c:d.git" in r.stdout, r.stderr
    assert "c:d.git" not in _aspen(c, 0, "db", "list").stdout
    assert _aspen(c, 0, "db", "drop", "--repo", "c:d.git").returncode == 1
    want = node_refs(c.nodes[0], "d.git")                  # node 0's copy is the new log's import
    assert _log_refs(c, 0, "d.git") == ["import"]
    for j, n in enumerate(c.nodes):
        check_clone(f"{n.url}/d.git", tmp_path / f"m{j}", want)


def test_a_catch_up_killed_mid_way_applies_its_versions_again(cluster, tmp_path):
    """A catch-up writes which versions it is applying before it starts
    (`replica.applying`): unpack-objects writes a small version's objects one
    by one, so one killed mid-way can leave the tip commit without its tree.
    Made here by hand on node 1: the commit alone, and the mark. The next
    request applies the version again; fsck is clean."""
    c = cluster
    work = new_work(c, "h.git", tmp_path)
    assert run("ls-remote", f"{c.nodes[1].url}/h.git").returncode == 0       # node 1 has its copy
    before = (c.nodes[1].root / "h.git" / "aspen" / "replica").read_text().split()[0]
    tip = commit(work, "half")
    assert run("push", f"{c.nodes[0].url}/h.git", "HEAD:main", cwd=str(work)).returncode == 0
    gitdir = str(c.nodes[1].root / "h.git")
    raw = h.git("cat-file", "commit", tip, cwd=str(work)).stdout
    h.git("hash-object", "-w", "-t", "commit", "--stdin", cwd=gitdir, input=raw)   # the commit, not its tree
    (Path(gitdir) / "aspen" / "replica.applying").write_text(f"{int(before) + 1}\n")
    want = node_refs(c.nodes[0], "h.git")
    assert node_refs(c.nodes[1], "h.git") == want
    assert not (Path(gitdir) / "aspen" / "replica.applying").exists()
    h.fsck_strict(gitdir)
    check_clone(f"{c.nodes[1].url}/h.git", tmp_path / "m", want)


def test_pushes_through_nginx_whose_thin_packs_name_bases_another_node_took(cluster, tmp_path):
    """Through nginx (round robin), a push's GET and POST go to different
    nodes, and each push's pack is thin against the one before (one line of
    a large file changed), which another node took. A node catches up
    before it reads the pack: every push lands, every node agrees."""
    c = cluster
    work = new_work(c, "t.git", tmp_path)
    lines = [f"line {i} {os.urandom(16).hex()}\n" for i in range(4000)]
    for k in range(8):
        lines[k * 100] = f"changed in push {k}\n"
        (work / "big.txt").write_text("".join(lines))
        h.git("add", "big.txt", cwd=str(work))
        h.git("commit", "-q", "-m", f"thin {k}", cwd=str(work))
        r = run("push", c.front("t.git", auth=True), "HEAD:main", cwd=str(work))
        assert r.returncode == 0, r.stderr
    tip = h.out("rev-parse", "HEAD", cwd=str(work))
    for j, n in enumerate(c.nodes):
        refs = node_refs(n, "t.git")
        assert refs["refs/heads/main"] == tip
        check_clone(f"{n.url}/t.git", tmp_path / f"m{j}", refs)
