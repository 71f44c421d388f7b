"""`aspen`: the operator's command line. `dev` serves repositories; `log`,
`verify`, `compact`, `import` and `query` read and maintain a repository's
ref store and version packs; `stats` reports the response cache, and with
`--server` the server's metrics (metrics.py). Each command reads the
server's settings (settings.py) from its environment, and exits 2 when one
cannot be parsed."""

from __future__ import annotations

import argparse
import os
import sys

from .. import __version__
from .. import settings as aspen_settings
from .cluster import cmd_db, cmd_replica
from .history import RECORDED, cmd_compact, cmd_log, cmd_query, cmd_restore, cmd_undo, cmd_verify
from .imports import cmd_import
from .server import cmd_dev, cmd_doctor, cmd_install_cgi, cmd_resident, cmd_stats


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aspen", description="Aspen: a drop-in replacement for git http-backend.",
        epilog="A repository's past, for any git client: git clone http://HOST/REPO.git@V (a version from "
               "`aspen log`) or REPO.git@2026-11-30T12:00Z; over protocol v2 also --server-option=aspen-version=V "
               "or aspen-at=T. Read-only. A bundle of it: GET http://HOST/REPO.git/aspen/bundle[@V] "
               "(git clone --bundle-uri=...). See docs/time-travel.md.")
    parser.add_argument("--version", action="version", version=f"aspen {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    dev = sub.add_parser("dev", help="serve every repository under DIR on localhost (embedded defaults)",
                         description="Serve every bare repository under DIR over smart and dumb HTTP on localhost. "
                                     "An empty or missing DIR gets a small demo repository. Pushes are allowed "
                                     "anonymously (http.receivepack=true is implied) unless --no-push is given.")
    dev.add_argument("dir", nargs="?", default="./repos", help="directory of repositories (default: ./repos)")
    dev.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    dev.add_argument("--port", type=int, default=8080, help="port (default: 8080; 0 picks a free one)")
    dev.add_argument("--workers", type=int, default=2, help="gunicorn worker processes (default: 2)")
    dev.add_argument("--no-push", action="store_true", help="refuse pushes, as stock does without REMOTE_USER")
    dev.set_defaults(func=cmd_dev)

    log = sub.add_parser("log", help="versions of a repository's refs, newest first",
                         description="List the ref store's versions newest first: id, kind (import, push, "
                                     "external), who, when, and each ref update (old..new, ff when a fast-forward); "
                                     "with --json also each version's place in the hash chain.")
    log.add_argument("repo", help="path of the repository")
    log.add_argument("-n", "--limit", type=int, default=None, help="show at most N versions")
    log.add_argument("--json", action="store_true", help="one JSON object per version per line")
    log.add_argument("--all-updates", action="store_true", help="do not abbreviate versions with many updates")
    log.add_argument("--export", metavar="FILE", help="write every chained version (hash, previous hash, canonical "
                                                      "text) as JSON lines to FILE (- for stdout), for an auditor "
                                                      "(docs/ref-store.md)")
    log.set_defaults(func=cmd_log)

    verify = sub.add_parser("verify", help="check the ref store against the refs on disk and the objects",
                            description="Check the ref store's own consistency (SQLite integrity, versions replay "
                                        "to the current refs, nothing pending), that it equals the refs on disk, "
                                        "and that every ref's objects are present and connected, and the hash "
                                        "chain over the versions. Exit 0 only when everything is consistent.")
    verify.add_argument("repo", help="path of the repository")
    verify.add_argument("--chain", action="store_true", help="check only the hash chain over the versions, end to "
                                                             "end, and name the first broken link")
    verify.add_argument("--json", action="store_true", help="print the result as JSON")
    verify.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    verify.set_defaults(func=cmd_verify)

    undo = sub.add_parser("undo", help="one new version putting back every ref a version changed",
                          description="Make one new version that sets every ref version V changed back to its value "
                                      "before V (a ref V created is deleted). Refused, with the refs named, when one "
                                      "of them moved since V, unless --force. Objects git gc pruned are put back from "
                                      "the version packs first; post-receive and post-update run as for a push.")
    undo.add_argument("repo", help="path of the repository")
    undo.add_argument("version", type=int, help="the version to undo (`aspen log` lists them)")
    undo.add_argument("--force", action="store_true", help="put the refs back even where they moved since")
    undo.add_argument("--json", action="store_true", help="print the result as JSON")
    undo.set_defaults(func=cmd_undo)

    restore = sub.add_parser("restore", help="one new version bringing one ref back to its value at a version or time",
                             description="Make one new version that sets REF to its value at version V, or at the "
                                         "latest version committed by time T (ISO 8601, e.g. 2026-11-30T12:00Z): a "
                                         "deleted branch comes back. Objects git gc pruned are put back from the "
                                         "version packs first; post-receive and post-update run as for a push.")
    restore.add_argument("repo", help="path of the repository")
    restore.add_argument("ref", help="the full ref name, e.g. refs/heads/topic")
    restore.add_argument("--at", required=True, metavar="V|T", help="a version number or a time")
    restore.add_argument("--json", action="store_true", help="print the result as JSON")
    restore.set_defaults(func=cmd_restore)

    compact = sub.add_parser("compact", help="build missing history segments and checkpoint the store",
                             description="Build every segment the geometric schedule calls for (pushes do this as "
                                         "they land; this catches up after external changes or crashes), then "
                                         "checkpoint the SQLite write-ahead log.")
    compact.add_argument("repo", help="path of the repository")
    compact.add_argument("--json", action="store_true", help="print the result as JSON")
    compact.set_defaults(func=cmd_compact)

    imp = sub.add_parser("import", help="record a repository (or every one under a directory) and build its packs",
                         description="Bring the ref store up to the refs on disk (recording the repository as "
                                     "version 1 on first use), then build every version pack not built yet: the "
                                     "import version's pack holds the whole repository, each later version's is "
                                     "the thin pack of what it introduced. Then compact: build the segment packs "
                                     "(runs of versions 2..N on a binary schedule) a full clone is spliced from, "
                                     "and remove those a larger one replaced. Packs are built once with a wide "
                                     "delta search, so this can take minutes on a large repository. When a "
                                     "builder is already running for the repository (one a push started), this "
                                     "waits for it (saying its pid), then builds whatever is still missing; exit "
                                     "0 once everything is built. Every build holds one of the machine's "
                                     "ASPEN_BUILDS_PER_SERVER build slots (default half the cores). With --all, "
                                     "REPO is a directory: every repository under it (bare, or a work tree's "
                                     ".git, found as GIT_PROJECT_ROOT serves them; other directories are "
                                     "skipped) is imported in turn, with a progress bar over the repositories. "
                                     "Interrupted (even by kill -9), run it again: what is built is skipped and "
                                     "the rest is built.")
    imp.add_argument("repo", metavar="REPO", help="path of the repository (with --all: a directory of repositories)")
    imp.add_argument("--all", action="store_true",
                     help="import every repository under the directory REPO, skipping what is built")
    imp.add_argument("--window", type=int, default=250, help="delta search window (default 250)")
    imp.add_argument("--depth", type=int, default=50, help="maximum delta chain depth (default 50)")
    imp.add_argument("--compression", type=int, default=9, help="zlib level 0-9 (default 9)")
    imp.add_argument("--threads", type=int, default=0,
                     help="pack-objects threads (default: git's, one per core, as background builds)")
    imp.add_argument("--reuse-deltas", action="store_true",
                     help="reuse the deltas of the repository's packs instead of searching every object afresh")
    imp.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    imp.add_argument("--no-wait", dest="no_wait", action="store_true",
                     help="exit at once (0) when another builder is running, leaving the packs to it")
    imp.add_argument("--wait-lock", dest="no_wait", action="store_true", help=argparse.SUPPRESS)   # the old name
    imp.add_argument("--background", action="store_true",
                     help="what a push starts under CGI: niceness 10, the idle scheduling class, exit at once "
                          "when another builder runs, and stop quietly, leaving nothing, if the repository "
                          "is deleted or replaced")
    imp.set_defaults(func=cmd_import)

    query = sub.add_parser("query", help="ask the ref store a history question (JSON answer with visit counts)",
                           description="`ancestor REPO REF J K`: is REF's value at version J an ancestor of its "
                                       "value at version K (exit 0 yes, 1 not proved)? `tip REPO COMMIT`: which "
                                       "versions made COMMIT a ref's value? Both print the versions and segments "
                                       "visited.")
    query.add_argument("what", choices=("ancestor", "tip"))
    query.add_argument("repo", help="path of the repository")
    query.add_argument("args", nargs="*", help="REF J K for ancestor, COMMIT for tip")
    query.set_defaults(func=cmd_query)

    icgi = sub.add_parser("install-cgi", help="make the installed aspen-cgi start Python directly, without /bin/sh",
                          description="Rewrite the first line of the installed aspen-cgi (pip installs it as a /bin/sh "
                                      "line that execs Python with -I -S) to start the venv's Python directly with the "
                                      "same flags: 0.8 ms less of every CGI request. ./run setup runs it; after a "
                                      "plain `pip install`, run it once as the venv's owner.")
    icgi.add_argument("path", nargs="?", help="the aspen-cgi to rewrite (default: the one beside this Python)")
    icgi.add_argument("--python", help="the interpreter it starts (default: python3 beside it)")
    icgi.add_argument("-q", "--quiet", action="store_true", help="print nothing when it succeeds")
    icgi.set_defaults(func=cmd_install_cgi)

    res = sub.add_parser("resident", help="show or stop the resident process aspen-cgi hands requests to",
                         description="Under CGI, aspen-cgi hands each request no recorded answer serves to a "
                                     "resident Aspen process of the same user, started on first need, which keeps "
                                     "the pipeline imported and forks workers (ASPEN_CGI_RESIDENT, "
                                     "ASPEN_CGI_RESIDENT_IDLE, ASPEN_CGI_RESIDENT_WORKERS). This shows it: its "
                                     "socket in ASPEN_RUN_DIR (run this with the server's setting), pid and "
                                     "workers; --stop ends it (workers finish their requests; the next request "
                                     "is answered in-process and starts another).")
    res.add_argument("--stop", action="store_true", help="stop it (SIGTERM) and wait for it to go")
    res.add_argument("--all", action="store_true", help="every resident of this user in the run directory, "
                                                        "other installs' too")
    res.add_argument("--json", action="store_true", help="print them as JSON")
    res.set_defaults(func=cmd_resident)

    dbp = sub.add_parser("db", help="the PostgreSQL database of ref stores (ASPEN_REFSTORE_URL): "
                                    "init, list, migrate, drop",
                         description="init: make the database's list of stores (each repository's store, a "
                                     "schema of its own, is made on its first request); list: every store in "
                                     "it, with the repository it is known by; migrate: move every store to "
                                     "this Aspen's schema now (a cluster with a shared pack store, once every "
                                     "node runs this Aspen; docs/cluster.md, Upgrading); drop: remove the store "
                                     "of the repository --repo names, e.g. before a cluster's repository is "
                                     "replaced by a new one at the same path (docs/cluster.md).")
    dbp.add_argument("action", choices=("init", "list", "migrate", "drop"),
                     help="init: make the list of stores; list: show them; migrate: move them to this "
                          "Aspen's schema; drop: remove one (--repo)")
    dbp.add_argument("--repo", help="drop: the repository the store is known by (as `list` shows it)")
    dbp.add_argument("url", nargs="?", help="the database's postgresql:// URL (default: ASPEN_REFSTORE_URL)")
    dbp.add_argument("--json", action="store_true", help="print the stores as JSON")
    dbp.set_defaults(func=cmd_db)

    rep = sub.add_parser("replica", help="bring this node's repositories to the cluster's log (docs/cluster.md)",
                         description="sync: make each repository the log knows and this node lacks (an empty "
                                     "node, a lost directory), then apply the pack store's packs of every version "
                                     "its copy lacks and set its refs as the log has them, with a progress bar. "
                                     "Needs the server's ASPEN_REFSTORE_URL, ASPEN_PACK_STORE, ASPEN_CLUSTER and "
                                     "GIT_PROJECT_ROOT. A server does the same before each answer; this does it "
                                     "ahead of the first request.")
    rep.add_argument("action", choices=("sync",), help="sync: bring the copies to the log")
    rep.add_argument("repo", nargs="*", help="path of a repository on this node (it need not exist yet)")
    rep.add_argument("--all", action="store_true", help="every repository of ASPEN_CLUSTER in the log")
    rep.add_argument("--quiet", action="store_true", help="no progress bar")
    rep.set_defaults(func=cmd_replica)

    doc = sub.add_parser("doctor", help="check what breaks deployments, and say how to fix each",
                         description="Check, on the server, what breaks Aspen deployments, one line each with how to "
                                     "fix it: the settings and where each came from (the environment, Apache's "
                                     "SetEnv lines); Apache's CGI or WSGI module; PrivateTmp and the run directory; "
                                     "then, as the web server's user (root switches to it): the run directory's "
                                     "admission and build slots and the resident; PostgreSQL and the pack store "
                                     "in a cluster; and for each repository (those named, else every one under "
                                     "GIT_PROJECT_ROOT) that it can be read and pushed to, git's ownership check "
                                     "(safe.directory), that its aspen/ state is writable, the ref store against "
                                     "the refs on disk and the pack backlog. With --url, a smart-HTTP request to "
                                     "the server. Exit 1 when something is wrong (a FAIL line).")
    doc.add_argument("repo", nargs="*", help="repositories to check (default: every one under GIT_PROJECT_ROOT)")
    doc.add_argument("--user", help="the server's user (default: the unit's User=, else APACHE_RUN_USER from "
                                    "Apache's envvars when Apache runs Aspen, else this user)")
    doc.add_argument("--apache-dir", default=os.environ.get("APACHE_CONFDIR") or "/etc/apache2",
                     help="Apache's configuration (default: $APACHE_CONFDIR, else /etc/apache2)")
    doc.add_argument("--unit", action="append",
                     help="the server's systemd unit file, read for its Environment=, User= and PrivateTmp "
                          "(default: apache2.service's when Apache runs Aspen, and "
                          "/etc/systemd/system/aspen-gunicorn.service where it exists; repeatable)")
    doc.add_argument("--url", help="a repository's URL on the server: its info/refs must answer as smart HTTP")
    doc.add_argument("--json", action="store_true", help="print the findings as JSON")
    doc.set_defaults(func=cmd_doctor)

    st = sub.add_parser("stats", help="response cache, admission and server metrics figures",
                        description="For each repository: requests answered through the response cache, the hit "
                                    "rate (hits and shared over all), bytes served from the cache and computed, "
                                    "cold computations, pre-warmed requests, entries and evictions; and for this "
                                    "machine the cold computations running and the admission queue depth "
                                    "(ASPEN_RUN_DIR). Counts are those of every process that served the "
                                    "repository since its cache was made. With --server: the server's metrics, "
                                    "the numbers GET /_aspen/metrics serves when the server runs with "
                                    "ASPEN_METRICS=1, read from the same files (metrics/ under ASPEN_STATE_DIR "
                                    "when set, else under ASPEN_RUN_DIR: run it with the server's setting): "
                                    "requests by service, method and status; fetches by plan (planned or "
                                    "fallback, and why) and by response-cache result (hit, shared, cold, ...); "
                                    "upload-pack bytes from stored packs, computed by git and from the cache; "
                                    "admission's 503s, queued fetches and queue depth; ref-store versions "
                                    "pushed; and the version-pack backlog.")
    st.add_argument("repo", nargs="*", help="path of a repository")
    st.add_argument("--server", action="store_true",
                    help="the server's metrics (what GET /_aspen/metrics serves with ASPEN_METRICS=1): requests, "
                         "plans and fallbacks, cache results, admission, pushes, pack backlog, bytes by source")
    st.add_argument("--json", action="store_true", help="print the figures as JSON")
    st.set_defaults(func=cmd_stats)
    return parser


