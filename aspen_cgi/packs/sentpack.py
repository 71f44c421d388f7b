"""The pack a push's client sent, kept beside the version packs
(packs/sent-<push id>.pack) so that its version's build can adopt it
instead of building one (versionpack.adopt). Written as the push streams
in, renamed into place once a ref update of the push landed, removed
otherwise; never larger than versionpack.ADOPT_MAX (a larger one is dropped
as soon as it grows past it: its version is built by pack-objects)."""

from __future__ import annotations

import os
from typing import IO, Optional

from .versionpack import ADOPT_MAX


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

    def keep(self) -> None:
        """The push landed: the pack goes where its version's build looks."""
        if self.f is None:
            return
        try:
            self.f.close()
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
