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
    # a decode row's proposed next tokens (speculation): verified in the same step as extra decode rows at
    # positions start+1.., their K/V written there; only the accepted ones count as computed afterwards
    draft: list[int] = field(default_factory=list)

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
        return (len(self.decodes) + sum(len(d.draft) for d in self.decodes)
                + sum(p.num_tokens for p in self.prefills))

    def __bool__(self) -> bool:
        return bool(self.decodes or self.prefills)


@dataclass
class StepResult:
    """What the runner sampled, by request id; Scheduler.update_from_output applies it."""

    tokens: dict[str, int]  # only the sequences that sample this step and did not fail
    logprobs: dict[str, TokenLogprob] = field(default_factory=dict)
    errors: dict[str, tuple[str, str]] = field(default_factory=dict)  # (stage, why it failed alone)
    # a speculating row's tokens after `tokens[rid]`, in order: the accepted proposals past the first, then
    # the bonus token (the first sample that differs from its proposal), each sampled as if one a step;
    # rows without proposals (and runners that never speculate, the simulator's) leave it empty
    more_tokens: dict[str, list[int]] = field(default_factory=dict)
    more_logprobs: dict[str, list[TokenLogprob]] = field(default_factory=dict)

    def tokens_of(self, request_id: str) -> list[int]:
        """Every token the row sampled this step, in order."""
        return [self.tokens[request_id], *self.more_tokens.get(request_id, ())]


class Runner(Protocol):
    block_size: int

    def execute(self, batch: ScheduledBatch) -> StepResult: ...
