"""Upload-pack requests, v0/v1 and v2, parsed into typed objects.

The planner reads a FetchRequest; a request Aspen does not answer goes to
git as it came.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional, Union

from .pktline import DELIM_PKT, FLUSH_PKT, Packet, ProtocolError, Special, parse, strip_lf

_OID = re.compile(r"\A[0-9a-f]{40}\Z|\A[0-9a-f]{64}\Z")


def _oid(value: str, what: str) -> str:
    if not _OID.match(value):
        raise ProtocolError(f"expected to get object ID in '{what}', not '{value[:80]}'")
    return value


@dataclass
class FetchRequest:
    version: int                                   # 0 (also 1) or 2
    wants: list[str] = field(default_factory=list)
    want_refs: list[str] = field(default_factory=list)
    haves: list[str] = field(default_factory=list)
    done: bool = False
    capabilities: list[str] = field(default_factory=list)   # v0: on the first want; v2: command args like thin-pack
    shallow: list[str] = field(default_factory=list)
    deepen: Optional[int] = None
    deepen_since: Optional[int] = None
    deepen_not: list[str] = field(default_factory=list)
    deepen_relative: bool = False
    filter: Optional[str] = None
    wait_for_done: bool = False
    packfile_uris: Optional[str] = None
    sideband_all: bool = False
    server_options: list[str] = field(default_factory=list)
    agent: Optional[str] = None
    rounds: int = 0                    # v0: have rounds ended by a flush or `done`, +1 for bytes after the last
    later_capabilities: bool = False   # v0: a want after the first carried capabilities (stock reads them too)

    def has_capability(self, name: str) -> bool:
        return any(c == name or c.startswith(name + "=") for c in self.capabilities)

    @property
    def needs_fallback_reason(self) -> Optional[str]:
        """Why this request cannot be answered from stored packs (for the planner's trace)."""
        if self.shallow or self.deepen is not None or self.deepen_since is not None or self.deepen_not:
            return "shallow"
        if self.filter is not None:
            return "filter"
        return None


@dataclass
class LsRefsRequest:
    peel: bool = False
    symrefs: bool = False
    unborn: bool = False
    prefixes: list[str] = field(default_factory=list)
    agent: Optional[str] = None
    server_options: list[str] = field(default_factory=list)


@dataclass
class OtherCommand:
    """A v2 command without a typed request: object-info (passed to git as it
    came), bundle-uri (Aspen's answer where it advertises it, else git's)."""
    name: str


V2Request = Union[FetchRequest, LsRefsRequest, OtherCommand, None]


def _int(value: str, what: str) -> int:
    if not re.fullmatch(r"-?[0-9]+", value):
        raise ProtocolError(f"invalid {what} '{value[:40]}'")
    # past any C integer git parses into, and past the digits int() converts: out of range
    digits = value.lstrip("-").lstrip("0") or "0"
    n = (int(digits) if len(digits) <= 20 else 1 << 64) * (-1 if value[0] == "-" else 1)
    if what == "deepen" and (n <= 0 or n >= 1 << 31):
        raise ProtocolError(f"invalid deepen: {value}")
    return n


def _shallow_arg(req: FetchRequest, line: str) -> bool:
    """The shallow/deepen/filter lines both protocol versions share."""
    if line.startswith("shallow "):
        req.shallow.append(_oid(line[8:], "shallow"))
    elif line.startswith("deepen "):
        req.deepen = _int(line[7:], "deepen")
    elif line.startswith("deepen-since "):
        req.deepen_since = _int(line[13:], "deepen-since")
    elif line.startswith("deepen-not "):
        req.deepen_not.append(line[11:])
    elif line == "deepen-relative":
        req.deepen_relative = True
    elif line.startswith("filter "):
        req.filter = line[7:]
    else:
        return False
    return True


def _text(pkt: bytes) -> str:
    return strip_lf(pkt).decode("utf-8", "surrogateescape")


def parse_v0(data: bytes) -> FetchRequest:
    """want lines (capabilities on the first), shallow/deepen/filter, flush,
    then have lines in flush-separated rounds, optionally `done`. A stateless
    request is one round: stock reads no further than its first flush or
    `done`, so `rounds` tells a responder whether it saw what stock would,
    and bytes after the first round are never an error (git gets them as
    they came, and stock ignores them)."""
    req = FetchRequest(version=0)
    open_round = False
    packets = parse(data)
    for pkt, _ in packets:
        if pkt is FLUSH_PKT:
            if not req.wants:
                return req              # upload-pack ends here: what follows is never read
            break
        if isinstance(pkt, Special):
            raise ProtocolError(f"unexpected {pkt.kind} packet in want list")
        _want_section_line(req, _text(pkt))
    else:
        if req.wants:
            raise ProtocolError("git upload-pack: request ended inside the want list")
        return req
    try:
        for pkt, _ in packets:
            open_round = _have_section_packet(req, pkt)
    except ProtocolError:
        if not req.rounds:
            raise
        open_round = True
    req.rounds += open_round
    return req


def _have_section_packet(req: FetchRequest, pkt: Packet) -> bool:
    """Read one packet after the want list; True while a round is open."""
    if pkt is FLUSH_PKT:
        req.rounds += 1
        return False
    if isinstance(pkt, Special):
        raise ProtocolError(f"unexpected {pkt.kind} packet in have list")
    line = _text(pkt)
    if line.startswith("have "):
        req.haves.append(_oid(line[5:].split(" ")[0], "have"))
        return True
    if line == "done":
        req.done = True
        req.rounds += 1
        return False
    raise ProtocolError(f"git upload-pack: expected SHA1 list, got '{line[:80]}'")


def _want_section_line(req: FetchRequest, line: str) -> None:
    if line.startswith("want "):
        oid, _, caps = line[5:].partition(" ")
        req.wants.append(_oid(oid, "want"))
        if caps and len(req.wants) == 1:
            req.capabilities = caps.split()
            req.agent = next((c[6:] for c in req.capabilities if c.startswith("agent=")), None)
        elif caps:
            req.later_capabilities = True
    elif not _shallow_arg(req, line):
        raise ProtocolError(f"git upload-pack: protocol error, expected to get object ID, not '{line[:80]}'")


_FETCH_FLAGS = {"thin-pack", "no-progress", "include-tag", "ofs-delta"}


# git 2.39's serve.c: a capability line naming anything else makes upload-pack die ("unknown capability")
V2_CAPABILITIES = frozenset(("agent", "ls-refs", "fetch", "server-option", "object-format", "session-id",
                             "object-info"))


def parse_v2(data: bytes) -> V2Request:
    """One v2 command: `command=X`, capability lines, delim, arguments, flush.
    None for a request that is no command: empty, or a flush first (serve's
    loop ends there; what follows is never read)."""
    parsed = parse(data)
    first = next(parsed, None)
    if first is None or first[0] is FLUSH_PKT:
        return None
    packets: list[Packet] = [first[0]] + [p for p, _ in parsed]
    command = None
    caps: list[str] = []
    i = 0
    while i < len(packets) and packets[i] not in (DELIM_PKT, FLUSH_PKT):
        pkt = packets[i]
        if isinstance(pkt, Special):
            raise ProtocolError(f"unexpected {pkt.kind} packet in command")
        line = _text(pkt)
        if line.startswith("command="):
            if command is not None:
                raise ProtocolError("command supplied twice")
            command = line[8:]
        elif line.split("=", 1)[0] in V2_CAPABILITIES:
            caps.append(line)
        else:
            raise ProtocolError(f"unknown capability '{line[:80]}'")
        i += 1
    if command is None:
        raise ProtocolError("no command requested")
    if i >= len(packets):
        raise ProtocolError("request ended without a flush")
    args: list[str] = []
    if packets[i] is DELIM_PKT:
        i += 1
        while i < len(packets) and packets[i] is not FLUSH_PKT:
            pkt = packets[i]
            if isinstance(pkt, Special):
                raise ProtocolError(f"unexpected {pkt.kind} packet in arguments")
            args.append(_text(pkt))
            i += 1
        if i >= len(packets):
            raise ProtocolError("request ended without a flush")
    agent = next((c[6:] for c in caps if c.startswith("agent=")), None)
    options = [c[len("server-option="):] for c in caps if c.startswith("server-option=")]
    if command == "ls-refs":
        ls = LsRefsRequest(agent=agent, server_options=options)
        for arg in args:
            if arg == "peel":
                ls.peel = True
            elif arg == "symrefs":
                ls.symrefs = True
            elif arg == "unborn":
                ls.unborn = True
            elif arg.startswith("ref-prefix "):
                ls.prefixes.append(arg[11:])
            else:
                raise ProtocolError(f"unexpected line: '{arg[:80]}'")
        return ls
    if command == "fetch":
        req = FetchRequest(version=2, agent=agent, server_options=options)
        for arg in args:
            if arg.startswith("want "):
                req.wants.append(_oid(arg[5:], "want"))
            elif arg.startswith("want-ref "):
                req.want_refs.append(arg[9:])
            elif arg.startswith("have "):
                req.haves.append(_oid(arg[5:], "have"))
            elif arg == "done":
                req.done = True
            elif arg in _FETCH_FLAGS:
                req.capabilities.append(arg)
            elif arg == "wait-for-done":
                req.wait_for_done = True
            elif arg == "sideband-all":
                req.sideband_all = True
            elif arg.startswith("packfile-uris "):
                req.packfile_uris = arg[14:]
            elif not _shallow_arg(req, arg):
                raise ProtocolError(f"unexpected line: '{arg[:80]}'")
        return req
    if command == "object-info":
        return OtherCommand(command)
    if command == "bundle-uri":
        if args:        # git 2.40's bundle_uri_command() dies on any argument
            raise ProtocolError(f"bundle-uri: unexpected argument: '{args[0][:80]}'")
        return OtherCommand(command)
    raise ProtocolError(f"invalid command '{command[:80]}'")
