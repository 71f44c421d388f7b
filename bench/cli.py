"""`aspen-bench` (also `python -m bench`): run workloads against targets and
write a results folder; generate repositories; regenerate reports; list workloads."""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Optional

from . import machine as machine_mod
from . import results
from .progress import Progress, say

DEFAULT_TARGETS = "aspen,stock"
REPO_NAME = "bench.git"


def _workloads() -> dict:
    from .workloads import WORKLOADS
    return WORKLOADS


def _describe(fn) -> str:
    doc = (getattr(fn, "__doc__", None) or "").strip()
    if not doc:
        mod = sys.modules.get(getattr(fn, "__module__", ""), None)
        doc = (getattr(mod, "__doc__", None) or "").strip()
    para = " ".join(doc.split("\n\n", 1)[0].split())
    first = para.split(". ", 1)[0].rstrip(".")
    return first if len(first) <= 110 else first[:107] + "..."


# ---------------------------------------------------------------- parser

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="aspen-bench",
        description="Measure Aspen against stock git http-backend (and any smart-HTTP server by URL) "
                    "in the same run on the same machine.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    r = sub.add_parser("run", help="run workloads and write a results folder",
                       description="Run WORKLOADs (or `all`) against each target over its own copy of the "
                                   "same repository, and write bench/results/<date>-<machine>/.")
    r.add_argument("workloads", nargs="+", metavar="WORKLOAD", help="workload names (see `aspen-bench list`), or `all`")
    r.add_argument("--targets", default=DEFAULT_TARGETS,
                   help="comma-separated: aspen, aspen-packs, aspen-git, stock, stock-maintained, stock-apache, aspen-apache, aspen-modwsgi, url:NAME=URL "
                        "(default %(default)s)")
    src = r.add_mutually_exclusive_group()
    src.add_argument("--preset", choices=_preset_names(), default=None,
                     help="generate a repository of this size (default tiny with --quick, else small)")
    src.add_argument("--repo", type=Path, help="use a copy of this local bare repository instead")
    r.add_argument("--seed", type=int, default=None, help="generator seed (default: the preset's)")
    r.add_argument("--quick", action="store_true", help="small sizes everywhere (CI and smoke runs)")
    r.add_argument("--max-n", type=int, help="stale-branch: largest N (trunk pushes behind)")
    r.add_argument("--jobs", type=int, help="storms: K concurrent jobs (default 200)")
    r.add_argument("--writers", type=int, help="writers: W concurrent writers")
    r.add_argument("--seconds", type=float, help="writers: how long the writers push; busy-repo: the script's length")
    r.add_argument("--readers", type=int, help="writers: R readers polling and fetching meanwhile")
    r.add_argument("--clients", type=int, help="clone-concurrency: C clients at once")
    r.add_argument("--fetches", type=int, help="random-fetch, lagging-clients: F verified fetches per target")
    r.add_argument("--protocols",
                   help="random-fetch, lagging-clients: protocol versions the fetches take in turn (default 0,2)")
    r.add_argument("--history", type=int, help="history-clone: K trunk pushes before the clones (default 1000)")
    r.add_argument("--cpu-fetches", type=int,
                   help="warm-fetch: extra identical fetches per repetition for the server CPU (default 12, quick 2)")
    r.add_argument("--param", "-p", action="append", default=[], metavar="KEY=VALUE",
                   help="any workload parameter (repeatable), e.g. -p packs_timeout=3600 -p wait_packs=0")
    r.add_argument("--pushes", type=int, help="push-history: total trunk pushes")
    r.add_argument("--window", type=int, help="push-history: pushes per latency window")
    r.add_argument("--reps", type=int, help="repetitions of single-client workloads (medians are reported)")
    r.add_argument("--pool", type=int, help="client threads for concurrent workloads (default: one per job)")
    r.add_argument("--server-workers", type=int, help="gunicorn workers per target (default: targets' default)")
    r.add_argument("--server-threads", type=int, help="gunicorn threads per worker (default: targets' default)")
    r.add_argument("--out", type=Path, default=Path("bench/results"),
                   help="parent of the results folder (default %(default)s/)")
    r.add_argument("--machine", help="machine tag in the folder name (default: $ASPEN_BENCH_MACHINE or hostname)")
    r.add_argument("--results-dir", type=Path,
                   help="write into exactly this results folder (appending), instead of OUT/<date>-<machine>")
    r.add_argument("--workdir", type=Path, help="scratch directory (default: a fresh temporary one)")
    r.add_argument("--keep", action="store_true", help="keep the scratch directory")
    r.add_argument("--no-plots", action="store_true", help="write raw records and tables only")
    r.set_defaults(func=cmd_run)

    g = sub.add_parser("gen", help="generate a repository only",
                       description="Generate the deterministic bare repository of PRESET at DEST.")
    g.add_argument("preset", choices=_preset_names(), metavar="PRESET", help=" | ".join(_preset_names()))
    g.add_argument("dest", type=Path, metavar="DEST", help="bare repository to create (must not exist)")
    g.add_argument("--seed", type=int, default=None, help="generator seed (default: the preset's)")
    g.set_defaults(func=cmd_gen)

    rep = sub.add_parser("report", help="regenerate tables and plots from results folders",
                         description="Rebuild tables.md and the PNG plots of each DIR from its raw.jsonl; "
                                     "with --page, one page over all of them (each compared within itself).")
    rep.add_argument("dirs", type=Path, nargs="+", metavar="DIR", help="a results folder (holding raw.jsonl)")
    rep.add_argument("--no-plots", action="store_true", help="tables only")
    rep.add_argument("--page", type=Path, metavar="FILE",
                     help="also write a BENCHMARKS.md page (method, machine, tables, where Aspen loses) to FILE")
    rep.add_argument("--command", dest="campaign_command", default="",
                     help="with --page: the command that produced the results, quoted on the page")
    rep.set_defaults(func=cmd_report)

    ls = sub.add_parser("list", help="list workloads", description="List the workloads `run` knows.")
    ls.set_defaults(func=cmd_list)

    fl = sub.add_parser("faults", help="soak Aspen under load with faults injected at random",
                        description="Clone, fetch and push load against Aspen under gunicorn for N seconds while "
                                    "worker kill -9, git child kill -9 and SQLite locks held by another process "
                                    "are injected at random; then check that no acknowledged push was lost, "
                                    "aspen verify and git fsck are clean and a final clone is correct. Writes "
                                    "bench/results/<date>-faults/ (summary.json, README.md).")
    fl.add_argument("--seconds", type=float, default=60.0, help="how long to inject faults (default %(default)s)")
    fl.add_argument("--seed", type=int, default=1, help="random seed of the fault schedule (default %(default)s)")
    fl.add_argument("--out", type=Path, help="results folder (default bench/results/<date>-faults)")
    fl.add_argument("--keep", action="store_true", help="keep the scratch directory")
    fl.set_defaults(func=cmd_faults)

    fz = sub.add_parser("fuzz", help="fuzz everything that parses client bytes",
                        description="Fuzz pkt-lines, v0/v2 upload-pack requests, capabilities, CGI variables, "
                                    "receive-pack commands and pack headers, request bodies (gzip), the whole "
                                    "pipeline in process over a real repository, the aspen-cgi program, and raw "
                                    "HTTP framing to gunicorn, "
                                    "starting from requests captured from real git clients. Prints per target the "
                                    "inputs tried, inputs/s, distinct outcomes and crashes; writes "
                                    "OUT/<date>-fuzz/ (summary.json, README.md, crashes/, corpus/). Exits 1 when "
                                    "anything crashed.")
    fz.add_argument("--seconds", type=float, default=60.0,
                    help="total fuzzing time, shared equally by the targets (default %(default)s)")
    fz.add_argument("--seed", type=int, default=0, help="hypothesis seed; the same seed replays the same inputs "
                                                        "(default %(default)s)")
    fz.add_argument("--targets", default=None,
                    help="comma-separated targets (default all): pktline, upload-v0, upload-v2, capabilities, "
                         "cgi-vars, receive-commands, pack-header, body, pipeline, push, cgi, http-wire")
    fz.add_argument("--out", type=Path, default=Path("bench/results"),
                    help="parent of the results folder (default %(default)s/)")
    fz.add_argument("--workdir", type=Path, help="scratch directory (default: a fresh temporary one)")
    fz.add_argument("--keep", action="store_true", help="keep the scratch directory")
    fz.set_defaults(func=cmd_fuzz)

    from .polls import add_parser as add_polls
    add_polls(sub)
    return p


