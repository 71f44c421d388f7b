"""Building a RefStore's stored packs: the version packs (oldest version
first, the import version's being the whole repository) and the segment
packs the schedule asks for (segmentpack.py), each recorded through the
store; then pruning the runs a larger one replaced and sweeping what crashed
builders left in the packs directory.

The store keeps the data (what is built, what each version changed, the
records); this module builds: it runs git, writes and deletes pack files,
and tells the store what it made. Who calls it, and when: background.py.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Callable, Optional

from ..git.gitexec import child_env
from ..git.reader import object_info
from ..model.versions import is_null
from ..refstore.registry import SENT_PREFIX
from ..refstore.store import RefStore
from . import segmentpack as sp
from . import spanpack
from . import versionpack as vp
from .sentpack import listing_path, read_listing
from .versionpack import BuiltPack, DeltaSearch

Progress = Callable[[int, int, int], None]


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def build_packs(store: RefStore, search: Optional[DeltaSearch] = None, limit: Optional[int] = None,
                progress: Optional[Progress] = None, guard=None, adopt_only: bool = False,
                later: Optional[DeltaSearch] = None) -> list[tuple[int, Optional[BuiltPack]]]:
    """Build STORE's version packs not built yet, oldest version first (the
    import version's is the whole repository); (version, BuiltPack or None
    when it has no new values) of each. A version's pack is its client's
    pack when adopt() takes it, else built with LATER (default SEARCH): in
    the background git's own search, the wide one being compaction's
    (segment packs, widen_import).
    ADOPT_ONLY: stop, recording nothing more, at the first version whose
    pack would need git (no client's pack to adopt, or none adopt() takes,
    or no listing of the push's walk for its boundary).
    PROGRESS(done, total, version). GUARD (repoguard.RepoGuard) stops the
    build when the repository goes."""
    search = search or DeltaSearch()
    later = later or search
    todo = store.unbuilt(limit or (1 << 62))
    if not todo:
        drop_sent_of_built(store)
        return []
    values = store.refs_before(todo[0])
    out: list[tuple[int, Optional[BuiltPack]]] = []
    objects = None
    for n, vid in enumerate(todo):
        if progress:
            progress(n, len(todo), vid)
        ups = store.version_updates(vid)
        tips = [u.new for u in ups if not is_null(u.new)]
        peeled = [u.peeled if u.otype == "tag" and u.peeled else u.new for u in ups
                  if not is_null(u.new) and u.otype in (None, "commit", "tag")]
        if guard is not None:
            guard.check()
        sent = store.sent_pack(vid)
        listing = read_listing(sent) if sent is not None else None
        before = set(values.values())
        b = vp.boundary_listed(listing, tips, peeled, before)
        if b is None and adopt_only and tips:
            break
        if b is None:
            listing = None
            try:
                b = vp.boundary_of(store.repo, tips, peeled, sorted(before), search, guard)
            except vp.BuildError:
                # `git gc` pruned a value the refs had before (a deleted or rewound branch): what
                # only it reached is gone, so this version's pack is made against the values left
                before = _present(store, before)
                b = vp.boundary_of(store.repo, tips, peeled, sorted(before), search, guard)
        how = later
        built = None
        if tips and sent is not None:
            objects = objects or vp.RepoObjects(store.repo)
            built = vp.adopt(tips, b, sent, store.packs_dir, objects, guard,
                             listing.objects if listing is not None else None)
            how = vp.CLIENT_DELTAS if built else how
        if tips and built is None:
            if adopt_only:
                break
            built = vp.build(store.repo, tips, b.commits, store.packs_dir, how, guard)
        if sent is not None:
            _unlink(sent)
            _unlink(listing_path(sent))
        store.record_version_pack(vid, built, b, how)
        out.append((vid, built))
        for u in ups:
            if is_null(u.new):
                values.pop(u.ref, None)
            else:
                values[u.ref] = u.new
    if progress:
        progress(len(todo), len(todo), todo[-1])
    drop_sent_of_built(store)
    return out


def drop_sent_of_built(store: RefStore) -> list[str]:
    """Remove the packs pushes kept for versions that have their packs. A
    push keeps its client's pack just after its versions land, so a build
    running then can look before it is there and make the pack with git;
    whichever of the two comes second (this after the build, or after the
    push's keep) removes it. The paths removed."""
    try:
        names = os.listdir(store.packs_dir)
    except OSError:
        return []
    out = []
    for n in names:
        if n.startswith(SENT_PREFIX) and n.endswith(".pack") and store.push_built(n[len(SENT_PREFIX):-len(".pack")]):
            path = os.path.join(store.packs_dir, n)
            _unlink(path)
            _unlink(listing_path(path))
            out.append(path)
    return out


def import_to_widen(store: RefStore, search: DeltaSearch) -> bool:
    """The import version's pack was built with a narrower delta search than SEARCH."""
    window = store.import_window()
    return window is not None and window < search.window


def widen_import(store: RefStore, search: DeltaSearch, guard=None) -> Optional[BuiltPack]:
    """Build the import version's pack again with SEARCH (the same objects:
    its values, no boundary) and record it in place of the old one, which
    sweep_packs removes an hour later (fetches planned meanwhile still read
    it). None when the new pack does not hold the same number of objects:
    the old one stays, and so it does when git fails (versionpack.BuildError,
    raised: say, gc pruned what a value reached, or git was killed)."""
    old = store.version_pack(1)
    if old is None:
        return None
    (name, objects, _size), _boundary = old
    tips = [u.new for u in store.version_updates(1) if not is_null(u.new)]
    if not tips:
        return None
    built = vp.build(store.repo, tips, (), store.packs_dir, search, guard)
    if built.name == name:
        return None
    if built.objects != objects:
        _unlink(built.pack)
        _unlink(built.idx)
        return None
    store.widen_import(built, search)
    return built


def segments_to_build(store: RefStore) -> list[tuple[int, int]]:
    """The runs the schedule asks for over the versions packed so far, not built yet, in order."""
    through, have = store.packed_through_and_runs()
    return [run for run in sp.schedule(through) if run not in have]


def _present(store: RefStore, values) -> set[str]:
    """Those of VALUES the repository still holds."""
    info = object_info(store.gitdir, child_env(store.repo.git_env, GIT_DIR="."), sorted(set(values)))
    return {v for v in values if info.get(v, ("missing", None))[0] != "missing"}


def build_segment(store: RefStore, lo: int, hi: int, search: Optional[DeltaSearch] = None,
                  guard=None) -> Optional[BuiltPack]:
    """Build and record the segment pack of versions LO … HI (all done); the
    BuiltPack or None when empty. GUARD as for build_packs."""
    search = search or DeltaSearch()
    after, before = store.run_values(lo, hi)
    try:
        built = sp.build(store.repo, after, before, store.packs_dir, search, guard) if after else None
    except vp.BuildError:
        before = sorted(_present(store, before))      # as in build_packs: values gc pruned since
        built = sp.build(store.repo, after, before, store.packs_dir, search, guard) if after else None
    if built is not None and not built.objects:
        built = None            # its file goes with the next sweep unless a version pack shares it
    store.record_segment_pack(lo, hi, built, search)
    return built


def prune_segments(store: RefStore) -> list[tuple[int, int]]:
    """Forget the segment packs that lie inside a larger built one and delete
    their files (a clone reading one keeps its open file; one that finds it
    gone falls back to git)."""
    runs, names = store.drop_nested_segments()
    for name in names:
        for ext in (".pack", ".idx"):
            _unlink(os.path.join(store.packs_dir, f"pack-{name}{ext}"))
    return runs


def sweep_packs(store: RefStore, min_age: float = 3600.0) -> list[str]:
    """Remove what crashed builders left in STORE's packs directory: pack files
    no row names and packs pushes kept that no build took (untouched for
    MIN_AGE seconds), and scratch directories of processes that are gone.
    The paths removed."""
    try:
        names = os.listdir(store.packs_dir)
    except OSError:
        return []
    used = store.pack_names()
    now = time.time()
    out = []
    for n in names:
        path = os.path.join(store.packs_dir, n)
        if n.startswith(vp.SCRATCH_PREFIX):
            if not vp.scratch_owner_alive(n):
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    _unlink(path)            # an adopted pack's index being written
                out.append(path)
            continue
        stem, ext = os.path.splitext(n)
        sent = (stem.startswith(SENT_PREFIX) and ext in (".pack", ".tmp", ".list", ".tmp-list")  # a push's, never built from
                or n.startswith(spanpack.PREFIX))                   # which span pack answers a plan
        if not sent and (not (stem.startswith("pack-") and ext in (".pack", ".idx")) or stem[5:] in used):
            continue
        try:
            st = os.stat(path)
            if now - max(st.st_mtime, st.st_ctime) >= min_age:
                os.unlink(path)
                out.append(path)
        except OSError:
            pass
    return out
