"""What the prefix cache holds for a waiting sequence, read without attaching anything (pure Python).

Admission and grouping look at many waiting requests every step; `KVCacheManager.lookup_prefix` would
pin blocks for each of them. This view only reads the index. A sequence's block keys are hashed once
and kept by the KV manager."""

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
        """The hit lookup_prefix(seq) would find now (same rules: never the last token, min prefix)."""
        kv = self.kv
        cfg = kv.config
        if not cfg.prefix_cache or seq.block_table or seq.num_computed_tokens or kv.is_swapped(seq):
            return PrefixHit()
        usable = self.keys(seq)[: (seq.num_tokens - 1) // kv.block_size]
        hit = PrefixHit()
        refs = kv.pool.ref_counts
        for h in usable:
            block = kv.index.slot_of(h)
            if block is not None:
                if refs[block] > 0:
                    hit.shared += 1
                    hit.sharers = refs[block]
                else:
                    hit.cached += 1
            elif (cfg.codesign and kv.host is not None and kv.host.has(h)) or (kv.disk is not None and kv.disk.has(h)):
                hit.lower += 1
            else:
                break
        min_tokens = cfg.min_prefix_tokens if cfg.codesign else 1
        return hit if hit.blocks and hit.blocks * kv.block_size >= min_tokens else PrefixHit()

    def common_blocks(self, a: Sequence, b: Sequence) -> int:
        """Leading full blocks two sequences share (equal chained keys)."""
        n = 0
        for x, y in zip(self.keys(a), self.keys(b), strict=False):
            if x != y:
                break
            n += 1
        return n
