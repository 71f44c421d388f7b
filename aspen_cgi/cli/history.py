"""A repository's ref store from the command line: `log` (with the
chain's export), `verify`, `compact`, `query`, `undo` and `restore`; how
a command opens a repository's store (`open_repo`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Optional


def open_repo(repo: str):
    """The store of REPO (a bare repository or a work tree's .git), synced with the disk."""
    from ..refstore.store import RefStore  # startup
    gitdir = repo
    if not os.path.isfile(os.path.join(gitdir, "HEAD")) and os.path.isdir(os.path.join(repo, ".git")):
        gitdir = os.path.join(repo, ".git")
    if not os.path.isfile(os.path.join(gitdir, "HEAD")):
        raise SystemExit(f"aspen: not a git repository: {repo}")
    gitdir = os.path.abspath(gitdir)
    from ..runtime.repository import Repository  # startup
    store = RefStore.open(Repository.of(gitdir, dict(os.environ, GIT_DIR=gitdir)))
    if store is None:
        raise SystemExit(f"aspen: cannot keep a ref store for {repo} (read-only? set ASPEN_STATE_DIR)")
    from ..refstore import db  # startup
    try:
        store.sync()
    except db.Unstorable as e:
        raise SystemExit(f"aspen: the ref store cannot hold the refs of {repo}: {e}; they are served from disk")
    if store.imported:
        RECORDED.append(gitdir)
    return store


RECORDED: list[str] = []       # the repositories this command recorded as version 1 (pre-warmed after an import)


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def _cert_json(cert) -> Optional[dict]:
    """A version's push certificate for `aspen log --json` (its text as UTF-8, undecodable bytes replaced)."""
    if cert is None:
        return None
    return {"blob": cert.blob, "signer": cert.signer, "key": cert.key, "status": cert.status,
            "nonce": cert.nonce, "nonce_status": cert.nonce_status, "nonce_slop": cert.nonce_slop,
            "text": cert.text.decode("utf-8", "replace")}


# git's words for each %G? letter (git log's pretty formats)
SIGNATURE_WORDS = {"G": "good signature", "B": "bad signature", "E": "signature cannot be checked",
                   "X": "good signature, expired", "Y": "good signature, expired key",
                   "R": "good signature, revoked key", "N": "no signature checked"}


def _cert_line(cert) -> str:
    """`    signed: good signature by <signer>, key <key>, nonce OK, certificate <blob>`."""
    what = SIGNATURE_WORDS.get(cert.status, cert.status)
    by = f" by {cert.signer}" if cert.signer else ""
    slop = f" ({cert.nonce_slop:+d}s)" if cert.nonce_slop is not None else ""
    return (f"    signed: {cert.status} {what}{by}, key {cert.key or '-'}, nonce {cert.nonce_status}{slop}, "
            f"certificate {cert.blob[:12]}\n")


def cmd_log(args: argparse.Namespace) -> int:
    store = open_repo(args.repo)
    if args.export:
        return _export_chain(store, args.export)
    out = sys.stdout
    cluster = store.replica_root is not None      # the node that took each version is worth a look
    try:
        for v in store.log(args.limit):
            if args.json:
                link = store.chain([v.id]).get(v.id)
                out.write(json.dumps({"id": v.id, "kind": v.kind, "who": v.who, "at": v.at, "push_id": v.push_id,
                                      "state": v.state, "node": v.node,
                                      "updates": [{"ref": u.ref, "old": u.old, "new": u.new, "fast_forward": u.ff}
                                                  for u in v.updates],
                                      "cert": _cert_json(v.cert),
                                      "chain": None if link is None else
                                      {"hash": link[1], "prev": link[0], "start": bool(link[2])}}) + "\n")
                continue
            who = v.who or "-"
            state = "" if v.state == "done" else f" [{v.state}]"
            what = f"  ({v.push_id})" if v.kind in ("undo", "restore") and v.push_id else ""
            via = f"  via {v.node}" if cluster and v.node else ""
            out.write(f"version {v.id}  {v.kind}  {who}  {_when(v.at)}{state}{what}{via}\n")
            if v.cert is not None:
                out.write(_cert_line(v.cert))
            shown = v.updates if args.all_updates or len(v.updates) <= 20 else v.updates[:20]
            for u in shown:
                mark = " ff" if u.ff else ""
                out.write(f"    {u.old[:12]}..{u.new[:12]}  {u.ref}{mark}\n")
            if len(shown) < len(v.updates):
                out.write(f"    ... {len(v.updates) - len(shown)} more (--all-updates)\n")
    except BrokenPipeError:
        pass
    return 0


def _export_chain(store, path: str) -> int:
    """Every chained version as one JSON line (version, prev, hash, start, text): what
    docs/ref-store.md's auditor procedure checks without Aspen."""
    out = sys.stdout if path == "-" else open(path, "w", encoding="utf-8")
    n = 0
    try:
        for link in store.chain_links():
            out.write(json.dumps({"version": link.version, "prev": link.prev, "hash": link.hash,
                                  "start": link.start, "text": link.text}) + "\n")
            n += 1
    finally:
        if out is not sys.stdout:
            out.close()
    if path != "-":
        print(f"{path}: {n} chained versions", file=sys.stderr)
    return 0


def cmd_verify_chain(args: argparse.Namespace, store) -> int:
    rep = store.verify_chain()
    if args.json:
        print(json.dumps({"ok": rep.ok, **rep.__dict__}))
    elif rep.ok:
        span = f"versions {rep.first}..{rep.last} ({rep.links})" if rep.links else "no versions yet"
        print(f"chain intact: {span}; it starts at version {rep.starts_at}")
    else:
        print(f"chain broken at version {rep.broken_at}: {rep.why}")
    return 0 if rep.ok else 1


def cmd_verify(args: argparse.Namespace) -> int:
    store = open_repo(args.repo)
    if args.chain:
        return cmd_verify_chain(args, store)
    from ..runtime.progress import Spinner  # startup
    with Spinner("verifying", enabled=not args.quiet) as spin:
        rep = store.verify(progress=spin.step)
    if args.json:
        print(json.dumps({"ok": rep.ok, "versions": rep.versions, "refs": rep.refs, "problems": rep.problems}))
    else:
        for p in rep.problems:
            print(f"problem: {p}")
        print(f"{'consistent' if rep.ok else 'NOT consistent'}: {rep.versions} versions, {rep.refs} refs, "
              f"{len(rep.problems)} problems")
    return 0 if rep.ok else 1


def cmd_compact(args: argparse.Namespace) -> int:
    store = open_repo(args.repo)
    rep = store.compact()
    if args.json:
        print(json.dumps(rep.__dict__))
    else:
        print(f"compacted: {rep.versions} versions, {rep.nodes_built} segments built now, "
              f"{rep.segments} segments ({rep.segment_rows} ref summaries) over {rep.levels} levels")
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    store = open_repo(args.repo)
    if args.what == "ancestor":
        if len(args.args) != 3:
            raise SystemExit("aspen query ancestor REPO REF J K")
        try:
            ref, j, k = args.args[0], int(args.args[1]), int(args.args[2])
        except ValueError:
            raise SystemExit("aspen query ancestor REPO REF J K (J and K are version numbers)")
        t0 = time.perf_counter()
        a = store.is_ancestor(ref, j, k)
        us = (time.perf_counter() - t0) * 1e6
        print(json.dumps({"ref": a.ref, "j": a.j, "k": a.k, "ancestor": a.ancestor, "value_j": a.value_j,
                          "value_k": a.value_k, "versions_visited": a.visits.versions,
                          "segments_visited": a.visits.segments, "us": round(us, 1)}))
        return 0 if a.ancestor else 1
    if len(args.args) != 1:
        raise SystemExit("aspen query tip REPO COMMIT")
    t = store.tips(args.args[0])
    print(json.dumps({"commit": t.commit, "tips": [{"version": v, "ref": r} for v, r in t.tips],
                      "versions_visited": t.visits.versions, "segments_visited": t.visits.segments}))
    return 0 if t.tips else 1


def depth1_entries(items) -> dict[str, int]:
    """Depth-1 clones' entries by what they hold: git's answer (stock, the wide
    one being built), the wide one, or git's kept for good."""
    from ..cache.entries import DEPTH1_LABELS, depth1_of  # startup
    counts = {label: 0 for label in DEPTH1_LABELS.values()}
    for e in items:
        label = DEPTH1_LABELS.get(depth1_of(e.path) or 0)
        if label:
            counts[label] += 1
    return counts


def _who() -> str:
    import pwd  # startup
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def _rewind(args: argparse.Namespace, store, kind: str, make, through: int, push_id: str) -> int:
    """Make an undo or restore version (push/undo.py) and say what it did."""
    from ..model.versions import VersionMeta  # startup
    from ..push import undo as rewind  # startup
    from ..runtime.repository import Repository  # startup
    from ..service import child_env  # startup
    t0 = time.monotonic()
    try:
        changes = make()
        done = rewind.apply(store, Repository.of(store.gitdir, child_env(dict(os.environ), store.gitdir)), changes,
                            VersionMeta(kind=kind, who=_who(), push_id=push_id), through)
    except rewind.Refused as e:
        if args.json:
            print(json.dumps({"ok": False, "refused": str(e)}))
        else:
            print(f"aspen {kind}: refused: {e}", file=sys.stderr)
        return 1
    ms = (time.monotonic() - t0) * 1000
    if done.hook_output:
        sys.stderr.write(done.hook_output.decode("utf-8", "replace"))
    if args.json:
        print(json.dumps({"ok": True, "version": done.version, "kind": kind, "ms": round(ms, 1),
                          "reinjected": list(done.reinjected), "post_receive_status": done.hook_status,
                          "updates": [{"ref": c.ref, "old": c.old, "new": c.new} for c in done.changes]}))
        return 0
    print(f"version {done.version}: {kind} ({push_id}), {len(done.changes)} ref(s), {ms:.0f} ms")
    for c in done.changes:
        print(f"    {(c.old or '')[:12]}..{c.new[:12]}  {c.ref}")
    if done.reinjected:
        print(f"    objects put back from the packs of versions {', '.join(map(str, done.reinjected))}")
    return 0


def cmd_undo(args: argparse.Namespace) -> int:
    from ..push import undo as rewind  # startup
    store = open_repo(args.repo)
    return _rewind(args, store, "undo", lambda: rewind.undo_changes(store, args.version, args.force),
                   args.version - 1, f"undo-{args.version}")


def cmd_restore(args: argparse.Namespace) -> int:
    from ..model.pin import PinError, parse  # startup
    from ..push import undo as rewind  # startup
    store = open_repo(args.repo)
    try:
        version = store.resolve_pin(parse(args.at))
    except PinError as e:
        print(f"aspen restore: refused: {e}", file=sys.stderr)
        return 1
    return _rewind(args, store, "restore", lambda: rewind.restore_changes(store, args.ref, version),
                   version, f"restore-{version}")
