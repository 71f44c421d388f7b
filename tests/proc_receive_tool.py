"""A `proc-receive` hook for tests: git's `test-tool proc-receive`
(t/helper/test-proc-receive.c of git 2.39), which t5411 runs as the hook,
in Python. It negotiates the version, reads the commands and push options,
prints what it read to stderr with -v, and answers with the -r lines.
The --die-* options make it fail at each step, as test-tool's do.

    proc_receive_tool.py [-v] [--version N] [--no-push-options]
                         [--die-read-version | --die-write-version | --die-read-commands
                          | --die-read-push-options | --die-write-report] [-r LINE]...

For what test-tool cannot do: --send ITEM (repeated) writes ITEMs in
place of the report, --version-send ITEM in place of the version answer
(the push-option section is then read if the answer claims push-options
as receive-pack parses it, offered or not); an ITEM is `flush`, `delim`,
`raw:BYTES` (written as they are) or a payload framed as one pkt-line,
nothing added (Python escapes in both: `\\x00`, `\\n`). --run CMD
(repeated) runs CMD with sh before the report (its output to stderr): a
hook that updates refs as AGit servers do. --exit N exits with status N
at the end."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys


def die(msg: str) -> None:
    sys.stderr.write(f"fatal: {msg}\n")
    sys.stderr.flush()
    os._exit(128)


def read_exact(n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = os.read(0, n - len(out))
        if not chunk:
            return out
        out += chunk
    return out


def read_pkt():
    """A payload (newline chomped), "flush"/"delim"/"end", or None at end of input."""
    head = read_exact(4)
    if len(head) < 4:
        return None
    size = int(head, 16)
    if size < 4:
        return {0: "flush", 1: "delim", 2: "end"}.get(size, "flush")
    data = read_exact(size - 4)
    if len(data) < size - 4:
        return None
    return data[:-1] if data.endswith(b"\n") else data


def write_pkt(data: bytes) -> None:
    os.write(1, b"%04x" % (len(data) + 4) + data)


def flush() -> None:
    os.write(1, b"0000")


def item_bytes(item: str) -> bytes:
    if item == "flush":
        return b"0000"
    if item == "delim":
        return b"0001"
    raw = item.startswith("raw:")
    data = (item[4:] if raw else item).encode().decode("unicode_escape").encode("latin-1")
    return data if raw else b"%04x" % (len(data) + 4) + data


def send(items: list[str]) -> None:
    for item in items:
        os.write(1, item_bytes(item))


def has_feature(features: bytes, name: bytes) -> bool:
    """connect.c's parse_feature_request(): NAME as a word of the C string FEATURES, alone or NAME=VALUE."""
    features = features.split(b"\0")[0]
    at = features.find(name)
    while at >= 0:
        after = features[at + len(name):at + len(name) + 1]
        if (at == 0 or features[at - 1:at].isspace()) and (after in (b"", b"=") or after.isspace()):
            return True
        at = features.find(name, at + 1)
    return False


def claims_push_options(answer: bytes) -> bool:
    """Whether receive-pack, reading ANSWER as the version negotiation, sets
    hook_use_push_options (builtin/receive-pack.c's run_proc_receive_hook):
    a `version=` line of more than 8 bytes, newline chomped, up to the first
    packet that is not a line, with push-options among the features after its NUL."""
    claimed = False
    while len(answer) >= 4:
        try:
            size = int(answer[:4], 16)
        except ValueError:
            break
        if size < 4 or len(answer) < size:
            break
        line, answer = answer[4:size], answer[size:]
        if line.endswith(b"\n"):
            line = line[:-1]
        if len(line) > 8 and line.startswith(b"version="):
            head = line.split(b"\0")[0]
            if len(head) < len(line) and has_feature(line[len(head) + 1:], b"push-options"):
                claimed = True
    return claimed


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("-V", "--version", type=int, default=1)
    p.add_argument("-r", "--return", dest="returns", action="append", default=[])
    p.add_argument("--no-push-options", action="store_true")
    for step in ("read-version", "write-version", "read-commands", "read-push-options", "write-report"):
        p.add_argument(f"--die-{step}", action="store_true")
    p.add_argument("--send", action="append")
    p.add_argument("--version-send", action="append")
    p.add_argument("--run", action="append", default=[])
    p.add_argument("--exit", type=int, default=0)
    args = p.parse_args(argv)

    use_atomic = use_push_options = False
    if args.die_read_version:
        die("die with the --die-read-version option")
    while True:
        pkt = read_pkt()
        if not isinstance(pkt, bytes):
            break
        if args.version == 0:
            continue
        if len(pkt) > 8 and pkt.startswith(b"version="):
            line, _, features = pkt.partition(b"\0")
            server = int(line[8:].split(b"\0")[0] or b"0")
            if server != 1:
                die(f"bad protocol version: {server}")
            feats = features.decode().split()
            use_atomic = use_atomic or "atomic" in feats
            use_push_options = use_push_options or "push-options" in feats
    if args.die_write_version:
        die("die with the --die-write-version option")
    if args.version_send is not None:
        send(args.version_send)
        # receive-pack sends a push-option section (a flush at least) after the
        # commands whenever the answer claims push-options, offered or not:
        # read it, as a hook claiming them does, or exit while receive-pack may
        # still be writing it (EPIPE there: "fail to write push-options")
        claimed = claims_push_options(b"".join(item_bytes(item) for item in args.version_send))
        return after_version(args, use_atomic, use_push_options, claimed)
    if args.version != 0:
        feature = "push-options" if use_push_options and not args.no_push_options else ""
        write_pkt(f"version={args.version}\0{feature}\n".encode())
    flush()
    return after_version(args, use_atomic, use_push_options, use_push_options and not args.no_push_options)


def after_version(args, use_atomic: bool, use_push_options: bool, read_options: bool) -> int:
    """USE_PUSH_OPTIONS: receive-pack offered them (what -v says);
    READ_OPTIONS: the hook claimed them, so a push-option section follows the commands."""
    commands = []
    while True:
        pkt = read_pkt()
        if not isinstance(pkt, bytes):
            break
        if args.die_read_commands:
            die("die with the --die-read-commands option")
        commands.append(pkt.decode())
    options = []
    if read_options:
        if args.die_read_push_options:
            die("die with the --die-read-push-options option")
        while True:
            pkt = read_pkt()
            if not isinstance(pkt, bytes):
                break
            options.append(pkt.decode())

    if args.verbose:
        err = sys.stderr
        if use_push_options or use_atomic:
            err.write("proc-receive:" + (" atomic" if use_atomic else "") + (" push_options" if use_push_options else "") + "\n")
        for c in commands:
            err.write(f"proc-receive< {c}\n")
        for o in options:
            err.write(f"proc-receive< {o}\n")
        for r in args.returns:
            err.write(f"proc-receive> {r}\n")
        err.flush()
    for cmd in args.run:
        subprocess.run(cmd, shell=True, stdout=2, check=False)
    if args.die_write_report:
        die("die with the --die-write-report option")
    if args.send is not None:
        send(args.send)
    else:
        for r in args.returns:
            write_pkt(f"{r}\n".encode())
        flush()
    return args.exit


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BrokenPipeError:
        os._exit(1)      # receive-pack stopped listening: whether a write still fit in the pipe is timing