def _preset_names() -> list[str]:
    try:
        from .repogen import PRESETS
        return list(PRESETS)
    except Exception:
        return ["tiny", "small", "medium"]


# ---------------------------------------------------------------- commands

def cmd_faults(args) -> int:
    from . import faults
    return faults.cmd(args)


def cmd_fuzz(args) -> int:
    from .fuzz import command
    return command.cmd(args)


def cmd_list(args) -> int:
    for name, fn in _workloads().items():
        print(f"{name:20} {_describe(fn)}")
    return 0


def cmd_gen(args) -> int:
    from .repogen import generate, spec_for
    args.dest.parent.mkdir(parents=True, exist_ok=True)
    t = time.monotonic()
    info = generate(spec_for(args.preset, args.seed), args.dest)
    print(f"{info.path}: {info.commits} commits, {info.objects} objects, {info.refs} refs "
          f"({time.monotonic() - t:.1f}s)")
    return 0


def cmd_report(args) -> int:
    for d in args.dirs:
        if not (d / results.RAW).is_file():
            raise SystemExit(f"aspen-bench: {d / results.RAW}: not found (not a results folder?)")
    for d in args.dirs:
        print(results.write_report(d, plots=not args.no_plots))
    if args.page:
        from .page import write_page
        print(write_page(args.page, list(args.dirs), command=args.campaign_command))
    return 0


