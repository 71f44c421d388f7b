"""The cache key of an upload-pack fetch: the repository, its refs (a
digest of the snapshot served: the same whether it came from the ref store
or the disk; the ref-store version rides along for eviction), and the
normalised request (every line as sent, less the client's
agent and session id), with everything else that changes the answer's
bytes: protocol version, namespace, configuration, shallow roots. Never the
user. Configuration that cannot change upload-pack's bytes is left out
(UNUSED_SECTIONS: http-backend's service switches, receive-pack's settings,
identities), so that `aspen import`'s pre-warm, run from a shell without the
server's `http.receivepack`, fills the entries the server reads."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Iterable, Optional

from ..protocol.pktline import ProtocolError, parse

_DROPPED = (b"agent=", b"session-id=")
UNUSED_SECTIONS = frozenset({"http", "receive", "user"})


def answer_config(entries: Iterable[tuple[str, object]]) -> tuple:
    """The configuration entries (lower-cased section first) that may change upload-pack's answer."""
    return tuple(e for e in entries if e[0].partition(".")[0] not in UNUSED_SECTIONS)


@dataclass(frozen=True)
class CacheKey:
    repo: str           # a short digest of the repository's real path
    version: int        # ref-store version (0 without a store), kept in the entry for eviction
    digest: str         # refs, settings and request

    @property
    def name(self) -> str:
        """The entry's file name: repository and digest."""
        return f"{self.repo}-{self.digest}"


def repo_tag(gitdir: str) -> str:
    return hashlib.sha256(os.path.realpath(gitdir).encode("utf-8", "surrogateescape")).hexdigest()[:12]


def normalised(body: bytes) -> bytes:
    """The request's pkt-lines without agent= and session-id= (as lines in
    v2, as capability words on v0's first want); flushes and delimiters kept."""
    out = []
    try:
        for pkt, _ in parse(body):
            if not isinstance(pkt, bytes):
                out.append(b"\0" + str(pkt).encode())
                continue
            words = [w for w in pkt.rstrip(b"\n").split(b" ") if not w.startswith(_DROPPED)]
            if words:
                out.append(b" ".join(words))
    except ProtocolError:
        return body
    return b"\n".join(out)


def fetch_key(gitdir: str, version: int, refs_digest: str, protocol: int, namespace: Optional[str],
              config_entries: Iterable, shallow: Iterable[str], extra: Iterable[str], body: bytes) -> CacheKey:
    h = hashlib.sha256()
    for part in (os.path.realpath(gitdir), str(protocol), namespace or "", refs_digest or "",
                 repr(answer_config(config_entries)), ",".join(shallow), ",".join(extra)):
        h.update(part.encode("utf-8", "surrogateescape") + b"\0")
    h.update(normalised(body))
    return CacheKey(repo_tag(gitdir), version, h.hexdigest()[:40])
