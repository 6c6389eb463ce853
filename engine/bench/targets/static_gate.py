"""Static batching in front of any target: requests are held until `batch_size` are waiting or the oldest
has waited `fill_timeout_s`, and the next batch starts only when the whole previous batch has finished
(WORKLOADS.md: batches of 16, 0.5 s fill timeout)."""

from __future__ import annotations

import dataclasses
import time
from collections import deque

from kvloop.engine.bench.targets.base import Event, Target
from kvloop.engine.core.snapshot import EngineSnapshot


class StaticBatchGate(Target):
    def __init__(self, inner: Target, batch_size: int = 16, fill_timeout_s: float = 0.5,
                 name: str | None = None):
        self.inner = inner
        self.batch_size = batch_size
        self.fill_timeout_s = fill_timeout_s
        self.name = name or inner.name
        self._queue: deque[tuple[float, str, list[int], int]] = deque()
        self.batches: list[int] = []  # sizes of the batches released, for the report

    def start(self) -> None:
        self.inner.start()

    def submit(self, request_id: str, prompt: list[int], max_tokens: int) -> None:
        self._queue.append((time.monotonic(), request_id, prompt, max_tokens))

    def _release(self) -> None:
        if not self._queue or not self.inner.idle():
            return
        full = len(self._queue) >= self.batch_size
        if not full and time.monotonic() - self._queue[0][0] < self.fill_timeout_s:
            return
        n = min(self.batch_size, len(self._queue))
        for _ in range(n):
            _, rid, prompt, max_tokens = self._queue.popleft()
            self.inner.submit(rid, prompt, max_tokens)
        self.batches.append(n)

    def poll(self, timeout: float) -> list[Event]:
        self._release()
        if self._queue and self.inner.idle():  # waiting for the fill timeout only
            timeout = min(timeout, max(0.0, self._queue[0][0] + self.fill_timeout_s - time.monotonic()))
        return self.inner.poll(timeout)

    def idle(self) -> bool:
        return not self._queue and self.inner.idle()

    def snapshot(self) -> EngineSnapshot | None:
        snap = self.inner.snapshot()
        if snap is not None:  # the requests held here wait too
            snap = dataclasses.replace(snap, num_waiting=snap.num_waiting + len(self._queue))
        return snap

    def info(self) -> dict:
        return {**self.inner.info(), "static_batch_size": self.batch_size,
                "fill_timeout_s": self.fill_timeout_s}

    def close(self) -> None:
        self.inner.close()
