"""Running the proc-receive hook for a push (stock's run_proc_receive_hook()):
the conversation on the hook's stdin and stdout in a thread of its own,
while the hook's stderr is relayed as it comes; the outcome per command.

Where stock dies (the hook writes something that is not a pkt-line: the
push then gets no report at all), the malformed packet ends the hook's
output where it stands, its error is reported with the others, and the
push goes on as after any failed hook."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import IO, Generator, Mapping, Optional, Sequence, Union

from ..git import gitexec
from ..git.hooks import Hooks
from ..protocol import procreceive as proto
from ..protocol.pktline import MAX_PKT

HOOK = "proc-receive"


@dataclass(frozen=True)
class Outcome:
    """run_proc_receive_hook()'s result: OK when it returned 0; MESSAGE what
    it says with rp_error ("" for nothing); one CommandOutcome per command."""
    ok: bool
    message: str
    commands: tuple[proto.CommandOutcome, ...]


@dataclass(frozen=True)
class Request:
    """What the hook is given: every command of the push (old, new, ref), which
    of them are its own, and what the client negotiated."""
    commands: tuple[tuple[str, str, str], ...]
    handled: tuple[bool, ...]
    atomic: bool
    use_push_options: bool
    push_options: tuple[str, ...]


class _Malformed(Exception):
    """A packet receive-pack's reader would die on (its message, without `fatal: `)."""


_Packet = Union[bytes, str]     # a payload, or "flush", "delim", "response-end", "eof"


def _read_exact(stream: IO[bytes], n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = stream.read(n - len(out))
        if not chunk:
            break
        out += chunk
    return out


def _read_packet(stream: IO[bytes]) -> _Packet:
    """packet_read() with PACKET_READ_GENTLE_ON_EOF: an output cut short is its end."""
    head = _read_exact(stream, 4)
    if len(head) < 4:
        return "eof"
    try:
        if not all(c in b"0123456789abcdefABCDEF" for c in head):
            raise ValueError
        size = int(head, 16)
    except ValueError:
        raise _Malformed(f"protocol error: bad line length character: {head.decode('latin-1')}") from None
    if size < 4:
        if size == 3:
            raise _Malformed("protocol error: bad line length 3")
        return ("flush", "delim", "response-end")[size]
    if size > MAX_PKT:
        raise _Malformed(f"protocol error: bad line length {size}")
    data = _read_exact(stream, size - 4)
    return data if len(data) == size - 4 else "eof"


@dataclass
class _Section:
    lines: list[bytes]
    eof: bool = False
    malformed: Optional[str] = None


def _section(stream: IO[bytes]) -> _Section:
    """The hook's packets up to its flush (or delim, response end, end of output)."""
    sec = _Section([])
    while True:
        try:
            pkt = _read_packet(stream)
        except _Malformed as e:
            sec.malformed = str(e)
            return sec
        if isinstance(pkt, bytes):
            sec.lines.append(pkt)
            continue
        sec.eof = pkt == "eof"
        return sec


class _Conversation:
    """The protocol on the hook's stdin and stdout; outcome() once it is over."""

    def __init__(self, proc, req: Request):
        self.proc = proc
        self.req = req
        self.ok = False
        self.errors: list[str] = []
        self.report: Optional[proto.Report] = None

    def _write(self, data: bytes) -> bool:
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
            return True
        except (OSError, ValueError):
            return False

    def run(self) -> None:
        try:
            self._talk()
        finally:
            for f in (self.proc.stdin, self.proc.stdout):
                try:
                    f.close()
                except OSError:
                    pass

    def _talk(self) -> None:
        req = self.req
        version = None
        if self._write(proto.version_request(req.atomic, req.use_push_options)):
            sec = _section(self.proc.stdout)
            if sec.malformed:
                self.errors.append(sec.malformed + "\n")
            elif not sec.eof:
                version = proto.parse_version(sec.lines)
        if version is None:
            self.errors.append("fail to negotiate version with proc-receive hook")
            return
        if version.version not in (0, 1):
            self.errors.append(f"proc-receive version '{version.version}' is not supported")
            return
        sent = [c for c, mine in zip(req.commands, req.handled) if mine]
        # one write: a hook that dies after the commands finds the options already in its pipe,
        # as it nearly always does with stock's two quick writes
        data = proto.commands_request(sent)
        if version.push_options:
            data += proto.options_request(req.push_options)
        if not self._write(data):
            self.errors.append("fail to write commands to proc-receive hook")
            return
        sec = _section(self.proc.stdout)
        if sec.malformed:
            self.errors.append(sec.malformed + "\n")
        refs = [r for _, _, r in req.commands]
        self.report = proto.parse_report(sec.lines, (sec.eof or bool(sec.malformed)) and not sec.lines,
                                         refs, req.handled, len(req.commands[0][0]) if req.commands else 40)
        if self.report.message:
            self.errors.append(self.report.message)
        self.ok = self.report.ok and not sec.malformed

    def outcome(self, exit_ok: bool) -> Outcome:
        if self.report is not None:
            commands = self.report.commands
        else:
            commands = tuple(proto.CommandOutcome(h, False, None) for h in self.req.handled)
        message = "".join(self.errors)
        return Outcome(self.ok and exit_ok, message[:-1] if message.endswith("\n") else message, commands)


def run(hooks: Hooks, gitdir: str, env: Mapping[str, str], req: Request, idle: float = 0,
        log: Optional[list] = None) -> Generator[Optional[bytes], None, Outcome]:
    """Run the hook on REQ: yield its stderr as it comes (None after IDLE
    seconds of silence), return the Outcome once it has exited."""
    path = hooks.find(HOOK)
    if path is None:
        return Outcome(False, f"cannot find hook '{HOOK}'",
                       tuple(proto.CommandOutcome(h, False, None) for h in req.handled))
    try:
        proc = gitexec.hook_conversation(path, cwd=gitdir, env=gitexec.child_env(env))
    except OSError as e:
        return Outcome(False, f"cannot run {HOOK}: {e}",
                       tuple(proto.CommandOutcome(h, False, None) for h in req.handled))
    assert proc.stderr is not None                      # a PIPE (gitexec.hook_conversation)
    talk = _Conversation(proc, req)
    thread = threading.Thread(target=talk.run, daemon=True)
    thread.start()
    done = False
    try:
        yield from gitexec.read_idle(proc.stderr, idle)
        while thread.is_alive():
            thread.join(idle if idle > 0 else None)
            if thread.is_alive():
                yield None
        rc = proc.wait()
        done = True
    finally:
        if not done:
            gitexec.kill(proc)
            proc.wait()
            thread.join(timeout=5)
        proc.stderr.close()
    if rc < 0 and log is not None:
        log.append(f"error: {path} died of signal {-rc}\n")
    return talk.outcome(rc == 0)


def handled_by_hook(patterns: Sequence[proto.RefPattern], commands: Sequence[tuple[str, str, str]],
                    eligible: Sequence[bool]) -> tuple[bool, ...]:
    """Which commands the hook takes: those still to be processed that a
    receive.procReceiveRefs pattern matches."""
    return tuple(ok and proto.matches(patterns, o, n, r) for (o, n, r), ok in zip(commands, eligible))
