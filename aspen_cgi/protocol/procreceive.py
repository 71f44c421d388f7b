"""The proc-receive hook's protocol as git 2.39's receive-pack speaks it
(run_proc_receive_hook(), read_proc_receive_report()): which commands
`receive.procReceiveRefs` hands to the hook, the version negotiation, the
commands and push options written to it, and its report (`ok`/`ng` per ref,
`option refname|old-oid|new-oid|forced-update|fall-through`) read into
typed results with stock's error messages. Pure: no processes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence

from ..model.objectid import is_null
from .pktline import FLUSH, encode

_HEX = set("0123456789abcdef")


# -- receive.procReceiveRefs ------------------------------------------------------------------

@dataclass(frozen=True)
class RefPattern:
    """One receive.procReceiveRefs value: `[<modifiers>:]<prefix>`, the
    modifiers `a` (create), `d` (delete), `m` (modify) and `!` (negate)."""
    prefix: str
    add: bool = True
    delete: bool = True
    modify: bool = True
    negative: bool = False

    @classmethod
    def parse(cls, value: str) -> "RefPattern":
        mods, colon, rest = value.partition(":")
        if not colon:
            return cls(value.rstrip("/"))
        return cls(rest.rstrip("/"), "a" in mods, "d" in mods, "m" in mods, "!" in mods)


def patterns(values: Iterable[Optional[str]]) -> tuple[RefPattern, ...]:
    """The patterns of receive.procReceiveRefs in configuration order
    (value-less entries left out: pushpolicy refuses the push for them)."""
    return tuple(RefPattern.parse(v) for v in values if v is not None)


def matches(pats: Sequence[RefPattern], old: str, new: str, ref: str) -> bool:
    """proc_receive_ref_matches(): the first pattern whose modifiers admit
    the command decides; a negative one matches the refs outside its prefix."""
    for p in pats:
        if not p.add and is_null(old):
            continue
        if not p.delete and is_null(new):
            continue
        if not p.modify and not is_null(old) and not is_null(new):
            continue
        inside = ref.startswith(p.prefix) and (len(ref) == len(p.prefix) or ref[len(p.prefix)] == "/")
        if inside != p.negative:
            return True
    return False


# -- what receive-pack writes -------------------------------------------------------------------

def version_request(atomic: bool, push_options: bool) -> bytes:
    caps = " ".join(c for c, on in (("atomic", atomic), ("push-options", push_options)) if on)
    line = b"version=1\0" + caps.encode() + b"\n" if caps else b"version=1\n"
    return encode(line) + FLUSH


def commands_request(commands: Iterable[tuple[str, str, str]]) -> bytes:
    """`old new ref` per command, no newline (as stock writes them), then a flush."""
    return b"".join(encode(f"{o} {n} {r}".encode("utf-8", "surrogateescape")) for o, n, r in commands) + FLUSH


def options_request(options: Iterable[str]) -> bytes:
    return b"".join(encode(o.encode("utf-8", "surrogateescape")) for o in options) + FLUSH


# -- what the hook answers ----------------------------------------------------------------------

def _c_line(payload: bytes) -> str:
    """A packet as receive-pack's C string sees it: one trailing newline
    chomped, cut at the first NUL."""
    if payload.endswith(b"\n"):
        payload = payload[:-1]
    return payload.partition(b"\0")[0].decode("utf-8", "surrogateescape")


def _atoi(text: str) -> int:
    """C's atoi() on a 64-bit system: leading blanks, a sign, digits; the
    long it reads cut to an int."""
    s = text.lstrip(" \t\n\v\f\r")
    sign = -1 if s.startswith("-") else 1
    if s.startswith(("+", "-")):
        s = s[1:]
    digits = ""
    for ch in s:
        if not ch.isdigit() or not ch.isascii():
            break
        digits += ch
    value = min(int(digits or "0"), 2 ** 63 - 1) * sign
    value = max(value, -2 ** 63) & 0xFFFFFFFF
    return value - 2 ** 32 if value >= 2 ** 31 else value


@dataclass(frozen=True)
class VersionAnswer:
    version: int
    push_options: bool      # the hook asked for the push options


def parse_version(lines: Iterable[bytes]) -> VersionAnswer:
    """The hook's answer up to its flush: the last `version=N` wins; any of
    them may carry `push-options` after a NUL."""
    version, opts = 0, False
    for payload in lines:
        body = payload[:-1] if payload.endswith(b"\n") else payload
        if len(body) > 8 and body.startswith(b"version="):
            text, nul, features = body.partition(b"\0")
            version = _atoi(text[8:].decode("latin-1"))
            if nul and "push-options" in features.partition(b"\0")[0].decode("utf-8", "replace").split():
                opts = True
    return VersionAnswer(version, opts)


@dataclass(frozen=True)
class RefReport:
    """One `ok` of the hook with options: what the ref really became (each
    field None where the hook did not say)."""
    ref_name: Optional[str] = None
    old_oid: Optional[str] = None
    new_oid: Optional[str] = None
    forced_update: bool = False


@dataclass(frozen=True)
class CommandOutcome:
    """A command after the hook's report. HANDLED: the hook took it (it was
    sent and did not fall through); RETURNED: the hook reported on it."""
    handled: bool
    returned: bool
    error: Optional[str]
    reports: tuple[RefReport, ...] = ()


@dataclass(frozen=True)
class Report:
    ok: bool                                # no protocol error, no `ng`, every handled ref reported
    message: str                            # stock's errmsg (lines, the last newline dropped), "" when none
    commands: tuple[CommandOutcome, ...]    # one per push command, in order


@dataclass
class _Command:
    ref: str
    handled: bool
    returned: bool = False
    error: Optional[str] = None
    reports: list[dict[str, Any]] = field(default_factory=list)


def _oid(value: Optional[str], hexsz: int) -> Optional[str]:
    """parse_oid_hex(): HEXSZ hex digits at the start (what follows is not looked at)."""
    if value is None or len(value) < hexsz or not set(value[:hexsz].lower()) <= _HEX:
        return None
    return value[:hexsz].lower()


def parse_report(lines: Iterable[bytes], eof_first: bool, refs: Sequence[str],
                 sent: Sequence[bool], hexsz: int = 40) -> Report:
    """read_proc_receive_report(): LINES are the hook's packets up to its
    flush (or the end of its output); EOF_FIRST says its output ended before
    any of them. REFS are all the push's commands, SENT which of them the
    hook was given."""
    cmds = [_Command(r, s) for r, s in zip(refs, sent)]
    if eof_first:
        return Report(False, "proc-receive exited abnormally", tuple(_outcome(c) for c in cmds))
    errors: list[str] = []
    ok = True
    option_error_once = False
    hint: Optional[int] = None
    report: Optional[dict[str, Any]] = None
    new_report = False
    for payload in lines:
        line = _c_line(payload)
        head, space, rest = line.partition(" ")
        if not space:
            errors.append(f"proc-receive reported incomplete status line: '{head}'\n")
            ok = False
            continue
        if head == "option":
            if hint is None or not (report is not None or new_report):
                if not option_error_once:
                    errors.append("proc-receive reported 'option' without a matching 'ok/ng' directive\n")
                    option_error_once = True
                ok = False
                continue
            if new_report:
                report = {}
                cmds[hint].reports.append(report)
                new_report = False
            assert report is not None       # a report is under way (checked above)
            key, has_val, val = rest.partition(" ")
            value = val if has_val else None
            if key == "refname":
                report["ref_name"] = value
            elif key == "old-oid" and _oid(value, hexsz) is not None:
                report["old_oid"] = _oid(value, hexsz)
            elif key == "new-oid" and _oid(value, hexsz) is not None:
                report["new_oid"] = _oid(value, hexsz)
            elif key == "forced-update":
                report["forced_update"] = True
            elif key == "fall-through":
                cmds[hint].handled = False
                cmds[hint].returned = False
            continue
        report, new_report = None, False
        refname, has_msg, msg = rest.partition(" ")
        if head not in ("ok", "ng"):
            errors.append(f"proc-receive reported bad status '{head}' on ref '{refname}'\n")
            ok = False
            continue
        found = None
        if hint is not None:
            found = next((i for i in range(hint, len(cmds)) if cmds[i].ref == refname), None)
        if found is None:
            found = next((i for i, c in enumerate(cmds) if c.ref == refname), None)
        hint = found
        if found is None:
            errors.append(f"proc-receive reported status on unknown ref: {refname}\n")
            ok = False
            continue
        c = cmds[found]
        if not c.handled:
            errors.append(f"proc-receive reported status on unexpected ref: {refname}\n")
            ok = False
            continue
        c.returned = True
        if head == "ng":
            c.error = msg if has_msg else "failed"
            ok = False
            continue
        new_report = True
    for c in cmds:
        if c.handled and c.error is None and not c.returned:
            c.error = "proc-receive failed to report status"
            ok = False
    message = "".join(errors)
    return Report(ok, message[:-1] if message.endswith("\n") else message, tuple(_outcome(c) for c in cmds))


def _outcome(c: _Command) -> CommandOutcome:
    return CommandOutcome(c.handled, c.returned, c.error, tuple(RefReport(**r) for r in c.reports))
