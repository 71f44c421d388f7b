"""`aspen-bench fuzz`: capture the seed corpus, fuzz each target for its
share of the time, print a table, write bench/results/<date>-fuzz/."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import corpus as corpus_mod
from . import report, select
from .model import Session, TargetResult
from .runner import run_target


def _printer(budget: float):
    tty = sys.stdout.isatty()
    last = [0.0]

    def progress(r: TargetResult, elapsed: float) -> None:
        now = time.monotonic()
        if not tty and now - last[0] < 10:
            return
        last[0] = now
        line = (f"fuzz {r.name}: {r.tried:,} inputs, {len(r.outcomes)} outcomes, {r.crash_count} crashes "
                f"({elapsed:.0f}/{budget:.0f} s)")
        sys.stdout.write(("\r" + line.ljust(100)) if tty else line + "\n")
        sys.stdout.flush()
    return progress


def cmd(args) -> int:
    try:
        targets = select(args.targets)
    except ValueError as e:
        raise SystemExit(f"aspen-bench: {e}")
    if not targets:
        raise SystemExit("aspen-bench: no fuzz targets selected")
    per_target = args.seconds / len(targets)
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="aspen-fuzz-", dir=args.workdir))
    results: list[TargetResult] = []
    try:
        t0 = time.monotonic()
        root, corpus = corpus_mod.build(scratch)
        print(f"aspen-bench fuzz: corpus of {len(corpus.requests)} requests from real git clients "
              f"({time.monotonic() - t0:.1f} s); {len(targets)} targets, {per_target:.0f} s each, seed {args.seed}",
              flush=True)
        session = Session(corpus, root, scratch / "work")
        session.workdir.mkdir()
        for target in targets:
            r = run_target(target, session, seed=args.seed, seconds=per_target, progress=_printer(per_target))
            results.append(r)
            end = "\n" if sys.stdout.isatty() else ""
            print(f"{end}fuzz {r.name}: {r.tried:,} inputs in {r.seconds:.0f} s, {len(r.outcomes)} outcomes, "
                  f"{r.crash_count} crashes" + (f" -- DID NOT RUN: {r.error.splitlines()[0]}" if r.error else ""),
                  flush=True)
        folder = report.folder_for(args.out)
        meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "seed": args.seed, "seconds": args.seconds,
                "seconds_per_target": per_target, "targets": [t.name for t in targets],
                "command": "aspen-bench " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["fuzz"] else "aspen-bench fuzz",
                "corpus_requests": len(corpus.requests)}
        report.write(folder, results, meta)
        corpus.save(folder / "corpus")
        print()
        print(report.table(results), end="")
        print(f"aspen-bench fuzz: results in {folder}")
    finally:
        if args.keep:
            print(f"aspen-bench fuzz: kept {scratch}")
        else:
            # not shutil.rmtree: it recurses per level, and a fuzzed push may leave a ref 1,000 directories deep
            subprocess.run(["rm", "-rf", str(scratch)], check=False)
    broken = [r.name for r in results if r.crashes or r.error]
    if broken:
        print(f"aspen-bench fuzz: crashes or errors in {', '.join(broken)}")
        return 1
    return 0
