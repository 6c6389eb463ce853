"""Static batching in virtual time, for schedulers without a static mode: the benchmark's
StaticBatchGate (engine.bench.targets.static_gate) on the simulator's clock. Requests are held until
`batch_size` wait or the oldest has waited `fill_timeout_s`, and a batch is released only when the
engine is idle (the previous batch has finished)."""

from __future__ import annotations

from collections import deque

from kvloop.engine.sim.workload import RequestSpec


class VirtualStaticGate:
    def __init__(self, batch_size: int = 16, fill_timeout_s: float = 0.5):
        self.batch_size = batch_size
        self.fill_timeout_s = fill_timeout_s
        self.queue: deque[tuple[float, RequestSpec]] = deque()
        self.batches: list[int] = []

    def submit(self, spec: RequestSpec, now: float) -> None:
        self.queue.append((now, spec))

    def release(self, now: float, engine_idle: bool) -> list[RequestSpec]:
        if not self.queue or not engine_idle:
            return []
        if len(self.queue) < self.batch_size and now < self.due():  # the same float as due()
            return []
        n = min(self.batch_size, len(self.queue))
        self.batches.append(n)
        return [self.queue.popleft()[1] for _ in range(n)]

    def due(self) -> float | None:
        """When the fill timeout lets the head's batch go (None: nothing held)."""
        return self.queue[0][0] + self.fill_timeout_s if self.queue else None

    def __len__(self) -> int:
        return len(self.queue)
