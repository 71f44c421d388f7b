"""A clone's server side without its client side: the protocol v2 fetch
`git clone -q --mirror` (2.39) sends, the whole answer read, every pack it
names by packfile URI downloaded, as git would, but nothing indexed. What a
storm of N clones costs a server, without N index-packs on the bench's own
cores (100 of git.git would be hours of client CPU on 2 cores). Used by
bench/offload_clone.py (`--raw`) and the `offload-storm` workload."""

from __future__ import annotations

import time
import urllib.request
from dataclasses import dataclass
from typing import Optional

from aspen_cgi.protocol.pktline import DELIM, FLUSH, encode


def fetch_body(wants: list[str], uri_protocols: Optional[str]) -> bytes:
    """Every ref value wanted, no progress; `packfile-uris URI_PROTOCOLS` when given."""
    fmt = "sha256" if wants and len(wants[0]) == 64 else "sha1"
    caps = ["command=fetch\n", "agent=git/2.39.5\n", f"object-format={fmt}\n"]
    args = ["thin-pack\n", "no-progress\n", "ofs-delta\n"] + [f"want {w}\n" for w in wants]
    if uri_protocols:
        args.append(f"packfile-uris {uri_protocols}\n")
    args.append("done\n")
    return b"".join(encode(x) for x in caps) + DELIM + b"".join(encode(x) for x in args) + FLUSH


def _read_all(resp) -> tuple[int, bytes]:
    """The response's length, and its first 64 KiB (where a packfile-uris section is)."""
    head = resp.read(65536)
    n = len(head)
    while True:
        chunk = resp.read(1 << 20)
        if not chunk:
            return n, head
        n += len(chunk)


def uris(head: bytes) -> list[str]:
    """The URIs of a fetch answer's packfile-uris section (none: all inline)."""
    out, pos, inside = [], 0, False
    while pos + 4 <= len(head):
        n = int(head[pos:pos + 4], 16)
        if n < 4:
            if inside:
                return out
            pos += 4
            continue
        line = head[pos + 4:pos + n].rstrip(b"\n")
        pos += n
        if line == b"packfile-uris":
            inside = True
        elif inside:
            out.append(line.split(b" ", 1)[1].decode())
        elif line == b"packfile":
            return out
    return out


@dataclass(frozen=True)
class RawClone:
    answer_bytes: int       # the upload-pack answer
    static_bytes: int       # the packs it named, downloaded
    wall_s: float


def clone(repo_url: str, body: bytes, timeout: float = 3600) -> RawClone:
    t = time.perf_counter()
    req = urllib.request.Request(f"{repo_url}/git-upload-pack", data=body, headers={
        "Content-Type": "application/x-git-upload-pack-request", "Git-Protocol": "version=2",
        "Accept": "application/x-git-upload-pack-result"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        answer, head = _read_all(resp)
    static = 0
    for uri in uris(head):
        with urllib.request.urlopen(uri, timeout=timeout) as resp:
            static += _read_all(resp)[0]
    return RawClone(answer, static, time.perf_counter() - t)
