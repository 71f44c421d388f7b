"""The ref store as the planner's `History`: tips, ancestry, what each
version introduced, its pack and boundary, and what a full clone is
spliced from."""

from __future__ import annotations

from typing import Optional

from .model import AncestryAnswer, CloneView, TipAnswer
from .store import RefStore


class StoreHistory:
    def __init__(self, store: RefStore):
        self.store = store

    def tips(self, commit: str) -> TipAnswer:
        return self.store.tips(commit)

    def is_ancestor(self, ref: str, j: int, k: int) -> AncestryAnswer:
        return self.store.is_ancestor(ref, j, k)

    def introduced_by(self, commit: str) -> list[int]:
        return self.store.introduced_by(commit)

    def pack_of(self, version: int) -> Optional[tuple[str, tuple[str, ...], tuple[str, ...]]]:
        got = self.store.version_pack(version)
        if got is None:
            return None
        (name, _, _), boundary = got
        return name, tuple(boundary), self.store.version_refs(version)

    def all_packs_built(self) -> bool:
        return self.store.all_packs_built()

    def clone_view(self) -> Optional[CloneView]:
        return self.store.clone_view()
