"""Step-cost model of decode attention, plain and cascaded (pure Python, no torch): the runner decides
per group whether cascade pays; the scheduler and the simulator can price a decode step with it.

One attention call that stacks M query rows against S shared tokens costs, per layer,
    call_us + row_us * M + S * max(token_us, token_row_us * M)
(a roofline: a few stacked rows cost what streaming the K/V costs, many rows what the products cost),
and every row that takes part in a cascade pays merge_us per extra partial result. Plain decode is one
such call per row (M = 1) over its whole context. Coefficients are measured by
bench/calibrate_cascade.py on a CPU and stored below per KV dtype; compare them only within one machine.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionCost:
    call_us: float  # fixed cost of one attention call (op dispatch)
    row_us: float  # per stacked query row
    token_us: float  # per token while streaming K/V bounds the call (few stacked rows)
    token_row_us: float  # per token and stacked row once the products bound it (many rows)
    merge_us: float  # per row and extra partial result (log-sum-exp merge)
    # A row's own part up to this many tokens is copied out and batched with rows of similar length; longer
    # ones are read in place (per-call overhead of thin products beats the copy only for long spans).
    copy_max_tokens: int = 512

    def span_us(self, rows: int, tokens: int) -> float:
        return self.call_us + self.row_us * rows + tokens * max(self.token_us, self.token_row_us * rows)

    def plain_us(self, context_lens: Iterable[int]) -> float:
        """One decode step's attention per layer without cascade."""
        return sum(self.span_us(1, n) for n in context_lens)

    def group_gain_us(self, members: int, shared_tokens: int) -> float:
        """Time saved per layer by reading `shared_tokens` once for `members` rows (negative: a loss)."""
        alone = members * shared_tokens * max(self.token_us, self.token_row_us)
        together = self.span_us(members, shared_tokens) + self.merge_us * members
        return alone - together

    def worth(self, members: int, shared_tokens: int) -> bool:
        return members > 1 and shared_tokens > 0 and self.group_gain_us(members, shared_tokens) > 0

    def step_us(self, context_lens: list[int], groups: Iterable[tuple[int, int]]) -> float:
        """Per layer: plain cost of these rows minus the gain of each cascaded (members, shared_tokens)."""
        return self.plain_us(context_lens) - sum(self.group_gain_us(m, s) for m, s in groups)


# Measured with `bench/calibrate_cascade.py --threads 2` (the engine's thread count in the benchmarks) on an
# AVX512-BF16 CPU, quiet machine: the fit's worst sample is off by 40% (bf16) / 27% (fp32); break-even
# shared tokens for 16 sharers: 368 (bf16), 80 (fp32), inside or below the published 256-512. fp16 reuses
# bf16's entry (same bytes; not measured separately). copy_max_tokens is set above any context here: with 2
# threads, reading a long own part in place (one thin product per row) measured 1.7x slower per step than
# copying rows out and batching them by length (bench/decode_shared.py, nothing shared, context 2,000),
# although the calibration's micro-benchmark put the crossover at 1,024 tokens.
_BF16 = AttentionCost(call_us=233.872, row_us=0.0289, token_us=0.06555, token_row_us=0.01613, merge_us=3.062,
                      copy_max_tokens=8192)
COSTS: dict[str, AttentionCost] = {
    "bfloat16": _BF16,
    "float16": _BF16,
    "float32": AttentionCost(call_us=94.993, row_us=1.7569, token_us=0.15738, token_row_us=0.02125, merge_us=3.062,
                             copy_max_tokens=8192),
}


def cost_for(kv_dtype: str) -> AttentionCost:
    """The model for a KV dtype name ("bfloat16", "torch.bfloat16", ...)."""
    return COSTS[kv_dtype.removeprefix("torch.")]
