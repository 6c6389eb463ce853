"""The goodput law: trials of one knob step each, kept when more requests met the SLO, rolled back when not.

Pure (no I/O, no clock; events passed in), a ControlLaw in all it shares with the rule-based law: the start
values (the settings' initials, else what the pool holds at the engine's max context, then the memory-derived
maximum at the first request), the event path's placement and preemption-burst cut, and the safety rules,
which act every period before any trial: out-of-memory events, preemptions past the tolerated share and KV
use above the band cut the cap (never above the memory-derived maximum), the first two also lower the
watermark; a step budget below the decode floor is raised to it; the budget never goes above the engine's
configured budget.

The objective. A window's score is its goodput share: the good requests over those judged plus the arrivals
not served (refused, or left waiting: the growth of the queue) over the window's periods. It is goodput
normalised by the load, so that a change of the arrival rate between two windows is not taken for a knob's
effect: in a steady state it is the share of the requests that met the SLO (goodput over the arrival rate);
under overload, where the queue grows, the arrivals not served count against it, so a knob that serves more
per second scores higher. (Arrivals themselves are not the denominator: the requests in flight at a window's
edges swing with the arrivals' timing, which reads as misses when every request was good.) Two windows are
compared on it when each judged at least trial.min_judged requests; else on the proxy, the mean SLO slack of
the requests with a first token (at least trial.min_proxy in each window); else there is too little traffic to
judge.

The trials, one period at a time:
  1. baseline: the last window_periods periods at the current values; when they hold traffic enough, a trial
     starts, else the law holds (too_little_traffic);
  2. a trial moves one knob one step (the cap times or over cap_step, at least one request, up only while
     KV use is below the band; the watermark plus or minus watermark_step; the budget times or over
     budget_step, not under the decode floor), waits settle_periods (the requests finishing then were
     admitted before the move), then gathers a window;
  3. judged against the baseline: kept when the score rose by more than the margin (goodput share: margin +
     noise_z standard errors of the difference; proxy: proxy_margin), else rolled back to the exact previous
     value (worse, or no_gain: a move that does not clearly help is not kept). A trial clearly worse before
     its window is full is rolled back at once (trial_worse_early). With too little traffic the window
     grows, up to max_wait_periods, then the trial is rolled back (trial_too_little_traffic);
  4. a kept trial's window is the next baseline and the same knob moves again the same way; after a
     rollback the next (knob, direction) in the rotation follows, after a fresh baseline. A round of trials
     with none kept rests rest_periods before the next round.
A safety change or an event-path change during a trial ends it: its knob goes back (unless the safety rule
moved it) and a fresh baseline starts. Every decision carries the windows' figures it was taken on.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from kvloop.sidecar.law import STEERED, ControlLaw, Decision, Observation, _inputs
from kvloop.sidecar.settings import Settings, TrialParams

# the rotation of trials: the step budget first (the knob that decides goodput on unseen traffic, issue 57)
PAIRS: tuple[tuple[str, int], ...] = (("step_token_budget", 1), ("step_token_budget", -1), ("batch_cap", 1),
                                      ("batch_cap", -1), ("watermark", 1), ("watermark", -1))


@dataclass
class Tally:
    """SLO outcomes summed over periods."""

    periods: int = 0
    good: int = 0
    judged: int = 0
    refused: int = 0
    queue_growth: float = 0.0  # waiting requests at the end less at the start (the periods chain)
    arrived: int = 0  # reported, not scored: its in-flight part swings with the arrivals' timing
    slack_sum: float = 0.0
    slack_count: int = 0

    def add(self, o: Observation) -> Tally:
        self.periods += 1
        self.good += o.slo_good
        self.judged += o.slo_judged
        self.refused += o.rejections
        self.queue_growth += o.queue_growth
        self.arrived += o.requests_arrived
        if o.slo_slack_mean is not None:
            self.slack_sum += o.slo_slack_mean * o.slo_slack_count
            self.slack_count += o.slo_slack_count
        return self

    @staticmethod
    def of(periods) -> Tally:
        t = Tally()
        for o in periods:
            t.add(o)
        return t

    @property
    def requests(self) -> float:
        """What the share is taken over: the requests judged, plus the arrivals not served (refused, or
        left waiting: the queue's growth)."""
        return self.judged + self.refused + max(0.0, self.queue_growth)

    @property
    def share(self) -> float | None:
        return self.good / self.requests if self.requests else None

    @property
    def slack(self) -> float | None:
        return self.slack_sum / self.slack_count if self.slack_count else None

    def enough(self, p: TrialParams) -> bool:
        return self.judged >= p.min_judged or self.slack_count >= p.min_proxy


@dataclass(frozen=True)
class Verdict:
    outcome: str  # better | worse | no_gain | too_little_traffic
    metric: str | None = None  # goodput_share | slack
    base: float | None = None
    trial: float | None = None
    threshold: float = 0.0  # the rise a trial must beat (and the fall that makes it worse)


def judge(base: Tally, trial: Tally, p: TrialParams) -> Verdict:
    """The trial window against the baseline window (see the module's docstring)."""
    if base.judged >= p.min_judged and trial.judged >= p.min_judged:
        b, t = base.share or 0.0, trial.share or 0.0
        se = math.sqrt(b * (1 - b) / base.requests + t * (1 - t) / trial.requests)
        metric, threshold = "goodput_share", p.margin + p.noise_z * se
    elif base.slack_count >= p.min_proxy and trial.slack_count >= p.min_proxy:
        b, t = base.slack or 0.0, trial.slack or 0.0
        metric, threshold = "slack", p.proxy_margin
    else:
        return Verdict("too_little_traffic")
    outcome = "better" if t - b > threshold else "worse" if b - t > threshold else "no_gain"
    return Verdict(outcome, metric, round(b, 6), round(t, 6), round(threshold, 6))


@dataclass(frozen=True)
class Trial:
    knob: str
    direction: int
    old: float  # the value a rollback restores, exactly


class SafeLaw(ControlLaw):
    """What the goodput and bandit laws share with the rule-based one: its start, its placement, its
    event-path burst cut (not its surge raise: a raise is theirs to choose) and its safety rules."""

    def reset(self, *args, **kwargs) -> None:
        super().reset(*args, **kwargs)
        self._disturbed = False  # a change since the last period that was not the law's own choice

    def _cap_event(self, o: Observation) -> Decision | None:
        if o.oom_events or o.preemptions >= self.settings.law.event_preemptions:
            return self._cut("preemption_burst", self._cap_inputs(o))
        return None

    def event(self, obs: Observation, now: float) -> list[Decision]:
        decisions = super().event(obs, now)
        if any(d.changed for d in decisions):
            self._disturbed = True
        return decisions

    def _protect(self, o: Observation, why: dict[str, str]) -> set[str]:
        """The placement at the first footprint and the safety rules, applied; the knobs they moved. After
        one of them (or an event-path change) `_disturbed` is set."""
        self._observe(o)
        self._since_cut += 1
        out = []
        if not self._placed and self.memory_max is not None:
            out.append(self._place("memory_derived_start", {}))
        pressure = ("oom" if o.oom_events else "preemptions" if self._preempting(o)
                    else "kv_above_band" if o.kv_use > self.settings.law.kv_band_high else None)
        if pressure:
            out.append(self._cut(pressure, {}))
        if pressure in ("oom", "preemptions"):
            w = self.settings.watermark
            out.append(self._move("watermark", self.watermark, self.watermark - w.max_step, w, pressure, {}))
        floor = self.decode_floor(o)
        if self.step_token_budget < floor:
            out.append(Decision("step_token_budget", self.step_token_budget, floor, "decode_floor"))
        moved = [d for d in out if d.changed]
        self._apply(moved)
        for d in moved:
            why[d.knob] = d.reason
        if moved:
            self._disturbed = True
        return {d.knob for d in moved}

    def _decision(self, knob: str, old: float, o: Observation, reason: str, info: dict) -> Decision:
        inputs = _inputs(queue_depth=o.queue_depth, running=o.running, num_decoding=o.num_decoding,
                         kv_use=o.kv_use, preemptions=o.preemptions, oom_events=o.oom_events,
                         slo_good=o.slo_good, slo_judged=o.slo_judged, requests_arrived=o.requests_arrived,
                         slo_slack_mean=o.slo_slack_mean, memory_max=self.memory_max,
                         decode_floor=self.decode_floor(o), ceiling=self.budget_bounds.max)
        inputs.update(info)
        return Decision(knob, old, getattr(self, knob), reason, inputs)

    def _decisions(self, old: tuple, o: Observation, why: dict[str, str], info: dict,
                   default: str) -> list[Decision]:
        decisions = [self._decision(k, v, o, why.get(k, default), info)
                     for k, v in zip(STEERED, old, strict=True)]
        self.quiet_periods = 0 if any(d.changed for d in decisions) else self.quiet_periods + 1
        return decisions


class GoodputLaw(SafeLaw):
    def reset(self, *args, **kwargs) -> None:
        super().reset(*args, **kwargs)
        self._new_baseline(settle=0)
        self.trial: Trial | None = None
        self._pair = 0
        self._no_gain: set[tuple[str, int]] = set()  # pairs tried (or moot) since the last kept trial
        self._rest = 0

    def update_settings(self, settings: Settings) -> None:
        super().update_settings(settings)
        self._base = deque(self._base, maxlen=settings.trial.window_periods)

    @property
    def params(self) -> TrialParams:
        return self.settings.trial

    def _new_baseline(self, settle: int) -> None:
        self._base: deque[Observation] = deque(maxlen=self.settings.trial.window_periods)
        self._window: list[Observation] = []
        self._settle = settle

    # ---- one period -------------------------------------------------------------------------------
    def decide(self, obs: Observation) -> list[Decision]:
        old = self.targets()
        why: dict[str, str] = {}
        info: dict[str, float | str | None] = {}
        moved = self._protect(obs, why)
        if self._disturbed:
            self._interrupt(why, moved)
            info["phase"] = "fresh_baseline"
        else:
            self._trial_step(obs, why, info)
        return self._decisions(old, obs, why, info, str(info.get("phase", "hold")))

    def _interrupt(self, why: dict, moved: set[str]) -> None:
        """A change not of the trial's making: the trial's knob back (unless safety moved it), a fresh
        baseline."""
        self._disturbed = False
        t, self.trial = self.trial, None
        if t is not None and t.knob not in moved:
            setattr(self, t.knob, t.old)
            why[t.knob] = "trial_interrupted"
        self._new_baseline(self.params.settle_periods)

    def _trial_step(self, obs: Observation, why: dict, info: dict) -> None:
        p = self.params
        if self._settle > 0:
            self._settle -= 1
            info["phase"] = "settling"
            return
        if self._rest > 0:
            self._rest -= 1
            info["phase"] = "resting"
            return
        if self.trial is None:
            self._base.append(obs)
            base = Tally.of(self._base)
            info.update(phase="baseline", **_tally_inputs("base", base))
            if len(self._base) < p.window_periods:
                return
            if not base.enough(p):
                info["phase"] = "too_little_traffic"
                return
            self._start(obs, why, info)
            return
        self._window.append(obs)
        base, win = Tally.of(self._base), Tally.of(self._window)
        v = judge(base, win, p)
        info.update(phase="trial_window", trial_knob=self.trial.knob, trial_direction=self.trial.direction,
                    verdict=v.outcome, metric=v.metric, base_score=v.base, trial_score=v.trial,
                    threshold=v.threshold, **_tally_inputs("base", base), **_tally_inputs("trial", win))
        full = len(self._window) >= p.window_periods
        if v.outcome == "worse" and not full and v.metric == "goodput_share":
            self._rollback(why, "trial_worse_early")
        elif not full:
            return
        elif v.outcome == "better":
            self._keep(why, info)
            self._start(obs, why, info)
        elif v.outcome == "too_little_traffic" and len(self._window) < p.max_wait_periods:
            info["phase"] = "waiting_for_traffic"
        else:
            self._rollback(why, "trial_" + ("rolled_back" if v.outcome == "worse" else v.outcome))

    def _keep(self, why: dict, info: dict) -> None:
        t, self.trial = self.trial, None
        why[t.knob] = "trial_kept"
        info["kept"] = f"{t.knob}{'+' if t.direction > 0 else '-'}"
        self._no_gain = {(t.knob, -t.direction)}  # moving back would undo what was just measured better
        self._base = deque(self._window, maxlen=self.params.window_periods)
        self._window = []

    def _rollback(self, why: dict, reason: str) -> None:
        t, self.trial = self.trial, None
        setattr(self, t.knob, t.old)
        why[t.knob] = reason
        self._no_gain.add((t.knob, t.direction))
        self._pair = (PAIRS.index((t.knob, t.direction)) + 1) % len(PAIRS)
        self._new_baseline(self.params.settle_periods)

    def _start(self, obs: Observation, why: dict, info: dict) -> None:
        """The next (knob, direction) that moves, from the rotation; a round without any rests."""
        for i in range(len(PAIRS)):
            pair = PAIRS[(self._pair + i) % len(PAIRS)]
            if pair in self._no_gain:
                continue
            knob, direction = pair
            new = self._stepped(knob, direction, obs)
            if new == getattr(self, knob):
                self._no_gain.add(pair)  # at a bound: moot this round
                continue
            self._pair = PAIRS.index(pair)
            self.trial = Trial(knob, direction, getattr(self, knob))
            setattr(self, knob, new)
            why[knob] = "trial_up" if direction > 0 else "trial_down"
            self._window, self._settle = [], self.params.settle_periods
            return
        self._no_gain = set()
        self._rest = self.params.rest_periods
        self._new_baseline(settle=0)
        info["phase"] = "round_without_gain"

    def _stepped(self, knob: str, direction: int, o: Observation) -> float:
        """The knob one trial step away, within its bounds (the cap up only while the pool has room; the
        budget not under the decode floor)."""
        p, s = self.params, self.settings
        if knob == "batch_cap":
            cap = self.batch_cap
            if direction > 0:
                if o.kv_use >= s.law.kv_band_low or o.preemptions:
                    return cap
                return int(s.batch_cap.clamp(max(cap + 1, round(cap * p.cap_step))))
            return int(s.batch_cap.clamp(min(cap - 1, round(cap / p.cap_step))))
        if knob == "watermark":
            return round(s.watermark.clamp(self.watermark + direction * p.watermark_step), 6)
        b, bounds = self.step_token_budget, self.budget_bounds
        if direction > 0:
            return int(bounds.clamp(round(b * p.budget_step)))
        return int(bounds.clamp(max(self.decode_floor(o), round(b / p.budget_step))))


def _tally_inputs(prefix: str, t: Tally) -> dict:
    return {f"{prefix}_periods": t.periods, f"{prefix}_good": t.good, f"{prefix}_judged": t.judged,
            f"{prefix}_arrived": t.arrived, f"{prefix}_refused": t.refused,
            f"{prefix}_queue_growth": round(t.queue_growth, 2),
            f"{prefix}_share": None if t.share is None else round(t.share, 4),
            f"{prefix}_slack": None if t.slack is None else round(t.slack, 4)}
