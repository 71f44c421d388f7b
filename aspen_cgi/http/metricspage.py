"""What a scrape of the server's metrics reads (`GET /_aspen/metrics`,
`aspen stats --server`): the counters every process added to
(runtime/metrics.py) and the gauges read now: admission's queue and running
computations, and the version-pack backlog of the stores marked as having
versions to build (the only part that opens a store)."""

from __future__ import annotations

import os
import time
from typing import Mapping

from .. import settings
from ..refstore import registry
from ..runtime import admission, metrics, pollfiles


def backlog(where: str, url: "str | None" = None) -> tuple[int, int]:
    """(versions without their pack, repositories with any) over the marked stores
    (URL: the PostgreSQL database of those whose mark names a store's record)."""
    versions = repos = 0
    folder = os.path.join(where, metrics.BACKLOG)
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0, 0
    now = time.time()
    for e in entries:
        if "." in e.name:
            try:                                     # a writer's leftover, killed between write and rename
                if now - e.stat().st_mtime > metrics.PRUNE_S:
                    os.unlink(e.path)
            except OSError:
                pass
            continue
        try:
            with open(e.path, encoding="utf-8", errors="surrogateescape") as f:
                store_path = f.read().rstrip("\n")
            age = now - e.stat().st_mtime
        except OSError:
            continue
        if not os.path.isfile(store_path):
            _unlink(e.path)                          # the repository (or its store) is gone
            continue
        n = registry.unbuilt_count(store_path, url)
        if n == 0 and age > metrics.PRUNE_S:
            # set the mark aside, then look again: a push that lands meanwhile either is
            # seen now or marks the repository afresh (its kick comes after its version)
            aside = f"{e.path}.{os.getpid()}.aside"
            try:
                os.rename(e.path, aside)
            except OSError:
                continue
            n = registry.unbuilt_count(store_path, url)
            if n:
                os.replace(aside, e.path)
            else:
                _unlink(aside)
        if n:
            versions += n
            repos += 1
    return versions, repos


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# -- reading them -----------------------------------------------------------------------------------

def gauges(env: Mapping[str, str], where: str) -> dict[str, float]:
    g = admission.gauges(admission.capacity(settings.of(env)))
    versions, repos = backlog(where, settings.of(env).refstore_url)
    return {"aspen_admission_queue_depth": g.queued, "aspen_admission_cold_running": g.running,
            "aspen_pack_builds_running": g.builds, "aspen_version_pack_backlog": versions,
            "aspen_version_pack_backlog_repositories": repos}


def snapshot(env: Mapping[str, str]) -> dict[str, float]:
    """Every series now: the counters added up and the gauges read."""
    where = metrics.directory(settings.of(env))
    out = metrics.totals(where)
    for name in metrics.UNLABELLED:
        out.setdefault(name, 0)
    out.update(gauges(env, where))
    polls = pollfiles.served(settings.of(env))
    if polls is not None:
        out["aspen_polls_from_files_total"] = polls
    return out
