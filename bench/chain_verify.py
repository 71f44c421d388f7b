"""The hash chain's cost (docs/ref-store.md): N versions committed one per
transaction as pushes commit them, each chained in its transaction (the
sealing cost is that transaction's time with the chain against without),
then `aspen verify --chain` over all of them, in process and as the command.

    python -m bench.chain_verify [--versions 10000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aspen_cgi.refstore import chaining, db
from aspen_cgi.refstore.store import RefStore
from aspen_cgi.runtime.repository import Repository

from .progress import Progress


def _repo(where: Path) -> Path:
    repo = where / "r.git"
    env = dict(os.environ, GIT_AUTHOR_NAME="b", GIT_AUTHOR_EMAIL="b@b", GIT_COMMITTER_NAME="b", GIT_COMMITTER_EMAIL="b@b")
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    blob = subprocess.run(["git", "hash-object", "-w", "--stdin"], cwd=repo, input=b"x", capture_output=True,
                          check=True, env=env).stdout.decode().strip()
    tree = subprocess.run(["git", "mktree"], cwd=repo, input=f"100644 blob {blob}\tf\n".encode(), capture_output=True,
                          check=True, env=env).stdout.decode().strip()
    commit = subprocess.run(["git", "commit-tree", tree, "-m", "c"], cwd=repo, capture_output=True, check=True,
                            env=env).stdout.decode().strip()
    subprocess.run(["git", "update-ref", "refs/heads/main", commit], cwd=repo, check=True)
    return repo


def _commit(store: RefStore, i: int, chain: bool) -> float:
    """One version of 3 ref updates, as a push commits it; its transaction's seconds."""
    def tx(conn: db.Conn) -> None:
        v = db.insert_version(conn, "push", "bench", time.time(), None, "done", None)
        db.insert_updates(conn, v, [(f"refs/heads/b{i % 50}/{k}", f"{i:040x}", f"{i + 1:040x}", True, "commit", None)
                                    for k in range(3)])
        if chain:
            chaining.seal(conn)
    t = time.perf_counter()
    db.write(store.conn, tx)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--versions", type=int, default=10000, help="versions to chain (default 10000)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = _repo(Path(tmp))
        env = dict(os.environ, GIT_DIR=str(repo))
        store = RefStore.open(Repository.of(str(repo), env))
        store.sync()
        with_chain, without = [], []
        progress = Progress(args.versions, "versions")
        for i in range(args.versions):
            (with_chain if i % 2 == 0 else without).append(_commit(store, i, chain=i % 2 == 0))
            if i % 2 == 1:      # the next sealed version chains the unsealed one too: take it out of the timing
                db.write(store.conn, chaining.seal)
            if i % 200 == 0:
                progress(i + 1, args.versions)
        progress.close()
        t = time.perf_counter()
        rep = store.verify_chain()
        in_process = time.perf_counter() - t
        t = time.perf_counter()
        cli = subprocess.run([sys.executable, "-m", "aspen_cgi.cli", "verify", "--chain", str(repo)],
                             capture_output=True, text=True)
        command = time.perf_counter() - t
    result = {"versions": rep.links, "ok": rep.ok, "verify_in_process_s": round(in_process, 3),
              "verify_command_s": round(command, 3), "command_said": cli.stdout.strip(),
              "commit_ms_with_chain_p50": round(statistics.median(with_chain) * 1000, 3),
              "commit_ms_without_chain_p50": round(statistics.median(without) * 1000, 3),
              "commit_ms_with_chain_p99": round(statistics.quantiles(with_chain, n=100)[-1] * 1000, 3),
              "commit_ms_without_chain_p99": round(statistics.quantiles(without, n=100)[-1] * 1000, 3)}
    if args.json:
        print(json.dumps(result))
        return 0
    print("| measure | value |\n|---|---|")
    for k, v in result.items():
        print(f"| {k} | {v} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
