"""The CGI program as Apache runs it: `aspen-cgi` started per request with
the fuzzed CGI environment and the body on stdin (the same inputs as the
pipeline target). A crash is a non-zero exit, a traceback on stderr, an
answer without a header block, an undeliberate 5xx, or a hang."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from typing import Iterator

from .model import Crash, Run, Session, Target
from .pipeline import HttpInput, _inputs, base_env, deliberate_5xx

DEADLINE = 60.0
_STATUS = re.compile(rb"^Status: (\d{3})", re.MULTILINE)


def run_cgi(base: dict, inp: HttpInput) -> str:
    env = inp.env(base)
    if any("\0" in v for v in env.values()):
        return "no CGI environment holds NUL"    # Apache refuses %00 in a path; C strings cannot carry it
    try:
        proc = subprocess.run([sys.executable, "-m", "aspen_cgi.cgi"], env=env, input=inp.body,
                              capture_output=True, timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        raise Crash("hang", f"aspen-cgi did not end within {DEADLINE:.0f}s") from None
    stderr = proc.stderr.decode("utf-8", "replace")
    if proc.returncode != 0:
        raise Crash(f"exit {proc.returncode}", stderr[-4000:])
    if "Traceback" in stderr or "internal error" in stderr:
        raise Crash("traceback on stderr", stderr[-4000:])
    head, sep, body = proc.stdout.partition(b"\r\n\r\n")
    if not sep or not (b"Content-Type:" in head or b"Status:" in head):
        raise Crash("no header block", repr(proc.stdout[:300]))
    if b"Traceback" in body:
        raise Crash("traceback in body", body[-4000:].decode("utf-8", "replace"))
    m = _STATUS.search(head)
    status = int(m.group(1)) if m else 200
    messages = "\n".join(line for line in stderr.splitlines() if not line.startswith("aspen"))
    if status >= 500 and not deliberate_5xx(status, messages):
        raise Crash(f"status {status}", stderr[-4000:])
    return f"{status} {inp.path_info.rsplit('/', 1)[-1][:20]}"


@contextlib.contextmanager
def _open(s: Session) -> Iterator[Run]:
    base = base_env(s)
    base["ASPEN_ACCESS_LOG"] = "0"
    yield lambda inp: run_cgi(base, inp)


TARGETS = [
    Target("cgi", "aspen-cgi as Apache starts it: the pipeline's inputs as environment and stdin",
           lambda s: _inputs(s), _open, slow=True),
]
