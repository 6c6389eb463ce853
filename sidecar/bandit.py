"""The learning law: a contextual bandit over a small grid of knob settings, keyed by the load regime.

Pure (no I/O, no clock; seeded), a SafeLaw (sidecar.goodput): the same start values, placement, event-path
burst cut and safety rules as the other laws, applied every period before the bandit's choice.

Arms: every combination of bandit.cap_factors (times the memory-derived cap; before the first request, the
start cap), bandit.budget_factors (times the step budget at the engine's start, within the budget's bounds and
not under the decode floor) and bandit.watermark_offsets (added to the watermark at the start). After a
safety cut the cap's arms are held to the cut value for hysteresis_periods x arm_periods periods.
Regime (the context), from the period's Observation: idle (nothing queued or running: no choice, no
reward), light (under one request waiting on average), queued (more, KV use below the band) or saturated
(KV use in the band or above); times prefill (at least PREFILL_HEAVY of the running rows prefill) or decode.
An arm plays arm_periods periods; the first settles (unless the arm repeats the targets already set), each
later one rewards the arm in the regime it was chosen in with the period's goodput share (sidecar.goodput:
good over judged plus the arrivals not served) when at least bandit.min_judged requests were judged, else the
proxy (the mean SLO slack, clipped to [0, 1]: the farther inside the SLO, the better), else nothing. A period
with a safety or event-path change rewards nothing. The next arm is UCB1's: untried arms first (the start
values' arm, then a seeded order), then the largest mean + explore x sqrt(2 ln n_regime / n_arm); exploration
decays as the counts grow. Decisions say explore (an arm other than the best mean) or exploit, with the
regime, the arm and its statistics.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass

from kvloop.sidecar.goodput import SafeLaw, Tally
from kvloop.sidecar.law import STEERED, Decision, Observation
from kvloop.sidecar.settings import BanditParams

PREFILL_HEAVY = 0.25  # share of the running rows prefilling that makes a period prefill-heavy


@dataclass(frozen=True)
class Arm:
    cap_factor: float
    budget_factor: float
    watermark_offset: float


def arms(p: BanditParams) -> tuple[Arm, ...]:
    return tuple(Arm(*a) for a in itertools.product(p.cap_factors, p.budget_factors, p.watermark_offsets))


def regime(o: Observation, kv_band_low: float) -> str:
    if o.queue_depth < 0.5 and o.running < 0.5:
        return "idle"
    load = "light" if o.queue_depth < 1 else "saturated" if o.kv_use >= kv_band_low else "queued"
    prefilling = max(0.0, o.running - o.num_decoding)
    return f"{load}/{'prefill' if o.running and prefilling >= PREFILL_HEAVY * o.running else 'decode'}"


def reward(o: Observation, p: BanditParams) -> float | None:
    """The period's goodput share, else the proxy (mean slack in [0, 1]), else None (nothing to judge)."""
    t = Tally().add(o)
    if t.judged >= p.min_judged and t.share is not None:
        return t.share
    return None if t.slack is None else min(1.0, max(0.0, t.slack))


