"""Packs between a cluster's nodes, with no shared filesystem (ASPEN_NODE_URL,
refstore/peers.py, docs/cluster.md): a push is acknowledged only once its
pack is on ASPEN_REPLICAS nodes; requests between nodes need the cluster's
secret and a pack is checked before it is kept; a node that loses its disk
while pushes go on rebuilds from its peers. The stack is tests/test_cluster.py's
(PostgreSQL of its own, 3 gunicorn nodes, nginx), in its "peers" mode; that
module runs all of its own tests in this mode too."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

import pytest

from aspen_cgi import settings
from aspen_cgi.refstore import db, db_postgres, db_schema, peers
from aspen_cgi.refstore.registry import LOCAL_PACKS

from . import harness as h
from .test_cluster import Cluster, _aspen, check_clone, commit, new_work, node_refs, run, three_nodes

pytestmark = [pytest.mark.timeout(600),
              pytest.mark.aspen_store_unchecked("each node's copies are verified here, with the cluster's settings")]


@pytest.fixture(scope="module")
def peers_cluster(tmp_path_factory):
    yield from three_nodes(tmp_path_factory.mktemp("peers"), "peers")


def _holders(c: Cluster) -> dict[tuple[str, str], set[str]]:
    conn = db.pgconn.PgConn(c.url, "public", 1, db.PG_USE_SCHEMA)
    out: dict[tuple[str, str], set[str]] = {}
    for store, name, node in conn.execute("SELECT store, name, node FROM aspen_pack_holders"):
        out.setdefault((store, name), set()).add(node)
    return out


def _on_disk(node: h.Server, store: str, name: str) -> bool:
    return (node.root / LOCAL_PACKS / store / name).is_file()


def _schema(c: Cluster, name: str) -> str:
    return db_postgres.pg_schema(f"c:{name}")


def test_a_push_is_on_two_nodes_before_it_is_acknowledged(peers_cluster, tmp_path):
    c = peers_cluster
    work = new_work(c, "k.git", tmp_path)
    store = _schema(c, "k.git")
    before = {k for k in _holders(c) if k[0] == store}
    commit(work, "kept twice", size=4096)
    assert run("push", f"{c.nodes[0].url}/k.git", "HEAD:main", cwd=str(work)).returncode == 0
    new = {k: v for k, v in _holders(c).items() if k[0] == store and k not in before}
    assert len(new) == 1, new                     # the push's pack
    (key, nodes), = new.items()
    assert c.nodes[0].url in nodes and len(nodes) == 2, nodes
    by_url = {n.url: n for n in c.nodes}
    for node in nodes:
        assert _on_disk(by_url[node], *key)
    # the import's pack went to a second node too
    imported = [k for k in before if len(_holders(c)[k]) >= 2]
    assert imported, before


def _sig(c: Cluster, method: str, path: str, secret: str = "") -> str:
    s = settings.of({"ASPEN_REFSTORE_URL": c.url, "ASPEN_CLUSTER": "c", "ASPEN_NODE_URL": "http://127.0.0.1:1",
                     "ASPEN_CLUSTER_SECRET": secret or "a-cluster-secret-of-the-tests"})
    return peers.sign(s, method, path)


def _request(url: str, method: str = "GET", data: bytes | None = None, sig: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=data, method=method)
    if sig is not None:
        req.add_header(peers.HEADER, sig)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_node_requests_need_the_secret_and_a_pack_is_checked_before_it_is_kept(peers_cluster, tmp_path):
    """GET without a signature or with another secret's: 403; signed: the
    file's bytes; a missing file: 404. PUT of bytes that are not the pack
    the name says: 400, nothing kept; of the right bytes: 201, kept."""
    c = peers_cluster
    new_work(c, "s.git", tmp_path)
    store = _schema(c, "s.git")
    key = next(k for k in _holders(c) if k[0] == store)
    holder = next(n for n in c.nodes if _on_disk(n, *key))
    other = next(n for n in c.nodes if not _on_disk(n, *key)) if not all(_on_disk(n, *key) for n in c.nodes) \
        else None
    path = f"{peers.PREFIX}{store}/{key[1]}"
    assert _request(holder.url + path)[0] == 403
    assert _request(holder.url + path, sig=_sig(c, "GET", path, "another-secret-of-16-chars"))[0] == 403
    assert _request(holder.url + path, sig=_sig(c, "PUT", path))[0] == 403       # signed for another method
    assert _request(f"http://127.0.0.1:{c.port}{path}", sig=_sig(c, "GET", path))[0] == 404  # not through nginx
    status, body = _request(holder.url + path, sig=_sig(c, "GET", path))
    assert status == 200 and body == (holder.root / LOCAL_PACKS / store / key[1]).read_bytes()
    missing = f"{peers.PREFIX}{store}/{'0' * 40}.pack"
    assert _request(holder.url + missing, sig=_sig(c, "GET", missing))[0] == 404
    target = other or holder
    bad_name = f"{'1' * 40}.pack"
    bad = f"{peers.PREFIX}{store}/{bad_name}"
    assert _request(target.url + bad, "PUT", body, _sig(c, "PUT", bad))[0] == 400
    assert not (target.root / LOCAL_PACKS / store / bad_name).exists()
    flipped = body[:20] + bytes([body[20] ^ 1]) + body[21:]
    if other is not None:
        assert _request(other.url + path, "PUT", flipped, _sig(c, "PUT", path))[0] == 400
        assert not _on_disk(other, *key)
        assert _request(other.url + path, "PUT", body, _sig(c, "PUT", path))[0] == 201
        assert _on_disk(other, *key)
    assert not [p for p in (target.root / LOCAL_PACKS / store).iterdir() if p.name.startswith("tmp-")]


def test_a_push_is_refused_when_too_few_nodes_can_keep_its_pack(peers_cluster, tmp_path):
    c = peers_cluster
    work = new_work(c, "f.git", tmp_path)
    want = node_refs(c.nodes[0], "f.git")
    c.nodes[1].stop()
    c.nodes[2].stop()
    try:
        commit(work, "alone")
        r = run("push", f"{c.nodes[0].url}/f.git", "HEAD:main", cwd=str(work))
        assert r.returncode != 0 and "could not be kept on enough nodes" in r.stderr, r.stderr
        assert node_refs(c.nodes[0], "f.git") == want
    finally:
        c.restart(1)
        c.restart(2)
    r = run("push", f"{c.nodes[0].url}/f.git", "HEAD:main", cwd=str(work))
    assert r.returncode == 0, r.stderr
    for n in c.nodes:
        assert node_refs(n, "f.git")["refs/heads/main"] == h.out("rev-parse", "HEAD", cwd=str(work))


def test_a_node_that_loses_its_disk_while_pushes_go_on_rebuilds_from_its_peers(peers_cluster, tmp_path):
    """Node 1's repositories and packs are deleted while pushes go through
    nodes 0 and 2; it comes back empty and makes its copies from the log and
    its peers' packs: every acknowledged push on every node, fsck clean, and
    `aspen verify` clean on each."""
    c = peers_cluster
    works = {name: new_work(c, name, tmp_path / name) for name in ("w1.git", "w2.git")}
    for name in works:
        assert run("ls-remote", f"{c.nodes[1].url}/{name}").returncode == 0     # node 1 has its copies
    acked: dict[str, list[str]] = {name: [] for name in works}
    stop = threading.Event()
    errors: list[str] = []

    def pusher(name: str, node: int) -> None:
        work = works[name]
        i = 0
        while not stop.is_set() and i < 40:
            tip = commit(work, f"{name}-{i}", size=2048)
            r = run("push", f"{c.nodes[node].url}/{name}", "HEAD:main", cwd=str(work))
            if r.returncode == 0:
                acked[name].append(tip)
            else:
                errors.append(r.stderr)
                h.git("reset", "-q", "--hard", "HEAD~1", cwd=str(work))
            i += 1
    threads = [threading.Thread(target=pusher, args=("w1.git", 0)), threading.Thread(target=pusher, args=("w2.git", 2))]
    for t in threads:
        t.start()
    try:
        c.nodes[1].stop()
        for p in c.nodes[1].root.iterdir():
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        c.restart(1)
        for name in works:
            assert run("ls-remote", f"{c.nodes[1].url}/{name}").returncode == 0
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=300)
    assert not errors, errors
    for name, work in works.items():
        assert acked[name], name
        want = node_refs(c.nodes[0], name)
        assert want["refs/heads/main"] == acked[name][-1]
        for i, n in enumerate(c.nodes):
            assert node_refs(n, name) == want
            check_clone(f"{n.url}/{name}", tmp_path / f"m-{name}-{i}", want)
            h.fsck_strict(str(n.root / name))
            r = _aspen(c, i, "verify", str(n.root / name))
            assert r.returncode == 0, r.stdout + r.stderr
    assert any("service=peer-packs" in n.log_text() for n in (c.nodes[0], c.nodes[2]))


def _workers(node: h.Server) -> set[int]:
    """The pids of the node's gunicorn workers (its master's children)."""
    out = set()
    for pid, _, _ in h.processes():
        try:
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == node.proc.pid:
                    out.add(pid)
        except (OSError, ValueError, IndexError):
            continue
    return out


def test_a_rolling_reload_under_load_fails_no_client_and_loses_no_push(peers_cluster, tmp_path):
    """Each node's code started again in turn (SIGHUP, what the shipped
    unit's `systemctl reload` sends: gunicorn starts new workers, which
    import the code as it is now, and lets the old ones finish what they
    took; the listening socket stays open) while pushers and cloners go
    through nginx: no client operation fails, and every acknowledged push
    is on every node afterwards."""
    c = peers_cluster
    seed = new_work(c, "roll.git", tmp_path / "seed")
    h.git("push", "-q", c.front("roll.git", auth=True), "HEAD:refs/heads/seed", cwd=str(seed))
    stop = threading.Event()
    failures: list[str] = []
    acked: dict[str, str] = {}
    counts = {"push": 0, "clone": 0}

    def pusher(k: int) -> None:
        work = tmp_path / f"pusher{k}"
        h.git("clone", "-q", c.front("roll.git"), str(work))
        i = 0
        while not stop.is_set():
            tip = commit(work, f"roll-{k}-{i}", size=1024)
            r = run("push", c.front("roll.git", auth=True), f"HEAD:refs/heads/p{k}", cwd=str(work))
            counts["push"] += 1
            if r.returncode != 0:
                failures.append(f"push: {r.stderr}")
                return
            acked[f"refs/heads/p{k}"] = tip
            i += 1

    def cloner(k: int) -> None:
        i = 0
        while not stop.is_set():
            dest = tmp_path / f"clone{k}-{i}"
            r = run("clone", "-q", "--bare", c.front("roll.git"), str(dest))
            counts["clone"] += 1
            if r.returncode != 0:
                failures.append(f"clone: {r.stderr}")
                return
            shutil.rmtree(dest)
            i += 1
    threads = [threading.Thread(target=pusher, args=(k,)) for k in range(2)]
    threads += [threading.Thread(target=cloner, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    try:
        for node in c.nodes:
            stop.wait(2)
            old = _workers(node)
            assert old
            os.kill(node.proc.pid, signal.SIGHUP)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (_workers(node) and not _workers(node) & old):
                time.sleep(0.05)
            assert _workers(node) and not _workers(node) & old, "the node's workers were not replaced"
        stop.wait(2)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=300)
    assert not failures, failures
    assert counts["push"] >= 6 and counts["clone"] >= 4, counts
    for n in c.nodes:
        refs = node_refs(n, "roll.git")
        for ref, tip in acked.items():
            assert refs[ref] == tip, (n.url, ref)


def test_a_node_writes_nothing_to_a_log_a_newer_aspen_moved_on(peers_cluster, tmp_path):
    """A store whose recorded schema is not this Aspen's (a newer node moved
    it on while this one still runs): a push through a running node that
    had the store open is refused, and the log gains no version; back at
    this schema, it lands."""
    c = peers_cluster
    work = new_work(c, "sv.git", tmp_path)
    for n in c.nodes:
        assert run("ls-remote", f"{n.url}/sv.git").returncode == 0      # every node has it open
    want = node_refs(c.nodes[0], "sv.git")
    schema = _schema(c, "sv.git")
    count = f"SELECT count(*) FROM {schema}.versions"
    before = c.pg.psql(count, "cluster").strip()
    c.pg.psql("UPDATE aspen_stores SET schema_version = schema_version + 1 WHERE repo = 'c:sv.git'", "cluster")
    try:
        commit(work, "newer schema")
        r = run("push", f"{c.nodes[1].url}/sv.git", "HEAD:main", cwd=str(work))
        assert r.returncode != 0, r.stderr
        assert c.pg.psql(count, "cluster").strip() == before
        for n in c.nodes:
            assert node_refs(n, "sv.git") == want
    finally:
        c.pg.psql("UPDATE aspen_stores SET schema_version = schema_version - 1 WHERE repo = 'c:sv.git'", "cluster")
    assert run("push", f"{c.nodes[1].url}/sv.git", "HEAD:main", cwd=str(work)).returncode == 0
    assert node_refs(c.nodes[2], "sv.git")["refs/heads/main"] == h.out("rev-parse", "HEAD", cwd=str(work))


SCHEMA_10_RELEASE = "7cbc10675f19b70f00aa293f9dbf3517a657108f"    # the last Aspen whose stores are at schema 10


@pytest.fixture(scope="module")
def schema_10_aspen(tmp_path_factory) -> Path:
    """That release's aspen_cgi, from this checkout's history (a clone of the project has it)."""
    dest = tmp_path_factory.mktemp("aspen-schema10")
    here = Path(__file__).resolve().parent.parent
    tree = subprocess.run(["git", "-C", str(here), "archive", SCHEMA_10_RELEASE, "aspen_cgi"], capture_output=True)
    assert tree.returncode == 0, ("the release of schema 10 must be in this checkout's history (a shallow clone "
                                  "lacks it): " + tree.stderr.decode(errors="replace"))
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tree.stdout, check=True)
    assert "SCHEMA_VERSION = 10\n" in (dest / "aspen_cgi" / "refstore" / "db.py").read_text()
    return dest


def _store_at(c: Cluster, name: str) -> tuple[int, Optional[int]]:
    conn = db.pgconn.PgConn(c.url, "public", 1, db.PG_USE_SCHEMA)
    row = conn.execute("SELECT schema_version, (to_jsonb(s) ->> 'reads_from')::int FROM aspen_stores s"
                       " WHERE repo = ?", (f"c:{name}",)).fetchone()     # an older Aspen's list has no reads_from
    return row[0], row[1]


def _versions(c: Cluster, name: str) -> int:
    return int(c.pg.psql(f"SELECT count(*) FROM {_schema(c, name)}.versions", "cluster").strip())


def test_an_upgrade_that_changes_the_schema_runs_old_and_new_nodes_side_by_side(peers_cluster, schema_10_aspen,
                                                                                  tmp_path):
    """The nodes of the release before (store schema 10) are replaced one at a
    time by this Aspen's (11): while any old node runs, the store stays at 10
    and every node takes pushes; once all run this Aspen the store moves on by
    itself; an old node that comes back then refuses pushes (the log gains
    nothing) and still answers fetches; every acknowledged push is on every node."""
    c = peers_cluster
    try:
        for i in range(3):
            c.restart(i, code=schema_10_aspen)
        work = new_work(c, "up.git", tmp_path)
        assert _store_at(c, "up.git") == (10, None)
        acked: dict[str, str] = {}
        tips: list[str] = []

        def push_through(i: int, text: str) -> None:
            acked["refs/heads/main"] = commit(work, text, size=512)
            tips.append(acked["refs/heads/main"])
            r = run("push", f"{c.nodes[i].url}/up.git", "HEAD:main", cwd=str(work))
            assert r.returncode == 0, (i, r.stderr)
        for i in range(3):
            push_through(i, f"old-{i}")
        for upgraded in range(3):
            c.restart(upgraded)                          # this Aspen
            for i in range(3):
                push_through(i, f"after-{upgraded}-{i}")
                for n in c.nodes:
                    assert node_refs(n, "up.git")["refs/heads/main"] == acked["refs/heads/main"], (upgraded, i, n.url)
            if upgraded < 2:
                assert _store_at(c, "up.git") == (10, None), "moved on while a node of schema 10 runs"
        deadline = time.monotonic() + 60
        i = 0
        while _store_at(c, "up.git")[0] != db.SCHEMA_VERSION and time.monotonic() < deadline:
            assert run("ls-remote", f"{c.nodes[i % 3].url}/up.git").returncode == 0
            i += 1
            time.sleep(0.2)
        assert _store_at(c, "up.git") == (db.SCHEMA_VERSION, db_schema.READS_FROM)
        push_through(1, "at-11")
        log = [json.loads(line) for line in _aspen(c, 1, "log", "--json", str(c.nodes[1].root / "up.git"))
               .stdout.splitlines()]
        assert log[0]["node"] == c.nodes[1].url         # newest first: the version this Aspen wrote

        c.restart(2, code=schema_10_aspen)               # an old node comes back
        before = _versions(c, "up.git")
        commit(work, "refused", size=512)
        r = run("push", f"{c.nodes[2].url}/up.git", "HEAD:main", cwd=str(work))
        assert r.returncode != 0 and "failed to update ref" in r.stderr, r.stderr
        assert _versions(c, "up.git") == before
        # it serves what its disk holds: an acknowledged tip, maybe not the latest (it cannot read the log)
        assert node_refs(c.nodes[2], "up.git")["refs/heads/main"] in tips
    finally:
        for i in range(3):
            if c.nodes[i].code is not None:
                c.restart(i)
    push_through(2, "back-at-11")
    for j, n in enumerate(c.nodes):
        check_clone(f"{n.url}/up.git", tmp_path / f"m{j}", node_refs(c.nodes[0], "up.git"))
        assert _aspen(c, j, "verify", str(n.root / "up.git")).returncode == 0
