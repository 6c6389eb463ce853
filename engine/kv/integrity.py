"""The KV manager's invariants (DESIGN §2), checked by tests after every step (pure Python)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvloop.engine.core.sequence import Sequence

if TYPE_CHECKING:
    from kvloop.engine.kv.manager import KVCacheManager


def check_manager(kv: KVCacheManager, live: list[Sequence]) -> None:
    counts = [0] * kv.num_blocks
    for seq in live:
        for block in seq.block_table:
            counts[block] += 1
        for i, h in enumerate(seq.block_hashes[: len(seq.block_table)]):
            assert kv.index.slot_of(h) == seq.block_table[i], "a committed block is not indexed"
    free = kv.pool.free_blocks()
    assert len(free) == kv.pool.num_free, "a block is on the free list twice"
    for block in range(kv.num_blocks):
        assert counts[block] == kv.pool.ref_counts[block], f"block {block}: refcount mismatch"
        cached = block in kv.policy
        states = (block in free) + (counts[block] > 0) + cached
        assert states == 1, f"block {block} is in {states} of free/referenced/cached"
        if cached:
            assert kv.index.hash_of(block) is not None, f"cached block {block} is not indexed"
        if block in free:
            assert kv.index.hash_of(block) is None, f"free block {block} is still indexed"
    kv.index.check()
    if kv.host is not None:
        pins = [0] * kv.host.num_slots
        for _, slots in kv._swapped.values():
            for slot in slots:
                pins[slot] += 1
        kv.host.check(pins)
    if kv.disk is not None:
        assert len(kv.disk) <= kv.disk.capacity
    assert len(kv.ghost) <= kv.ghost.capacity
