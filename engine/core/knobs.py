"""The engine's live knobs: what the feedback coordinator moves while the engine runs.

`KNOBS` declares each knob once (name, type, unit, the range a target may carry); the control block's
targets record (engine/control/fields.py) and the hook that applies it take names, types and ranges from
here, so a new knob is one row here and one field of the live `Knobs`.

`Knobs` holds the live values in one object: the scheduler reads the batch cap and the step token
budget, the KV manager the retention watermark, the speculator (engine/scheduler/speculation.py) the
speculation cap, and only the control hook (and the simulator's coordinator, through the same hook)
writes them, through `set`. The configured values stay in the configs (SchedulerConfig.max_num_seqs,
max_num_batched_tokens and speculation_max_tokens, KVConfig.watermark): they are where the knobs start
(`configured`, what stale targets fall back to) and the step budget's and the speculation cap's ceiling."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Knob:
    name: str
    kind: type  # int or float: the targets record's field type
    unit: str
    lo: float  # the lowest value a target may carry
    hi: float  # the highest (below it when hi_open)
    hi_open: bool = False
    doc: str = ""

    def admits(self, value: float) -> bool:
        if math.isnan(value):
            return False
        return self.lo <= value and (value < self.hi if self.hi_open else value <= self.hi)

    def bounds(self) -> str:
        return f"[{self.lo}, {self.hi}{')' if self.hi_open else ']'}"


BATCH_CAP = Knob("batch_cap", int, "requests", 1, 1 << 16,
                 doc="running requests at most (lowering it preempts nobody: admission waits)")
WATERMARK = Knob("watermark", float, "share of the device pool", 0.0, 1.0, hi_open=True,
                 doc="cached blocks that earned their place keep this share of the pool against allocations")
# 2^24 is a sanity bound on what a target may say; the engine clamps to [its floor, its configured budget]
STEP_TOKEN_BUDGET = Knob("step_token_budget", int, "tokens", 1, 1 << 24,
                         doc="tokens one step may schedule (the prefill chunk size); TPOT rises with it")
# 64 is a sanity bound (issue 56 proposes 4-8); the engine clamps to [0, its configured
# --speculation-max-tokens]: a coordinator caps speculation, never raises it past the operator's.
SPECULATION_MAX_TOKENS = Knob("speculation_max_tokens", int, "tokens", 0, 64,
                              doc="caps each row's proposed tokens per step (0 turns speculation off live)")
KNOBS: tuple[Knob, ...] = (BATCH_CAP, WATERMARK, STEP_TOKEN_BUDGET, SPECULATION_MAX_TOKENS)

BUDGET_FLOOR = 16  # tokens: the live step budget stays at or above one block and at least this


@dataclass(frozen=True)
class KnobValues:
    """One value per knob, in KNOBS order."""

    batch_cap: int
    watermark: float
    step_token_budget: int
    speculation_max_tokens: int = 0


class Knobs:
    """The live values (plain attributes: the scheduler and the KV manager read them on every admission and
    allocation). Write them through `set`, which checks and clamps."""

    __slots__ = ("batch_cap", "watermark", "step_token_budget", "speculation_max_tokens", "configured",
                 "budget_floor")

    def __init__(self, batch_cap: int, watermark: float, step_token_budget: int, block_size: int = 1,
                 speculation_max_tokens: int = 0):
        if step_token_budget < 1:
            raise ValueError("step_token_budget must be >= 1")
        self.configured = KnobValues(int(batch_cap), float(watermark), int(step_token_budget),
                                     max(0, int(speculation_max_tokens)))
        self.budget_floor = min(int(step_token_budget), max(BUDGET_FLOOR, block_size))
        self.batch_cap, self.watermark, self.step_token_budget, self.speculation_max_tokens = 0, 0.0, 0, 0
        self.set(batch_cap, watermark, step_token_budget, speculation_max_tokens)

    @property
    def budget_ceiling(self) -> int:
        """The configured step budget: the live one never goes above it."""
        return self.configured.step_token_budget

    @property
    def speculation_ceiling(self) -> int:
        """The configured --speculation-max-tokens: the live cap never goes above it."""
        return self.configured.speculation_max_tokens

    def set(self, batch_cap: int | None = None, watermark: float | None = None,
            step_token_budget: int | None = None, speculation_max_tokens: int | None = None) -> None:
        """Sets the knobs given (None: leave it). A batch cap or watermark outside its range raises (the
        control link drops such targets before); the step budget is clamped to [floor, ceiling], the
        speculation cap to [0, its configured value]."""
        if batch_cap is not None:
            if not BATCH_CAP.admits(batch_cap):
                raise ValueError(f"batch cap must lie in {BATCH_CAP.bounds()}")
            self.batch_cap = int(batch_cap)
        if watermark is not None:
            if not WATERMARK.admits(watermark):
                raise ValueError(f"watermark must lie in {WATERMARK.bounds()}")
            self.watermark = float(watermark)
        if step_token_budget is not None:
            self.step_token_budget = max(self.budget_floor, min(int(step_token_budget), self.budget_ceiling))
        if speculation_max_tokens is not None:  # a cap: within [0, the configured value]
            cap = min(int(speculation_max_tokens), self.speculation_ceiling)
            self.speculation_max_tokens = max(0, cap)

    def values(self) -> KnobValues:
        return KnobValues(self.batch_cap, self.watermark, self.step_token_budget, self.speculation_max_tokens)
