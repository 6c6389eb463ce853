"""The control law on scripted metric traces: direction and bounds of every decision."""

from __future__ import annotations

import dataclasses

import pytest

from kvloop.sidecar.law import ControlLaw, Observation
from kvloop.sidecar.settings import Bounds, Settings

S = Settings(batch_cap=Bounds(2, 64, 8, 16), watermark=Bounds(0.0, 0.8, 0.1, 0.3))

HEAVY = Observation(queue_depth=20, running=16, kv_use=0.6, hit_rate=0.7)
LIGHT = Observation(queue_depth=0, running=2, kv_use=0.2, hit_rate=0.7)
COLD_FLOOD = Observation(queue_depth=40, running=16, kv_use=0.99, preemptions=5, hit_rate=0.0)
BURST = Observation(queue_depth=5, running=16, kv_use=0.9, preemptions=3, hit_rate=0.6)


def run(law: ControlLaw, trace: list[Observation]):
    out = []
    for obs in trace:
        cap, w = law.batch_cap, law.watermark
        cap_d, w_d = law.decide(obs)
        # bounds of every decision: within max_step of the previous value, inside the clamp
        assert (cap_d.old, w_d.old) == (cap, w)
        assert abs(cap_d.new - cap) <= S.batch_cap.max_step and S.batch_cap.min <= cap_d.new <= S.batch_cap.max
        assert abs(w_d.new - w) <= S.watermark.max_step + 1e-9 and S.watermark.min <= w_d.new <= S.watermark.max
        assert isinstance(cap_d.new, int) and cap_d.reason and w_d.reason
        out.append((cap_d, w_d))
    return out


def test_load_step_up_raises_cap_and_watermark_after_hysteresis():
    law = ControlLaw(S)
    ds = run(law, [HEAVY] * 8)
    assert [c.direction for c, _ in ds[:2]] == [0, 1]  # hysteresis: the raise comes on the 2nd period
    assert ds[0][0].reason == "hysteresis" and ds[1][0].reason == "queued_kv_headroom"
    assert all(c.direction >= 0 for c, _ in ds) and law.batch_cap > 16
    assert all(w.direction >= 0 for _, w in ds) and law.watermark > 0.3
    assert {w.reason for _, w in ds if w.changed} == {"heavy_load_good_hits"}


def test_cap_rises_to_the_bound_and_stops():
    law = ControlLaw(S)
    ds = run(law, [dataclasses.replace(HEAVY, running=64)] * 40)
    assert law.batch_cap == 64 and ds[-1][0].reason == "at_max" and not ds[-1][0].changed
    assert law.watermark == pytest.approx(0.8)


def test_load_step_down_lowers_watermark_and_holds_cap():
    law = ControlLaw(S)
    run(law, [HEAVY] * 6)
    cap = law.batch_cap
    ds = run(law, [LIGHT] * 16)
    assert all(c.direction == 0 and c.reason == "no_queue" for c, _ in ds)
    assert law.batch_cap == cap
    assert all(w.direction <= 0 for _, w in ds) and law.watermark == pytest.approx(0.0)
    assert ds[-1][1].reason == "at_min"
    assert law.converged


def test_cold_flood_cuts_at_once_and_lowers_watermark():
    law = ControlLaw(S)
    run(law, [HEAVY] * 6)
    before_cap, before_w = law.batch_cap, law.watermark
    ds = run(law, [COLD_FLOOD] * 3)
    assert all(c.direction == -1 and c.reason == "preemptions" for c, _ in ds)
    assert ds[0][0].new == max(before_cap - 8, int(before_cap * 0.75))  # multiplicative, step-bounded
    assert all(w.direction == -1 for _, w in ds) and law.watermark < before_w


def test_preemption_burst_then_recovery_waits_for_hysteresis():
    law = ControlLaw(S)
    ds = run(law, [BURST, BURST, HEAVY, HEAVY, HEAVY])
    assert [c.direction for c, _ in ds] == [-1, -1, 0, 1, 0]
    assert ds[2][0].reason == "hysteresis"


def test_kv_above_band_cuts_without_preemptions():
    law = ControlLaw(S)
    c, _ = law.decide(Observation(queue_depth=10, running=16, kv_use=0.97))
    assert c.direction == -1 and c.reason == "kv_above_band"


def test_oom_cuts():
    law = ControlLaw(S)
    c, w = law.decide(Observation(queue_depth=0, running=4, kv_use=0.3, oom_events=1))
    assert c.reason == "oom" and c.direction == -1 and w.direction == -1


def test_kv_in_band_holds_cap():
    law = ControlLaw(S)
    ds = run(law, [Observation(queue_depth=10, running=16, kv_use=0.9, hit_rate=0.1)] * 4)
    assert all(c.direction == 0 and c.reason == "kv_in_band" for c, _ in ds)
    assert all(w.reason == "heavy_load_poor_hits" and not w.changed for _, w in ds)


def test_no_raise_when_cap_does_not_bind_or_rejections():
    law = ControlLaw(S)
    ds = run(law, [dataclasses.replace(HEAVY, running=4)] * 4)
    assert all(c.reason == "cap_not_binding" and not c.changed for c, _ in ds)
    ds = run(law, [dataclasses.replace(HEAVY, rejections=2)] * 4)
    assert all(c.reason == "rejections" and not c.changed for c, _ in ds)


def test_ttft_objective_raises_at_once_when_queueing():
    law = ControlLaw(dataclasses.replace(S, ttft_p99_s=1.0))
    c, _ = law.decide(dataclasses.replace(HEAVY, ttft_p99_s=3.0))
    assert c.direction == 1 and c.reason == "ttft_objective"
    law2 = ControlLaw(dataclasses.replace(S, ttft_p99_s=1.0))  # objective met: the usual hysteresis
    c, _ = law2.decide(dataclasses.replace(HEAVY, ttft_p99_s=0.5))
    assert c.reason == "hysteresis"


def test_queue_tolerance_from_settings():
    law = ControlLaw(dataclasses.replace(S, max_queue_depth=30))
    ds = run(law, [HEAVY] * 4)  # 20 queued < 30 tolerated
    assert all(c.reason == "no_queue" for c, _ in ds)


def test_settings_update_clamps_and_reset_restores_initial():
    law = ControlLaw(S)
    run(law, [dataclasses.replace(HEAVY, running=64)] * 20)
    law.update_settings(dataclasses.replace(S, batch_cap=Bounds(2, 24, 8, 16)))
    assert law.batch_cap == 24
    law.reset()
    assert (law.batch_cap, law.watermark) == (16, 0.3)
