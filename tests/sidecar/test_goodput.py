"""The goodput law on synthetic objectives: it climbs, undoes a bad step, holds without traffic, rolls back
exactly, and keeps the safety rules."""

from __future__ import annotations

import math
from dataclasses import replace

from kvloop.sidecar.goodput import GoodputLaw, Tally, judge
from kvloop.sidecar.law import Observation, memory_cap
from kvloop.sidecar.settings import Bounds, Settings, TrialParams

S = Settings(law_kind="goodput", batch_cap=Bounds(1, 128, 8, None), watermark=Bounds(0.0, 0.8, 0.1, None),
             step_token_budget=Bounds(64, 8192, 256, None))
POOL = 1000
FOOTPRINT = 0.9 * POOL / 32  # the memory-derived cap: 32
assert memory_cap(POOL, FOOTPRINT, 0.9) == 32


def law_at(budget: int = 512, watermark: float = 0.1, settings: Settings = S) -> GoodputLaw:
    law = GoodputLaw(settings)
    law.reset(engine_cap=8, engine_watermark=watermark, engine_budget=budget, budget_ceiling=8192)
    return law


def period(law: GoodputLaw, share: float, judged: int = 2000, slack: float | None = None,
           **extra) -> Observation:
    """A period of the synthetic service: `judged` requests finished, `share` of them good."""
    good = round(share * judged)
    return Observation(queue_depth=2, running=min(law.batch_cap, 20), num_decoding=10, kv_use=0.5,
                       footprint_blocks=FOOTPRINT, pool_blocks=POOL, slo_good=good,
                       slo_missed={"ttft": judged - good, "tpot": 0, "failed": 0}, slo_slack_count=judged,
                       slo_slack_mean=slack if slack is not None else share - 0.5, requests_arrived=judged,
                       requests_finished=judged, **extra)


def peaked(law: GoodputLaw) -> float:
    """Goodput share with a peak at budget 2048 and cap 40; the watermark does not matter."""
    cap, _, budget = law.targets()
    return 0.9 - 0.1 * abs(math.log2(budget / 2048)) - 0.005 * abs(cap - 40)


def test_climbs_to_the_peak_within_a_bounded_number_of_periods():
    law = law_at(budget=512)
    seen, kept, periods = [], set(), 0
    while periods < 120:
        periods += 1
        ds = law.decide(period(law, peaked(law)))
        assert [d.knob for d in ds] == ["batch_cap", "watermark", "step_token_budget"]
        assert all(d.reason and "slo_judged" in d.inputs for d in ds)  # every decision explained
        seen += [d for d in ds if d.changed]
        kept |= {d.inputs["kept"] for d in ds if "kept" in d.inputs}
        if law._rest:  # a round of trials found nothing better: converged
            break
    assert periods <= 60  # 57 here: three kept steps, seven trials undone
    cap, watermark, budget = law.targets()
    assert budget == 2048 and abs(cap - 40) <= round(40 * (S.trial.cap_step - 1)) and watermark == 0.1
    assert kept == {"step_token_budget+", "batch_cap+"}
    assert seen[0].reason == "memory_derived_start" and seen[0].new == 32  # starts where the rules law does


def test_a_step_that_made_goodput_worse_is_undone_at_the_next_judgement():
    law = law_at(budget=2048)
    law.decide(period(law, peaked(law)))  # places the cap (a change: a fresh baseline follows)
    law.batch_cap = 40
    reasons = []
    while law.trial is None:
        reasons.append(law.decide(period(law, peaked(law)))[2].reason)
    assert law.trial.knob == "step_token_budget" and law.step_token_budget == 4096  # up first
    law.decide(period(law, peaked(law)))  # settling: not judged
    d = law.decide(period(law, peaked(law)))[2]  # the first judgement
    assert d.reason == "trial_worse_early" and (d.old, d.new) == (4096, 2048)
    assert d.inputs["verdict"] == "worse" and d.inputs["metric"] == "goodput_share"


ROLLBACKS = {"trial_no_gain", "trial_rolled_back", "trial_worse_early", "trial_too_little_traffic"}


def test_noise_free_rollback_restores_the_previous_values_exactly():
    # flat in every knob: each trial ends without a gain and is rolled back
    law = law_at(budget=1000, watermark=0.3)
    law.decide(period(law, 0.7))
    start = law.targets()
    rolled = []
    for _ in range(60):
        before = law.targets()
        for d in law.decide(period(law, 0.7)):
            if d.reason in ROLLBACKS:
                rolled.append(d)
                assert law.targets() == start and d.new == getattr(law, d.knob)
        assert law.targets() in (start, before) or law.trial is not None
    assert {d.reason for d in rolled} == {"trial_no_gain"}
    assert {d.knob for d in rolled} == {"batch_cap", "watermark", "step_token_budget"}
    assert law.targets() == start and law.watermark == 0.3  # exactly, not approximately


