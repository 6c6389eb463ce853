"""Cache-aware ordering of the waiting queue by remaining work, with an aging bound (codesign, queue_order
`work`; `slo`: by TTFT deadline instead, item 2's variant; pure Python).

1. Preempted requests first, then aged ones, both oldest first, as `priority` (grouping.py): if one does not
   fit, admission stops there and holds the memory for it, so nobody passes it. A request is aged once its
   wait exceeds `aging_factor` x the median queue wait of the last requests to start (WaitReference), and at
   least `aging_floor_s`: no request waits much longer than the queue makes a typical request wait, whatever
   the order of the rest. The reference is the wait under this order, not under FCFS; shortest-first makes
   the median smaller than FCFS's, so the bound is tighter than the same multiple of FCFS's median.
2. The rest by remaining work, shortest first: the prompt tokens that the prefix index does not hold now
   (every tier counts as held: a lower-tier hit is promoted, not computed). A request joining a running
   group's shared prefix has little left and comes early; among equal work the larger join saving, then the
   oldest. The same peek prices and gates the request afterwards (PrefixView.remembered).
3. As in grouping.py, a request whose prefix a running request is prefilling right now waits for that
   prefill's blocks instead of computing the same prefix twice.
Cost per step: the aging test over the whole queue (no prefix walk), and at most `max_queue` peeks: beyond
the oldest `max_queue` unaged requests the rest follow in arrival order (a long queue keeps the order where
it matters, at its head, and the step stays bounded)."""

from __future__ import annotations

import itertools
import statistics
from collections import deque
from collections.abc import Callable, Iterable
from collections.abc import Sequence as Seq

from kvloop.engine.core.sequence import Sequence
from kvloop.engine.scheduler.grouping import defers
from kvloop.engine.scheduler.prefix import PrefixHit, PrefixView

# Requests whose waits make the reference: enough that one long outlier moves the median little, few enough
# that it follows a change of load within a few seconds of traffic.
WAIT_WINDOW = 64


class WaitReference:
    """The median queue wait (enqueue to first start, on the scheduler's clock) of the last `window`
    requests to start."""

    def __init__(self, window: int = WAIT_WINDOW):
        self._waits: deque[float] = deque(maxlen=window)
        self._median: float | None = 0.0  # None: to recompute

    def record(self, wait: float) -> None:
        self._waits.append(max(0.0, wait))
        self._median = None

    @property
    def median(self) -> float:
        if self._median is None:
            self._median = statistics.median(self._waits)
        return self._median

    def aged_after(self, factor: float, floor_s: float) -> float:
        """The wait past which a request is aged."""
        return max(floor_s, factor * self.median)


def order_by_work(waiting: Iterable[Sequence], running: Seq[Sequence], view: PrefixView, now: float,
                  enqueued: Callable[[Sequence], float], aged_after: float, max_queue: int, min_share: int,
                  block_size: int, join_saving: Callable[[PrefixHit], float] | None = None,
                  deadline: Callable[[Sequence], float] | None = None) -> tuple[list[Sequence], set[int]]:
    """(candidates in offer order, ids of the priority ones). With `deadline` (queue_order slo: when each
    request's TTFT bound runs out) the rest go earliest deadline first, those already past theirs after the
    ones that can still make it (serving a lost request first makes others miss too), remaining work breaking
    ties; else shortest remaining work first."""
    priority, rest = [], []
    for s in waiting:
        (priority if s.num_preemptions or now - enqueued(s) > aged_after else rest).append(s)
    priority.sort(key=lambda s: (not s.num_preemptions, enqueued(s)))
    rest.sort(key=enqueued)
    prefilling = [r for r in running if r.num_computed_tokens < len(r.prompt_token_ids)]
    keyed = []
    for s in itertools.islice(rest, max_queue):
        peek = view.peek(s)
        if defers(view, s, peek, prefilling, min_share):
            continue
        left = max(0, s.num_prompt_tokens - peek.blocks * block_size)
        saving = join_saving(peek) if join_saving is not None and peek.shared else 0.0
        if deadline is None:
            keyed.append((left, -saving, enqueued(s), s))
        else:
            due = deadline(s)
            keyed.append((due < now, due, left, s))
    keyed.sort(key=lambda x: x[:3])
    return priority + [x[3] for x in keyed] + rest[max_queue:], {id(s) for s in priority}
