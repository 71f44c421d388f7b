"""The PostgreSQL database of stores and a cluster's node: `aspen db`
(init, list, migrate, drop) and `aspen replica sync`."""

from __future__ import annotations

import argparse
import json
import os
import sys

from .. import settings as aspen_settings


def cmd_db(args: argparse.Namespace) -> int:
    from ..refstore import registry  # startup
    from ..refstore import store as refstore
    url = args.url or aspen_settings.of(os.environ).refstore_url
    if not url:
        print("aspen db: no database: give its URL or set ASPEN_REFSTORE_URL", file=sys.stderr)
        return 2
    if args.action == "drop":
        if not args.repo:
            print("aspen db drop: name the store's repository with --repo (as `aspen db list` shows it)",
                  file=sys.stderr)
            return 2
        try:
            gone = registry.drop_database_store(url, args.repo)
        except (refstore.db.Error, refstore.db.Busy) as e:      # type: ignore[misc]
            print(f"aspen db drop: {e}", file=sys.stderr)
            return 1
        print(f"aspen db drop: {'dropped' if gone else 'no store of'} {args.repo}")
        return 0 if gone else 1
    if args.action == "migrate":
        return _db_migrate(url, args)
    try:
        stores = registry.database_stores(url, init=args.action == "init")
    except refstore.db.Error as e:      # type: ignore[misc]
        print(f"aspen db {args.action}: {e}", file=sys.stderr)
        return 1
    except refstore.db.Busy as e:
        print(f"aspen db {args.action}: the database did not answer: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([{"repo": r, "schema": sc, "schema_version": v} for r, sc, v in stores]))
    elif args.action == "init":
        print(f"aspen db init: ready, {len(stores)} store(s)")
    else:
        for r, sc, v in stores:
            print(f"{sc}  schema {v}  {r}")
    return 0


def _db_migrate(url: str, args: argparse.Namespace) -> int:
    """`aspen db migrate`: every store behind moved to this Aspen's schema now."""
    from ..refstore import db, registry  # startup
    from ..runtime.progress import Bar  # startup
    bar = Bar("aspen db migrate", enabled=not args.json)
    try:
        moved = registry.migrate_database_stores(url, bar.update)
    except (db.Error, db.Busy) as e:      # type: ignore[misc]
        bar.finish()
        print(f"aspen db migrate: {e}", file=sys.stderr)
        return 1
    bar.finish()
    newer = [(r, b) for r, b, a in moved if a > db.SCHEMA_VERSION]
    if args.json:
        print(json.dumps([{"repo": r, "before": b, "after": a} for r, b, a in moved]))
    else:
        changed = sum(1 for _, b, a in moved if a != b)
        print(f"aspen db migrate: {changed} of {len(moved)} store(s) moved to schema {db.SCHEMA_VERSION}")
        for r, b in newer:
            print(f"aspen db migrate: {r} is at schema {b}, newer than this Aspen's", file=sys.stderr)
    return 1 if any(a < db.SCHEMA_VERSION for _, _, a in moved) else 0


def cmd_replica(args: argparse.Namespace) -> int:
    """`aspen replica sync`: bring this node's copies to the log."""
    from ..refstore import registry  # startup
    from ..refstore import store as refstore
    from ..runtime.progress import Bar  # startup
    from ..runtime.repository import Repository  # startup
    env = dict(os.environ)
    s = aspen_settings.of(env)
    if not registry.replica_mode(s):
        print("aspen replica: this node is no replica: set ASPEN_REFSTORE_URL and ASPEN_PACK_STORE",
              file=sys.stderr)
        return 2
    paths = list(args.repo)
    if args.all:
        root = env.get("GIT_PROJECT_ROOT")
        if not root or not s.cluster:
            print("aspen replica sync --all: set GIT_PROJECT_ROOT and ASPEN_CLUSTER", file=sys.stderr)
            return 2
        assert s.refstore_url is not None       # replica_mode(s) above
        try:
            known = registry.database_stores(s.refstore_url)
        except (refstore.db.Error, refstore.db.Busy) as e:      # type: ignore[misc]
            print(f"aspen replica sync: {e}", file=sys.stderr)
            return 1
        paths += [os.path.join(root, r[len(s.cluster) + 1:]) for r, _, _ in known if r.startswith(s.cluster + ":")]
    if not paths:
        print("aspen replica sync: name a repository, or --all", file=sys.stderr)
        return 2
    failed = 0
    for path in paths:
        path = os.path.abspath(path)
        served = Repository.of(path, dict(env, GIT_DIR=path))
        made = not os.path.exists(os.path.join(path, "HEAD")) and registry.materialize(path, served)
        if not os.path.isfile(os.path.join(path, "HEAD")):
            print(f"aspen replica sync: {path}: not a repository here, and the log knows none there",
                  file=sys.stderr)
            failed += 1
            continue
        store = refstore.RefStore.open(served)
        if store is None:
            print(f"aspen replica sync: {path}: its store cannot be opened", file=sys.stderr)
            failed += 1
            continue
        bar = Bar(f"sync {os.path.basename(path)}", enabled=not args.quiet)
        try:
            before, after = store.catch_up(lambda done, total: bar.update(done, total, "versions' packs"))
        except (OSError, refstore.db.Error, refstore.db.Busy) as e:     # type: ignore[misc]
            bar.finish()
            print(f"aspen replica sync: {path}: {e}", file=sys.stderr)
            failed += 1
            continue
        bar.finish()
        print(f"{path}: {'made, ' if made else ''}version {before} -> {after}")
    return 1 if failed else 0
