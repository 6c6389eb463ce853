"""Continuous batching with a token budget and chunked prefill, running requests first (pure Python).

Each step: running sequences get their next token (or their next prefill chunk) oldest first; when the
pool cannot hold that growth, the newest running sequence is preempted (its blocks freed, recomputed
later) instead of failing. Then waiting sequences are admitted in arrival order while the batch cap,
the token budget and free blocks allow."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from kvloop.engine.kv.manager import KVCacheManager, blocks_for
from kvloop.engine.scheduler.batch import ScheduledBatch, ScheduledSeq
from kvloop.engine.scheduler.sequence import SeqStatus, Sequence


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 64  # batch cap: running sequences at most
    max_num_batched_tokens: int = 512  # token budget of one step
    max_model_len: int = 8192

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")


class RequestRejected(ValueError):
    """The request can never run here; `reason` says why."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager):
        self.config = config
        self.kv = kv
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    @property
    def batch_cap(self) -> int:
        return self.config.max_num_seqs

    def add(self, seq: Sequence) -> None:
        total = seq.num_prompt_tokens + (0 if seq.params is None else seq.params.max_tokens)
        if seq.num_prompt_tokens == 0:
            raise RequestRejected("empty_prompt", "the prompt is empty")
        if total > self.config.max_model_len:
            raise RequestRejected(
                "too_long",
                f"this model's maximum context length is {self.config.max_model_len} tokens; the request has "
                f"{seq.num_prompt_tokens} prompt tokens and asks for {seq.params.max_tokens} more ({total} in all)",
            )
        if blocks_for(seq.num_prompt_tokens + 1, self.kv.block_size) > self.kv.num_blocks:
            raise RequestRejected(
                "too_long", f"the prompt ({seq.num_prompt_tokens} tokens) does not fit the KV cache "
                f"({self.kv.num_blocks * self.kv.block_size} tokens)")
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.config.max_num_batched_tokens
        scheduled: list[Sequence] = []
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_uncomputed_tokens, budget)
            if not self._grow(seq, n):
                continue  # seq itself was preempted; running[i] is now the next sequence
            self._place(batch, seq, n)
            scheduled.append(seq)
            budget -= n
            i += 1
        while self.waiting and budget > 0 and len(self.running) < self.batch_cap:
            seq = self.waiting[0]
            if seq.num_computed_tokens == 0 and not seq.block_table:
                self.kv.lookup_prefix(seq)
            n = min(seq.num_uncomputed_tokens, budget)
            if not self.kv.allocate(seq, seq.num_computed_tokens + n):
                break  # FCFS: the head of the queue waits for memory
            self.waiting.popleft()
            seq.status = SeqStatus.RUNNING
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = time.monotonic()
            self.running.append(seq)
            self._place(batch, seq, n)
            budget -= n
        return batch

    def _grow(self, seq: Sequence, n: int) -> bool:
        """Finds blocks for n more tokens of seq, preempting the newest running sequences as needed."""
        while not self.kv.allocate(seq, seq.num_computed_tokens + n):
            victim = self.running[-1]
            self.preempt(victim)
            if victim is seq:
                return False
        return True

    def preempt(self, seq: Sequence) -> None:
        """Recompute-style preemption: free its blocks; it goes back to the head of the queue."""
        self.running.remove(seq)
        self.kv.release(seq)
        seq.num_computed_tokens = 0
        seq.num_cached_tokens = 0
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    @staticmethod
    def _place(batch: ScheduledBatch, seq: Sequence, n: int) -> None:
        item = ScheduledSeq(seq, seq.num_computed_tokens, n)
        (batch.decodes if n == 1 else batch.prefills).append(item)

    def finish(self, seq: Sequence, reason: str) -> None:
        if seq.is_finished:
            return
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv.release(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        seq.finished_time = time.monotonic()

    def check_integrity(self) -> None:
        self.kv.check_integrity([*self.running, *self.waiting])
