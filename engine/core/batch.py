"""What the scheduler hands the runner each step, and the runner interface (a simulator implements it too)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from kvloop.engine.core.sequence import Sequence, TokenLogprob


@dataclass(slots=True)  # one per running sequence per step
class ScheduledSeq:
    seq: Sequence
    start: int  # seq.num_computed_tokens before this step
    num_tokens: int  # tokens computed this step

    @property
    def samples(self) -> bool:
        """A token is sampled once all of the sequence's tokens are computed."""
        return self.start + self.num_tokens == self.seq.num_tokens


@dataclass
class ScheduledBatch:
    decodes: list[ScheduledSeq] = field(default_factory=list)  # one token each, laid out first
    prefills: list[ScheduledSeq] = field(default_factory=list)

    @property
    def items(self) -> list[ScheduledSeq]:
        return self.decodes + self.prefills

    @property
    def num_tokens(self) -> int:
        return len(self.decodes) + sum(p.num_tokens for p in self.prefills)

    def __bool__(self) -> bool:
        return bool(self.decodes or self.prefills)


@dataclass
class StepResult:
    """What the runner sampled, by request id; Scheduler.update_from_output applies it."""

    tokens: dict[str, int]  # only the sequences that sample this step and did not fail
    logprobs: dict[str, TokenLogprob] = field(default_factory=dict)
    errors: dict[str, tuple[str, str]] = field(default_factory=dict)  # (stage, why it failed alone)


class Runner(Protocol):
    block_size: int

    def execute(self, batch: ScheduledBatch) -> StepResult: ...
