"""The engine's end of the loop: after every step, publish the snapshot and apply the targets.

Duck-typed against EngineCore (no torch import here). The batch cap goes to the scheduler (its
setter when it has one, else `config.max_num_seqs`); the watermark to `engine.kv.set_watermark`
when the KV manager has that method."""

from __future__ import annotations

import math
import os
from collections import deque

from kvloop.engine.control.link import ControlLink
from kvloop.engine.control.records import Targets

TTFT_WINDOW = 256  # recent first tokens that the TTFT percentiles cover


class EngineControl:
    """`after_step` runs on the engine's thread after every step, empty ones included: the server's engine
    thread steps every IDLE_TICK_S while idle (engine/server/async_engine.py), so the snapshot stays fresh
    and the targets are polled while nothing runs. That one thread is the block's only writer."""

    def __init__(self, link: ControlLink):
        self.link = link
        self.ttfts: deque[float] = deque(maxlen=TTFT_WINDOW)
        self._pcts = (math.nan, math.nan)
        self._dirty = False
        self.applied: Targets | None = None

    @classmethod
    def attach(cls, engine, path: str | os.PathLike, stale_after_s: float = 120.0) -> EngineControl:
        """Opens (or creates) the block with the engine's configured values as the defaults."""
        defaults = Targets(batch_cap=engine.scheduler.config.max_num_seqs,
                           watermark=getattr(engine.kv, "watermark", None))
        return cls(ControlLink(path, defaults, stale_after_s=stale_after_s))

    def after_step(self, engine, outputs) -> None:
        for out in outputs:
            if out.num_output_tokens == 1 and out.first_token_time is not None:
                self.ttfts.append(max(0.0, out.first_token_time - out.arrival_time))
                self._dirty = True
        self.link.publish(engine.snapshot(), *self._percentiles())
        targets = self.link.poll_targets()
        if targets is not None and not targets.same_values(self.applied):
            apply_targets(engine, targets)
            self.applied = targets

    def _percentiles(self) -> tuple[float, float]:
        if self._dirty:
            xs = sorted(self.ttfts)
            n = len(xs)
            self._pcts = (xs[(n - 1) // 2], xs[min(n - 1, math.ceil(0.99 * n) - 1)])
            self._dirty = False
        return self._pcts

    def close(self) -> None:
        self.link.close()


def apply_targets(engine, t: Targets) -> None:
    if t.batch_cap is not None:
        sched = engine.scheduler
        setter = getattr(sched, "set_batch_cap", None)
        if setter is not None:
            setter(t.batch_cap)
        else:
            sched.config.max_num_seqs = t.batch_cap
    if t.watermark is not None:
        setter = getattr(engine.kv, "set_watermark", None)
        if setter is not None:
            setter(t.watermark)
