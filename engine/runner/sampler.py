"""Turns logits into tokens: greedy, temperature, top-k, top-p, per-request seeds, logprobs."""

from __future__ import annotations

import torch
from kvloop.engine.sampling import SamplingParams
from kvloop.engine.scheduler.sequence import TokenLogprob


class Sampler:
    def __init__(self) -> None:
        self._generators: dict[str, torch.Generator] = {}  # per seeded request

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def _generator(self, request_id: str, seed: int | None) -> torch.Generator | None:
        if seed is None:
            return None
        gen = self._generators.get(request_id)
        if gen is None:
            gen = torch.Generator().manual_seed(seed)
            self._generators[request_id] = gen
        return gen

    def sample(self, logits: torch.Tensor, params: list[SamplingParams], request_ids: list[str]
               ) -> tuple[list[int], list[TokenLogprob | None]]:
        """logits: float32 [B, vocab]."""
        greedy = logits.argmax(dim=-1)
        tokens = greedy.tolist()
        for row, p in enumerate(params):
            if not p.greedy:
                tokens[row] = self._sample_row(logits[row], p, self._generator(request_ids[row], p.seed))
        logprobs: list[TokenLogprob | None] = [None] * len(params)
        wanted = [row for row, p in enumerate(params) if p.logprobs is not None]
        if wanted:
            lp = torch.log_softmax(logits[wanted], dim=-1)
            for j, row in enumerate(wanted):
                k = params[row].logprobs
                top = []
                if k:
                    values, ids = lp[j].topk(k)
                    top = list(zip(ids.tolist(), values.tolist(), strict=True))
                logprobs[row] = TokenLogprob(tokens[row], float(lp[j, tokens[row]]), top)
        return tokens, logprobs

    @staticmethod
    def _sample_row(logits: torch.Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
        scores = logits / p.temperature
        if p.top_k > 0:
            kth = torch.topk(scores, min(p.top_k, scores.shape[-1])).values[-1]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_scores, order = scores.sort(descending=True)
            probs = sorted_scores.softmax(-1)
            # drop tokens once the mass before them already reaches top_p (the top token always stays)
            drop = probs.cumsum(-1) - probs >= p.top_p
            sorted_scores = sorted_scores.masked_fill(drop, float("-inf"))
            scores = torch.full_like(scores, float("-inf")).scatter(0, order, sorted_scores)
        probs = scores.softmax(-1)
        return int(torch.multinomial(probs, 1, generator=gen))
