"""Deterministic generator of realistic bare repositories for the bench.

One `git fast-import` process is fed a stream built from a seeded RNG: text
files whose lines are inserted, deleted and changed over time (so deltas
matter), directories of several depths, renames, feature branches merged back
into `main`, annotated and lightweight tags. Author and committer dates derive
from the seed, so the same `GenSpec` always gives the same commit ids.

    info = generate(PRESETS["small"], Path("/tmp/bench.git"))
    info = use_repo(Path("/srv/git/linux.git"))      # --repo PATH
"""

from __future__ import annotations

import os
import random
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

IDENT = "Bench Generator <bench@aspen.invalid>"
_WORDS = ("alpha beta gamma delta value index count buffer stream packet object commit tree blob ref "
          "branch merge tag offset length header reader writer cache plan version segment proof "
          "client server request response error result config option path name size limit").split()


@dataclass(frozen=True)
class GenSpec:
    """What to generate. `files` is the initial number of files; each commit edits
    about `edits` of them (plus occasional additions)."""
    commits: int = 50
    files: int = 20
    max_depth: int = 3
    branches: int = 2
    tags: int = 4
    merges_every: int = 10
    renames_every: int = 15
    seed: int = 1
    edits: int = 2


PRESETS: dict[str, GenSpec] = {
    "tiny": GenSpec(commits=50, files=20, max_depth=3, branches=2, tags=4, merges_every=10, renames_every=15, edits=2),
    "small": GenSpec(commits=500, files=120, max_depth=4, branches=3, tags=10, merges_every=25, renames_every=20, edits=4),
    "medium": GenSpec(commits=3000, files=800, max_depth=5, branches=4, tags=30, merges_every=40, renames_every=25, edits=8),
    "large": GenSpec(commits=12000, files=4000, max_depth=6, branches=6, tags=60, merges_every=40, renames_every=25,
                     edits=8),
}


@dataclass
class RepoInfo:
    """A bare repository ready to serve."""
    path: Path
    commits: int
    objects: int
    refs: int


