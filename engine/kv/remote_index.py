"""What the KV manager knows of the remote store's contents, without asking it (pure Python): the blocks it
wrote or found there (most recent first out of a bounded LRU), and the blocks a lookup just found missing,
remembered for a short while so that a request waiting at the head of the queue does not ask again each
step. Knowing is a hint: the store evicts on its own, and a known block that is gone when read is a miss
(forgotten here). So the prefix view (peek) reads this alone; only a lookup asks the store."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

KNOWN_ENTRIES = 1 << 16  # hashes remembered as in the store (~100 bytes each)
ABSENT_S = 1.0  # how long a block found missing is not asked for again


class RemoteIndex:
    def __init__(self, capacity: int = KNOWN_ENTRIES, absent_s: float = ABSENT_S,
                 clock: Callable[[], float] = time.monotonic):
        self.capacity, self.absent_s, self.clock = capacity, absent_s, clock
        self._known: OrderedDict[int, None] = OrderedDict()
        self._absent: OrderedDict[int, float] = OrderedDict()  # hash -> until when it counts as missing

    def __len__(self) -> int:
        return len(self._known)

    def has(self, h: int) -> bool:
        return h in self._known

    def add(self, h: int) -> None:
        self._known[h] = None
        self._known.move_to_end(h)
        self._absent.pop(h, None)
        if len(self._known) > self.capacity:
            self._known.popitem(last=False)

    def forget(self, h: int) -> None:
        """Gone or bad when read: missing for a while (an engine that recomputes it writes it again)."""
        self._known.pop(h, None)
        self.absent(h)

    def absent(self, h: int) -> None:
        self._absent[h] = self.clock() + self.absent_s
        self._absent.move_to_end(h)
        if len(self._absent) > self.capacity:
            self._absent.popitem(last=False)

    def recently_absent(self, h: int) -> bool:
        until = self._absent.get(h)
        if until is None:
            return False
        if self.clock() < until:
            return True
        del self._absent[h]
        return False