class BanditLaw(SafeLaw):
    def reset(self, *args, **kwargs) -> None:
        super().reset(*args, **kwargs)
        p = self.params
        self.arms = arms(p)
        self._rng = random.Random(p.seed)
        self._stats: dict[str, list[list[float]]] = {}  # regime -> per arm [reward sum, count]
        self._order: dict[str, list[int]] = {}  # regime -> the order untried arms are played in
        self._start_cap, self._start_watermark = self.batch_cap, self.watermark
        self._start_budget = self.step_token_budget
        self.arm: int | None = None
        self.arm_regime: str | None = None
        self._played = 0
        self._settle = False
        self._cap_limit: int | None = None
        self._limit_periods = 0

    @property
    def params(self) -> BanditParams:
        return self.settings.bandit

    def mean(self, regime: str, arm: int) -> float | None:
        """The arm's mean reward in the regime (None: never rewarded there)."""
        total, n = self._stats.get(regime, {arm: (0.0, 0)})[arm]
        return total / n if n else None

    def decide(self, obs: Observation) -> list[Decision]:
        old = self.targets()
        why: dict[str, str] = {}
        moved = self._protect(obs, why)
        self._hold_cap_limit("batch_cap" in moved and why["batch_cap"] != "memory_derived_start")
        info: dict[str, float | str | None] = {"arm": self.arm, "arm_regime": self.arm_regime}
        disturbed, self._disturbed = self._disturbed, False
        if self.arm is not None:
            self._played += 1
            r = None if disturbed or (self._settle and self._played == 1) else reward(obs, self.params)
            if r is not None:
                stat = self._stats[self.arm_regime][self.arm]
                stat[0] += r
                stat[1] += 1
            info["reward"] = None if r is None else round(r, 4)
        now = regime(obs, self.settings.law.kv_band_low)
        info["regime"] = now
        default = "arm_playing"
        if now == "idle":
            default = "idle"
        elif moved:
            default = "safety_first"  # the next choice waits for a period the safety rules leave alone
        elif self.arm is None or self._played >= self.params.arm_periods:
            default = self._choose(now, obs, why, info)
        return self._decisions(old, obs, why, info, default)

    def event(self, obs: Observation, now: float) -> list[Decision]:
        decisions = super().event(obs, now)
        self._hold_cap_limit(any(d.knob == "batch_cap" and d.reason == "preemption_burst" and d.changed
                                 for d in decisions), count=False)
        return decisions

    def _hold_cap_limit(self, cut: bool, count: bool = True) -> None:
        """After a safety cut the cap's arms stay at or under the cut value for a while (`count`: a period
        passed)."""
        if cut:
            self._cap_limit = self.batch_cap
            self._limit_periods = self.settings.law.hysteresis_periods * self.params.arm_periods
        elif self._limit_periods > 0:
            self._limit_periods -= int(count)
        else:
            self._cap_limit = None

    def _choose(self, now: str, obs: Observation, why: dict, info: dict) -> str:
        stats = self._stats.setdefault(now, [[0.0, 0] for _ in self.arms])
        order = self._order.get(now)
        if order is None:
            rest = [i for i in range(len(self.arms)) if i != self._home()]
            self._rng.shuffle(rest)
            order = self._order[now] = [self._home(), *rest]
        total = sum(n for _, n in stats)
        untried = [i for i in order if stats[i][1] == 0]
        means = {i: s / n for i, (s, n) in enumerate(stats) if n}
        if untried:
            pick, reason = untried[0], "bandit_explore"
        else:
            c = self.params.explore
            ucb = {i: means[i] + c * math.sqrt(2 * math.log(total) / stats[i][1]) for i in order}
            pick = max(order, key=lambda i: ucb[i])  # ties: the first in the seeded order
            best = max(order, key=lambda i: means[i])
            reason = "bandit_exploit" if means[pick] >= means[best] else "bandit_explore"
            info["ucb"] = round(ucb[pick], 4)
        arm = self.arms[pick]
        info.update(arm=pick, arm_regime=now, cap_factor=arm.cap_factor, budget_factor=arm.budget_factor,
                    watermark_offset=arm.watermark_offset, arm_count=stats[pick][1],
                    arm_mean=None if pick not in means else round(means[pick], 4), regime_count=total)
        before = self.targets()
        self._set(arm, obs)
        self.arm, self.arm_regime, self._played = pick, now, 0
        self._settle = self.targets() != before
        for k, b, a in zip(STEERED, before, self.targets(), strict=True):
            if a != b:
                why[k] = reason
        return reason

    def _home(self) -> int:
        """The arm nearest the start values (factors 1, offset 0)."""
        return min(range(len(self.arms)), key=lambda i: (abs(math.log(self.arms[i].cap_factor))
                                                         + abs(math.log(self.arms[i].budget_factor))
                                                         + abs(self.arms[i].watermark_offset)))

    def _set(self, arm: Arm, o: Observation) -> None:
        s = self.settings
        center = self._ceiling() if self.memory_max is not None else self._start_cap
        cap = max(1, round(center * arm.cap_factor))
        if self._cap_limit is not None:
            cap = min(cap, self._cap_limit)
        self.batch_cap = int(s.batch_cap.clamp(cap))
        self.watermark = round(float(s.watermark.clamp(self._start_watermark + arm.watermark_offset)), 6)
        budget = max(self.decode_floor(o), round(self._start_budget * arm.budget_factor))
        self.step_token_budget = int(self.budget_bounds.clamp(budget))
