"""Response cache entries on local disk: one file per complete framed
response body, written once by a producer while any number of followers
read it as it grows (woken by the producer when it runs in their process;
cache.responses has followers in other processes wait_end() instead).

A file is a 40-byte header then the body, byte for byte as it goes to the
client (so a complete entry is served with sendfile from offset 40). While
it is written it is `NAME.part`, and its producer holds an exclusive flock
on it: a follower at the end of the bytes written so far waits while the
lock is held. The producer ends by writing the header (length, CRC-32,
outcome, ref-store version); a kept entry is then renamed to NAME, an answer not worth keeping
(git said no) is unlinked once written, so followers already on it still
read it to the end. A `.part` whose producer died holds no lock and no
header: followers see it abandoned, and the next request removes it.

A depth-1 clone's entry says in its outcome field (bits 8-15) which answer
it holds: git's own (`stock`, while the wide one is built beside it), the
wide pack (`wide`), or git's kept for good (`stock-kept`: the wide one was
not smaller). A `Replacement` writes the wide answer to a locked temporary
file and renames it over the entry: requests that opened the old file read
it to its end; the new file is a new inode (and a new creation time in its
header), so its CRC-32 is checked again.

Bits 16-17 of the outcome field say what made the answer: the planner
from stored packs (`planned`), git (`git`), or git because the versions'
packs were not built yet (`git-unbuilt`): such an entry is dropped, and the
answer computed again, by the first request that finds the packs built
(cache/responses.py), and so is a `planned` entry made before the import's
pack was built again wide: the cache never serves a worse answer than the
one now possible.

Single-flight: `.part` appears only through link(2) of a file already
locked, so at most one producer per name exists at a time, across
processes, and a visible `.part` is always either locked or finished.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

MAGIC = b"ASPENC1\n"
HEADER = struct.Struct(">8sQIIQQ")   # magic, body length, crc32, outcome, created (ns), ref-store version
HEADER_SIZE = HEADER.size                  # 40
KEPT, DISCARDED = 1, 2                     # outcomes: an entry for later requests, or only for its followers
# what a depth-1 clone's entry holds (outcome bits 8-15); 0: not a depth-1 clone's
DEPTH1_STOCK, DEPTH1_WIDE, DEPTH1_STOCK_KEPT = 1, 2, 3
DEPTH1_LABELS = {DEPTH1_STOCK: "stock", DEPTH1_WIDE: "wide", DEPTH1_STOCK_KEPT: "stock-kept"}
# what made the answer (outcome bits 16-17); 0: not said (an entry older than the mark)
PLANNED, GIT, GIT_UNBUILT = 1, 2, 3
KIND_LABELS = {PLANNED: "planned", GIT: "git", GIT_UNBUILT: "git-unbuilt"}
_OUTCOME_AT = 20                           # the outcome field's offset in the header
CHUNK = 65536
SUFFIX = ".entry"


class Abandoned(Exception):
    """The producer stopped before the end (it died, its computation failed,
    or the disk filled). SENT bytes had already reached this follower's client."""

    def __init__(self, sent: int):
        super().__init__(f"cache entry abandoned after {sent} bytes")
        self.sent = sent


@dataclass(frozen=True)
class Header:
    length: int
    crc: int
    outcome: int
    version: int = 0
    depth1: int = 0         # DEPTH1_* or 0
    created: int = 0        # ns
    kind: int = 0           # PLANNED, GIT, GIT_UNBUILT or 0

    @classmethod
    def read(cls, fd: int) -> Optional["Header"]:
        raw = os.pread(fd, HEADER_SIZE, 0)
        if len(raw) < HEADER_SIZE:
            return None
        magic, length, crc, field, created, version = HEADER.unpack(raw)
        outcome, depth1, kind = field & 0xFF, field >> 8 & 0xFF, field >> 16
        if (magic != MAGIC or outcome not in (KEPT, DISCARDED) or depth1 not in (0, *DEPTH1_LABELS)
                or kind not in (0, *KIND_LABELS)):
            return None
        return cls(length, crc, outcome, version, depth1, created, kind)


def _header(length: int, crc: int, outcome: int, version: int, depth1: int, kind: int = 0) -> bytes:
    return HEADER.pack(MAGIC, length, crc, outcome | depth1 << 8 | kind << 16, time.time_ns(), version)


