"""Static batching, the naive baseline: fixed batches, no joining mid-batch, memory reserved up front.

A batch forms only when no batch is running: once `batch_size` requests wait, or the oldest has
waited `fill_timeout_s` (on the scheduler's clock, so the simulator's virtual time works). Up to
`batch_size` requests are taken in arrival order and each reserves blocks for prompt + max_tokens at
once. A reservation that does not fit the pool is an out-of-memory event (counted). What happens to
that request is `on_oom`:
- 'fail' (default): it finishes with finish_reason 'error' ("out of memory"), as a naive server that
  sizes nothing ahead answers a failed allocation; the rest of the batch runs.
- 'retry': it goes back to the head of the queue for the next batch (counted again if it fails again).
No prefix cache is consulted: the reservation is the whole prompt."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvloop.engine.core.sequence import SeqStatus

if TYPE_CHECKING:
    from kvloop.engine.scheduler.scheduler import Scheduler


class StaticBatcher:
    def __init__(self, batch_size: int, fill_timeout_s: float, on_oom: str = "fail"):
        self.batch_size = batch_size
        self.fill_timeout_s = fill_timeout_s
        self.on_oom = on_oom
        self.oom_events = 0
        self.batches: list[int] = []  # size of each batch formed

    def ready(self, sched: Scheduler, now: float) -> bool:
        if sched.running or not sched.waiting:
            return False
        return (len(sched.waiting) >= self.batch_size
                or now - sched.enqueued(sched.waiting[0]) >= self.fill_timeout_s)

    def form(self, sched: Scheduler, now: float) -> None:
        """Starts the next batch when it is due: moves requests from waiting to running, reserved."""
        if not self.ready(sched, now):
            return
        kv = sched.kv
        taken = [sched.waiting.popleft() for _ in range(min(self.batch_size, len(sched.waiting)))]
        retry = []
        for seq in taken:
            total = seq.num_prompt_tokens + seq.params.max_tokens
            if kv.allocate(seq, total):
                sched.start_running(seq, now)
                continue
            self.oom_events += 1
            if self.on_oom == "retry":
                retry.append(seq)
            else:
                sched.fail(seq,
                           f"out of memory: the batch's KV reservation ({total} tokens) does not fit "
                           "the pool")
        for seq in reversed(retry):
            seq.status = SeqStatus.WAITING
            sched.waiting.appendleft(seq)
        if sched.running:
            self.batches.append(len(sched.running))
