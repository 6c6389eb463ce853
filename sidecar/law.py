"""The control law: observations in, new batch cap, retention watermark and step token budget out.

Pure (no I/O, no clock: event times are passed in), so the simulator reuses it unchanged.

Batch cap: AIMD that starts at the memory-derived maximum and probes past it while the pool shows room. The
memory-derived maximum is the cap the device pool holds at the observed footprint of a request:
floor(fill x pool blocks / blocks per running request), fill the middle of the KV band [kv_band_low,
kv_band_high] (default 0.85-0.95), the footprint counting what a running request holds plus the rest of its
prompt. Until a request has been seen, the cap is the settings' initial, else what the pool holds at the
engine's max context, else the engine's own cap; the first footprint places it at the memory-derived maximum
(reason memory_derived_start, on the event path: within a second of the first request). The estimate errs
low (it counts every prefilling row's whole prompt, and more rows share more prefixes), so it is where the
cap starts and where a cut lands, not a ceiling: the measured KV use and preemptions bound the raises. A
preemption swaps a row to the host tier and resumes it from there, so a rare one costs less than a smaller
batch: preemptions up to preemption_share of the requests finished in the period stop the raises but do not
cut (on W5 CPU a fixed cap of 16 with 29 preemptions in 1,198 requests served 1.07x the coordinator that cut
on every preemption). Each period, in order:
  1. out-of-memory events, preemptions past that share, KV use above the band -> cut multiplicatively
     (cap x cut_factor, at most down to the memory-derived maximum), at once; so does a TTFT objective
     missed while KV use is in the band and the cap binds: raising cannot fix that breach (ttft_memory_bound);
  2. preemptions within the tolerated share -> hold (preemptions_tolerated: the pool is at its edge);
  3. a TTFT objective missed while requests queue and KV is below the band -> raise (ttft_objective);
  4. requests queue (more than max_queue_depth), the cap binds (running reached cap_binding x cap), KV is
     below the band, no rejections -> the memory-derived maximum rose by footprint_shift since the cap was
     last placed (the traffic changed: re-place, footprint_shift), else raise additively
     (queued_kv_headroom);
  5. otherwise hold (the reason says which condition failed; KV use in the band: kv_in_band). A footprint
     that grows (chat turns to documents) fills the pool past the band or preempts, and rule 1 cuts.
Raises add ceil(raise_fraction x memory-derived maximum) (the cap itself before one is known), at most
max_step, up to the settings' maximum, and wait hysteresis_periods periods after a cut (reason cooldown).
Cuts and placements are not bounded by max_step.
Event path (between periods, on two consecutive samples, at most one event decision per event_cooldown_s):
a preemption burst (event_preemptions or more) cuts (preemption_burst); a queue that grew by
event_queue_growth x cap or more, with the cap binding and KV below the band, raises (queue_surge).
Watermark:
  1. out-of-memory events or preemptions past the tolerated share -> lower (working memory wins); preemptions
     within that share -> hold (preemptions_tolerated: the pool is at its edge, so no larger reserve either);
  2. requests queue below the cap, hardly any row prefills (prefill is not what keeps them), and the
     running rows' KV use and the watermark reach kv_band_low -> lower at once (the reserve is what holds
     them back: reserve_holds_queue);
  3. heavy load (queued, or the cap binding with KV in the band or above) and a hit rate >= hit_good
     -> raise after hysteresis_periods (protect hot prefixes), while KV use plus the raised watermark
     stays a step below kv_band_low (else no_room_for_reserve);
  4. light load (nothing queued, KV use below light_kv) -> lower after hysteresis_periods;
  5. otherwise hold.
Step token budget (the prefill chunk size), steered to the TPOT P50 objective (targets.tpot_p50_s; none:
hold the engine's own budget):
  1. below the decode floor (the most running rows plus the budget's min: decode rows take their tokens
     from the same budget, and prefills need room) -> raise (decode_floor);
  2. nothing prefilling or waiting -> hold (no_prefill_waiting);
  3. no row decoding -> raise (nothing_decoding);
  4. less than budget_settle_s since the budget last changed (the periods since x period_s) -> hold
     (settling: the TPOT P50 cannot show the change yet);
  5. TPOT P50 above the objective -> lower by cut_factor, at most max_step, not under the floor
     (tpot_objective);
  6. TPOT P50 below tpot_headroom x the objective -> raise by max_step, hysteresis_periods after a cut
     (tpot_headroom);
  7. otherwise hold (tpot_in_band, tpot_unknown).
The budget never goes above the engine's configured budget (its ceiling, from the snapshot).
Every change is clamped to [min, max]; a change the clamp swallows is a hold with reason "at_min"/"at_max".
The batch cap's max is the settings' or the engine's own cap at its start, whichever is higher: the CPU
default bound (64) must not cut an engine configured for more rows (the simulator's H200 runs 256).
Every decision carries the inputs it was taken on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from kvloop.engine.core.knobs import KNOBS as ENGINE_KNOBS
from kvloop.sidecar.settings import Bounds, Settings

# The knobs the laws steer, in the order of targets() and of their decisions. The engine has more
# (engine/core/knobs.py KNOBS: the speculation cap too); the coordinator writes the others by name
# (sidecar/coordinator.py), so a law's targets() zips against STEERED, never against the engine's KNOBS.
STEERED = ("batch_cap", "watermark", "step_token_budget")
assert set(STEERED) <= {k.name for k in ENGINE_KNOBS}, "a steered knob the control block does not carry"


@dataclass(frozen=True)
class Observation:
    """What happened over one period, or between two samples on the event path (the coordinator builds it
    from snapshots: sidecar.observe)."""

    queue_depth: float  # mean waiting requests
    running: float  # mean running requests
    kv_use: float  # mean device-pool use, 0..1
    preemptions: int = 0  # during the period
    rejections: int = 0
    oom_events: int = 0
    hit_rate: float | None = None  # prefix-cache token hit rate over the period; None: no queries
    ttft_p99_s: float | None = None
    running_max: float | None = None  # most running at any sample of the period (None: the mean)
    # the memory-derived maximum cap
    # device blocks per running request (held + rest of prompt); None: none ran
    footprint_blocks: float | None = None
    pool_blocks: int = 0  # device pool size in blocks
    # the step token budget
    num_decoding: float = 0.0  # mean rows decoding
    decoding_max: float | None = None  # most rows decoding at any sample (None: the mean)
    tpot_p50_s: float | None = None
    tpot_p99_s: float | None = None
    step_token_budget_max: int = 0  # the engine's configured budget, the knob's ceiling (0: unknown)
    # the event path
    queue_growth: float = 0.0  # waiting requests at the end less at the start
    seconds: float = 0.0  # how long the observation covers
    # reported with the decisions (the law does not steer on them)
    tier_hit_rates: Mapping[str, float] = field(default_factory=dict)  # each tier's hits / tokens asked of it
    requests_finished: int = 0
    tokens_generated: int = 0
    # SLO outcomes of the requests finished over the observation (engine.core.slo; aborts are not judged):
    # what the goodput and bandit laws steer on (sidecar.goodput)
    slo_good: int = 0
    slo_missed: Mapping[str, int] = field(default_factory=dict)  # MISS_REASONS -> requests
    slo_slack_count: int = 0  # judged requests with a first token
    slo_slack_mean: float | None = None  # their mean slack (1 instant, 0 at the bound, < 0 missed)
    # requests that arrived: finished + refused + growth of those waiting or running (the record has no
    # arrival counter; conservation gives it)
    requests_arrived: int = 0

    @property
    def slo_judged(self) -> int:
        return self.slo_good + sum(self.slo_missed.values())


@dataclass(frozen=True)
class Decision:
    knob: str  # one of STEERED
    old: float
    new: float
    reason: str
    inputs: Mapping[str, float | None] = field(default_factory=dict)  # what the decision was taken on
    trigger: str = "period"  # "period" | "event" | "start" (a new engine start)

    @property
    def changed(self) -> bool:
        return self.new != self.old

    @property
    def direction(self) -> int:
        return (self.new > self.old) - (self.new < self.old)


def memory_cap(pool_blocks: float, footprint_blocks: float, fill: float) -> int:
    """Requests of this footprint that fill this share of the pool (at least 1)."""
    # 0.9 x 1000 / 15 is 60
    return max(1, math.floor(fill * pool_blocks / max(footprint_blocks, 1e-9) + 1e-9))


def _inputs(**values: float | None) -> dict[str, float | None]:
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in values.items()}


class ControlLaw:
    def __init__(self, settings: Settings):
        self.given_settings = self.settings = settings  # settings: these, within the engine's own cap
        self.reset()

    @property
    def fill(self) -> float:
        """The pool share the memory-derived maximum aims at: the middle of the KV band."""
        p = self.settings.law
        return (p.kv_band_low + p.kv_band_high) / 2

    def reset(self, engine_cap: int | None = None, engine_watermark: float | None = None,
              engine_budget: int | None = None, start_cap: int | None = None,
              budget_ceiling: int | None = None) -> None:
        """Back to the initial targets (a new engine start), each clamped into its bounds. Batch cap: the
        settings' initial, else `start_cap` (what the pool holds at the engine's max context), else the
        engine's own cap, else the lower bound. Watermark and budget: the settings' initial, else the
        engine's own value. budget_ceiling: the engine's configured budget (the budget never goes above)."""
        self._engine_cap = engine_cap
        self.settings = s = self._with_engine_cap(self.given_settings)
        cap = next((c for c in (s.batch_cap.initial, start_cap, engine_cap) if c), s.batch_cap.min)
        mark = s.watermark.initial if s.watermark.initial is not None else engine_watermark
        self.budget_ceiling = budget_ceiling or None
        budget = s.step_token_budget.initial or engine_budget or self.budget_bounds.max
        self.batch_cap = int(s.batch_cap.clamp(cap))
        self.watermark = float(s.watermark.clamp(mark if mark is not None and mark == mark
                                                 else s.watermark.min))
        self.step_token_budget = int(self.budget_bounds.clamp(budget))
        self.memory_max: int | None = None  # the memory-derived maximum cap; None until a request is seen
        self.footprint_blocks: float | None = None
        # the memory-derived maximum the cap was last placed at (or the lowest since)
        self._anchor: int | None = None
        self._placed = False
        self._since_cut = self._since_budget_cut = s.law.hysteresis_periods  # periods since the last cut
        self._budget_periods = math.inf  # periods since the step budget last changed
        self._streak = {"w_up": 0, "w_down": 0}
        self._last_event = -math.inf
        self.quiet_periods = 0  # consecutive periods without a change

    def update_settings(self, settings: Settings) -> None:
        """New bounds apply at once (the current targets are clamped into them)."""
        self.given_settings = settings
        self.settings = settings = self._with_engine_cap(settings)
        self.batch_cap = int(settings.batch_cap.clamp(self.batch_cap))
        self.watermark = float(settings.watermark.clamp(self.watermark))
        self.step_token_budget = int(self.budget_bounds.clamp(self.step_token_budget))

    def _with_engine_cap(self, settings: Settings) -> Settings:
        """The settings with the batch cap's upper bound raised to the engine's own cap where that is higher:
        an engine configured for more rows (a GPU's 256) is not cut to the CPU default's 64 by the bound."""
        b, cap = settings.batch_cap, self._engine_cap
        if not cap or cap <= b.max:
            return settings
        return replace(settings, batch_cap=replace(b, max=cap))

    def targets(self) -> tuple[int, float, int]:
        """The steered knobs' values, in STEERED order."""
        return self.batch_cap, self.watermark, self.step_token_budget

    @property
    def budget_bounds(self) -> Bounds:
        """The settings' bounds of the step budget, capped by the engine's configured budget."""
        b = self.settings.step_token_budget
        if self.budget_ceiling is None or self.budget_ceiling >= b.max:
            return b
        return Bounds(min(b.min, self.budget_ceiling), self.budget_ceiling, b.max_step, b.initial)

    @property
    def converged(self) -> bool:
        return self.quiet_periods >= self.settings.law.converged_periods

    def decide(self, obs: Observation) -> list[Decision]:
        """One period: a decision per steered knob, in STEERED order."""
        self._observe(obs)
        self._since_cut += 1
        self._since_budget_cut += 1
        self._budget_periods += 1
        decisions = [self._cap(obs), self._watermark(obs), self._budget(obs)]
        self._apply(decisions)
        if decisions[-1].changed:
            self._budget_periods = 0
        self.quiet_periods = 0 if any(d.changed for d in decisions) else self.quiet_periods + 1
        return decisions

    def event(self, obs: Observation, now: float) -> list[Decision]:
        """Between periods, on the last two samples: the first footprint places the cap; a preemption burst
        cuts it; a surging queue raises it. At most one burst or surge decision per event_cooldown_s. Once the
        cap is placed, the memory-derived maximum moves with the periods only (two samples are too few)."""
        if not self._placed:
            self._observe(obs)
        d = None
        if not self._placed and self.memory_max is not None:
            d = self._place("memory_derived_start", self._cap_inputs(obs))
        elif now - self._last_event >= self.settings.law.event_cooldown_s:
            d = self._cap_event(obs)
            if d is not None:
                self._last_event = now
        if d is None:
            return []
        d = Decision(d.knob, d.old, d.new, d.reason, d.inputs, trigger="event")
        self._apply([d])
        if d.changed:
            self.quiet_periods = 0
        return [d]

    # ---- the memory-derived maximum -------------------------------------------------------------
    def _observe(self, o: Observation) -> None:
        if o.step_token_budget_max:
            self.budget_ceiling = o.step_token_budget_max
        if o.footprint_blocks and o.pool_blocks:
            self.footprint_blocks = o.footprint_blocks
            self.memory_max = memory_cap(o.pool_blocks, o.footprint_blocks, self.fill)
            if self._anchor is not None:
                self._anchor = min(self._anchor, self.memory_max)

    def _ceiling(self) -> int:
        """Where a placement puts the cap and the highest a cut leaves it: the memory-derived maximum within
        the bounds."""
        b = self.settings.batch_cap
        return int(b.clamp(self.memory_max if self.memory_max is not None else b.max))

    def _place(self, reason: str, inputs: dict) -> Decision:
        """The cap to the memory-derived maximum (a placement, not a step: max_step does not bound it)."""
        self._placed = True
        self._anchor = self.memory_max
        return Decision("batch_cap", self.batch_cap, self._ceiling(), reason, inputs)

    def _cap_inputs(self, o: Observation) -> dict:
        return _inputs(queue_depth=o.queue_depth, queue_growth=o.queue_growth, running=o.running,
                       running_max=o.running_max, kv_use=o.kv_use, preemptions=o.preemptions,
                       requests_finished=o.requests_finished, oom_events=o.oom_events,
                       rejections=o.rejections,
                       ttft_p99_s=o.ttft_p99_s, ttft_objective_s=self.settings.ttft_p99_s,
                       footprint_blocks=self.footprint_blocks, pool_blocks=o.pool_blocks,
                       memory_max=self.memory_max)

    # ---- batch cap ------------------------------------------------------------------------------
    def _cap(self, o: Observation) -> Decision:
        s, p, cap = self.settings, self.settings.law, self.batch_cap
        inputs = self._cap_inputs(o)
        ceiling = self._ceiling()
        if not self._placed and self.memory_max is not None:
            return self._place("memory_derived_start", inputs)
        binding = (o.running if o.running_max is None else o.running_max) >= p.cap_binding * cap
        headroom = o.kv_use < p.kv_band_low
        ttft_missed = s.ttft_p99_s is not None and o.ttft_p99_s is not None and o.ttft_p99_s > s.ttft_p99_s
        pressure = ("oom" if o.oom_events else "preemptions" if self._preempting(o)
                    else "kv_above_band" if o.kv_use > p.kv_band_high
                    else "ttft_memory_bound" if ttft_missed and not headroom and binding and o.queue_depth > 0
                    else None)
        if pressure:
            return self._cut(pressure, inputs)
        if o.preemptions:
            return Decision("batch_cap", cap, cap, "preemptions_tolerated", inputs)
        if ttft_missed and o.queue_depth > 0 and headroom and not o.rejections:
            return self._raise("ttft_objective", inputs)
        queued = o.queue_depth > s.max_queue_depth
        if not queued or not headroom or not binding or o.rejections:
            why = ("no_queue" if not queued else "kv_in_band" if not headroom
                   else "cap_not_binding" if not binding else "rejections")
            return Decision("batch_cap", cap, cap, why, inputs)
        if (self.memory_max is not None and self._anchor is not None and cap < ceiling
                and self.memory_max > self._anchor * (1 + p.footprint_shift)):
            return self._place("footprint_shift", inputs)
        return self._raise("queued_kv_headroom", inputs)

    def _cap_event(self, o: Observation) -> Decision | None:
        s, p, cap = self.settings, self.settings.law, self.batch_cap
        if o.oom_events or o.preemptions >= p.event_preemptions:
            return self._cut("preemption_burst", self._cap_inputs(o))
        binding = (o.running if o.running_max is None else o.running_max) >= p.cap_binding * cap
        surge = o.queue_growth >= max(1.0, p.event_queue_growth * cap) and o.queue_depth > s.max_queue_depth
        if (surge and binding and o.kv_use < p.kv_band_low and not o.rejections
                and self._since_cut >= p.hysteresis_periods and cap < s.batch_cap.max):
            return self._raise("queue_surge", self._cap_inputs(o))
        return None

    def _cut(self, reason: str, inputs: dict) -> Decision:
        """Multiplicative decrease (not bounded by max_step), never above the memory-derived maximum."""
        cap = self.batch_cap
        self._since_cut = 0
        new = int(self.settings.batch_cap.clamp(min(math.floor(cap * self.settings.law.cut_factor),
                                                    self._ceiling())))
        return Decision("batch_cap", cap, new, reason if new != cap else "at_min", inputs)

    def _preempting(self, o: Observation) -> bool:
        """Preemptions past the tolerated share of the requests that finished over the observation."""
        return o.preemptions > self.settings.law.preemption_share * o.requests_finished

    def _raise(self, reason: str, inputs: dict) -> Decision:
        """Additive increase: a share of the memory-derived maximum, at most max_step, up to the settings'
        maximum (callers raise only while KV use is below the band: the pool, not the estimate, bounds it)."""
        s, p, cap = self.settings, self.settings.law, self.batch_cap
        if self._since_cut < p.hysteresis_periods:
            return Decision("batch_cap", cap, cap, "cooldown", inputs)
        step = min(s.batch_cap.max_step, max(1, math.ceil(p.raise_fraction * (self.memory_max or cap))))
        new = min(cap + step, s.batch_cap.max)
        if new <= cap:
            return Decision("batch_cap", cap, cap, "at_max", inputs)
        return Decision("batch_cap", cap, int(new), reason, inputs)

    # ---- watermark ------------------------------------------------------------------------------
    def _watermark(self, o: Observation) -> Decision:
        s, p, w = self.settings, self.settings.law, self.watermark
        inputs = _inputs(queue_depth=o.queue_depth, running=o.running, running_max=o.running_max,
                         num_decoding=o.num_decoding, kv_use=o.kv_use, hit_rate=o.hit_rate,
                         preemptions=o.preemptions,
                         requests_finished=o.requests_finished, oom_events=o.oom_events)
        if o.oom_events or o.preemptions:
            self._streak["w_up"] = self._streak["w_down"] = 0
            if o.oom_events or self._preempting(o):
                return self._move("watermark", w, w - s.watermark.max_step, s.watermark,
                                  "oom" if o.oom_events else "preemptions", inputs)
            # tolerated ones, as the cap holds on them: a pool at its edge gets no larger reserve
            return Decision("watermark", w, w, "preemptions_tolerated", inputs)
        queued = o.queue_depth > s.max_queue_depth
        cap_binds = (o.running if o.running_max is None else o.running_max) >= p.cap_binding * self.batch_cap
        # mean rows prefilling: under one, prefill is not the bottleneck
        prefilling = o.running - o.num_decoding
        if queued and not cap_binds and prefilling < 1 and o.kv_use + w >= p.kv_band_low:
            # requests wait below the cap, no prefill keeps them, and the running rows and the reserve fill
            # the pool: the reserve is what holds them back
            self._streak["w_up"] = self._streak["w_down"] = 0
            return self._move("watermark", w, w - s.watermark.max_step, s.watermark, "reserve_holds_queue",
                              inputs)
        heavy = queued or (o.running >= p.cap_binding * self.batch_cap and o.kv_use >= p.kv_band_low)
        light = o.queue_depth == 0 and o.kv_use < p.light_kv
        if heavy and o.hit_rate is not None and o.hit_rate >= p.hit_good:
            # a larger reserve must leave the rows room, with a step to spare (hysteresis against rule 2)
            if o.kv_use + w + 2 * s.watermark.max_step > p.kv_band_low:
                self._streak["w_up"] = 0
                return Decision("watermark", w, w, "no_room_for_reserve", inputs)
            return self._streaked("w_up", "w_down", w + s.watermark.max_step, "heavy_load_good_hits", inputs)
        if light:
            return self._streaked("w_down", "w_up", w - s.watermark.max_step, "light_load", inputs)
        self._streak["w_up"] = self._streak["w_down"] = 0
        return Decision("watermark", w, w, "heavy_load_poor_hits" if heavy else "moderate_load", inputs)

    def _streaked(self, key: str, other: str, target: float, reason: str, inputs: dict) -> Decision:
        self._streak[other] = 0
        self._streak[key] += 1
        if self._streak[key] < self.settings.law.hysteresis_periods:
            return Decision("watermark", self.watermark, self.watermark, "hysteresis", inputs)
        self._streak[key] = 0
        return self._move("watermark", self.watermark, target, self.settings.watermark, reason, inputs)

    # ---- step token budget ----------------------------------------------------------------------
    def _budget(self, o: Observation) -> Decision:
        s, p, b = self.settings, self.settings.law, self.step_token_budget
        bounds = self.budget_bounds
        floor = self.decode_floor(o)
        decoding = o.num_decoding if o.decoding_max is None else o.decoding_max
        objective = s.tpot_p50_s
        inputs = _inputs(tpot_p50_s=o.tpot_p50_s, tpot_objective_s=objective, num_decoding=o.num_decoding,
                         queue_depth=o.queue_depth, running=o.running, decode_floor=floor, ceiling=bounds.max)
        if objective is None:
            return Decision("step_token_budget", b, b, "no_tpot_objective", inputs)
        if b < floor:
            return self._move("step_token_budget", b, floor, bounds, "decode_floor", inputs)
        if o.queue_depth <= 0 and o.running <= o.num_decoding:
            return Decision("step_token_budget", b, b, "no_prefill_waiting", inputs)
        if decoding <= 0:
            return self._move("step_token_budget", b, bounds.max, bounds, "nothing_decoding", inputs)
        if o.tpot_p50_s is None:
            return Decision("step_token_budget", b, b, "tpot_unknown", inputs)
        if self._budget_periods * s.period_s < p.budget_settle_s:
            return Decision("step_token_budget", b, b, "settling", inputs)
        if o.tpot_p50_s > objective:
            self._since_budget_cut = 0
            target = max(floor, math.floor(b * p.cut_factor))
            return self._move("step_token_budget", b, target, bounds, "tpot_objective", inputs)
        if o.tpot_p50_s < p.tpot_headroom * objective:
            if self._since_budget_cut < p.hysteresis_periods:
                return Decision("step_token_budget", b, b, "cooldown", inputs)
            return self._move("step_token_budget", b, bounds.max, bounds, "tpot_headroom", inputs)
        return Decision("step_token_budget", b, b, "tpot_in_band", inputs)

    def decode_floor(self, o: Observation) -> int:
        """The least step budget: the most running rows (each decode row takes a token of it) plus the
        budget's min (room for prefills)."""
        bounds = self.budget_bounds
        rows = o.running if o.running_max is None else o.running_max
        return int(bounds.clamp(math.ceil(rows) + bounds.min))

    # ---- shared ---------------------------------------------------------------------------------
    def _apply(self, decisions: list[Decision]) -> None:
        for d in decisions:
            setattr(self, d.knob, float(d.new) if d.knob == "watermark" else int(d.new))

    @staticmethod
    def _move(knob: str, old: float, target: float, bounds: Bounds, reason: str, inputs: dict) -> Decision:
        step = bounds.max_step
        new = min(old + step, max(old - step, target))  # bounded step
        new = bounds.clamp(new)
        new = round(new, 6) if knob == "watermark" else int(new)
        if new == old:
            up = target > old or (target == old and old >= bounds.max)
            return Decision(knob, old, old, "at_max" if up else "at_min", inputs)
        return Decision(knob, old, new, reason, inputs)
