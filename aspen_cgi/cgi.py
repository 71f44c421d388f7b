"""`aspen-cgi`: the CGI program. It starts once per request under Apache, so it
imports only the request pipeline and writes stock's exact header block."""

from __future__ import annotations

import os
import sys
import time


def main() -> int:
    started = time.monotonic()
    from .accesslog import Counted, enabled, write_messages
    from .http.backend import handle
    from .http.message import Request

    env = dict(os.environ)
    resp = handle(Request(env, sys.stdin.buffer, None))
    write_messages(sys.stderr, resp.log)
    out = sys.stdout.buffer
    head = "".join(f"{k}: {v}\r\n" for k, v in resp.headers) + "\r\n"
    body = Counted(resp.body, sys.stderr, env.get("REQUEST_METHOD", "-"), env.get("PATH_INFO", ""),
                   resp.status, resp.trace, started, enabled(env), resp.late)
    try:
        out.write(head.encode("utf-8", "surrogateescape"))
        for chunk in body:
            out.write(chunk)
            out.flush()
        out.flush()
    except BrokenPipeError:
        pass
    finally:
        body.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
