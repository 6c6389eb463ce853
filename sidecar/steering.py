"""Snapshots in, decisions out: the period window, the event window (the last two samples) and the law.

No I/O and no clock of its own (sample times are passed in), so the sidecar's coordinator and the
simulator's virtual one steer the same way; they differ only in where records come from and where the
targets go."""

from __future__ import annotations

from kvloop.engine.control.records import ControlRecord
from kvloop.sidecar.bandit import BanditLaw
from kvloop.sidecar.goodput import GoodputLaw
from kvloop.sidecar.law import STEERED, ControlLaw, Decision, Observation
from kvloop.sidecar.observe import PeriodWindow, start_cap
from kvloop.sidecar.settings import Settings

LAW_CLASSES: dict[str, type[ControlLaw]] = {"rules": ControlLaw, "goodput": GoodputLaw, "bandit": BanditLaw}


def make_law(settings: Settings) -> ControlLaw:
    """The law the settings name (`law`: rules, goodput or bandit)."""
    return LAW_CLASSES[settings.law_kind](settings)


class Steering:
    def __init__(self, settings: Settings):
        self.law = make_law(settings)
        self.window = PeriodWindow()
        self.last: ControlRecord | None = None  # the previous sample (the event window's start)
        self.last_obs: Observation | None = None  # the last period's observation
        self._start_args: dict | None = None  # what the law was last reset with (a new engine start)

    def update_settings(self, settings: Settings) -> None:
        """New settings; another law starts over from the engine's start, then takes the current targets
        and memory estimate (no jump)."""
        if settings.law_kind == self.law.settings.law_kind:
            self.law.update_settings(settings)
            return
        old, self.law = self.law, make_law(settings)
        if self._start_args is not None:
            self.law.reset(**self._start_args)
        law = self.law
        law.batch_cap, law.watermark, law.step_token_budget = old.targets()
        law.memory_max, law.footprint_blocks = old.memory_max, old.footprint_blocks
        law._placed, law._anchor = old._placed, old._anchor
        law.update_settings(settings)

    def start(self, rec: ControlRecord, first: bool) -> list[Decision]:
        """A new engine start: back to the initial targets, the period and event windows started over."""
        old = self.law.targets()
        law = self.law
        cap0 = start_cap(rec, law.fill)
        self._start_args = dict(engine_cap=rec.batch_cap, engine_watermark=rec.watermark,
                                engine_budget=rec.step_token_budget, start_cap=cap0,
                                budget_ceiling=rec.step_token_budget_max)
        law.reset(**self._start_args)
        self.window, self.last = PeriodWindow(), None
        inputs = {"engine_batch_cap": rec.batch_cap, "start_cap": cap0, "pool_blocks": rec.kv_blocks_total,
                  "max_model_len": rec.max_model_len, "engine_watermark": round(rec.watermark, 4),
                  "engine_step_token_budget": rec.step_token_budget,
                  "step_token_budget_max": rec.step_token_budget_max}
        reason = "engine_start" if first else "engine_restart"
        return [Decision(k, o, n, reason, inputs, trigger="start")
                for k, o, n in zip(STEERED, old, law.targets(), strict=True)]

    def sample(self, rec: ControlRecord, now: float, events: bool = True) -> list[Decision]:
        """Adds a sample to the period; with `events`, the event path looks at it and the one before. A change
        there starts the period window over at this sample, so the next periodic decision judges what followed
        (a preemption burst is not punished twice)."""
        prev, self.last = self.last, rec
        self.window.add(rec)
        if not events:
            return []
        short = PeriodWindow(prev or rec)  # the first sample of a start: no counter deltas, but its footprint
        short.add(rec)
        decisions = self.law.event(short.observation(), now)
        if any(d.changed for d in decisions):  # counters from this sample on; its gauges count
            self.window = PeriodWindow(rec)
            self.window.add(rec)
        return decisions

    def tick(self) -> list[Decision]:
        """Ends a period: a decision per knob (holds when the period had no sample)."""
        obs = self.window.observation()
        self.window = self.window.next()
        if obs is None:
            return self.hold("no_samples")
        self.last_obs = obs
        return self.law.decide(obs)

    def skip(self) -> None:
        """Ends a period without deciding (mode off)."""
        self.window = self.window.next()

    def hold(self, reason: str) -> list[Decision]:
        """A decision per knob that keeps its value (e.g. the snapshot is stale)."""
        return [Decision(k, v, v, reason) for k, v in zip(STEERED, self.law.targets(), strict=True)]
