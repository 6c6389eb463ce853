"""Preemption instead of out-of-memory: swap a victim's blocks to the host tier when there is room,
else free them and recompute later. Counted by kind ('swap', 'recompute')."""

from __future__ import annotations

from kvloop.engine.core.sequence import SeqStatus, Sequence
from kvloop.engine.kv.manager import KVCacheManager

KINDS = ("swap", "recompute")


class Preemptor:
    def __init__(self, kv: KVCacheManager):
        self.kv = kv
        self.counts: dict[str, int] = dict.fromkeys(KINDS, 0)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def preempt(self, seq: Sequence) -> str:
        """Takes seq's device blocks away; returns the kind. The caller moves seq to the waiting queue."""
        if self.kv.swap_out(seq):  # progress kept: swap_in on its next allocate
            kind = "swap"
        else:
            self.kv.release(seq)
            seq.num_computed_tokens = 0
            seq.num_cached_tokens = 0
            seq.cached_tokens_by_tier = {}
            kind = "recompute"
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        self.counts[kind] += 1
        return kind
