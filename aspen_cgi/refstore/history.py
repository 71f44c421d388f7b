"""The ref store as the planner's `History`: tips (each commit looked up
once per request, the haves in one query), ancestry, what each version
introduced, its pack and boundary, which objects a stored pack holds, and
what a full clone is spliced from.

One StoreHistory serves one request: the tips, ancestry answers, versions'
packs and introducing versions it looked up and the pack indexes it loaded
are kept (the proof and its exactness check ask the same questions), and
`indexes` hands the loaded ones to the splice so no `.idx` is read twice.
A built version's pack, boundary and refs, and the values it wrote, never
change: those are kept for every request of the process (SHARED, keyed by
the store's identity: a store made again at the same path is another), so
a proof reads the store only for what it has not seen yet (three queries a
version: half of planning's time in random-fetch)."""

from __future__ import annotations

import os
from typing import Collection, Optional, Sequence

from ..memo import put_bounded
from .model import AncestryAnswer, CloneView, TipAnswer
from .store import RefStore


SHARED: dict[tuple, object] = {}      # (store identity, "pack"|"values", version) -> answer
SHARED_MAX = 100_000


def _share(key: tuple, value: object) -> None:
    put_bounded(SHARED, key, value, SHARED_MAX)


class StoreHistory:
    def __init__(self, store: RefStore):
        self.store = store
        self._identity: Optional[tuple[str, float]] = None
        self._tips: dict[str, TipAnswer] = {}
        self.indexes: dict[str, object] = {}      # pack name -> PackIndex
        self._ancestry: dict[tuple[str, int, int], AncestryAnswer] = {}
        self._introduced: dict[str, list[int]] = {}
        self._packs: dict[int, Optional[tuple[str, tuple[str, ...], tuple[str, ...]]]] = {}

    def tips(self, commit: str) -> TipAnswer:
        got = self._tips.get(commit)
        if got is None:
            got = self._tips[commit] = self.store.tips(commit)
        return got

    def tips_many(self, commits: Sequence[str]) -> dict[str, TipAnswer]:
        todo = [c for c in dict.fromkeys(commits) if c not in self._tips]
        if todo:
            self._tips.update(self.store.tips_many(todo))
        return {c: self._tips[c] for c in commits}

    def is_ancestor(self, ref: str, j: int, k: int) -> AncestryAnswer:
        key = (ref, j, k)
        got = self._ancestry.get(key)
        if got is None:
            got = self._ancestry[key] = self.store.is_ancestor(ref, j, k)
        return got

    def introduced_by(self, commit: str) -> list[int]:
        got = self._introduced.get(commit)
        if got is None:
            got = self._introduced[commit] = self.store.introduced_by(commit)
        return list(got)

    def introduced_commits(self, version: int) -> frozenset[str]:
        key = (self.identity(), "introduced", version)
        out = SHARED.get(key)
        if out is None:
            out = frozenset(self.store.introduced_commits(version))
            if self.pack_of(version) is not None:
                _share(key, out)           # a built version's N_v is final
        return out

    def introduced_many(self, commits: Sequence[str]) -> dict[str, list[int]]:
        todo = [c for c in dict.fromkeys(commits) if c not in self._introduced]
        if todo:
            self._introduced.update(self.store.introduced_by_many(todo))
        return {c: list(self._introduced[c]) for c in commits}

    def commit_facts(self, commits: Sequence[str]) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
        return self.store.commit_facts(commits)

    def identity(self) -> tuple[str, float]:
        if self._identity is None:
            self._identity = self.store.identity()
        return self._identity

    def pack_of(self, version: int) -> Optional[tuple[str, tuple[str, ...], tuple[str, ...]]]:
        if version in self._packs:
            return self._packs[version]
        key = (self.identity(), "pack", version)
        out = SHARED.get(key)
        if out is None:
            got = self.store.version_pack(version)
            if got is None:
                return None            # not built yet: asked again
            (name, _, _), boundary = got
            out = (name, tuple(boundary), self.store.version_refs(version))
            _share(key, out)
        self._packs[version] = out
        return out

    def version_values(self, version: int) -> tuple[str, ...]:
        key = (self.identity(), "values", version)
        out = SHARED.get(key)
        if out is None:
            out = self.store.version_values(version)
            if version <= self.store.version and self.pack_of(version) is not None:
                _share(key, out)           # a built version is done: its values are final
        return out

    def pack_holds(self, name: str, oids: Collection[str]) -> frozenset[str]:
        """Which of OIDS (hex) the stored pack NAME holds, by bisecting its
        `.idx`; raises PackError when the index cannot be read."""
        from ..packs.packfile import PackIndex
        index = self.indexes.get(name)
        if index is None:
            index = self.indexes[name] = PackIndex.load(os.path.join(self.store.packs_dir, f"pack-{name}.idx"))
        return frozenset(o for o in oids if bytes.fromhex(o) in index)

    def all_packs_built(self) -> bool:
        return self.store.all_packs_built()

    def clone_view(self) -> Optional[CloneView]:
        return self.store.clone_view()
