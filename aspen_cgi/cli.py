"""`aspen`: the operator's command line (`aspen dev` today; import, log,
compact, verify and stats arrive with the ref store)."""

from __future__ import annotations

import argparse
import sys

from . import __version__


def _cmd_dev(args: argparse.Namespace) -> int:
    from .devserver import serve
    return serve(args.dir, args.host, args.port, args.workers, allow_push=not args.no_push)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aspen", description="Aspen: a drop-in replacement for git http-backend.")
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
    dev.set_defaults(func=_cmd_dev)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
