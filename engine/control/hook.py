"""The engine's end of the loop: after every step, publish the snapshot and apply the targets.

Duck-typed against EngineCore (no torch import here). The batch cap and the step token budget go to
the scheduler (its setters when it has them, else `config.max_num_seqs` / `config.max_num_batched_tokens`);
the watermark to `engine.kv.set_watermark` when the KV manager has that method.

TTFT is taken at each request's first token; TPOT (time per output token after the first) at its finish,
over its whole decode: the same per-request TPOT the benchmarks report, so the step budget is steered to
the number it is judged by."""

from __future__ import annotations

import os

from kvloop.engine.control.link import ControlLink
from kvloop.engine.control.percentiles import RecentPercentiles
from kvloop.engine.control.records import Targets


def request_tpot(first_token_time: float | None, finished_time: float | None, num_output_tokens: int) -> float | None:
    """Seconds per output token after the first; None when there is no second token (or no times)."""
    if first_token_time is None or finished_time is None or num_output_tokens < 2:
        return None
    return max(0.0, finished_time - first_token_time) / (num_output_tokens - 1)


class EngineControl:
    """`after_step` runs on the engine's thread after every step, empty ones included: the server's engine
    thread steps every IDLE_TICK_S while idle (engine/server/async_engine.py), so the snapshot stays fresh
    and the targets are polled while nothing runs. That one thread is the block's only writer."""

    def __init__(self, link: ControlLink):
        self.link = link
        self.ttft = RecentPercentiles()
        self.tpot = RecentPercentiles()
        self.applied: Targets | None = None

    @classmethod
    def attach(cls, engine, path: str | os.PathLike, stale_after_s: float = 120.0) -> EngineControl:
        """Opens (or creates) the block with the engine's configured values as the defaults."""
        config = engine.scheduler.config
        defaults = Targets(batch_cap=config.max_num_seqs, watermark=getattr(engine.kv, "watermark", None),
                           step_token_budget=getattr(config, "max_num_batched_tokens", None))
        return cls(ControlLink(path, defaults, stale_after_s=stale_after_s))

    def after_step(self, engine, outputs) -> None:
        for out in outputs:
            if out.num_output_tokens == 1 and out.first_token_time is not None:
                self.ttft.add(out.first_token_time - out.arrival_time)
            if out.finished and out.finish_reason != "error":
                tpot = request_tpot(out.first_token_time, out.finished_time, out.num_output_tokens)
                if tpot is not None:
                    self.tpot.add(tpot)
        self.link.publish(engine.snapshot(), self.ttft.p50_p99(), self.tpot.p50_p99())
        targets = self.link.poll_targets()
        if targets is not None and not targets.same_values(self.applied):
            apply_targets(engine, targets)
            self.applied = targets

    def close(self) -> None:
        self.link.close()


def apply_targets(engine, t: Targets) -> None:
    sched = engine.scheduler
    if t.batch_cap is not None:
        setter = getattr(sched, "set_batch_cap", None)
        if setter is not None:
            setter(t.batch_cap)
        else:
            sched.config.max_num_seqs = t.batch_cap
    if t.step_token_budget is not None:
        setter = getattr(sched, "set_step_token_budget", None)
        if setter is not None:
            setter(t.step_token_budget)  # clamped there to what the scheduler can run
        else:
            sched.config.max_num_batched_tokens = t.step_token_budget
    if t.watermark is not None:
        setter = getattr(engine.kv, "set_watermark", None)
        if setter is not None:
            setter(t.watermark)
