"""The pack store (ASPEN_PACK_STORE, docs/cluster.md): a directory on shared
storage holding write-once packs, one directory per repository (named as
its store's schema), each pack named by its trailer. A file is written
under a temporary name, fsynced, renamed into place and its directory
fsynced, so a name that exists always holds a whole pack. Nothing in it is
ever rewritten; it is never a live git repository.

The interface is the four methods of PackStore (upload, path, has,
names); an object store (S3) would implement the same ones."""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from typing import BinaryIO, Optional

TMP_PREFIX = "tmp-"
_NAME = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?\.pack$")


class PackStoreError(OSError):
    pass


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Upload:
    """One pack being written: write() its bytes as they come, then finish()
    (its name) once the whole pack is known good, or discard()."""

    def __init__(self, directory: str):
        self.directory = directory
        self.tmp = os.path.join(directory, f"{TMP_PREFIX}{uuid.uuid4().hex}")
        self.f: Optional[BinaryIO] = open(self.tmp, "xb")
        self.tail = b""
        self.failed = False

    def write(self, chunk: bytes) -> None:
        if self.f is None or not chunk:
            return
        try:
            self.f.write(chunk)
        except OSError:
            self.failed = True
        self.tail = (self.tail + chunk)[-32:]

    def written(self) -> None:
        """The file was written directly (through self.f): take its tail from it."""
        if self.f is None:
            return
        try:
            self.f.flush()
            with open(self.tmp, "rb") as f:
                f.seek(max(0, os.path.getsize(self.tmp) - 32))
                self.tail = f.read()
        except OSError:
            self.failed = True

    def finish(self, hash_len: int = 20) -> str:
        """Fsync and rename the pack to its trailer's name (HASH_LEN bytes:
        20 for SHA-1, 32 for SHA-256); that name."""
        if self.f is None or self.failed or len(self.tail) < hash_len:
            self.discard()
            raise PackStoreError("the pack could not be written to the pack store")
        f, self.f = self.f, None
        try:
            f.flush()
            os.fsync(f.fileno())
            f.close()
            name = self.tail[-hash_len:].hex() + ".pack"
            final = os.path.join(self.directory, name)
            if os.path.exists(final):
                os.unlink(self.tmp)   # the same bytes, written before
            else:
                os.rename(self.tmp, final)
                fsync_dir(self.directory)
            return name
        except OSError as e:
            self.discard()
            raise PackStoreError(f"the pack could not be written to the pack store: {e}") from e

    def discard(self) -> None:
        f, self.f = self.f, None
        with contextlib.suppress(OSError):
            if f is not None:
                f.close()
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)


class PackStore:
    """One repository's directory in the pack store."""

    def __init__(self, root: str, repo_dir: str):
        self.directory = os.path.join(root, repo_dir)

    def upload(self) -> Upload:
        try:
            os.makedirs(self.directory, exist_ok=True)
            return Upload(self.directory)
        except OSError as e:
            raise PackStoreError(f"the pack store cannot be written: {e}") from e

    def path(self, name: str) -> str:
        if not _NAME.match(name):
            raise PackStoreError(f"not a pack store name: {name!r}")
        return os.path.join(self.directory, name)

    def has(self, name: str) -> bool:
        return os.path.isfile(self.path(name))

    def names(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.directory) if _NAME.match(n))
        except FileNotFoundError:
            return []
