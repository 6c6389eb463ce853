"""The engine's end of the loop: after every step, publish the snapshot and apply the targets.

Duck-typed against EngineCore (no torch import here): targets are written to the engine's live knobs,
`engine.scheduler.knobs` (engine/core/knobs.py), which the scheduler, its speculator and the KV manager
read.

TTFT is taken at each request's first token; TPOT (time per output token after the first) at its finish,
over its whole decode: the same per-request TPOT the benchmarks report, so the step budget is steered to
the number it is judged by."""

from __future__ import annotations

import os
from dataclasses import asdict

from kvloop.engine.control.link import ControlLink
from kvloop.engine.control.percentiles import RecentPercentiles
from kvloop.engine.control.records import Targets
from kvloop.engine.core.knobs import Knobs
from kvloop.engine.core.slo import request_tpot


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
        """Opens (or creates) the block with the knobs' configured values as the defaults."""
        defaults = Targets(**asdict(engine.scheduler.knobs.configured))
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
    """The targets' values to the engine's live knobs (None: keep); the step budget is clamped there to what
    the scheduler can run."""
    knobs: Knobs = engine.scheduler.knobs
    knobs.set(**t.knob_values())
