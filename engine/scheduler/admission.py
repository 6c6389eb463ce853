"""Cache-aware admission (codesign): does a waiting sequence fit, counted after its prefix hit?

A sequence's need is the device blocks it will hold once admitted, up to a decode reserve:
blocks for min(prompt + max_tokens, tokens so far + reserve), less the prefix blocks that running
sequences already hold (sharing them costs nothing). Cached-but-unreferenced and lower-tier hits still
count: sharing or promoting them adds referenced blocks, but they cost no prefill compute.
Running sequences keep their own rolling reserve. Admission keeps

    referenced + reserves of running + need  <=  N - ceil(watermark * N)

so the watermark share of the pool stays free or cached: hits let more requests in (their prefix is
shared), a cold flood fewer (every prompt is new blocks)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from kvloop.engine.core.sequence import Sequence
from kvloop.engine.kv.manager import KVCacheManager, blocks_for
from kvloop.engine.scheduler.prefix import PrefixView


class AdmissionGate:
    def __init__(self, kv: KVCacheManager, view: PrefixView, reserve_tokens: int):
        self.kv = kv
        self.view = view
        self.reserve_tokens = reserve_tokens

    def target_blocks(self, seq: Sequence) -> int:
        """Blocks seq should be able to hold: its tokens plus the decode reserve, capped by max_tokens."""
        final = len(seq.prompt_token_ids) + seq.params.max_tokens
        return blocks_for(min(final, len(seq.token_ids) + self.reserve_tokens), self.kv.block_size)

    def outstanding(self, running: Iterable[Sequence]) -> int:
        """Reserve blocks that running sequences may still take (every step, over every running row: swap
        state asked only when some sequence is swapped)."""
        kv, reserve, bs = self.kv, self.reserve_tokens, self.kv.block_size
        swaps = kv.num_swapped > 0
        total = 0
        for s in running:  # target_blocks(s) inline: this runs over every running row every step
            final = len(s.prompt_token_ids) + s.params.max_tokens
            tokens = len(s.token_ids) + reserve
            left = (min(final, tokens) + bs - 1) // bs - len(s.block_table)
            if left > 0 and not (swaps and kv.is_swapped(s)):
                total += left
        return total

    def limit(self) -> int:
        """Blocks admission may commit: the pool less the watermark share (codesign keeps it back)."""
        n = self.kv.num_blocks
        return n - math.ceil(self.kv.watermark * n)

    def headroom(self, running: Iterable[Sequence]) -> int:
        return self.limit() - self.kv.num_referenced_blocks - self.outstanding(running)

    def need(self, seq: Sequence) -> int:
        return max(0, self.target_blocks(seq) - self.view.peek(seq).shared)