def test_holds_with_too_little_traffic():
    law = law_at(budget=512)
    law.decide(period(law, 0.9))
    start = law.targets()
    for _ in range(40):
        ds = law.decide(period(law, 0.0, judged=0))
        assert not any(d.changed for d in ds)
    assert law.targets() == start and ds[0].reason == "too_little_traffic"


def test_a_trial_waits_for_traffic_then_rolls_back():
    law = law_at(budget=2048)
    law.decide(period(law, 0.8))
    while law.trial is None:
        law.decide(period(law, 0.8))
    old = law.trial.old
    reasons = [law.decide(period(law, 0.0, judged=0))[2].reason for _ in range(S.trial.max_wait_periods + 1)]
    assert "waiting_for_traffic" in reasons and reasons[-1] == "trial_too_little_traffic"
    assert law.step_token_budget == old


def test_the_proxy_judges_at_low_traffic():
    # 5 requests a period: too few for the goodput share, enough for the mean slack
    settings = replace(S, trial=TrialParams(min_judged=50))
    law = law_at(budget=512, settings=settings)
    for _ in range(80):
        law.decide(period(law, 1.0, judged=5, slack=peaked(law)))
        if law._rest:
            break
    assert law.step_token_budget == 2048


def test_goodput_share_is_normalised_by_load():
    p = TrialParams(noise_z=0.0)
    # twice the arrivals, the same share: no effect of the knob
    assert judge(Tally(1, 80, 100), Tally(1, 160, 200), p).outcome == "no_gain"
    # as many good, but the queue grew by 100 (arrivals not served): worse
    base, trial = Tally(1, 80, 100), Tally(1, 80, 100, queue_growth=100.0)
    assert trial.share == 0.4 and judge(base, trial, p).outcome == "worse"
    # a queue that drains does not inflate the share; refusals count as missed
    assert Tally(1, 80, 100, queue_growth=-50.0).share == 0.8 and Tally(1, 80, 100, refused=60).share == 0.5
    # too few requests: the proxy; fewer still: nothing to judge
    assert judge(Tally(1, 2, 3, slack_sum=1.5, slack_count=3), Tally(1, 3, 3, slack_sum=2.4, slack_count=3),
                 TrialParams()).metric == "slack"
    assert judge(Tally(1, 1, 1), Tally(1, 1, 1), TrialParams()).outcome == "too_little_traffic"


def test_noise_term_needs_a_larger_rise_with_few_requests():
    p = TrialParams(margin=0.0, noise_z=2.0, min_judged=10)
    assert judge(Tally(1, 50, 100), Tally(1, 56, 100), p).outcome == "no_gain"  # 6 points, SE 7 points
    assert judge(Tally(1, 5000, 10000), Tally(1, 5600, 10000), p).outcome == "better"


def test_safety_cuts_during_a_trial_and_restores_the_trial_knob():
    law = law_at(budget=2048)
    law.decide(period(law, 0.8))
    while law.trial is None:
        law.decide(period(law, 0.8))
    knob, old, cap = law.trial.knob, law.trial.old, law.batch_cap
    ds = law.decide(period(law, 0.8, preemptions=500))
    assert ds[0].reason == "preemptions" and law.batch_cap == math.floor(cap * S.law.cut_factor)
    assert law.trial is None and getattr(law, knob) == old
    assert next(d for d in ds if d.knob == knob).reason == "trial_interrupted"
    # the event path: a burst cuts; the next period starts a fresh baseline
    law2 = law_at(budget=2048)
    law2.decide(period(law2, 0.8))
    assert law2.event(period(law2, 0.8, preemptions=5), now=100.0)[0].reason == "preemption_burst"
    assert law2.decide(period(law2, 0.8))[0].reason == "fresh_baseline"


def test_budget_never_below_the_decode_floor_nor_above_the_ceiling():
    law = law_at(budget=128)
    ds = law.decide(period(law, 0.8, running_max=100))
    assert ds[2].reason == "decode_floor" and law.step_token_budget == 100 + S.step_token_budget.min
    law = GoodputLaw(S)
    law.reset(engine_budget=512, budget_ceiling=512)
    law.decide(period(law, 0.8))
    for _ in range(30):
        law.decide(period(law, 0.8))
        assert law.step_token_budget <= 512
