"""Serving one upload-pack response through the cache: a complete entry is a
hit (sent as a file: sendfile under gunicorn and mod_wsgi); an entry being
written is shared: followed as it grows by requests of the producer's
process, sent once complete to those of other processes; otherwise this request starts the
computation (cold) in a producer thread that outlives its client, and
follows it like every other request. Whatever goes wrong with the cache
(full disk, corrupt entry, a producer that died before the first byte) the
request computes its answer itself (uncached): never an error for the
client; a cache it cannot write says so in the server's log.

An interim answer (git's own for a depth-1 clone, see fetch/depth1.py) is
marked so in its entry; INTERIM() is called by the second request that
asks for it (a hit that finds it still interim, or a request that followed
its computation, once it is published), and again by later hits while it
stays interim (it starts the better answer's build in the background, at
most one at a time). Not by the first: an answer asked for once would have
its wider build for nobody (a storm of one-off depth-1 fetches spent 3.5x
stock's server CPU on them)."""

from __future__ import annotations

import errno
import os
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Optional, Union

from .. import settings as aspen_settings
from . import entries, evict, stats
from .entries import Abandoned, EntryFile, Follower, Producer
from .key import CacheKey

DEFAULT_MAX = aspen_settings.default("ASPEN_CACHE_MAX_BYTES")
DEFAULT_RESERVE = aspen_settings.default("ASPEN_CACHE_RESERVE_BYTES")


@dataclass(frozen=True)
class Settings:
    directory: str
    max_bytes: int          # entries on disk, all repositories of the directory
    reserve_bytes: int      # free disk space below which no entry is started
    repo: Optional[str] = None   # the repository the directory is inside (made one level at a time while it
                                 # has HEAD: never a deleted repository's); None: a directory of its own


def settings(state_dir: str, s: aspen_settings.Settings) -> Optional[Settings]:
    """The cache of a repository whose state lives in STATE_DIR, or None when
    turned off (ASPEN_CACHE=off). ASPEN_CACHE_DIR shares one directory (and
    one bound, ASPEN_CACHE_MAX_BYTES, default 1 GiB) between repositories."""
    if not s.cache:
        return None
    shared = s.cache_dir
    directory = shared or os.path.join(state_dir, "cache")
    outside = shared or s.state_dir
    return Settings(directory, s.cache_max_bytes, s.cache_reserve_bytes,
                    None if outside else os.path.dirname(state_dir.rstrip("/")))


def make_dir(s: Settings) -> None:
    """The cache directory: one of its own (ASPEN_CACHE_DIR, or under
    ASPEN_STATE_DIR) as a whole; one inside the repository one level at a
    time, only while the repository has HEAD, never its directory itself: a
    background pre-warmer of a repository deleted meanwhile re-creates
    nothing of it (FileNotFoundError)."""
    if os.path.isdir(s.directory):
        return
    if s.repo is None:
        os.makedirs(s.directory, exist_ok=True)     # FileExistsError where a file stands in its place
        return
    repo = s.repo.rstrip("/") or "/"
    if not os.path.isfile(os.path.join(repo, "HEAD")):
        raise FileNotFoundError(f"no repository at {repo}")
    missing = []
    d = s.directory.rstrip("/")
    while d != repo and len(d) > len(repo) and not os.path.isdir(d):
        missing.append(d)
        d = os.path.dirname(d)
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            if not os.path.isdir(d):
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), d) from None


@dataclass
class Answer:
    mark: str                               # hit | shared | cold | uncached
    body: Union[Iterable[bytes], EntryFile]


Compute = Callable[[], Iterable[bytes]]


def _room(s: Settings) -> bool:
    try:
        st = os.statvfs(s.directory)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize >= s.reserve_bytes


def _make_room(s: Settings, need: int) -> bool:
    items = evict.entries(s.directory)
    total = sum(e.size for e in items)
    removed, freed = evict.evict(s.directory, max(0, total - max(need, 8 << 20)))
    if removed:
        stats.record(s.directory, "evicted", freed)
    return removed > 0


@dataclass(frozen=True)
class Judge:
    """What the request says of its answers: KIND() after the computation,
    what made it (entries.PLANNED, GIT, GIT_UNBUILT, or 0), kept in the
    entry; BETTER(), asked of a `git-unbuilt` entry, whether the packs it
    lacked are built now; STALE(created ns), asked of a `planned` entry,
    whether a better stored pack was made since (the import's, widened).
    Then the entry is dropped and the answer computed again, and
    SUPERSEDED() is called."""
    kind: Callable[[], int]
    better: Callable[[], bool]
    superseded: Callable[[], None] = lambda: None
    stale: Callable[[int], bool] = lambda created: False


