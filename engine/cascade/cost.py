"""Step-cost model of decode attention, plain and cascaded (pure Python, no torch): the runner decides
per group whether cascade pays; the scheduler and the simulator can price a decode step with it.

One attention call that stacks M query rows against S shared tokens costs, per layer,
    call_us + row_us * M + S * max(token_us, token_stack_us + token_row_us * M)
(a roofline: a few stacked rows cost what streaming the K/V costs, many rows what the products cost, plus
what a kernel pays once per token for all the rows it stacks, such as widening 16-bit K/V; 0 on torch),
and every row that takes part in a cascade pays merge_us per extra partial result (group_us more per
group). Plain decode is one such call per row (M = 1) over its whole context. A group cascades only where
the modelled gain exceeds min_gain times what its rows' reading of the shared tokens costs plain: a margin
for the model's error on small groups, where both paths take tens of microseconds (fitted by the calibration
against whole decode steps, so that the model never picks the path measured slower). For a backend whose
kernel takes the whole step in one call (the CPU kernel, which also merges each row's partial results inside
it), a "call" is one segment of that call: call_us is what a segment adds, and the call's own fixed cost, the
same with or without cascade, is left out.
Coefficients are measured by bench/calibrate_cascade.py on a CPU and stored below per attention backend
and KV dtype; compare them only within one machine and one backend.
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
    group_us: float = 0.0  # per cascaded group, beyond its rows' merges (CPU kernel: the merge's fixed cost)
    token_stack_us: float = 0.0  # per token, once for all the stacked rows, beside their products
    min_gain: float = 0.0  # the share of the group's plain reading cost cascade must save to be chosen

    def token_cost_us(self, rows: int) -> float:
        """Per token of one call that stacks `rows` query rows."""
        return max(self.token_us, self.token_stack_us + self.token_row_us * rows)

    def span_us(self, rows: int, tokens: int) -> float:
        return self.call_us + self.row_us * rows + tokens * self.token_cost_us(rows)

    def plain_us(self, context_lens: Iterable[int]) -> float:
        """One decode step's attention per layer without cascade: span_us(1, n) per row, its two terms
        taken out of the loop (the same arithmetic; the simulator prices every step with it)."""
        fixed, per_token = self.call_us + self.row_us * 1, self.token_cost_us(1)
        return sum(fixed + n * per_token for n in context_lens)

    def group_gain_us(self, members: int, shared_tokens: int) -> float:
        """Time saved per layer by reading `shared_tokens` once for `members` rows (negative: a loss)."""
        alone = members * shared_tokens * self.token_cost_us(1)
        together = self.span_us(members, shared_tokens) + self.group_us + self.merge_us * members
        return alone - together

    def worth(self, members: int, shared_tokens: int) -> bool:
        if members < 2 or shared_tokens <= 0:
            return False
        margin = self.min_gain * members * shared_tokens * self.token_cost_us(1)
        return self.group_gain_us(members, shared_tokens) > margin

    def step_us(self, context_lens: list[int], groups: Iterable[tuple[int, int]]) -> float:
        """Per layer: plain cost of these rows minus the gain of each cascaded (members, shared_tokens)."""
        return self.plain_us(context_lens) - sum(self.group_gain_us(m, s) for m, s in groups)


# Entries per backend and KV dtype; where each number came from: docs/cascade_calibration.md.
# torch: `bench/calibrate_cascade.py --threads 2` -> bench/results/cascade_calibration.json
_BF16 = AttentionCost(call_us=233.872, row_us=0.0289, token_us=0.06555, token_row_us=0.01613, merge_us=3.062,
                      copy_max_tokens=8192)
_FP32 = AttentionCost(call_us=94.993, row_us=1.7569, token_us=0.15738, token_row_us=0.02125, merge_us=3.062,
                      copy_max_tokens=8192)

# cpu: `bench/calibrate_cascade.py --backend cpu --threads 2` -> bench/results/cascade_calibration_cpu.json
_CPU_BF16 = AttentionCost(call_us=3.106, row_us=1.4141, token_us=0.05871, token_row_us=0.036745,
                          merge_us=0.0, copy_max_tokens=512, group_us=0.0, token_stack_us=0.01292,
                          min_gain=0.0)
_CPU_FP32 = AttentionCost(call_us=2.047, row_us=1.7709, token_us=0.07751, token_row_us=0.037584,
                          merge_us=0.0, copy_max_tokens=512, group_us=0.0, token_stack_us=0.02851,
                          min_gain=0.0)

# cpu/avx512bf16: the same on AVX512-BF16 -> bench/results/cascade_calibration_cpu_avx512bf16.json
_CPU_BF16_BLOCKED = AttentionCost(call_us=0.0, row_us=2.6018, token_us=0.02572, token_row_us=0.016463,
                                  merge_us=0.0, copy_max_tokens=512, group_us=0.0, token_stack_us=0.0,
                                  min_gain=0.0)

# cpu/amx: the same on a CPU with AMX tiles -> bench/results/cascade_calibration_cpu_amx.json
_CPU_BF16_AMX = AttentionCost(call_us=0.604, row_us=0.506, token_us=0.02106, token_row_us=0.005884,
                              merge_us=0.82, copy_max_tokens=512, group_us=0.0, token_stack_us=0.0,
                              min_gain=0.0)

# Per attention backend (backend.py's names, or a cost name "name/variant": AttentionBackend.cost_name), per
# KV dtype. A variant measured for some KV dtypes only runs the others through its backend's routine.
BLOCKED_BF16 = "avx512bf16"  # the cpu kernel's variant with the blocked bf16 routine
AMX_TILES = "amx"  # ... with the blocked routine for plain rows and the AMX tile routine for stacked ones
COSTS: dict[str, dict[str, AttentionCost]] = {
    "torch": {"bfloat16": _BF16, "float16": _BF16, "float32": _FP32},
    "cpu": {"bfloat16": _CPU_BF16, "float16": _CPU_BF16, "float32": _CPU_FP32},
    f"cpu/{BLOCKED_BF16}": {"bfloat16": _CPU_BF16_BLOCKED},
    f"cpu/{AMX_TILES}": {"bfloat16": _CPU_BF16_AMX},
}
# Backends decided by another's entries, said here rather than found by a silent fallback. Triton has no
# calibration of its own yet: the torch path's entries decide for it.
STAND_INS: dict[str, str] = {"triton": "torch"}


def cost_for(kv_dtype: str, backend: str = "torch") -> AttentionCost:
    """The model for a KV dtype name ("bfloat16", "torch.bfloat16", ...) on an attention backend's decode path
    (its cost name: the registered name, or "name/variant"; the torch path by default, as the simulator prices
    steps). An error for a backend without entries: its cascade decisions would otherwise rest on another
    path's trade-off."""
    dtype = kv_dtype.removeprefix("torch.")
    name = STAND_INS.get(backend, backend)
    entries = COSTS.get(name)
    if entries is None:
        raise ValueError(f"no attention cost model for backend {backend!r}; measured: {sorted(COSTS)}, "
                         f"standing in: {STAND_INS} (bench/calibrate_cascade.py measures one)")
    # a variant's other dtypes: its backend's
    return entries.get(dtype) or COSTS[name.partition("/")[0]][dtype]
