"""What the prefix cache holds for a waiting sequence, read without attaching anything (pure Python).

Admission and grouping look at many waiting requests every step; `KVCacheManager.lookup_prefix` would
pin blocks for each of them. This view asks `KVCacheManager.peek_prefix` (the manager's hit rules,
changing nothing) and adds what only the scheduler needs: which device blocks running sequences hold,
and how many of them share the prefix. A sequence's block keys are hashed once and kept by the KV manager."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from kvloop.engine.core.sequence import Sequence
from kvloop.engine.kv.manager import KVCacheManager


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
        self._held: dict[Sequence, PrefixHit] | None = None  # peeks remembered while the cache stays as it is

    def keys(self, seq: Sequence) -> list[int]:
        """Chained keys of seq's full blocks (the KV manager hashes each block once)."""
        return self.kv.keys(seq)

    @contextmanager
    def remembered(self) -> Iterator[None]:
        """Within: a sequence's peek is remembered until `forget()`, which the caller calls whenever it may
        have changed the cache (grouped admission peeks each candidate to order, to price and to gate it)."""
        outer, self._held = self._held, {}
        try:
            yield
        finally:
            self._held = outer

    def forget(self) -> None:
        if self._held:
            self._held.clear()

    def peek(self, seq: Sequence) -> PrefixHit:
        """The hit lookup_prefix(seq) would find now, its device blocks split into shared and cached."""
        held = self._held
        if held is None:
            return self._peek(seq)
        hit = held.get(seq)
        if hit is None:
            hit = held[seq] = self._peek(seq)
        return hit

    def _peek(self, seq: Sequence) -> PrefixHit:
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