def answer(s: Settings, key: CacheKey, compute: Compute, log: list,
           interim: Optional[Callable[[], object]] = None, judge: Optional[Judge] = None) -> Answer:
    try:
        make_dir(s)
    except FileNotFoundError:
        return _uncached(s, compute)        # the repository is going (a pre-warmer's)
    except OSError as e:
        log.append(_unwritable(s, e))
        return _uncached(s, compute)
    name = key.name
    for _ in range(3):
        hit = _complete(s, name, "hit", interim, judge)
        if hit is not None:
            return hit
        follower = Follower.open(s.directory, name)
        if follower is not None and follower.progress is not None:
            follower.progress.asked_again = True
            return Answer("shared", _followed(s, follower, "shared", compute, log))
        if follower is not None:
            # another process computes it: wait for the end, then it is a hit (or
            # abandoned: compute). Following its bytes here could be cut short
            # by a full disk there, which this process could not make good.
            follower.wait_end()
            follower.close()
            # the answer this request waited for, as the producer's own followers get it: never
            # superseded by packs built meanwhile (that computed it again, a second git run)
            hit = _complete(s, name, "shared", interim)
            if hit is not None:
                return hit
            continue
        if not _room(s):
            break
        try:
            producer = Producer.begin(s.directory, name, key.version,
                                      entries.DEPTH1_STOCK if interim is not None else 0)
        except OSError as e:
            log.append(_unwritable(s, e))
            break
        if producer is None:
            continue            # another request began it (or finished it) just now: look again
        try:
            fd = os.open(producer.part, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            producer.abandon()
            break
        producer.make_room = lambda need: _make_room(s, need)
        follower = Follower(fd, producer.part, producer.progress)
        threading.Thread(target=_produce, args=(s, producer, compute, interim, judge),
                         name="aspen-cache-producer").start()
        return Answer("cold", _followed(s, follower, "cold", compute, log))
    return _uncached(s, compute)


def _unwritable(s: Settings, error: OSError) -> str:
    """The server log's line for a cache this request could not write: the
    answer is computed uncached, and so is every answer until it is fixed
    (e.g. a directory left by a command run as another user)."""
    return (f"aspen: the response cache {s.directory} cannot be written ({error.__class__.__name__}: "
            f"{error.strerror or error}); answering uncached\n")


def entry_span(hit: EntryFile) -> tuple[str, int, int]:
    """Where the answer in HIT's file lies: path, offset, length."""
    return (hit.path, entries.HEADER_SIZE, hit.length)


def replay_effects(s: Settings, hit: EntryFile) -> list[tuple[str, str, str]]:
    """What a replayed hit (http/replay.py) does beside sending the entry:
    what _complete does, as file operations (count the hit, mark it used)."""
    return [("append", os.path.join(s.directory, stats.LOG), f"hit {int(hit.length)}\n"), ("atime", hit.path, "")]


def _complete(s: Settings, name: str, mark: str, interim: Optional[Callable[[], object]] = None,
              judge: Optional[Judge] = None) -> Optional[Answer]:
    """NAME's complete entry as an answer marked MARK, counted and touched; or
    None. An entry still interim calls INTERIM. A `git-unbuilt` entry whose
    packs JUDGE finds built now, or a `planned` one it finds stale, is
    removed: None."""
    hit = entries.open_complete(s.directory, name)
    if hit is None:
        return None
    if judge is not None and ((hit.kind == entries.GIT_UNBUILT and judge.better())
                              or (hit.kind == entries.PLANNED and judge.stale(hit.created))):
        hit.file.close()
        entries.remove_if_same(hit.path, hit.ino)
        stats.record(s.directory, "superseded", hit.length)
        judge.superseded()
        return None
    entries.touch(hit.path)
    stats.record(s.directory, mark, hit.length)
    if interim is not None and hit.depth1 == entries.DEPTH1_STOCK:
        _call(interim)
    return Answer(mark, hit)


def _call(interim: Callable[[], object]) -> None:
    try:
        interim()
    except Exception:   # noqa: BLE001  (background work that would make later answers better: never an error)
        pass


def _uncached(s: Settings, compute: Compute) -> Answer:
    body = compute()

    def counted() -> Iterator[bytes]:
        n = 0
        for chunk in body:
            n += len(chunk)
            yield chunk
        stats.record(s.directory, "uncached", n)
    return Answer("uncached", _closing(counted(), body))


def _closing(it: Iterator[bytes], inner: object) -> Iterator[bytes]:
    try:
        yield from it
    finally:
        close = getattr(inner, "close", None)
        if close is not None:
            close()


def _followed(s: Settings, follower: Follower, mark: str, compute: Compute, log: list) -> Iterator[bytes]:
    try:
        yield from follower
    except Abandoned as e:
        stats.record(s.directory, "abandoned", e.sent)
        error = follower.progress.error if follower.progress is not None else None
        if e.sent:
            log.append(f"aspen: cache entry abandoned after {e.sent} bytes ({error or 'producer stopped'}); "
                       "response cut short\n")
            return
        if error is not None and getattr(error, "status", None):
            raise error            # an HTTP answer (503 past the queue bound) the computation gave
        body = _uncached(s, compute).body
        assert not isinstance(body, EntryFile)      # _uncached(): the computed answer as it comes
        yield from body
        return
    finally:
        follower.close()
    stats.record(s.directory, mark, follower.sent)


def _produce(s: Settings, producer: Producer, compute: Compute,
             interim: Optional[Callable[[], object]] = None, judge: Optional[Judge] = None) -> None:
    body = None
    published = False
    try:
        body = compute()
        for chunk in body:
            producer.write(chunk)
        returncode = getattr(body, "returncode", 0)
        size = entries.HEADER_SIZE + producer.length
        keep = returncode in (0, None) and not producer.spilled and size <= s.max_bytes
        if keep:       # room first, so the bound holds the moment the entry appears
            removed, freed = evict.evict(s.directory, s.max_bytes, need=size)
            if removed:
                stats.record(s.directory, "evicted", freed)
            evict.sweep_parts(s.directory)
        published = producer.finish(keep, judge.kind() if judge is not None else 0)
    except BaseException as e:   # the thread's end: followers learn of it from the entry
        producer.progress.error = e
        producer.abandon()
    finally:
        close = getattr(body, "close", None)
        if close is not None:
            close()
    if published and interim is not None and producer.progress.asked_again:
        _call(interim)
