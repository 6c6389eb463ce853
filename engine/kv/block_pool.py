"""Fixed-size KV blocks with reference counts (pure Python).

A block is free or referenced here. The KV manager adds a third state, cached: unreferenced, still
indexed by its hash and holding reusable K/V, evictable on demand (it is on no free list)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class OutOfBlocks(RuntimeError):
    pass


class BlockPool:
    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError("the KV pool needs at least one block")
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise OutOfBlocks("no free KV block")
        block = self._free.popleft()
        self.ref_counts[block] = 1
        return block

    def take(self, block: int) -> None:
        """Hands out a block that was not on the free list (an evicted cached block)."""
        assert self.ref_counts[block] == 0
        self.ref_counts[block] = 1

    def incref(self, block: int) -> None:
        self.ref_counts[block] += 1

    def incref_all(self, blocks: Iterable[int]) -> list[int]:
        """One more reference to each block, in order; returns those that had none before (cached ones, which
        leave the eviction order), in that order."""
        refs, first = self.ref_counts, []
        for block in blocks:
            if not refs[block]:
                first.append(block)
            refs[block] += 1
        return first

    def decref(self, block: int) -> bool:
        """Drops one reference; returns True when it was the last one."""
        return bool(self.decref_all((block,)))

    def decref_all(self, blocks: Iterable[int]) -> list[int]:
        """Drops one reference to each block, in order; returns those whose last reference went, in that order
        (a release drops a whole table: one loop)."""
        refs, last = self.ref_counts, []
        for block in blocks:
            count = refs[block] - 1
            if count <= 0:
                if count < 0:
                    raise RuntimeError(f"block {block} released more often than referenced")
                last.append(block)
            refs[block] = count
        return last

    def put_free(self, block: int) -> None:
        self._free.append(block)

    def free_blocks(self) -> set[int]:
        return set(self._free)
