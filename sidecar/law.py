"""The control law: one period's observation in, new batch cap and retention watermark out.

Pure (no I/O, no clock), so the simulator reuses it unchanged. Per period, for each knob, in order:

Batch cap (KV band [low, high], default 0.85-0.95):
  1. out-of-memory events, preemptions, or KV use above the band -> cut multiplicatively
     (cap * cut_factor), at once;
  2. a TTFT objective is missed while requests queue and KV is below the band -> raise at once
     (queueing is what the cap can fix);
  3. requests queue (more than max_queue_depth), the cap binds (running reached cap_binding * cap),
     KV is below the band, no rejections -> raise by raise_fraction of the cap once the condition
     has held for hysteresis_periods periods;
  4. otherwise hold (the reason says which condition failed).
Watermark:
  1. out-of-memory events or preemptions -> lower (working memory wins);
  2. heavy load (queued, or the cap binding with KV in the band or above) and a hit rate >= hit_good
     -> raise after hysteresis_periods (protect hot prefixes);
  3. light load (nothing queued, KV use below light_kv) -> lower after hysteresis_periods;
  4. otherwise hold.
Every change is at most max_step and clamped to [min, max]; a change that the clamp swallows is a
hold with reason "at_min"/"at_max". A cut resets the opposite streaks (hysteresis between
directions).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from kvloop.sidecar.settings import Settings


@dataclass(frozen=True)
class Observation:
    """What happened over one period (the coordinator builds it from snapshots)."""

    queue_depth: float  # mean waiting requests
    running: float  # mean running requests
    kv_use: float  # mean device-pool use, 0..1
    preemptions: int = 0  # during the period
    rejections: int = 0
    oom_events: int = 0
    hit_rate: float | None = None  # prefix-cache token hit rate over the period; None: no queries
    ttft_p99_s: float | None = None
    running_max: float | None = None  # most running at any sample of the period (None: the mean)
    # reported with the decisions (the law does not steer on them yet)
    tier_hit_rates: Mapping[str, float] = field(default_factory=dict)  # each tier's hits / tokens asked of it
    requests_finished: int = 0
    tokens_generated: int = 0


@dataclass(frozen=True)
class Decision:
    knob: str  # "batch_cap" | "watermark"
    old: float
    new: float
    reason: str

    @property
    def changed(self) -> bool:
        return self.new != self.old

    @property
    def direction(self) -> int:
        return (self.new > self.old) - (self.new < self.old)


class ControlLaw:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.reset()

    def reset(self, engine_cap: int | None = None, engine_watermark: float | None = None) -> None:
        """Back to the initial targets (a new engine start): the settings' initial values, else the
        engine's own (from its snapshot), else the lower bound; clamped into the bounds."""
        s = self.settings
        cap = s.batch_cap.initial if s.batch_cap.initial is not None else engine_cap
        mark = s.watermark.initial if s.watermark.initial is not None else engine_watermark
        self.batch_cap = int(s.batch_cap.clamp(cap if cap else s.batch_cap.min))
        self.watermark = float(s.watermark.clamp(mark if mark is not None and mark == mark else s.watermark.min))
        self._streak = {"cap_up": 0, "w_up": 0, "w_down": 0}
        self.quiet_periods = 0  # consecutive periods without a change

    def update_settings(self, settings: Settings) -> None:
        """New bounds apply at once (the current targets are clamped into them)."""
        self.settings = settings
        self.batch_cap = int(settings.batch_cap.clamp(self.batch_cap))
        self.watermark = float(settings.watermark.clamp(self.watermark))

    @property
    def converged(self) -> bool:
        return self.quiet_periods >= self.settings.law.converged_periods

    def decide(self, obs: Observation) -> list[Decision]:
        decisions = [self._cap(obs), self._watermark(obs)]
        self.batch_cap = int(decisions[0].new)
        self.watermark = float(decisions[1].new)
        self.quiet_periods = 0 if any(d.changed for d in decisions) else self.quiet_periods + 1
        return decisions

    # ---- batch cap ------------------------------------------------------------------------------
    def _cap(self, o: Observation) -> Decision:
        s, p, cap = self.settings, self.settings.law, self.batch_cap
        pressure = ("oom" if o.oom_events else "preemptions" if o.preemptions
                    else "kv_above_band" if o.kv_use > p.kv_band_high else None)
        if pressure:
            self._streak["cap_up"] = 0
            return self._move("batch_cap", cap, math.floor(cap * p.cut_factor), s.batch_cap, pressure)
        headroom = o.kv_use < p.kv_band_low
        queued = o.queue_depth > s.max_queue_depth
        ttft_missed = s.ttft_p99_s is not None and o.ttft_p99_s is not None and o.ttft_p99_s > s.ttft_p99_s
        up = cap + max(1, math.ceil(cap * p.raise_fraction))
        if ttft_missed and o.queue_depth > 0 and headroom and not o.rejections:
            self._streak["cap_up"] = 0
            return self._move("batch_cap", cap, up, s.batch_cap, "ttft_objective")
        binding = (o.running if o.running_max is None else o.running_max) >= p.cap_binding * cap
        if not queued or not headroom or not binding or o.rejections:
            self._streak["cap_up"] = 0
            why = ("no_queue" if not queued else "kv_in_band" if not headroom
                   else "cap_not_binding" if not binding else "rejections")
            return Decision("batch_cap", cap, cap, why)
        self._streak["cap_up"] += 1
        if self._streak["cap_up"] < p.hysteresis_periods:
            return Decision("batch_cap", cap, cap, "hysteresis")
        self._streak["cap_up"] = 0
        return self._move("batch_cap", cap, up, s.batch_cap, "queued_kv_headroom")

    # ---- watermark ------------------------------------------------------------------------------
    def _watermark(self, o: Observation) -> Decision:
        s, p, w = self.settings, self.settings.law, self.watermark
        if o.oom_events or o.preemptions:
            self._streak["w_up"] = self._streak["w_down"] = 0
            return self._move("watermark", w, w - s.watermark.max_step, s.watermark,
                              "oom" if o.oom_events else "preemptions")
        heavy = (o.queue_depth > s.max_queue_depth
                 or (o.running >= p.cap_binding * self.batch_cap and o.kv_use >= p.kv_band_low))
        light = o.queue_depth == 0 and o.kv_use < p.light_kv
        if heavy and o.hit_rate is not None and o.hit_rate >= p.hit_good:
            return self._streaked("w_up", "w_down", w + s.watermark.max_step, "heavy_load_good_hits")
        if light:
            return self._streaked("w_down", "w_up", w - s.watermark.max_step, "light_load")
        self._streak["w_up"] = self._streak["w_down"] = 0
        return Decision("watermark", w, w, "heavy_load_poor_hits" if heavy else "moderate_load")

    def _streaked(self, key: str, other: str, target: float, reason: str) -> Decision:
        self._streak[other] = 0
        self._streak[key] += 1
        if self._streak[key] < self.settings.law.hysteresis_periods:
            return Decision("watermark", self.watermark, self.watermark, "hysteresis")
        self._streak[key] = 0
        return self._move("watermark", self.watermark, target, self.settings.watermark, reason)

    @staticmethod
    def _move(knob: str, old: float, target: float, bounds, reason: str) -> Decision:
        step = bounds.max_step
        new = min(old + step, max(old - step, target))  # bounded step
        new = bounds.clamp(new)
        if knob == "batch_cap":
            new = int(new)
        else:
            new = round(new, 6)
        if new == old:
            return Decision(knob, old, old, "at_max" if target > old else "at_min")
        return Decision(knob, old, new, reason)
