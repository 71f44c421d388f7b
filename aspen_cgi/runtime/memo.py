"""Bounded in-process memories: `Memo`, a small LRU of computed response
bytes, for answers that depend only on a ref snapshot and settings
(advertisements and ls-refs repeat identically between pushes, so a
long-lived process computes each once); `put_bounded`, for dicts of facts
that never change (a built version's pack, a parsed tree)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Hashable, MutableMapping


def put_bounded(items: MutableMapping, key: Hashable, value: object, maxsize: int) -> None:
    """ITEMS[KEY] = VALUE, first forgetting the oldest quarter of ITEMS when it
    holds MAXSIZE entries (threads may share ITEMS: a key another removed is skipped)."""
    if len(items) >= maxsize:
        for k in list(items)[:max(1, maxsize // 4)]:
            items.pop(k, None)
    items[key] = value


class Memo:
    def __init__(self, maxsize: int = 64):
        self.maxsize = maxsize
        self._items: "OrderedDict[Hashable, tuple[object, bytes]]" = OrderedDict()
        self._lock = threading.Lock()

    def get(self, owner: object, key: Hashable, compute: Callable[[], bytes]) -> bytes:
        """The bytes for KEY computed over OWNER (an immutable snapshot: it is
        kept alive with the entry and compared by identity)."""
        full = (id(owner), key)
        with self._lock:
            hit = self._items.get(full)
            if hit is not None and hit[0] is owner:
                self._items.move_to_end(full)
                return hit[1]
        data = compute()
        with self._lock:
            self._items[full] = (owner, data)
            self._items.move_to_end(full)
            while len(self._items) > self.maxsize:
                self._items.popitem(last=False)
        return data
