"""Per-row logits processors: each changes the logits of the rows that ask for it, before sampling.

One shape for every per-request adjustment (logit_bias, presence/frequency penalties, and a grammar's
token mask), so the sampler applies them in one place and isolates a failing row the same way for all:
`wants` picks the rows, `apply` edits those rows' logits in place (batched over the wanted rows)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

import torch

from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.core.sequence import Sequence


@dataclass
class SampleRow:
    """What a processor may read about one row: its request, its parameters and its sequence (the
    scheduler's Sequence, None in unit tests that sample bare logits)."""

    request_id: str
    params: SamplingParams
    seq: Sequence | None = None

    @property
    def output_token_ids(self) -> list[int]:
        return self.seq.output_token_ids if self.seq is not None else []


class LogitsProcessor(Protocol):
    name: str  # the stage named in a failed request's error and in the failure counter

    def wants(self, row: SampleRow) -> bool: ...

    def apply(self, logits: torch.Tensor, rows: list[SampleRow]) -> None:
        """logits: float32 [len(rows), vocab], the wanted rows only; edited in place."""


class LogitBias:
    name = "logit_bias"

    def __init__(self) -> None:
        # request id -> (the bias it was built from, ids, values): built once per request and reused while
        # the request is in the batch; kept for the latest call's rows only, so what leaves costs nothing
        self._built: dict[str, tuple[dict[int, float], torch.Tensor, torch.Tensor]] = {}

    def wants(self, row: SampleRow) -> bool:
        return bool(row.params.logit_bias)

    def forget(self, request_id: str) -> None:
        self._built.pop(request_id, None)

    def apply(self, logits: torch.Tensor, rows: list[SampleRow]) -> None:
        for i, row in enumerate(rows):
            bias = row.params.logit_bias
            built = self._built.get(row.request_id)
            if (built is None or built[0] != bias or built[2].device != logits.device
                    or built[2].dtype != logits.dtype):
                ids = torch.tensor(list(bias.keys()), dtype=torch.long, device=logits.device)
                values = torch.tensor(list(bias.values()), dtype=logits.dtype, device=logits.device)
                built = self._built[row.request_id] = (dict(bias), ids, values)
            logits[i].index_add_(0, built[1], built[2])
        self._built = {row.request_id: self._built[row.request_id] for row in rows}


class Penalties:
    """OpenAI's presence and frequency penalties over the tokens generated so far (not the prompt):
    logit[t] -= frequency * count[t] + presence * (count[t] > 0)."""

    name = "penalties"

    def __init__(self) -> None:
        # request id -> (its sequence, output tokens counted, counts [vocab]): counted once, then extended by
        # the tokens generated since; kept for the latest call's rows only, so what leaves costs nothing
        self._counted: dict[str, tuple[object, int, torch.Tensor]] = {}

    def wants(self, row: SampleRow) -> bool:
        p = row.params
        return bool((p.presence_penalty or p.frequency_penalty) and row.output_token_ids)

    def forget(self, request_id: str) -> None:
        self._counted.pop(request_id, None)

    def apply(self, logits: torch.Tensor, rows: list[SampleRow]) -> None:
        for i, row in enumerate(rows):
            counts = self._counts(row, logits)
            p = row.params
            logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)
        self._counted = {row.request_id: self._counted[row.request_id] for row in rows}

    def _counts(self, row: SampleRow, logits: torch.Tensor) -> torch.Tensor:
        """How often each token id below the vocabulary size occurs in the row's output so far."""
        vocab, out = logits.shape[-1], row.output_token_ids
        seen = self._counted.get(row.request_id)
        if (seen is None or seen[0] is not row.seq or seen[1] > len(out) or seen[2].shape[0] != vocab
                or seen[2].device != logits.device or seen[2].dtype != logits.dtype):
            ids = torch.tensor(out, dtype=torch.long, device=logits.device)
            counts = torch.bincount(ids, minlength=vocab)[:vocab].to(logits.dtype)
        else:
            counts = seen[2]
            for token in out[seen[1]:]:
                if token < vocab:  # as the full count's [:vocab]
                    counts[token] += 1
        self._counted[row.request_id] = (row.seq, len(out), counts)  # at once: a later row may raise
        return counts


class MinTokens:
    """min_tokens: until a row has that many output tokens, its stop token ids and (unless ignore_eos) the
    model's EOS ids cannot be sampled (vLLM's semantics; the output processor holds stop strings back too)."""

    name = "min_tokens"

    def __init__(self, eos_token_ids: Collection[int] = ()) -> None:
        self.eos_token_ids = tuple(eos_token_ids)

    def wants(self, row: SampleRow) -> bool:
        return row.params.min_tokens > len(row.output_token_ids)

    def apply(self, logits: torch.Tensor, rows: list[SampleRow]) -> None:
        vocab = logits.shape[-1]
        for i, row in enumerate(rows):
            p = row.params
            eos = () if p.ignore_eos else self.eos_token_ids
            banned = [t for t in (*p.stop_token_ids, *eos) if t < vocab]
            if banned:
                logits[i, banned] = float("-inf")


def default_processors() -> list[LogitsProcessor]:
    """Bias first, then penalties (the order OpenAI documents: bias is added to the raw logits)."""
    return [LogitBias(), Penalties()]
