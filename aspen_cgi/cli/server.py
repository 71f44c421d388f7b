"""The server around the stores: `dev` (serve a directory), `install-cgi`,
`resident`, `stats` (cache, admission and server metrics) and `doctor`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .. import settings as aspen_settings
from .history import depth1_entries


def cmd_dev(args: argparse.Namespace) -> int:
    from ..devserver import serve  # startup
    return serve(args.dir, args.host, args.port, args.workers, allow_push=not args.no_push)


def cmd_install_cgi(args: argparse.Namespace) -> int:
    from .. import cgilauncher  # startup
    path = args.path or cgilauncher.installed()
    python = args.python or os.path.join(os.path.dirname(path), "python3")
    why = cgilauncher.rewrite(path, python)
    if why is not None:
        print(f"aspen install-cgi: {why}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"{path}: starts {python} -IS directly")
    return 0


def cmd_resident(args: argparse.Namespace) -> int:
    from .. import resident  # startup
    run_dir = aspen_settings.of(os.environ).run_dir
    found = resident.running(run_dir)
    if not args.all:
        found = [r for r in found if r.ours]
    if args.json and not args.stop:
        print(json.dumps([r.as_dict() for r in found]))
        return 0
    if not found:
        print(f"no resident {'of this user' if args.all else 'of this install'} in {run_dir}")
        return 0
    rc = 0
    for r in found:
        if args.stop:
            went = resident.stop(r)
            print(f"{r.socket}: pid {r.pid} {'stopped' if went else 'did not stop within 10 s'}")
            rc |= 0 if went else 1
        else:
            state = f"pid {r.pid}, {len(r.workers)} worker(s)" if r.pid else "not running (a stale socket)"
            print(f"{r.socket}: {state}{'' if r.ours else ' (another install)'}")
    return rc


def cmd_stats(args: argparse.Namespace) -> int:
    from ..cache import evict, responses, stats  # startup
    from ..runtime import admission  # startup
    from ..runtime.statedir import state_dir  # startup
    if not args.repo and not args.server:
        raise SystemExit("aspen stats: name a repository, or --server for the server's metrics")
    rows = []
    for repo in args.repo:
        gitdir = os.path.abspath(repo)
        if not os.path.isfile(os.path.join(gitdir, "HEAD")):
            raise SystemExit(f"aspen: not a git repository: {repo}")
        config = aspen_settings.of(os.environ)
        settings = responses.settings(state_dir(gitdir, config), config)
        if settings is None:
            rows.append({"repo": repo, "cache": "off"})
            continue
        c = stats.totals(settings.directory) if os.path.isdir(settings.directory) else stats.Counters()
        items = evict.entries(settings.directory)
        rows.append({"repo": repo, "cache_dir": settings.directory, "requests": c.requests,
                     "hit_rate": round(c.hit_rate, 4), "hits": c.counts["hit"], "shared": c.counts["shared"],
                     "cold": c.counts["cold"], "uncached": c.counts["uncached"], "prewarmed": c.counts["prewarm"],
                     "bytes_from_cache": c.bytes["hit"] + c.bytes["shared"],
                     "bytes_computed": c.bytes["cold"] + c.bytes["uncached"], "evictions": c.counts["evicted"],
                     "evicted_bytes": c.bytes["evicted"], "abandoned": c.counts["abandoned"],
                     "superseded": c.counts["superseded"], "entries": len(items), "entry_bytes": sum(e.size for e in items),
                     "max_bytes": settings.max_bytes, "depth1_wide": c.counts["depth1_wide"],
                     "depth1_kept": c.counts["depth1_kept"], "depth1_entries": depth1_entries(items)})
    g = admission.gauges(admission.capacity(aspen_settings.of(os.environ)))
    server: dict[str, Any] = {"cold_running": g.running, "queue_depth": g.queued, "builds_running": g.builds}
    values = None
    if args.server:
        from ..http import metricspage  # startup
        from ..runtime import metrics  # startup
        values = metricspage.snapshot(os.environ)
        server.update({"metrics_dir": metrics.directory(aspen_settings.of(os.environ)), "metrics": metrics.families(values)})
    if args.json:
        print(json.dumps({"repositories": rows, "server": server}, indent=2))
        return 0
    for r in rows:
        if r.get("cache") == "off":
            print(f"{r['repo']}: cache off (ASPEN_CACHE=off)")
            continue
        print(f"{r['repo']}:")
        print(f"  requests {r['requests']}  hit rate {r['hit_rate']:.1%}  (hit {r['hits']}, shared {r['shared']}, "
              f"cold {r['cold']}, uncached {r['uncached']}, pre-warmed {r['prewarmed']})")
        print(f"  bytes served from cache {r['bytes_from_cache']:,}  computed {r['bytes_computed']:,}")
        print(f"  entries {r['entries']} ({r['entry_bytes']:,} of {r['max_bytes']:,} bytes)  "
              f"evictions {r['evictions']} ({r['evicted_bytes']:,} bytes)  abandoned {r['abandoned']}  "
              f"superseded {r['superseded']}")
        d1 = r["depth1_entries"]
        print(f"  depth-1 clones: entries stock {d1['stock']}, wide {d1['wide']}, stock-kept {d1['stock-kept']}; "
              f"made wide in the background {r['depth1_wide']}, kept git's {r['depth1_kept']}")
    if values is not None:
        _print_metrics(server["metrics_dir"], values)
    else:
        print(f"server: cold computations running {server['cold_running']}, queue depth {server['queue_depth']}, "
              f"pack builds running {server['builds_running']}")
    return 0


def _print_metrics(where: str, values: dict) -> None:
    """The server's metrics, family by family: the numbers GET /_aspen/metrics serves."""
    from ..runtime import metrics  # startup
    counted = [k for k in values if metrics.family(k) in metrics.COUNTERS and values[k]]
    print(f"server metrics ({where}):")
    if not counted:
        print("  nothing counted yet: the server counts with ASPEN_METRICS=1 in its environment, here "
              "under ASPEN_STATE_DIR or ASPEN_RUN_DIR as set for it")
    for name, kind, title, _ in metrics.FAMILIES:
        rows = [(metrics.labels_of(k), v) for k, v in sorted(values.items()) if metrics.family(k) == name]
        if not rows:
            continue
        if len(rows) == 1 and not rows[0][0]:
            print(f"  {title}: {metrics.number_text(rows[0][1])}")
            continue
        print(f"  {title}:")
        cells = [list(labels.values()) for labels, _ in rows]
        ncol = max(len(c) for c in cells)
        widths = [max((len(c[i]) for c in cells if i < len(c)), default=0) for i in range(ncol)]
        for c, (_, v) in zip(cells, rows):
            text = "  ".join((c[i] if i < len(c) else "-").ljust(widths[i]) for i in range(ncol))
            print(f"    {text}  {metrics.number_text(v)}")


def cmd_doctor(args: argparse.Namespace) -> int:
    from .. import doctor  # startup
    c = doctor.checkup(args.repo, args.user, args.apache_dir, args.unit, args.url, os.environ)
    return doctor.report(doctor.examine(c), args.json)