def _resolve_workloads(names: list[str]) -> list[str]:
    known = _workloads()
    out: list[str] = []
    for n in names:
        for part in n.split(","):
            part = part.strip()
            if not part:
                continue
            if part == "all":
                out += [w for w in known if w not in out]
            elif part in known:
                if part not in out:
                    out.append(part)
            else:
                raise SystemExit(f"aspen-bench: unknown workload {part!r} (known: {', '.join(known)}, all)")
    return out


def _prepare_repo(args, source_root: Path):
    """The source repository every target gets a copy of; returns RepoInfo."""
    from . import repogen
    dest = source_root / REPO_NAME
    if args.repo:
        info = repogen.use_repo(args.repo)
        shutil.copytree(info.path, dest, symlinks=True)
        subprocess.run(["git", "config", "http.receivepack", "true"], cwd=dest, check=True)
        return repogen.describe(dest)
    preset = args.preset or ("tiny" if args.quick else "small")
    return repogen.generate(repogen.spec_for(preset, args.seed), dest)


def _knobs(args) -> dict:
    knobs = {"max_n": args.max_n, "jobs": args.jobs, "writers": args.writers, "seconds": args.seconds,
             "clients": args.clients, "fetches": args.fetches, "pushes": args.pushes, "seed": args.seed,
             "reps": args.reps, "pool": args.pool, "readers": args.readers, "window": args.window,
             "protocols": getattr(args, "protocols", None), "history": getattr(args, "history", None),
             "cpu_fetches": getattr(args, "cpu_fetches", None)}
    out = {k: v for k, v in knobs.items() if v is not None}
    for item in getattr(args, "param", None) or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"aspen-bench: --param {item!r}: expected KEY=VALUE")
        out[key.strip().replace("-", "_")] = _param_value(value.strip())
    return out


