"""What the prefix cache holds for a waiting sequence, read without attaching anything (pure Python).

Admission and grouping look at many waiting requests every step; `KVCacheManager.lookup_prefix` would
pin blocks for each of them. This view asks `KVCacheManager.peek_prefix` (the manager's hit rules,
changing nothing) and adds what only the scheduler needs: which device blocks running sequences hold,
and how many of them share the prefix. A sequence's block keys are hashed once and kept by the KV manager."""

from __future__ import annotations

from dataclasses import dataclass

from kvloop.engine.kv.manager import KVCacheManager
from kvloop.engine.scheduler.sequence import Sequence


@dataclass
class PrefixHit:
    shared: int = 0  # device blocks that running sequences already hold (free to share)
    cached: int = 0  # device blocks cached but unreferenced (sharing them takes them from the cache)
    lower: int = 0  # blocks in the host or disk tier (promoted into new device blocks)
    # block tables holding the last shared block: tables are prefix chains, so every one of them holds the
    # whole shared prefix (the running group the sequence would join)
    sharers: int = 0

    @property
    def blocks(self) -> int:
        return self.shared + self.cached + self.lower


class PrefixView:
    def __init__(self, kv: KVCacheManager):
        self.kv = kv

    def keys(self, seq: Sequence) -> list[int]:
        """Chained keys of seq's full blocks (the KV manager hashes each block once)."""
        return self.kv.keys(seq)

    def peek(self, seq: Sequence) -> PrefixHit:
        """The hit lookup_prefix(seq) would find now, its device blocks split into shared and cached."""
        if seq.num_computed_tokens:  # the scheduler looks up only a sequence that has computed nothing
            return PrefixHit()
        kv = self.kv
        match = kv.peek_prefix(seq)
        shared = cached = lower = sharers = 0
        refs, slots = kv.pool.ref_counts, kv.index.slots
        for h, tier in zip(match.hashes, match.tiers, strict=True):
            if tier != "device":
                lower += 1
                continue
            held = refs[slots[h]]
            if held:
                shared += 1
                sharers = held
            else:
                cached += 1
        return PrefixHit(shared, cached, lower, sharers)

    def common_blocks(self, a: Sequence, b: Sequence) -> int:
        """Leading full blocks two sequences share (equal chained keys)."""
        n = 0
        for x, y in zip(self.keys(a), self.keys(b), strict=False):
            if x != y:
                break
            n += 1
        return n
