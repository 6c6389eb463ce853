"""The grammar as one of the sampler's logits processors: masks the constrained rows (only those: the
sampler hands a processor its wanted rows alone), and advances each row's matcher with the token it
sampled. Matchers are kept by request id, not by step or by KV blocks, so a request keeps its grammar state
through swap and recompute preemption (recompute re-prefills without sampling, so nothing is re-fed) and
is indifferent to prefix-cache hits."""

from __future__ import annotations

import torch

from kvloop.engine.runner.logits_processors import SampleRow
from kvloop.engine.structured.bitmask import allocate_bitmask, apply_bitmask
from kvloop.engine.structured.compiler import GrammarCompiler
from kvloop.engine.structured.matcher import GrammarMatcher


class GrammarMask:
    name = "grammar"

    def __init__(self, compiler: GrammarCompiler):
        self.compiler = compiler
        self._matchers: dict[str, GrammarMatcher] = {}
        self._bitmask = allocate_bitmask(0, compiler.vocab_size)  # reused; grown to the widest batch seen

    def wants(self, row: SampleRow) -> bool:
        return row.params.grammar is not None

    def matcher(self, row: SampleRow) -> GrammarMatcher:
        m = self._matchers.get(row.request_id)
        if m is None:
            m = self._matchers[row.request_id] = GrammarMatcher(self.compiler, row.params.grammar)
        return m

    def apply(self, logits: torch.Tensor, rows: list[SampleRow]) -> None:
        n = len(rows)
        if self._bitmask.shape[0] < n:
            self._bitmask = allocate_bitmask(n, self.compiler.vocab_size)
        bitmask = self._bitmask[:n]
        for i, row in enumerate(rows):
            self.matcher(row).fill(bitmask[i])
        if logits.shape[-1] > self.compiler.vocab_size:  # padded vocab rows the tokenizer never emits
            logits[:, self.compiler.vocab_size:] = float("-inf")
            logits = logits[:, : self.compiler.vocab_size]
        apply_bitmask(logits, bitmask)

    def accept(self, row: SampleRow, token: int) -> None:
        self.matcher(row).accept(token)

    def forget(self, request_id: str) -> None:
        self._matchers.pop(request_id, None)