class _Progress:
    """What an in-process producer has written, so followers in the same
    process wake on new bytes instead of polling. When the disk refuses a
    write, the rest of the body is kept here (`spill`, from body offset
    `spill_at`) for the followers of this process, and the entry is dropped."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.written = 0
        self.ended = False
        self.spill_at: Optional[int] = None
        self.spill: list[bytes] = []
        self.error: Optional[BaseException] = None      # why the computation stopped, if it raised
        self.asked_again = False    # a second request of this process followed the computation

    def advance(self, n: int, ended: bool = False) -> None:
        with self.cond:
            self.written += n
            self.ended = self.ended or ended
            self.cond.notify_all()


_local: dict[str, _Progress] = {}
_local_lock = threading.Lock()


def _lock_held(fd: int) -> bool:
    """Does another open file (the producer's) hold the flock of FD's file?"""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


class Producer:
    """The one writer of an entry. write() raises OSError when the disk
    refuses (the caller abandons); finish() publishes the entry."""

    def __init__(self, directory: str, name: str, fd: int, tmp: str, version: int = 0, depth1: int = 0):
        self.version = version
        self.depth1 = depth1
        self.directory = directory
        self.name = name
        self.fd = fd
        self.part = os.path.join(directory, name + ".part")
        self._tmp = tmp
        self.length = 0
        self.crc = 0
        self.closed = False
        self.progress = _Progress()
        self.make_room: Optional[Callable[[int], bool]] = None   # asked once when the disk is full
        with _local_lock:
            _local[self.part] = self.progress

    @classmethod
    def begin(cls, directory: str, name: str, version: int = 0, depth1: int = 0) -> Optional["Producer"]:
        """The producer of NAME, or None when another one has it (or had it and
        finished). DEPTH1: what the entry will hold (DEPTH1_STOCK, or 0)."""
        tmp = os.path.join(directory, f".{name}.{os.getpid()}.{threading.get_ident()}.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.pwrite(fd, b"\0" * HEADER_SIZE, 0)
            try:
                os.link(tmp, os.path.join(directory, name + ".part"))
            except FileExistsError:
                os.close(fd)
                fd = -1
                return None
            return cls(directory, name, fd, tmp, version, depth1)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            raise
        finally:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def write(self, data: bytes) -> None:
        """Append DATA. A full disk never fails the write: MAKE_ROOM is asked
        once, then the rest goes to memory (see spill)."""
        if self.progress.spill_at is not None:
            with self.progress.cond:
                self.progress.spill.append(bytes(data))
            self.progress.advance(len(data))
            return
        view = memoryview(data)
        while view:
            try:
                n = os.pwrite(self.fd, view, HEADER_SIZE + self.length)
            except OSError as e:
                if not no_space(e):
                    raise
                room, self.make_room = self.make_room, None
                if room is not None and room(len(view)):
                    continue
                self.spill(bytes(view))
                return
            self.crc = zlib.crc32(view[:n], self.crc)
            self.length += n
            view = view[n:]
            self.progress.advance(n)

    def spill(self, rest: bytes) -> None:
        """The disk is full: drop the entry (no new follower joins it) and keep
        this and every later chunk in memory for the followers of this process;
        followers elsewhere see the entry abandoned at the end."""
        p = self.progress
        with p.cond:
            if p.spill_at is None:
                p.spill_at = self.length
                _unlink_quiet(self.part)
        self.write(rest)

    @property
    def spilled(self) -> bool:
        return self.progress.spill_at is not None

    def finish(self, keep: bool, kind: int = 0) -> bool:
        """Write the header (KIND: what made the answer); publish a kept entry
        as NAME, unlink the rest. Git's depth-1 answer is not published over
        a wide one already there (a pre-warm that ended first). True when
        published."""
        if self.spilled:
            self._close()
            return False
        dest = os.path.join(self.directory, self.name + SUFFIX)
        if keep and self.depth1 == DEPTH1_STOCK and depth1_of(dest) in (DEPTH1_WIDE, DEPTH1_STOCK_KEPT):
            keep = False
        outcome = KEPT if keep else DISCARDED
        try:
            os.pwrite(self.fd, _header(self.length, self.crc, outcome, self.version, self.depth1, kind), 0)
        except OSError:
            self.abandon()
            raise
        try:
            if keep:
                os.rename(self.part, dest)
            else:
                os.unlink(self.part)
        except OSError:
            _unlink_quiet(self.part)
            keep = False
        self._close()
        return keep

    def abandon(self) -> None:
        """Stop without a header: followers see the entry abandoned."""
        _unlink_quiet(self.part)
        self._close()

    def _close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with _local_lock:
            if _local.get(self.part) is self.progress:
                del _local[self.part]
        os.close(self.fd)            # releases the flock: followers look at the header
        self.progress.advance(0, ended=True)


def _unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class Follower:
    """Reads an entry being written (or written) from offset 40 to its end."""

    def __init__(self, fd: int, part: str, progress: Optional[_Progress]):
        self.fd = fd
        self.part = part
        self.progress = progress
        self.sent = 0
        self.closed = False

    @classmethod
    def open(cls, directory: str, name: str) -> Optional["Follower"]:
        """Follow NAME's `.part`, or None when there is none (or it was a dead
        producer's, now removed)."""
        part = os.path.join(directory, name + ".part")
        with _local_lock:
            progress = _local.get(part)
        try:
            fd = os.open(part, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        if not _lock_held(fd) and Header.read(fd) is None:
            # a producer that died: nobody will finish it
            try:
                if os.stat(part).st_ino == os.fstat(fd).st_ino:
                    os.unlink(part)
            except OSError:
                pass
            os.close(fd)
            return None
        return cls(fd, part, progress)

    def __iter__(self) -> Iterator[bytes]:
        pos = HEADER_SIZE
        pause = 0.001
        try:
            while True:
                chunk = os.pread(self.fd, CHUNK, pos)
                if not chunk and self.progress is not None and self.progress.spill_at is not None:
                    chunk = self._from_spill(pos - HEADER_SIZE)
                if chunk:
                    pos += len(chunk)
                    self.sent += len(chunk)
                    pause = 0.001
                    yield chunk
                    continue
                if self.progress is not None and self.progress.spill_at is not None:
                    if self.progress.ended:
                        return
                    self._wait(pos, pause)
                    continue
                if _lock_held(self.fd):
                    self._wait(pos, pause)
                    pause = min(pause * 2, 0.02)
                    continue
                header = Header.read(self.fd)
                if header is None:
                    raise Abandoned(self.sent)
                if pos - HEADER_SIZE >= header.length:
                    return
                # the producer finished after our last read: read on
        finally:
            self.close()

    def wait_end(self) -> None:
        """Wait until the producer (of another process) has let go."""
        pause = 0.002
        while _lock_held(self.fd):
            time.sleep(pause)
            pause = min(pause * 1.5, 0.02)

    def _from_spill(self, offset: int) -> bytes:
        p = self.progress
        assert p is not None and p.spill_at is not None     # the caller's condition
        with p.cond:
            at = p.spill_at
            for piece in p.spill:
                if offset < at + len(piece):
                    return piece[max(0, offset - at):]
                at += len(piece)
        return b""

    def _wait(self, pos: int, pause: float) -> None:
        p = self.progress
        if p is None:
            time.sleep(pause)
            return
        with p.cond:
            p.cond.wait_for(lambda: p.written + HEADER_SIZE > pos or p.ended, timeout=0.05)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self.fd)


class EntryFile:
    """A complete, verified entry opened for sending: a real file (sendfile
    works on it) positioned at the body; `length` bytes follow."""

    def __init__(self, file, length: int, path: str, depth1: int = 0, kind: int = 0, ino: int = 0,
                 created: int = 0):
        self.file = file
        self.length = length
        self.path = path
        self.depth1 = depth1
        self.kind = kind
        self.ino = ino
        self.created = created      # ns


_verified: dict[tuple, bool] = {}
_verified_lock = threading.Lock()


def open_complete(directory: str, name: str) -> Optional[EntryFile]:
    """NAME's complete entry, checked (magic, length, CRC-32 once per file
    per process), or None. A corrupt or truncated entry is removed."""
    path = os.path.join(directory, name + SUFFIX)
    try:
        f = open(path, "rb", buffering=0)
    except FileNotFoundError:
        return None
    except OSError:
        return None
    try:
        st = os.fstat(f.fileno())
        header = Header.read(f.fileno())
        # the file's identity and its header's: a replacement (renamed over the
        # entry) or a re-marked header is checked again, even on a reused inode
        ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
                 header and (header.crc, header.created, header.depth1))
        ok = header is not None and header.outcome == KEPT and st.st_size == HEADER_SIZE + header.length
        if ok and header is not None:
            with _verified_lock:
                known = _verified.get(ident)
            if not known:
                ok = _crc_of(f.fileno(), header.length) == header.crc
                if ok:
                    with _verified_lock:
                        if len(_verified) > 4096:
                            _verified.clear()
                        _verified[ident] = True
        if not ok:
            f.close()
            remove_if_same(path, st.st_ino)
            return None
        f.seek(HEADER_SIZE)
        assert header is not None                   # ok
        return EntryFile(f, header.length, path, header.depth1, header.kind, st.st_ino, header.created)
    except OSError:
        f.close()
        return None


