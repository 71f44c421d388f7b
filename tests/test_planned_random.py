"""Randomized differential test of planned fetches (fixed seeds): a random
history pushed through Aspen (commits on several branches, merges, reverts,
force-pushes, deletes, annotated tags, branches cut from the middle of a
multi-commit push, out-of-band ref changes), clients saved at random moments;
after `aspen import`, every client fetches from Aspen and from stock (same
repository), strict and non-strict, over protocol v0 (odd seeds) or v2 (even
seeds). Seeds 3, 7, 11 and 15 (v0) start with 16 extra branches, so that their
clients' first round ends with a flush (ready, no-done) rather than `done`;
those first 16 haves are often the extra branches alone, from which the
planner proves little: git answers such a round, as every round the
planner cannot prove.
Each fetch: the client's `git fsck --strict` is clean, its refs equal the
server's, every object it holds (reachable or not) equals the stock-fetched
twin's, and the access log says which path answered each round: planned,
or git only for unknown haves, what cannot be proved, and plans
whose stored packs hold objects stock would not send (extra-objects)."""

from __future__ import annotations

import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from . import harness as h
from . import pushkit as pk

FETCHES_PER_SEED = 12


def _objects(repo: Path) -> set[str]:
    """Every object in REPO, reachable or not: a planned fetch must leave
    the client with exactly what a stock fetch leaves it with."""
    out = h.out("cat-file", "--batch-all-objects", "--batch-check=%(objectname)", cwd=str(repo))
    return set(out.split())


def _random_history(rng: random.Random, work: Path, repo: Path, snapshots: list[Path], url: str,
                    tmp: Path) -> None:
    branches = ["main"]
    for step in range(18):
        action = rng.choice(["commit", "commit", "commit", "branch", "merge", "revert", "force", "delete",
                             "tag", "outside", "snapshot"])
        if action in ("commit", "snapshot") or len(branches) == 0:
            b = rng.choice(branches)
            h.git("checkout", "-q", b, cwd=str(work))
            n = rng.randint(1, 3)
            for k in range(n):
                f = work / f"f{rng.randrange(4)}.txt"
                f.write_text("".join(f"{step}.{k}.{i}\n" for i in range(rng.randint(5, 400))))
                pk.commit(work, f"s{step}.{k}")
            if n > 1 and rng.random() < 0.5:     # a branch cut from the middle of this multi-commit push
                cut = f"cut{step}"
                h.git("push", "-q", "origin", f"HEAD:{b}", f"HEAD~1:refs/heads/{cut}", cwd=str(work))
                h.git("branch", "-q", "-f", cut, "HEAD~1", cwd=str(work))
                branches.append(cut)
            else:
                h.git("push", "-q", "origin", f"HEAD:{b}", cwd=str(work))
        elif action == "branch":
            nb = f"b{step}"
            h.git("checkout", "-q", "-b", nb, rng.choice(branches), cwd=str(work))
            (work / f"{nb}.txt").write_text(nb + "\n")
            pk.commit(work, nb)
            h.git("push", "-q", "origin", nb, cwd=str(work))
            branches.append(nb)
        elif action == "merge" and len(branches) > 1:
            a, b = rng.sample(branches, 2)
            h.git("checkout", "-q", a, cwd=str(work))
            r = h.git("merge", "-q", "--no-edit", b, cwd=str(work), check=False)
            if r.returncode != 0:
                h.git("merge", "--abort", cwd=str(work), check=False)
                continue
            h.git("push", "-q", "origin", a, cwd=str(work))
        elif action == "revert":
            b = rng.choice(branches)
            h.git("checkout", "-q", b, cwd=str(work))
            r = h.git("revert", "--no-edit", "HEAD", cwd=str(work), check=False)
            if r.returncode == 0:
                h.git("push", "-q", "origin", b, cwd=str(work))
        elif action == "force":
            b = rng.choice(branches)
            h.git("checkout", "-q", b, cwd=str(work))
            if h.git("rev-parse", "-q", "--verify", "HEAD~1", cwd=str(work), check=False).returncode == 0:
                h.git("reset", "-q", "--hard", "HEAD~1", cwd=str(work))
                (work / "forced.txt").write_text(f"forced {step}\n")
                pk.commit(work, f"forced {step}")
                h.git("push", "-q", "--force", "origin", b, cwd=str(work))
        elif action == "delete" and len(branches) > 2:
            b = rng.choice([x for x in branches if x != "main"])
            h.git("push", "-q", "origin", f":{b}", cwd=str(work))
            h.git("checkout", "-q", "main", cwd=str(work))
            h.git("branch", "-q", "-D", b, cwd=str(work))
            branches.remove(b)
        elif action == "tag":
            t = f"v{step}"
            h.git("tag", "-a", "-m", t, t, rng.choice(branches), cwd=str(work))
            h.git("push", "-q", "origin", t, cwd=str(work))
        elif action == "outside":
            # a change made outside Aspen, noticed at the next request as an external version
            h.git("update-ref", f"refs/heads/outside{step}", h.out("rev-parse", "main", cwd=str(repo)),
                  cwd=str(repo))
        if rng.random() < 0.45:
            snap = tmp / f"client{len(snapshots)}.git"
            h.git("clone", "-q", "--mirror", url, str(snap))
            snapshots.append(snap)


