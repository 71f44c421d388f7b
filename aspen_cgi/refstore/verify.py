"""`aspen verify`: the ref store against itself (SQLite integrity, versions
replaying to the current refs, nothing pending, no stale lock, segment packs
on runs of versions that exist and nest, the hash chain), against the refs on disk as git
reads them, and against the objects (every ref's closure present)."""

from __future__ import annotations

from typing import Callable, Optional

from ..git import gitexec
from ..model.versions import VerifyReport
from ..runtime.owners import owner_alive
from ..runtime.repository import Repository
from . import chaining, db, diskrefs, views

STALE_LOCK_SECONDS = 60.0


def verify(store_conn: db.Conn, repo: Repository,
           progress: Optional[Callable[[str], None]] = None) -> VerifyReport:
    gitdir = repo.gitdir
    rep = VerifyReport()
    rep.problems += [f"sqlite: {p}" for p in db.integrity(store_conn)]
    with db.reading(store_conn) as conn:
        rep.versions = db.count_versions(conn)
        pending = db.pending_versions(conn)
        rows = db.all_refs(conn)
        replay = db.replay_refs(conn)
        latest = db.latest_version(conn)
        runs = [(lo, hi) for lo, hi, *_ in db.segment_packs(conn)]
    rep.refs = len(rows)
    for path in diskrefs.stale_locks(gitdir, STALE_LOCK_SECONDS):
        rep.problems.append(f"stale lock file {path} (over a minute old; remove it if no git process runs)")
    for vid, owner, _ in pending:
        rep.problems.append(f"version {vid} is pending (writer {owner}, "
                            f"{'alive' if owner_alive(owner) else 'gone'})")
    rep.problems += _segment_problems(runs, latest)
    chained = chaining.check(store_conn)
    if not chained.ok:
        rep.problems.append(f"hash chain broken at version {chained.broken_at}: {chained.why}")
    stored = {r.name: r for r in rows}
    direct = {n: r.oid for n, r in stored.items() if r.symref is None}
    if replay != direct:
        for n in sorted(set(replay) | set(direct)):
            if replay.get(n) != direct.get(n):
                rep.problems.append(f"{n}: versions replay to {replay.get(n)}, current table says {direct.get(n)}")
    disk = {r.name: r for r in views.read_git(repo)}
    for n in sorted(set(disk) | set(stored)):
        a, b = disk.get(n), stored.get(n)
        da = (a.oid, a.symref) if a else None
        db_ = (b.oid, b.symref) if b else None
        if da != db_:
            rep.problems.append(f"{n}: disk has {da}, store has {db_}")
    for r in rows:
        if r.symref is None and r.otype == "missing":
            rep.problems.append(f"{r.name}: object {r.oid} is missing")
    if progress:
        progress("checking connectivity")
    tips = sorted({r.oid for r in rows if r.oid})
    if tips:
        res = gitexec.git(["rev-list", "--objects", "--quiet", "--stdin"], cwd=gitdir,
                          env=repo.git_env, input="".join(t + "\n" for t in tips).encode())
        if not res.ok:
            rep.problems.append("objects: not every ref is connected: "
                                + res.stderr.decode("utf-8", "replace").strip()[:500])
    return rep


def _segment_problems(runs: list[tuple[int, int]], latest: int) -> list[str]:
    """Segment packs cover runs within versions 2 … latest, any two disjoint or nested."""
    out = []
    for lo, hi in runs:
        if not 2 <= lo < hi <= latest:
            out.append(f"segment pack of versions {lo}-{hi} is outside versions 2-{latest}")
    for i, (a, b) in enumerate(runs):
        for c, d in runs[i + 1:]:
            if a < c <= b < d or c < a <= d < b:
                out.append(f"segment packs of versions {a}-{b} and {c}-{d} overlap")
    return out