def _crc_of(fd: int, length: int) -> int:
    crc, pos = 0, HEADER_SIZE
    end = HEADER_SIZE + length
    while pos < end:
        chunk = os.pread(fd, min(1 << 20, end - pos), pos)
        if not chunk:
            return -1
        crc = zlib.crc32(chunk, crc)
        pos += len(chunk)
    return crc


def remove_if_same(path: str, ino: int) -> None:
    try:
        if os.stat(path).st_ino == ino:
            os.unlink(path)
    except OSError:
        pass


def touch(path: str) -> None:
    """Mark an entry used now: LRU order is by access time, set here (the
    modification time stays: it identifies the verified file)."""
    try:
        st = os.stat(path)
        os.utime(path, ns=(time.time_ns(), st.st_mtime_ns))
    except OSError:
        pass


def peek(path: str) -> Optional[Header]:
    """The header of the complete entry at PATH (not checked further), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        header = Header.read(fd)
        return header if header is not None and header.outcome == KEPT else None
    except OSError:
        return None
    finally:
        os.close(fd)


def depth1_of(path: str) -> Optional[int]:
    """What the complete entry at PATH holds (DEPTH1_* or 0), or None when there is none."""
    header = peek(path)
    return None if header is None else header.depth1


def mark_stock_kept(path: str) -> bool:
    """Re-mark the stock depth-1 entry at PATH as kept for good (its wide
    answer was not smaller): one byte of its header, in place."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        header = Header.read(fd)
        if header is None or header.outcome != KEPT or header.depth1 != DEPTH1_STOCK:
            return False
        os.pwrite(fd, struct.pack(">I", KEPT | DEPTH1_STOCK_KEPT << 8 | header.kind << 16), _OUTCOME_AT)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