# commands that read or write a repository's files: run as root, they act as its owner
AS_OWNER = ("log", "verify", "undo", "restore", "compact", "import", "query", "stats", "replica")


def _repo_paths(args: argparse.Namespace) -> list[str]:
    """The command's repository paths, made absolute (acting as the owner may change directory)."""
    if isinstance(args.repo, list):
        args.repo = [os.path.abspath(r) for r in args.repo]
        paths = list(args.repo)
    else:
        args.repo = os.path.abspath(args.repo)
        paths = [args.repo]
    if getattr(args, "export", None) and args.export != "-":
        args.export = os.path.abspath(args.export)
    if args.command == "replica" and args.all and os.environ.get("GIT_PROJECT_ROOT"):
        paths.append(os.environ["GIT_PROJECT_ROOT"])
    return paths


def _act_as_owner(args: argparse.Namespace) -> int:
    """Run as root, become the owner of the repositories named (0), or say why not (1)."""
    if args.command not in AS_OWNER or os.geteuid() != 0:
        return 0
    from ..runtime import runas  # startup
    paths = _repo_paths(args)
    owners = runas.owners_of(paths)
    if all(o.uid == 0 for o in owners):
        return 0
    if len(owners) > 1:
        named = ", ".join(f"{p} ({runas.owner_of(p).name})" for p in paths)
        print(f"aspen {args.command}: the repositories belong to different users: {named}; "
              f"run it once per owner, as that owner", file=sys.stderr)
        return 1
    owner = owners[0]
    existing = [p for p in paths if os.path.exists(p)]
    try:
        runas.become(owner)
    except runas.CannotActAs as e:
        print(f"aspen {args.command}: {paths[0]} belongs to {owner.name} and root cannot act as that user "
              f"here ({e}); run it as the owner: sudo -u {owner.name} aspen {args.command} ...", file=sys.stderr)
        return 1
    print(f"aspen {args.command}: acting as {owner.name}, the owner of {paths[0]}", file=sys.stderr)
    for p in existing:
        if not os.access(p, os.R_OK | os.X_OK):
            print(f"aspen {args.command}: {owner.name} cannot reach {p}: a directory above it is closed to that "
                  f"user (and to a server running as it)", file=sys.stderr)
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from .. import settings  # startup
    try:
        if args.command != "doctor":        # which says what is wrong with them
            aspen_settings.of(os.environ)   # every command reads them: a bad one stops it before it starts
    except settings.SettingsError as e:
        print(e, file=sys.stderr)
        return 2
    if _act_as_owner(args):
        return 1
    rc = args.func(args)
    if args.command == "import" and RECORDED:
        from ..fetch.prewarm import after_import  # startup
        after_import(RECORDED, dict(os.environ))     # their first depth-1 clones, before anyone asks
    return rc
