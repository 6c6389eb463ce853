"""Prefix grouping with aging (codesign): the order in which waiting requests are offered for admission.

1. Requests admitted before (preempted: swapped or to recompute) first, then aged requests (waiting at
   least `aging_s`), both oldest first. They are `priority`: if one does not fit, admission stops there
   and holds the memory for it, so no request is passed over once it has waited the bound.
2. The rest by what joining a running group saves in every decode step (`join_saving`, priced by the
   step-cost function: a row that joins adds only its suffix to the step's reads), then by longest
   cached-or-in-flight prefix hit (same document, same system prompt: they share blocks and need little
   prefill), ties oldest first.
3. A non-priority request whose prompt shares at least `min_share` more blocks with a running request
   that is still prefilling than the cache holds now is deferred for this step: once that prefill
   commits its blocks, the request gets them as a hit instead of computing the same prefix twice.
Above `max_queue` waiting requests the order is plain FCFS (overload: fairness first, and no per-step
scan of a long queue).
This is the `arrival` queue order; `work` (ordering.py) orders by remaining work under an adaptive aging
bound instead, and shares the deferral of 3."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq

from kvloop.engine.core.sequence import Sequence
from kvloop.engine.scheduler.prefix import PrefixHit, PrefixView


def order_waiting(waiting: Seq[Sequence], running: Seq[Sequence], view: PrefixView, now: float,
                  enqueued: Callable[[Sequence], float], aging_s: float, max_queue: int,
                  min_share: int, join_saving: Callable[[PrefixHit], float] | None = None
                  ) -> tuple[list[Sequence], set[int]]:
    """(candidates in offer order, ids of the priority ones)."""
    if len(waiting) > max_queue:
        return list(waiting), {id(s) for s in waiting}  # FCFS: every one holds its place
    priority = [s for s in waiting if s.num_preemptions or now - enqueued(s) >= aging_s]
    prio_ids = {id(s) for s in priority}
    first = sorted(priority, key=lambda s: (not s.num_preemptions, enqueued(s)))
    prefilling = [r for r in running if r.num_computed_tokens < len(r.prompt_token_ids)]
    rest = []
    for s in waiting:
        if id(s) in prio_ids:
            continue
        peek = view.peek(s)
        if defers(view, s, peek, prefilling, min_share):
            continue
        saving = join_saving(peek) if join_saving is not None and peek.shared else 0.0
        rest.append((-saving, -peek.blocks, enqueued(s), s))
    rest.sort(key=lambda x: x[:3])
    return first + [x[3] for x in rest], prio_ids


def defers(view: PrefixView, seq: Sequence, peek: PrefixHit, prefilling: Seq[Sequence],
           min_share: int) -> bool:
    """seq waits this step: a running request is prefilling at least `min_share` blocks of seq's prefix
    beyond what the cache holds now (once that prefill commits them, seq gets them as a hit)."""
    return any(view.common_blocks(seq, r) - peek.blocks >= min_share for r in prefilling)
