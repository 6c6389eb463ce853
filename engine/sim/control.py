"""The sidecar's coordinator in virtual time: the same Steering (period window, event path, and the law the
settings name: rules, goodput or bandit; sidecar.steering, unchanged) as the real one, fed with the engine
snapshot mapped through the control block's own record mapping, with TTFT and TPOT percentiles kept as the
engine hook keeps them, sampled at the real coordinator's rate (min(1 s, period/4)), deciding once a period
and on events between, and applied as the engine hook applies targets: to the scheduler's live knobs (batch
cap, watermark, step token budget), which its KV manager shares."""

from __future__ import annotations

from dataclasses import asdict

from kvloop.engine.control.percentiles import RecentPercentiles
from kvloop.engine.control.records import control_record, pack_record, unpack_record
from kvloop.engine.core.knobs import Knobs
from kvloop.engine.core.slo import request_tpot
from kvloop.engine.core.snapshot import EngineSnapshot
from kvloop.sidecar.law import ControlLaw, Decision
from kvloop.sidecar.settings import Settings
from kvloop.sidecar.steering import Steering


class VirtualCoordinator:
    def __init__(self, settings: Settings, start: float = 0.0):
        self.settings = settings
        self.steer = Steering(settings)
        self.sample_every = min(1.0, settings.period_s / 4)
        self.next_sample = start
        self.next_tick = start + settings.period_s
        self.ttft = RecentPercentiles()  # what the engine hook summarises
        self.tpot = RecentPercentiles()
        self.decisions: list[dict] = []
        self.ticks: list[float] = []
        self._started = False

    @property
    def law(self) -> ControlLaw:
        return self.steer.law

    def next_event(self) -> float:
        return min(self.next_sample, self.next_tick)

    def record_ttft(self, ttft: float) -> None:
        self.ttft.add(ttft)

    def record_finish(self, seq, now: float) -> None:
        """A finished request's TPOT, as the engine hook takes it from the request's output."""
        tpot = request_tpot(seq.first_token_time, now, seq.num_output_tokens)
        if tpot is not None:
            self.tpot.add(tpot)

    def advance(self, now: float, engine_snapshot, scheduler, kv=None) -> None:
        """Runs every sample and tick due by `now` (the engine calls this between steps). The targets go to
        scheduler.knobs, which the KV manager shares: `kv` is not needed."""
        knobs = scheduler.knobs
        while now >= self.next_event():
            if self.next_sample <= self.next_tick:
                self._sample(self.next_sample, engine_snapshot(), knobs)
                self.next_sample += self.sample_every
            else:
                self._tick(self.next_tick, knobs)
                self.next_tick += self.settings.period_s

    def _sample(self, t: float, snap: EngineSnapshot, knobs: Knobs) -> None:
        # Through the control block's record and its bytes, so the law sees exactly the fields it would.
        rec = unpack_record(pack_record(control_record(snap, self.ttft.p50_p99(), self.tpot.p50_p99(),
                                                       start_id=1)))
        if not self._started:  # the coordinator's engine_start: the initial targets
            self._started = True
            self._decided(t, self.steer.start(rec, first=True), knobs)
        events = self.settings.mode != "off" and self.settings.event_path
        self._decided(t, self.steer.sample(rec, t, events=events), knobs)

    def _tick(self, t: float, knobs: Knobs) -> None:
        self.ticks.append(t)
        if self.settings.mode == "off":
            self.steer.skip()
            return
        self._decided(t, self.steer.tick(), knobs)

    def _decided(self, t: float, decisions: list[Decision], knobs: Knobs) -> None:
        for d in decisions:
            self.decisions.append({"t": round(t, 3), **asdict(d)})
        if decisions and self.settings.mode == "enforce":
            knobs.set(*self.law.targets())  # as the engine hook's apply_targets does
