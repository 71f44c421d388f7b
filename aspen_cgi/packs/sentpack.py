"""The pack a push's client sent, kept beside the version packs
(packs/sent-<push id>.pack) so that its version's build can adopt it
instead of building one (versionpack.adopt). Written as the push streams
in, renamed into place once a ref update of the push landed, removed
otherwise; never larger than versionpack.ADOPT_MAX (a larger one is dropped
as soon as it grows past it: its version is built by pack-objects).

Beside it, for a push of one ref, the listing of its connectivity walk
(sent-<push id>.list): the new commits with their committer times and
parents, and the other new objects with their paths, which saves the build
its own walks."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import IO, Mapping, Optional

from ..model.objectid import OID_PATTERN
from .versionpack import ADOPT_MAX

LISTING_MAGIC = b"aspen-listing 2\n"
_HEX = re.compile(f"^{OID_PATTERN}$".encode())
_TIME = re.compile(rb"^[0-9]+$")


@dataclass(frozen=True)
class Listing:
    """`rev-list --objects --parents --timestamp TIPS --not --all` as a push's
    connectivity check ran it: the commits it found new, each with its
    parents and committer time, and every other object with its path."""
    tips: tuple[str, ...]
    commits: Mapping[str, tuple[str, ...]]
    objects: Mapping[str, str]
    times: Mapping[str, int]

    def encode(self) -> bytes:
        out = [LISTING_MAGIC]
        out += [b"t %s\n" % t.encode() for t in self.tips]
        out += [b"c %d %s\n" % (self.times[c], " ".join((c,) + ps).encode()) for c, ps in self.commits.items()]
        out += [b"o %s %s\n" % (o.encode(), p.encode("utf-8", "surrogateescape")) for o, p in self.objects.items()]
        return b"".join(out)

    @classmethod
    def decode(cls, data: bytes) -> Optional["Listing"]:
        if not data.startswith(LISTING_MAGIC) or not data.endswith(b"\n"):
            return None
        tips, commits, objects, times = [], {}, {}, {}
        for line in data[len(LISTING_MAGIC):-1].split(b"\n"):
            kind, rest = line[:2], line[2:]
            if kind == b"o ":
                oid, space, path = rest.partition(b" ")
                if not _HEX.match(oid) or not space:
                    return None
                objects[oid.decode()] = path.decode("utf-8", "surrogateescape")
                continue
            ids = rest.split(b" ")
            when = b""
            if kind == b"c ":
                when, ids = ids[0], ids[1:]
                if not _TIME.match(when):
                    return None
            if kind not in (b"t ", b"c ") or not ids or not all(_HEX.match(i) for i in ids):
                return None
            if kind == b"t ":
                tips.append(ids[0].decode())
            else:
                commits[ids[0].decode()] = tuple(i.decode() for i in ids[1:])
                times[ids[0].decode()] = int(when)
        return cls(tuple(tips), commits, objects, times)


def listing_path(pack: str) -> str:
    return pack[:-len(".pack")] + ".list"


def read_listing(pack: str) -> Optional[Listing]:
    """The listing kept beside the sent pack PACK, or None."""
    try:
        with open(listing_path(pack), "rb") as f:
            return Listing.decode(f.read())
    except OSError:
        return None


class SentPack:
    def __init__(self, f: IO[bytes], tmp: str, final: str):
        self.f: Optional[IO[bytes]] = f
        self.tmp, self.final = tmp, final
        self.size = 0

    @classmethod
    def start(cls, packs_dir: str, final: str, header: bytes) -> Optional["SentPack"]:
        """Begin keeping a pack whose 12 header bytes are HEADER; None when it cannot be kept."""
        try:
            os.mkdir(packs_dir)          # one level: the store's directory exists
        except FileExistsError:
            pass
        except OSError:
            return None
        tmp = final[:-len(".pack")] + ".tmp"
        try:
            f = open(tmp, "xb")
        except OSError:
            return None
        sent = cls(f, tmp, final)
        sent.write(header)
        return sent

    def write(self, chunk: bytes) -> None:
        if self.f is None:
            return
        self.size += len(chunk)
        if self.size > ADOPT_MAX:
            self.discard()
            return
        try:
            self.f.write(chunk)
        except OSError:
            self.discard()

    def keep(self, listing: Optional[Listing] = None) -> None:
        """The push landed: the pack goes where its version's build looks, with
        its LISTING first when there is one."""
        if self.f is None:
            return
        try:
            self.f.close()
            if listing is not None:
                tmp = self.tmp + "-list"
                with open(tmp, "wb") as f:
                    f.write(listing.encode())
                os.replace(tmp, listing_path(self.final))
            os.replace(self.tmp, self.final)
        except OSError:
            self.discard()
        self.f = None

    def discard(self) -> None:
        if self.f is not None:
            try:
                self.f.close()
            except OSError:
                pass
            self.f = None
            try:
                os.unlink(self.tmp)
            except OSError:
                pass
