"""The price of a decode step's attention, one function for the scheduler and the simulator (pure Python).

Which groups cascade is the runner's own plan (plan.py) under the mode's scope (cascade_scope.py) wherever the
per-layer attention model says it pays (cost.AttentionCost: measured on a CPU by bench/calibrate_cascade.py;
derived from the roofline for a GPU profile, engine/sim/cost.py). `StepCost` prices a step with that plan:
- the simulator charges its decode steps with `decode_us` over the shapes of its `planner`'s plan
  (sim/runner.py, and inside fast-forward windows); `price_us` does both in one call,
- the codesign scheduler orders waiting requests by `join_saving_us` (what a row that joins a running
  group saves against reading its prefix alone) and lets joining rows run beyond the batch cap while the
  step's price stays within what the cap's plain rows would cost."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvloop.engine.cascade.cost import AttentionCost
from kvloop.engine.cascade.plan import CascadePlan, CascadePlanner, build_plan
from kvloop.engine.core.cascade_scope import NESTED, SCOPES


@dataclass(frozen=True)
class StepCost:
    attention: AttentionCost  # per layer, microseconds
    layers: int  # the model's layers (1 where only comparisons matter, as in the scheduler)
    block_size: int
    groups: str = NESTED  # the cascade scope: one of cascade_scope.SCOPES

    def __post_init__(self) -> None:
        if self.groups not in SCOPES:
            raise ValueError(f"groups must be one of {SCOPES}")

    @property
    def nested(self) -> bool:
        return self.groups == NESTED

    def plan(self, tables: Sequence[Sequence[int]], context_lens: Sequence[int]) -> CascadePlan | None:
        """The runner's plan for decode rows with these tables and contexts (the new token included)."""
        return build_plan(tables, context_lens, self.block_size, self.attention.worth, self.nested)

    def planner(self) -> CascadePlanner:
        """A planner of the runner's plan that reuses it while the decode set is unchanged (as the runner's)
        and, where that changes, updates it for the rows that changed (pricing reads its `shapes`)."""
        return CascadePlanner(self.block_size, self.attention.worth, self.nested)

    @staticmethod
    def group_shapes(plan: CascadePlan | None) -> list[tuple[int, int]]:
        """(members, shared tokens) of each cascaded group of a plan."""
        return [] if plan is None else [(len(g.rows), g.num_tokens) for g in plan.groups]

    def decode_us(self, context_lens: Iterable[int], groups: Iterable[tuple[int, int]] = ()) -> float:
        """All layers' decode attention of rows with these contexts, with these (members, shared tokens)
        groups cascaded (none: the plain price)."""
        lens = context_lens if isinstance(context_lens, list) else list(context_lens)
        return self.layers * self.attention.step_us(lens, groups)

    def price_us(self, tables: Sequence[Sequence[int]], context_lens: Sequence[int]) -> float:
        """A decode step's attention as the runner would run it."""
        return self.decode_us(context_lens, self.group_shapes(self.plan(tables, context_lens)))

    def _gain(self, members: int, tokens: int) -> float:
        a = self.attention
        return a.group_gain_us(members, tokens) if a.worth(members, tokens) else 0.0

    def join_saving_us(self, sharers: int, shared_tokens: int) -> float:
        """What one more row whose first `shared_tokens` are held by `sharers` running rows saves per step
        by joining their group instead of reading that prefix alone (0: the group would not cascade).
        The prefix is priced as one group (nested levels folded together): an estimate for ordering and
        the cap; the simulator prices steps with the exact plan."""
        if sharers < 1 or shared_tokens <= 0:
            return 0.0
        joined, alone = self._gain(sharers + 1, shared_tokens), self._gain(sharers, shared_tokens)
        return self.layers * max(0.0, joined - alone)
