"""A request's state as the scheduler and runner see it."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from kvloop.engine.core.sampling import SamplingParams


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float = field(default_factory=time.monotonic)
    user: str | None = None  # a hint for cache policies (which client/session this is)
    status: SeqStatus = SeqStatus.WAITING
    token_ids: list[int] = field(default_factory=list)  # prompt + generated
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    block_table: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at admission
    cached_tokens_by_tier: dict[str, int] = field(default_factory=dict)  # of those: "device"/"host"/"disk"
    block_hashes: list[int] = field(default_factory=list)  # KV manager: chained keys of committed blocks
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_preemptions: int = 0
    # which stint of running this is: the scheduler numbers every start (admission, resumption after
    # preemption) anew, so a running row's identity is one int (plan caches key rows by it);
    # 0 before the first start
    stint: int = 0
    error: str | None = None  # why the scheduler failed it (finish_reason 'error'), e.g. static OOM

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED


def decodes(seq: Sequence) -> bool:
    """Whether seq's next step is a decode row: a single token to compute."""
    return seq.num_uncomputed_tokens == 1
