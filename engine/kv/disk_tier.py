"""Disk tier bookkeeping: which block hashes have files, in least-recently-used order, under a
capacity bound (pure Python; the mover reads, writes and deletes the files)."""

from __future__ import annotations

from collections import OrderedDict


class DiskTier:
    def __init__(self, capacity_blocks: int):
        self.capacity = capacity_blocks
        self._lru: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def has(self, h: int) -> bool:
        return h in self._lru

    def add(self, h: int) -> list[int]:
        """Records a file for h; returns the hashes whose files must go to respect the capacity."""
        self._lru[h] = None
        self._lru.move_to_end(h)
        victims = []
        while len(self._lru) > self.capacity:
            victims.append(self._lru.popitem(last=False)[0])
        return victims

    def touch(self, h: int) -> None:
        if h in self._lru:
            self._lru.move_to_end(h)

    def touch_chain(self, hashes: list[int]) -> None:
        """Marks blocks given parents first as used, tails first: the head ends up the most recent, so
        the LRU evicts a chain's tail before the head that makes the rest usable."""
        for h in reversed(hashes):
            self.touch(h)

    def remove(self, h: int) -> None:
        self._lru.pop(h, None)
