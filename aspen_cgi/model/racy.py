"""The racy window: a file whose modification time is this close to the
moment its contents were read (or later) may have changed within the same
clock tick, so its stat says nothing about its contents. Used by the ref
fingerprint (refstore/fingerprint.py), the CGI program's recorded answers
(http/replay.py) and the poll files (runtime/pollfiles.py). Imports
nothing: it is on the CGI program's replay path."""

RACY_NS = 100_000_000           # file systems with nanosecond timestamps (ext4, xfs, btrfs, tmpfs)
COARSE_RACY_NS = 2_000_000_000  # whole-second timestamps (ext3, small-inode ext4, HFS+, many NFS servers)


def window_ns(mtime_ns: int) -> int:
    """The racy window for a file stamped MTIME_NS: a whole second says the
    file system keeps whole seconds."""
    return COARSE_RACY_NS if mtime_ns % 1_000_000_000 == 0 else RACY_NS


def too_recent(mtime_ns: int, read_ns: int) -> bool:
    """A file stamped MTIME_NS, read at READ_NS: changed after it was read,
    or within the racy window before."""
    return read_ns - mtime_ns <= window_ns(mtime_ns)