# Which path answered a round: planned, or git for the only reasons these histories give.
ALLOWED = {"planned", "fallback why=unknown-have", "fallback why=haves-not-proved", "fallback why=extra-objects"}


def _path(line: str) -> str:
    m = re.search(r"plan=(\S+)(?: why=(\S+))?", line)
    assert m, line
    if m.group(1) == "planned":
        return m.group(1)
    return f"{m.group(1)} why={m.group(2)}"


def _pad_branches(work: Path, n: int) -> None:
    for k in range(n):
        h.git("checkout", "-q", "-b", f"pad{k}", "main", cwd=str(work))
        pk.commit(work, f"pad{k}")
    h.git("checkout", "-q", "main", cwd=str(work))
    h.git("push", "-q", "origin", *[f"pad{k}" for k in range(n)], cwd=str(work))


SEEDS = [(seed, 0 if seed % 2 else 2) for seed in range(1, 18)]   # 17 x 12 = 204 fetches from Aspen (and from stock)


@pytest.mark.parametrize("seed,version", SEEDS, ids=[f"v{v}-seed{s}" for s, v in SEEDS])
def test_random_histories_and_clients(seed, version, root, server_factory, cgi_server_factory, tmp_path):
    rng = random.Random(seed)
    server = server_factory(root, ASPEN_ACCESS_LOG="1")
    repo = pk.enable_push(root / "repo.git")
    url = server.url + "/repo.git"
    work = tmp_path / "work"
    h.git("clone", "-q", url, str(work))
    snapshots: list[Path] = []
    padded = version == 0 and seed % 4 == 3
    if padded:
        _pad_branches(work, 16)
    _random_history(rng, work, repo, snapshots, url, tmp_path)
    h.git("ls-remote", url)                      # the last outside change becomes a version
    res = subprocess.run([sys.executable, "-m", "aspen_cgi.cli", "import", "-q", str(repo)],
                         capture_output=True, text=True, cwd=h.REPO_DIR)
    assert res.returncode == 0, res.stderr
    stock = cgi_server_factory(repo.parent, "stock")
    server_refs = h.refs_of(str(repo))
    for i in range(FETCHES_PER_SEED):
        strict = rng.random() < 0.5
        snap = rng.choice(snapshots) if snapshots and rng.random() < 0.85 else None
        results = {}
        for name, base in (("aspen", url), ("stock", stock.url + "/repo.git")):
            client = tmp_path / f"f{i}-{name}.git"
            if snap is not None:
                shutil.copytree(snap, client)
            else:
                h.git("init", "-q", "--bare", str(client))
            before = len(re.findall(r"service=upload-pack method=POST", server.log_text()))
            h.git("-c", f"protocol.version={version}", "-c", f"transfer.fsckObjects={str(strict).lower()}",
                  "fetch", "-q", "--prune", "--no-tags", base, "+refs/*:refs/*", cwd=str(client))
            h.fsck_strict(str(client))
            assert h.refs_of(str(client)) == server_refs, (seed, version, i, name)
            results[name] = _objects(client)
            if name == "aspen":
                lines = [line for line in re.findall(r"service=upload-pack method=POST .*", server.log_text())[before:]
                         if "plan=" in line]
                paths = [_path(line) for line in lines]
                assert set(paths) <= ALLOWED, (seed, version, i, paths)
        assert results["aspen"] == results["stock"], (seed, version, i, len(results["aspen"] ^ results["stock"]))
    # How many are planned depends on the history; each was checked above.
    # Over seeds 1-17 on 2026-11-30: 112 of 204 (58 extra-objects fallbacks).