class Replacement:
    """A complete entry written beside NAME, then renamed over it (or made
    NAME): a temporary file flocked while written (sweep_parts leaves it be),
    unlinked when abandoned."""

    def __init__(self, directory: str, name: str, version: int):
        self.path = os.path.join(directory, name + SUFFIX)
        self.tmp = os.path.join(directory, f".{name}.wide.{os.getpid()}.{threading.get_ident()}.tmp")
        self.version = version
        self.fd = os.open(self.tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        self.length = 0
        self.crc = 0
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            os.pwrite(self.fd, b"\0" * HEADER_SIZE, 0)
        except BaseException:
            self.abandon()
            raise

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(self.fd, view, HEADER_SIZE + self.length)
            self.crc = zlib.crc32(view[:n], self.crc)
            self.length += n
            view = view[n:]

    def publish(self, depth1: int) -> None:
        """The header, then the rename over NAME (atomic: a reader opens the old
        file or the new one, never a mix)."""
        try:
            os.pwrite(self.fd, _header(self.length, self.crc, KEPT, self.version, depth1), 0)
            os.rename(self.tmp, self.path)
        except BaseException:
            self.abandon()
            raise
        self._close()

    def abandon(self) -> None:
        _unlink_quiet(self.tmp)
        self._close()

    def _close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def no_space(e: OSError) -> bool:
    return e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
