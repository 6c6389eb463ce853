"""The running rows' share of a step (pure Python): which rows run and with how many tokens, when a row's step
needs the KV manager (a new block, blocks to index, a swap-in), and the preemption that makes room when the
pool cannot hold that growth.

Scheduler.schedule() runs it row by row (`schedule_running`); the simulator's fast-forward (engine/sim/
fastforward.py) asks the same rules for the decode rows it advances without a Sequence write per step, and
hands a step whose growth does not fit back to schedule(), which preempts."""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate
from typing import TYPE_CHECKING

from kvloop.engine.core.batch import ScheduledBatch, ScheduledSeq
from kvloop.engine.core.sequence import Sequence
from kvloop.engine.kv.manager import KVCacheManager

if TYPE_CHECKING:
    from kvloop.engine.scheduler.scheduler import Scheduler


def split_budget(budget: int, wants: list[int]) -> list[int]:
    """Tokens for each running row this step, in running order (`wants`: what each has left to compute): each
    gets its want within what the rows before it left of the budget, and the list ends where the budget does
    (the rows after it wait for the next step). Prefix sums and a bisection, in C: the fast-forward splits
    every step over hundreds of rows."""
    if budget <= 0 or not wants:
        return []
    ends = list(accumulate(wants))
    k = bisect_left(ends, budget)  # the first row whose want reaches the budget's end
    if k == len(ends):
        return list(wants)
    grants = wants[: k + 1]
    grants[k] = budget - (ends[k - 1] if k else 0)
    return grants


def steps_to_block(computed: int, block_size: int) -> int:
    """Decode steps before a row with `computed` tokens computed reaches the step whose token starts a
    new block: the next step in which `kv.allocation_due` holds for it (and the block
    just filled is indexed)."""
    return -computed % block_size


def holds(kv: KVCacheManager, seq: Sequence, total: int) -> bool:
    """Whether seq's blocks hold `total` tokens (allocate, all or nothing, only where it changes anything)."""
    return not kv.allocation_due(seq, total) or kv.allocate(seq, total)


def grow(sched: Scheduler, seq: Sequence, n: int) -> bool:
    """Blocks for n more tokens of running seq; while the pool is short the newest running row is preempted
    (swapped or freed to recompute). False when seq itself was."""
    total = seq.num_computed_tokens + n
    while not holds(sched.kv, seq, total):
        victim = sched.running[-1]
        sched.preempt(victim)
        if victim is seq:
            return False
    return True


def place(batch: ScheduledBatch, seq: Sequence, n: int) -> None:
    """seq's n tokens from its computed ones: a decode row (one token) or a prefill chunk."""
    item = ScheduledSeq(seq, seq.num_computed_tokens, n)
    (batch.decodes if n == 1 else batch.prefills).append(item)


def schedule_running(sched: Scheduler, batch: ScheduledBatch, budget: int) -> int:
    """The running rows' part of schedule(): oldest first, each its split of the budget, grown (preempting the
    newest rows as needed) and placed. Returns the budget they leave for admission."""
    running = sched.running
    grants = split_budget(budget, [s.num_uncomputed_tokens for s in running])
    for i, n in enumerate(grants):
        if i >= len(running):
            break  # preempted for the rows before it (the newest go first)
        seq = running[i]
        if not grow(sched, seq, n):
            break  # seq itself was preempted: it was the newest
        place(batch, seq, n)
        budget -= n
    return budget
