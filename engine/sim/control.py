"""The sidecar's coordinator in virtual time: the same PeriodWindow and ControlLaw as the real one
(sidecar.observe, sidecar.law, unchanged), fed with the engine snapshot mapped through the control
block's own record mapping, sampled at the real coordinator's rate (min(1 s, period/4)), deciding
once a period, and applied as the engine hook applies targets."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict
from types import SimpleNamespace

from kvloop.engine.control.hook import TTFT_WINDOW, apply_targets
from kvloop.engine.control.records import Targets, control_record, pack_record, unpack_record
from kvloop.engine.snapshot import EngineSnapshot
from kvloop.sidecar.law import ControlLaw
from kvloop.sidecar.observe import PeriodWindow
from kvloop.sidecar.settings import Settings


class VirtualCoordinator:
    def __init__(self, settings: Settings, start: float = 0.0):
        self.settings = settings
        self.law = ControlLaw(settings)
        self.window = PeriodWindow()
        self.sample_every = min(1.0, settings.period_s / 4)
        self.next_sample = start
        self.next_tick = start + settings.period_s
        self.ttfts: deque[float] = deque(maxlen=TTFT_WINDOW)  # what the engine hook summarises
        self.decisions: list[dict] = []
        self.ticks: list[float] = []
        self._started = False

    def next_event(self) -> float:
        return min(self.next_sample, self.next_tick)

    def record_ttft(self, ttft: float) -> None:
        self.ttfts.append(ttft)

    def _ttft_pcts(self) -> tuple[float, float]:
        if not self.ttfts:
            return math.nan, math.nan
        xs = sorted(self.ttfts)
        n = len(xs)
        return xs[(n - 1) // 2], xs[min(n - 1, math.ceil(0.99 * n) - 1)]

    def advance(self, now: float, engine_snapshot, scheduler, kv) -> None:
        """Runs every sample and tick due by `now` (the engine calls this between steps)."""
        while now >= self.next_event():
            if self.next_sample <= self.next_tick:
                self._sample(engine_snapshot(), scheduler, kv)
                self.next_sample += self.sample_every
            else:
                self._tick(self.next_tick, scheduler, kv)
                self.next_tick += self.settings.period_s

    def _sample(self, snap: EngineSnapshot, scheduler, kv) -> None:
        # Through the control block's record and its bytes, so the law sees exactly the fields it would.
        rec = unpack_record(pack_record(control_record(snap, *self._ttft_pcts(), start_id=1)))
        if not self._started:  # the coordinator's engine_start: initial targets from the engine's own
            self._started = True
            self.law.reset(rec.batch_cap, rec.watermark)
            self._apply(scheduler, kv)
        self.window.add(rec)

    def _tick(self, t: float, scheduler, kv) -> None:
        self.ticks.append(t)
        if self.settings.mode == "off":
            self.window = self.window.next()
            return
        obs = self.window.observation()
        self.window = self.window.next()
        if obs is None:
            return
        for d in self.law.decide(obs):
            self.decisions.append({"t": round(t, 3), **asdict(d)})
        if self.settings.mode == "enforce":
            self._apply(scheduler, kv)

    def _apply(self, scheduler, kv) -> None:
        """The engine hook's own apply_targets (duck-typed on .scheduler and .kv)."""
        apply_targets(SimpleNamespace(scheduler=scheduler, kv=kv), Targets(self.law.batch_cap, self.law.watermark))
