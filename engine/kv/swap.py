"""Swapping a preempted sequence's blocks to the host tier and back (pure Python; part of the KV manager,
split out to keep files small). The public contract is in kv.manager's docstring."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvloop.engine.core.sequence import Sequence
from kvloop.engine.kv.hashing import ROOT

if TYPE_CHECKING:
    from kvloop.engine.kv.manager import KVCacheManager


class SwapMixin:
    def is_swapped(self: KVCacheManager, seq: Sequence) -> bool:
        return id(seq) in self._swapped

    @property
    def num_swapped(self: KVCacheManager) -> int:
        return len(self._swapped)

    def swap_out(self: KVCacheManager, seq: Sequence) -> bool:
        """Copies seq's blocks to pinned host slots and frees its device blocks; keeps its progress."""
        if self.host is None or not seq.block_table or self.is_swapped(seq):
            return False
        self._commit(seq)
        hashes = seq.block_hashes
        slots: list[int] = []
        for i, block in enumerate(seq.block_table):
            h = hashes[i] if i < len(hashes) else None
            slot = self.host.slot_of(h) if h is not None else None
            if slot is None:
                slot = self.host.acquire(self._host_evicted)
                if slot is None:  # no room: undo, the caller recomputes instead
                    for s in slots:
                        self.host.unpin(s)
                    return False
                self.host.pin(slot)
                self.mover.device_to_host(block, slot)
                if h is not None and not self.host.has(h):
                    self.host.insert(h, slot, hashes[i - 1] if i else ROOT)
            else:
                self.host.pin(slot)
            slots.append(slot)
        self._unref_all(seq.block_table)
        seq.block_table = []
        self._swapped[id(seq)] = (seq, slots)
        self.stats.swaps_out += 1
        return True

    def swap_in(self: KVCacheManager, seq: Sequence) -> bool:
        """Brings a swapped-out sequence's blocks back into the device pool; False when there is no room."""
        record = self._swapped.get(id(seq))
        if record is None:
            return False
        slots = record[1]
        hashes = seq.block_hashes
        on_device = [self.index.slot_of(hashes[i]) if i < len(hashes) else None for i in range(len(slots))]
        shared = [b for b in on_device if b is not None]
        cached = sum(1 for b in shared if self.pool.ref_counts[b] == 0)
        budget = self._evictable_budget(len(self.policy) - cached, self.num_referenced_blocks + cached,
                                        len(shared))
        if len(slots) - len(shared) > self.pool.num_free + budget:
            return False
        parent = ROOT
        for i, slot in enumerate(slots):
            block = on_device[i]
            if block is not None:
                self._ref_indexed(block)
            else:
                block = self._take_block(seq)
                self.mover.host_to_device(slot, block)
                if i < len(hashes):
                    self.index.add(block, hashes[i], parent)
            seq.block_table.append(block)
            if i < len(hashes):
                parent = hashes[i]
        for slot in slots:
            self.host.unpin(slot)
        del self._swapped[id(seq)]
        self.stats.swaps_in += 1
        return True
