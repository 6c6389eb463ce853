"""The price of a decode step's attention, one function for the scheduler and the simulator (pure Python).

Rows whose block tables begin with the same block ids (the KV manager's identities) share that prefix,
and a cascaded group reads it once. Which groups cascade is the runner's own plan (cascade/plan.py,
`build_plan`) under the mode's scope (`nested`: any shared prefix, nested ones included; `common`: only
the prefix common to every row, as vLLM) wherever the per-layer attention model says it pays
(cascade/cost.AttentionCost: measured on a CPU by bench/calibrate_cascade.py; derived from the
roofline for a GPU profile, engine/sim/cost.py). `StepCost` prices a step with that plan:
- the simulator charges its decode steps with `decode_us` over the groups of its `planner`'s plan
  (`group_shapes`; sim/runner.py, and inside fast-forward windows); `price_us` does both in one call,
- the codesign scheduler orders waiting requests by `join_saving_us` (what a row that joins a running
  group saves against reading its prefix alone) and lets joining rows run beyond the batch cap while the
  step's price stays within what the cap's plain rows would cost."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvloop.engine.cascade.cost import AttentionCost
from kvloop.engine.cascade.plan import CascadePlan, build_plan
from kvloop.engine.cascade.shapes import ShapePlanner

GROUP_SCOPES = ("nested", "common")


@dataclass(frozen=True)
class StepCost:
    attention: AttentionCost  # per layer, microseconds
    layers: int  # the model's layers (1 where only comparisons matter, as in the scheduler)
    block_size: int
    groups: str = "nested"  # GROUP_SCOPES

    def __post_init__(self) -> None:
        if self.groups not in GROUP_SCOPES:
            raise ValueError(f"groups must be one of {GROUP_SCOPES}")

    @property
    def nested(self) -> bool:
        return self.groups == "nested"

    def plan(self, tables: Sequence[Sequence[int]], context_lens: Sequence[int]) -> CascadePlan | None:
        """The runner's plan for decode rows with these tables and contexts (the new token included)."""
        return build_plan(tables, context_lens, self.block_size, self.attention.worth, self.nested)

    def planner(self) -> ShapePlanner:
        """A planner of the runner's plan that reuses it while the decode set is unchanged (as the runner's)
        and, where that changes, updates it for the rows that changed: its plans are group shapes."""
        return ShapePlanner(self.block_size, self.attention.worth, self.nested)

    @staticmethod
    def group_shapes(plan: CascadePlan | list[tuple[int, int]] | None) -> list[tuple[int, int]]:
        """(members, shared tokens) of each cascaded group (a ShapePlanner's plan is these already)."""
        if plan is None or isinstance(plan, list):
            return plan or []
        return [(len(g.rows), g.num_tokens) for g in plan.groups]

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
        return self.layers * max(0.0, self._gain(sharers + 1, shared_tokens) - self._gain(sharers, shared_tokens))
