"""Per-row logits processors: each changes the logits of the rows that ask for it, before sampling.

One shape for every per-request adjustment (logit_bias, presence/frequency penalties, and a grammar's
token mask), so the sampler applies them in one place and isolates a failing row the same way for all:
`wants` picks the rows, `apply` edits those rows' logits in place (batched over the wanted rows)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from kvloop.engine.sampling import SamplingParams
from kvloop.engine.scheduler.sequence import Sequence


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

    def wants(self, row: SampleRow) -> bool:
        return bool(row.params.logit_bias)

    def apply(self, logits: torch.Tensor, rows: list[SampleRow]) -> None:
        for i, row in enumerate(rows):
            bias = row.params.logit_bias
            ids = torch.tensor(list(bias.keys()), dtype=torch.long, device=logits.device)
            values = torch.tensor(list(bias.values()), dtype=logits.dtype, device=logits.device)
            logits[i].index_add_(0, ids, values)


class Penalties:
    """OpenAI's presence and frequency penalties over the tokens generated so far (not the prompt):
    logit[t] -= frequency * count[t] + presence * (count[t] > 0)."""

    name = "penalties"

    def wants(self, row: SampleRow) -> bool:
        p = row.params
        return bool((p.presence_penalty or p.frequency_penalty) and row.output_token_ids)

    def apply(self, logits: torch.Tensor, rows: list[SampleRow]) -> None:
        vocab = logits.shape[-1]
        for i, row in enumerate(rows):
            ids = torch.tensor(row.output_token_ids, dtype=torch.long, device=logits.device)
            counts = torch.bincount(ids, minlength=vocab)[:vocab].to(logits.dtype)
            p = row.params
            logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)


def default_processors() -> list[LogitsProcessor]:
    """Bias first, then penalties (the order OpenAI documents: bias is added to the raw logits)."""
    return [LogitBias(), Penalties()]
