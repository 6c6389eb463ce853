"""Per-sequence block tables over the block pool (pure Python).

The scheduler talks to the KV cache only through this class, so the prefix cache and the tiers extend
it (lookup at admission, caching on release) without the scheduler changing."""

from __future__ import annotations

from collections.abc import Iterable

from kvloop.engine.kv.block_pool import BlockPool
from kvloop.engine.scheduler.sequence import Sequence


def blocks_for(num_tokens: int, block_size: int) -> int:
    return (num_tokens + block_size - 1) // block_size


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def usage(self) -> float:
        """Share of the device pool held by running sequences."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def new_blocks_needed(self, seq: Sequence, total_tokens: int) -> int:
        return max(0, blocks_for(total_tokens, self.block_size) - len(seq.block_table))

    def lookup_prefix(self, seq: Sequence) -> int:
        """Attaches cached blocks of the prompt's prefix to seq; returns how many tokens they cover."""
        return 0

    def allocate(self, seq: Sequence, total_tokens: int) -> bool:
        """Grows seq's block table to hold total_tokens; all or nothing."""
        needed = self.new_blocks_needed(seq, total_tokens)
        if needed > self.num_free_blocks:
            return False
        seq.block_table.extend(self.pool.allocate() for _ in range(needed))
        return True

    def release(self, seq: Sequence) -> None:
        for block in seq.block_table:
            if self.pool.decref(block):
                self.pool.put_free(block)
        seq.block_table = []

    def check_integrity(self, live: Iterable[Sequence]) -> None:
        """Every block is free xor referenced; refcounts equal the number of tables holding the block."""
        counts = [0] * self.num_blocks
        for seq in live:
            for block in seq.block_table:
                counts[block] += 1
        free = self.pool.free_blocks()
        assert len(free) == self.pool.num_free, "a block is on the free list twice"
        for block in range(self.num_blocks):
            assert counts[block] == self.pool.ref_counts[block], f"block {block}: refcount mismatch"
            assert (block in free) == (counts[block] == 0), f"block {block}: free state wrong"