def _param_value(text: str):
    """A --param value: an int or float when it reads as one, else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def cmd_run(args) -> int:
    from .targets import parse_spec
    names = _resolve_workloads(args.workloads)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    for t in targets:
        try:
            parse_spec(t)
        except ValueError as e:
            raise SystemExit(f"aspen-bench: {e}")
    info = machine_mod.collect(args.machine)
    folder = args.results_dir or Path(args.out) / results.folder_name(info)
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="aspen-bench-", dir=args.workdir))
    scratch.chmod(0o755)   # Apache's CGI children (www-data) must reach the repository copies
    progress = Progress()
    failed: list[str] = []
    try:
        say(f"aspen-bench: workdir {scratch}")
        source = scratch / "source"
        source.mkdir()
        t = time.monotonic()
        repo = _prepare_repo(args, source)
        say(f"aspen-bench: repository {repo.commits} commits, {repo.objects} objects, {repo.refs} refs "
            f"({time.monotonic() - t:.1f}s)")
        run_args = {"argv": sys.argv[1:], "workloads": names, "targets": targets,
                    "preset": None if args.repo else (args.preset or ("tiny" if args.quick else "small")),
                    "repo_path": str(args.repo) if args.repo else None, "seed": args.seed,
                    "quick": args.quick, "knobs": _knobs(args),
                    "repo": {"commits": repo.commits, "objects": repo.objects, "refs": repo.refs}}
        writer = results.ResultsWriter(folder, info, run_args)
        i = 0
        try:
            for i, name in enumerate(names):
                say(f"aspen-bench: [{i + 1}/{len(names)}] {name} on {', '.join(targets)}")
                try:
                    writer.add(run_workload(name, targets, source, scratch / f"w{i}-{name}", args, progress))
                    progress.close()
                except Exception as e:
                    progress.close(note="failed")
                    failed.append(name)
                    writer.fail(name, f"{type(e).__name__}: {e}")
                    say(f"aspen-bench: {name} failed: {type(e).__name__}: {e}")
                    traceback.print_exc(file=sys.stderr)
        except KeyboardInterrupt:
            progress.close(note="interrupted")
            writer.fail(names[i], "interrupted")
            results.write_report(folder, plots=not args.no_plots)   # keep what was measured
            say(f"aspen-bench: interrupted; partial results in {folder}")
            raise
        tables = results.write_report(folder, plots=not args.no_plots)
        sys.stdout.write(tables.read_text())
        say(f"aspen-bench: results in {folder}")
    finally:
        if args.keep:
            say(f"aspen-bench: kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    if failed:
        say(f"aspen-bench: failed workloads: {', '.join(failed)}")
        return 1
    return 0


# Workloads measured with Aspen's response cache on (its product default): the
# storms it is for, the push workloads beside them, the busy repository
# (Aspen as an operator runs it) and fairness (its requests are cold anyway). The others measure a
# computation that a cache would answer from the second repetition on.
CACHED_WORKLOADS = frozenset({"storm-depth1", "storm-warm", "writers", "clone-concurrency", "busy-repo", "fairness",
                              "offload-storm"})


def _trunk(source: Path) -> str:
    """The branch HEAD names in SOURCE (refs/heads/main for the generated repositories)."""
    import subprocess
    p = subprocess.run(["git", "symbolic-ref", "-q", "HEAD"], cwd=str(source), capture_output=True, text=True)
    ref = p.stdout.strip()
    return ref if p.returncode == 0 and ref.startswith("refs/heads/") else "refs/heads/main"


def run_workload(name: str, targets: list[str], source: Path, workdir: Path, args, progress: Progress) -> list:
    """Start fresh targets over fresh copies of SOURCE, run one workload, stop them.

    Each workload gets its own servers so that pushes made by one workload
    (push-history, writers) never change what the next one measures."""
    from . import targets as targets_mod
    from .workloads import WorkloadContext
    workdir.mkdir(parents=True)
    fn = _workloads()[name]
    opts = {"repo": REPO_NAME, "warn": say}
    knobs = _knobs(args)
    cache = str(knobs.get("cache", "on" if name in CACHED_WORKLOADS else "off"))
    opts["env"] = {"ASPEN_CACHE": cache}
    if name == "fairness":
        from .workloads import fairness
        opts["env"].update(fairness.ENV)       # the bench's proxy is the clients' trusted proxy
    if args.server_workers:
        opts["workers"] = args.server_workers
    if args.server_threads:
        opts["threads"] = args.server_threads
    with targets_mod.running_targets(targets, source, workdir / "servers", **opts) as started:
        if not started:
            raise RuntimeError("no target could be started")
        infos = [t.info for t in started]
        ctx = WorkloadContext(
            targets=infos, repo=REPO_NAME, proxies={t.info.name: t.proxy for t in started},
            roots={t.info.name: t.info.root for t in started}, workdir=workdir / "client",
            quick=args.quick, params=_knobs(args), procs={t.info.name: list(t.info.pids) for t in started},
            progress=progress, trunk=_trunk(source / REPO_NAME))
        progress.start(0, name)
        return list(fn(ctx))


def _on_sigterm(signum, frame) -> None:
    # Unwind normally so that every started server is stopped (they run in their own sessions).
    raise KeyboardInterrupt


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        say("aspen-bench: interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