def _git(*args: str, cwd: Path, input: bytes | None = None) -> str:
    env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null")
    p = subprocess.run(["git", *args], cwd=str(cwd), input=input, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if p.returncode != 0:
        raise RuntimeError(f"git {' '.join(args[:3])} failed: {p.stderr.decode(errors='replace')[-2000:]}")
    return p.stdout.decode(errors="replace")


class _Stream:
    """Builds the fast-import stream; marks count from 1."""

    def __init__(self, seed: int):
        self.out: list[bytes] = []
        self.mark = 0
        self.when = 1_500_000_000 + (seed % 10_000) * 3_600

    def data(self, payload: bytes) -> None:
        self.out.append(b"data %d\n" % len(payload))
        self.out.append(payload)
        self.out.append(b"\n")

    def commit(self, ref: str, message: str, parents: list[int], ops: list[bytes]) -> int:
        self.mark += 1
        self.when += 97
        self.out.append(f"commit {ref}\nmark :{self.mark}\n".encode())
        stamp = f"{IDENT} {self.when} +0000\n"
        self.out.append(f"author {stamp}committer {stamp}".encode())
        self.data(message.encode())
        if parents:
            self.out.append(f"from :{parents[0]}\n".encode())
            for p in parents[1:]:
                self.out.append(f"merge :{p}\n".encode())
        self.out.extend(ops)
        self.out.append(b"\n")
        return self.mark


def _line(rng: random.Random) -> str:
    words = rng.choices(_WORDS, k=rng.randint(2, 8))
    indent = " " * (4 * rng.randint(0, 3))
    if rng.random() < 0.5:
        return f"{indent}{words[0]}_{rng.randint(0, 999)} = {'_'.join(words[1:3])}({', '.join(words[3:])})"
    return f"{indent}# {' '.join(words)}"


def _modify(path: str, lines: list[str]) -> bytes:
    body = ("\n".join(lines) + "\n").encode()
    return f"M 100644 inline {path}\n".encode() + b"data %d\n" % len(body) + body + b"\n"


def _edit(rng: random.Random, lines: list[str]) -> None:
    for _ in range(rng.randint(1, 4)):
        kind = rng.random()
        at = rng.randrange(len(lines) + 1)
        if kind < 0.45 or len(lines) < 10:
            lines[at:at] = [_line(rng) for _ in range(rng.randint(1, 6))]
        elif kind < 0.7 or len(lines) > 400:
            del lines[at:at + rng.randint(1, 5)]
        else:
            for i in range(at, min(len(lines), at + rng.randint(1, 3))):
                lines[i] = _line(rng)


def _new_path(rng: random.Random, spec: GenSpec, taken: dict, prefix: str = "") -> str:
    while True:
        depth = rng.randint(0, spec.max_depth)
        parts = [f"{rng.choice(_WORDS)}{rng.randint(0, 3)}" for _ in range(depth)]
        path = "/".join([p for p in [prefix.rstrip("/")] if p] + parts + [f"{rng.choice(_WORDS)}_{rng.randint(0, 9999)}.txt"])
        if path not in taken:
            return path


def build_stream(spec: GenSpec) -> bytes:
    """The fast-import stream for SPEC (pure: no process, no disk)."""
    rng = random.Random(spec.seed)
    s = _Stream(spec.seed)
    main: dict[str, list[str]] = {}
    ops: list[bytes] = []
    for _ in range(spec.files):
        path = _new_path(rng, spec, main)
        main[path] = [_line(rng) for _ in range(rng.randint(20, 80))]
        ops.append(_modify(path, main[path]))
    tip = s.commit("refs/heads/main", "initial import\n", [], ops)
    trunk_marks = [tip]
    branch_tip: dict[str, int] = {}
    branch_files: dict[str, dict[str, list[str]]] = {}
    unmerged: dict[str, bool] = {}
    names = [f"feature-{i}" for i in range(spec.branches)]
    for i in range(1, spec.commits):
        if names and spec.merges_every and i % spec.merges_every == 0 and any(unmerged.values()):
            name = next(n for n in rng.sample(names, len(names)) if unmerged.get(n))
            ops = []
            for path, lines in branch_files[name].items():
                if main.get(path) != lines:
                    main[path] = list(lines)
                    ops.append(_modify(path, lines))
            tip = s.commit("refs/heads/main", f"Merge branch '{name}'\n", [tip, branch_tip[name]], ops)
            unmerged[name] = False
            trunk_marks.append(tip)
            continue
        if names and rng.random() < 0.2:
            name = rng.choice(names)
            files = branch_files.setdefault(name, {})
            if not files or rng.random() < 0.3:
                path = _new_path(rng, spec, files, f"features/{name}/")
                files[path] = [_line(rng) for _ in range(rng.randint(10, 40))]
            else:
                path = rng.choice(sorted(files))
                _edit(rng, files[path])
            parent = branch_tip.get(name, tip)
            branch_tip[name] = s.commit(f"refs/heads/{name}", f"{name}: work on {path.rsplit('/', 1)[-1]}\n",
                                        [parent], [_modify(path, files[path])])
            unmerged[name] = True
            continue
        ops = []
        trunk_paths = sorted(p for p in main if not p.startswith("features/"))
        if spec.renames_every and i % spec.renames_every == 0 and trunk_paths:
            old = rng.choice(trunk_paths)
            new = _new_path(rng, spec, main)
            main[new] = main.pop(old)
            ops.append(f"R {old} {new}\n".encode())
            trunk_paths = sorted(p for p in main if not p.startswith("features/"))
        for path in rng.sample(trunk_paths, min(len(trunk_paths), rng.randint(1, spec.edits))):
            _edit(rng, main[path])
            ops.append(_modify(path, main[path]))
        if rng.random() < 0.05:
            path = _new_path(rng, spec, main)
            main[path] = [_line(rng) for _ in range(rng.randint(10, 60))]
            ops.append(_modify(path, main[path]))
        tip = s.commit("refs/heads/main", f"change {i}: {rng.choice(_WORDS)} {rng.choice(_WORDS)}\n", [tip], ops)
        trunk_marks.append(tip)
    for k in range(spec.tags):
        target = trunk_marks[min(len(trunk_marks) - 1, (k + 1) * len(trunk_marks) // (spec.tags + 1))]
        if k % 2 == 0:
            s.out.append(f"tag v{k // 2}.0\nfrom :{target}\ntagger {IDENT} {s.when} +0000\n".encode())
            s.data(f"release {k // 2}.0\n".encode())
        else:
            s.out.append(f"reset refs/tags/snapshot-{k}\nfrom :{target}\n\n".encode())
    s.out.append(b"done\n")
    return b"".join(s.out)


def generate(spec: GenSpec, dest: Path) -> RepoInfo:
    """Create bare repository DEST (must not exist) from SPEC, packed, pushable over HTTP."""
    dest = Path(dest)
    if dest.exists():
        raise FileExistsError(dest)
    _git("init", "-q", "--bare", "-b", "main", str(dest), cwd=dest.parent)
    _git("fast-import", "--quiet", "--done", cwd=dest, input=build_stream(spec))
    _git("repack", "-a", "-d", "-q", cwd=dest)
    _git("pack-refs", "--all", cwd=dest)
    _git("config", "http.receivepack", "true", cwd=dest)
    return describe(dest)


def describe(repo: Path) -> RepoInfo:
    """Counts for a bare repository: commits reachable from any ref, objects, refs."""
    commits = int(_git("rev-list", "--all", "--count", cwd=repo).strip() or 0)
    counts = dict(l.split(": ", 1) for l in _git("count-objects", "-v", cwd=repo).splitlines() if ": " in l)
    objects = int(counts.get("count", 0)) + int(counts.get("in-pack", 0))
    refs = len(_git("for-each-ref", "--format=%(refname)", cwd=repo).split())
    return RepoInfo(Path(repo), commits, objects, refs)


def use_repo(path: Path) -> RepoInfo:
    """Validate `--repo PATH`: an existing local bare repository with at least one ref."""
    path = Path(path).resolve()
    if not path.is_dir():
        raise ValueError(f"{path}: not a directory")
    try:
        bare = _git("rev-parse", "--is-bare-repository", cwd=path).strip()
    except RuntimeError as e:
        raise ValueError(f"{path}: not a git repository") from e
    if bare != "true":
        raise ValueError(f"{path}: not a bare repository")
    info = describe(path)
    if info.refs == 0:
        raise ValueError(f"{path}: has no refs")
    return info


def spec_for(name: str, seed: int | None = None) -> GenSpec:
    """A preset by name, optionally with another seed."""
    spec = PRESETS[name]
    return replace(spec, seed=seed) if seed is not None else spec
