"""The control law on scripted metric traces: direction and bounds of every decision."""

from __future__ import annotations

import dataclasses
import math

import pytest

from kvloop.sidecar.law import ControlLaw, Observation
from kvloop.sidecar.settings import Bounds, Settings

S = Settings(batch_cap=Bounds(2, 64, 8, 16), watermark=Bounds(0.0, 0.8, 0.1, 0.3))

HEAVY = Observation(queue_depth=20, running=16, kv_use=0.3, hit_rate=0.7)
LIGHT = Observation(queue_depth=0, running=2, kv_use=0.2, hit_rate=0.7)
COLD_FLOOD = Observation(queue_depth=40, running=16, kv_use=0.99, preemptions=5, hit_rate=0.0)
BURST = Observation(queue_depth=5, running=16, kv_use=0.9, preemptions=3, hit_rate=0.6)


def run(law: ControlLaw, trace: list[Observation]):
    out = []
    for obs in trace:
        cap, w, budget = law.targets()
        cap_d, w_d, b_d = law.decide(obs)
        s = law.settings
        # bounds of every decision: raises within max_step (cuts are multiplicative), inside the clamp
        assert (cap_d.old, w_d.old, b_d.old) == (cap, w, budget)
        assert cap_d.new - cap <= s.batch_cap.max_step and s.batch_cap.min <= cap_d.new <= s.batch_cap.max
        if cap_d.direction < 0:
            assert cap_d.new == max(s.batch_cap.min, math.floor(cap * s.law.cut_factor))
        assert abs(w_d.new - w) <= s.watermark.max_step + 1e-9
        assert s.watermark.min <= w_d.new <= s.watermark.max
        assert abs(b_d.new - budget) <= s.step_token_budget.max_step
        assert isinstance(cap_d.new, int) and isinstance(b_d.new,
                                                         int) and cap_d.reason and w_d.reason and b_d.reason
        assert [d.knob for d in (cap_d, w_d, b_d)] == ["batch_cap", "watermark", "step_token_budget"]
        assert cap_d.inputs["queue_depth"] == obs.queue_depth and "tpot_p50_s" in b_d.inputs  # explained
        out.append((cap_d, w_d))
    return out


def test_load_step_up_raises_cap_at_once_and_watermark_after_hysteresis():
    law = ControlLaw(S)
    ds = run(law, [HEAVY] * 8)
    assert ds[0][0].reason == "queued_kv_headroom" and ds[0][0].new == 20  # additive: ceil(0.25 x 16)
    assert all(c.direction >= 0 for c, _ in ds) and law.batch_cap > 16
    assert ds[0][1].reason == "hysteresis" and ds[1][1].reason == "heavy_load_good_hits"
    assert all(w.direction >= 0 for _, w in ds) and law.watermark == pytest.approx(0.4)
    assert {w.reason for _, w in ds if w.changed} == {"heavy_load_good_hits"}
    assert ds[-1][1].reason == "no_room_for_reserve"  # 0.3 KV use + 0.5: the rows would lose their room


def test_cap_rises_to_the_bound_and_stops():
    law = ControlLaw(S)
    ds = run(law, [dataclasses.replace(HEAVY, running=64)] * 40)
    assert law.batch_cap == 64 and ds[-1][0].reason == "at_max" and not ds[-1][0].changed
    assert law.watermark == pytest.approx(0.4) and ds[-1][1].reason == "no_room_for_reserve"


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


def test_cold_flood_cuts_multiplicatively_at_once_and_lowers_watermark():
    law = ControlLaw(S)
    run(law, [HEAVY] * 6)
    before_cap, before_w = law.batch_cap, law.watermark
    ds = run(law, [COLD_FLOOD] * 3)
    assert all(c.direction == -1 and c.reason == "preemptions" for c, _ in ds)
    assert ds[0][0].new == int(before_cap * 0.75)  # multiplicative, not bounded by max_step
    assert before_cap - ds[0][0].new > S.batch_cap.max_step or before_cap < 40
    assert all(w.direction == -1 for _, w in ds) and law.watermark < before_w


def test_recovery_after_a_cut_is_additive_after_the_cooldown():
    law = ControlLaw(S)
    ds = run(law, [BURST, BURST, HEAVY, HEAVY, HEAVY])
    assert [c.direction for c, _ in ds] == [-1, -1, 0, 1, 1]
    assert ds[2][0].reason == "cooldown"
    steps = [c.new - c.old for c, _ in ds[3:]]
    assert steps[0] == steps[1]  # additive: the same step each period


def test_watermark_lowered_at_once_when_its_reserve_holds_the_queue():
    law = ControlLaw(S)  # watermark 0.3
    held = Observation(queue_depth=6, running=10, running_max=10, num_decoding=10, kv_use=0.6, hit_rate=0.9)
    _, w, _ = law.decide(held)  # below the cap, nothing prefilling, 0.6 + 0.3 of the pool taken
    assert (w.new, w.reason) == (0.2, "reserve_holds_queue")
    law = ControlLaw(S)
    # prefills keep the queue: not the reserve
    _, w, _ = law.decide(dataclasses.replace(held, num_decoding=7))
    assert not w.changed


def test_kv_above_band_cuts_without_preemptions():
    law = ControlLaw(S)
    c, _, _ = law.decide(Observation(queue_depth=10, running=16, kv_use=0.97))
    assert c.direction == -1 and c.reason == "kv_above_band"


def test_oom_cuts():
    law = ControlLaw(S)
    c, w, _ = law.decide(Observation(queue_depth=0, running=4, kv_use=0.3, oom_events=1))
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


def test_ttft_breach_raises_when_memory_has_room_and_cuts_when_memory_binds():
    law = ControlLaw(dataclasses.replace(S, ttft_p99_s=1.0))
    c, _, _ = law.decide(dataclasses.replace(HEAVY, ttft_p99_s=3.0))
    assert c.direction == 1 and c.reason == "ttft_objective"
    bound = ControlLaw(dataclasses.replace(S, ttft_p99_s=1.0))  # KV in the band: raising cannot fix it
    c, _, _ = bound.decide(dataclasses.replace(HEAVY, ttft_p99_s=3.0, kv_use=0.9))
    assert c.direction == -1 and c.reason == "ttft_memory_bound" and c.new == 12
    met = ControlLaw(dataclasses.replace(S, ttft_p99_s=1.0))  # objective met: the usual raise
    c, _, _ = met.decide(dataclasses.replace(HEAVY, ttft_p99_s=0.5))
    assert c.reason == "queued_kv_headroom"


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


# ---- the memory-derived maximum ----------------------------------------------------------------------
WIDE = Settings(batch_cap=Bounds(1, 512, 16, None))


def test_initial_cap_before_any_request_pool_and_max_context_else_engine_else_settings():
    law = ControlLaw(WIDE)
    law.reset(engine_cap=64, start_cap=120)
    assert law.batch_cap == 120 and law.memory_max is None  # what the pool holds at the engine's max context
    law.reset(engine_cap=64)
    assert law.batch_cap == 64  # no max context reported: the engine's own cap
    law = ControlLaw(dataclasses.replace(WIDE, batch_cap=Bounds(1, 512, 16, 32)))
    law.reset(engine_cap=64, start_cap=120)
    assert law.batch_cap == 32  # the settings' initial, until the first request


def test_first_footprint_places_the_cap_at_the_memory_derived_maximum():
    law = ControlLaw(dataclasses.replace(WIDE, batch_cap=Bounds(1, 512, 16, 32)))
    obs = Observation(queue_depth=50, running=4, running_max=4, kv_use=0.04, footprint_blocks=100.0,
                      pool_blocks=10_000)
    (d,) = law.event(obs, now=0.0)
    # 0.9 x 10000 / 100
    assert (d.old, d.new, d.reason, d.trigger) == (32, 90, "memory_derived_start", "event")
    assert d.inputs["footprint_blocks"] == 100.0 and d.inputs["memory_max"] == 90  # not a step: past max_step
    assert law.event(obs, now=0.5) == []  # placed once
    small = ControlLaw(dataclasses.replace(WIDE, batch_cap=Bounds(1, 64, 8, 32)))
    c, _, _ = small.decide(obs)  # the periodic path places it too; clamped into the bounds
    assert (c.new, c.reason) == (64, "memory_derived_start")


def test_footprint_growth_cuts_the_cap_to_the_memory_derived_maximum_once_the_pool_overfills():
    law = ControlLaw(WIDE)
    law.decide(Observation(queue_depth=5, running=50, kv_use=0.5, footprint_blocks=100.0, pool_blocks=10_000))
    assert law.batch_cap == 90
    c, _, _ = law.decide(Observation(queue_depth=5, running=50, kv_use=0.8, footprint_blocks=300.0,
                                     pool_blocks=10_000))
    # room in the pool: the estimate errs low (fewer rows share fewer prefixes), so it does not lower the cap
    assert (c.new, c.reason) == (90, "cap_not_binding")
    c, _, _ = law.decide(Observation(queue_depth=5, running=60, kv_use=0.9, footprint_blocks=300.0,
                                     pool_blocks=10_000))
    assert (c.new, c.reason) == (90, "kv_in_band")  # the pool at its target fill: hold
    c, _, _ = law.decide(Observation(queue_depth=5, running=60, kv_use=0.97, footprint_blocks=300.0,
                                     pool_blocks=10_000))
    assert (c.new, c.reason) == (30, "kv_above_band")  # overfilled: down to what the pool holds, at once
    room = Observation(queue_depth=5, running=30, kv_use=0.8, footprint_blocks=300.0, pool_blocks=10_000)
    c, _, _ = law.decide(room)
    assert (c.new, c.reason) == (30, "cooldown")
    c, _, _ = law.decide(room)
    # queued, and the pool shows room the estimate did not see: the measured KV use, not the estimate, bounds
    assert (c.new, c.reason) == (38, "queued_kv_headroom")  # ceil(0.25 x 30)


def test_raises_pass_the_memory_derived_maximum_until_the_pool_fills():
    law = ControlLaw(WIDE)
    law.reset(engine_cap=8)
    law._placed = True  # as if placed earlier: the raise path alone
    law._anchor = 10**6
    ds = []
    for _ in range(5):  # the estimate says 500 blocks a request (0.9 x 10000 / 500 = 18); they take 320
        cap = law.batch_cap
        ds.append(law.decide(Observation(queue_depth=20, running=cap, kv_use=cap * 320 / 10_000,
                                         footprint_blocks=500.0, pool_blocks=10_000))[0])
    assert [d.new for d in ds] == [13, 18, 23, 28, 28]  # steps of ceil(0.25 x 18)
    assert ds[-1].reason == "kv_in_band"  # 28 x 320 blocks: 0.9 of the pool


def test_rare_preemptions_hold_the_cap_and_many_cut_it():
    law = ControlLaw(S)  # cap 16, watermark 0.3
    c, w, _ = law.decide(dataclasses.replace(HEAVY, preemptions=4, requests_finished=40))
    assert (c.new, c.reason) == (16, "preemptions_tolerated") and not w.changed  # 4 <= 0.1 x 40
    assert (c.inputs["preemptions"], c.inputs["requests_finished"]) == (4, 40)  # explained
    c, w, _ = law.decide(dataclasses.replace(HEAVY, preemptions=5, requests_finished=40))
    assert (c.new, c.reason) == (12, "preemptions") and w.reason == "preemptions" and w.direction == -1
    strict = ControlLaw(dataclasses.replace(S, law=dataclasses.replace(S.law, preemption_share=0.0)))
    c, _, _ = strict.decide(dataclasses.replace(HEAVY, preemptions=1, requests_finished=40))
    assert c.reason == "preemptions"  # a share of 0 cuts on every preemption


def test_tolerated_preemptions_hold_the_watermark_too():
    law = ControlLaw(S)  # cap 16, watermark 0.3
    ds = run(law, [dataclasses.replace(HEAVY, preemptions=2, requests_finished=40)] * 4)
    assert all(w.reason == "preemptions_tolerated" and not w.changed for _, w in ds)  # HEAVY alone raises it
    assert all(c.reason == "preemptions_tolerated" for c, _ in ds) and law.watermark == pytest.approx(0.3)
    _, w = run(law, [HEAVY] * 2)[-1]
    assert w.reason == "heavy_load_good_hits" and w.direction == 1  # the streak starts afresh after them


class Plant:
    """A pool of 10,000 blocks; `demand` requests want to run, each of `footprint` blocks. Running requests
    are the cap's or the demand's, fewer; a pool filled past 95% preempts."""

    POOL = 10_000

    def __init__(self, law: ControlLaw):
        self.law = law

    def period(self, demand: int, footprint: float) -> Observation:
        running = min(self.law.batch_cap, demand)
        kv = running * footprint / self.POOL
        return Observation(queue_depth=float(demand - running), running=float(running),
                           running_max=float(running),
                           kv_use=min(kv, 1.0), preemptions=int(kv > 0.95) * 5, footprint_blocks=footprint,
                           pool_blocks=self.POOL)


@pytest.mark.parametrize("max_step", [16, 64])
def test_phase_switch_converges_within_two_periods(max_step):
    """Chat (short contexts: the memory-derived maximum is high) and RAG (long ones: memory binds) alternate;
    after each switch, the first period mixes both phases' traffic. Within two periods of the switch the cap
    sits at the new phase's memory-derived maximum and stays there."""
    law = ControlLaw(Settings(batch_cap=Bounds(1, 512, max_step, 32)))
    plant = Plant(law)
    chat, rag = (400, 60.0), (80, 350.0)  # (demand, footprint blocks)
    best = {chat: math.floor(0.9 * Plant.POOL / chat[1]), rag: math.floor(0.9 * Plant.POOL / rag[1])}
    phase, caps = chat, []
    for _ in range(4):
        new = rag if phase == chat else chat
        mixed = ((phase[0] + new[0]) // 2, (phase[1] + new[1]) / 2)
        law.decide(plant.period(*mixed))  # the period the switch falls in
        law.decide(plant.period(*new))
        caps.append((law.batch_cap, best[new]))
        for _ in range(3):  # steady: no change
            d = law.decide(plant.period(*new))[0]
            assert not d.changed, d
        phase = new
    for cap, target in caps:
        assert abs(cap - target) <= 0.1 * target, caps


# ---- the event path --------------------------------------------------------------------------------
def test_event_path_cuts_on_a_preemption_burst_rate_limited():
    law = ControlLaw(S)
    burst = Observation(queue_depth=5, running=16, kv_use=0.9, preemptions=3, seconds=1.0)
    (d,) = law.event(burst, now=100.0)
    assert (d.old, d.new, d.reason, d.trigger) == (16, 12, "preemption_burst", "event")
    assert d.inputs["preemptions"] == 3
    assert law.event(burst, now=105.0) == []  # within event_cooldown_s: no thrash
    assert law.event(dataclasses.replace(burst, preemptions=2), now=111.0) == []  # below the burst size
    (d,) = law.event(burst, now=111.0)
    assert d.new == 9
    c, _, _ = law.decide(HEAVY)  # the next periods wait before raising again
    assert c.reason == "cooldown"


def test_event_path_raises_on_a_surging_queue_with_room():
    law = ControlLaw(S)
    surge = Observation(queue_depth=30, running=16, running_max=16, kv_use=0.4, queue_growth=12, seconds=1.0)
    (d,) = law.event(surge, now=0.0)
    assert (d.new, d.reason) == (20, "queue_surge")
    law2 = ControlLaw(S)
    # a slow queue: the period's job
    assert law2.event(dataclasses.replace(surge, queue_growth=4), now=0.0) == []
    # memory binds: raising cannot help
    assert law2.event(dataclasses.replace(surge, kv_use=0.9), now=0.0) == []


# ---- the step token budget -------------------------------------------------------------------------
B = Settings(step_token_budget=Bounds(64, 4096, 512, 2048), tpot_p50_s=0.1)
DECODING = Observation(queue_depth=5, running=10, running_max=10, kv_use=0.5, num_decoding=10,
                       decoding_max=10,
                       tpot_p50_s=0.2)


def budget(law: ControlLaw, obs: Observation):
    return law.decide(obs)[2]


def test_budget_lowered_under_a_tpot_breach_while_prefills_wait():
    law = ControlLaw(B)
    d = budget(law, DECODING)
    assert (d.old, d.new, d.reason) == (2048, 1536, "tpot_objective")
    assert d.inputs["tpot_p50_s"] == 0.2 and d.inputs["tpot_objective_s"] == 0.1
    for _ in range(12):
        d = budget(law, DECODING)
    assert law.step_token_budget == 74 and d.reason == "at_min"  # the decode floor: 10 rows + min 64


def test_budget_held_when_no_prefill_waits_or_tpot_in_band_or_no_objective():
    law = ControlLaw(B)
    d = budget(law, dataclasses.replace(DECODING, queue_depth=0))
    assert not d.changed and d.reason == "no_prefill_waiting"
    d = budget(law, dataclasses.replace(DECODING, tpot_p50_s=0.09))
    assert not d.changed and d.reason == "tpot_in_band"
    d = budget(law, dataclasses.replace(DECODING, tpot_p50_s=None))
    assert d.reason == "tpot_unknown"
    free = ControlLaw(dataclasses.replace(B, tpot_p50_s=None))
    assert budget(free, DECODING).reason == "no_tpot_objective"


def test_budget_raised_when_nothing_decodes_or_tpot_has_headroom():
    law = ControlLaw(B)
    d = budget(law, dataclasses.replace(DECODING, num_decoding=0, decoding_max=0, running=4, running_max=4))
    assert (d.new, d.reason) == (2560, "nothing_decoding")
    law = ControlLaw(B)
    budget(law, DECODING)  # a cut
    calm = dataclasses.replace(DECODING, tpot_p50_s=0.05)
    assert budget(law, calm).reason == "cooldown"
    d = budget(law, calm)
    assert (d.old, d.new, d.reason) == (1536, 2048, "tpot_headroom")


def test_budget_never_above_the_engines_configured_budget():
    law = ControlLaw(B)
    law.reset(engine_budget=512, budget_ceiling=1024)
    assert law.step_token_budget == 1024  # the settings' initial 2048, clamped to the engine's ceiling
    d = budget(law, dataclasses.replace(DECODING, num_decoding=0, decoding_max=0, step_token_budget_max=1024))
    assert not d.changed and d.reason == "at_max"


def test_budget_raised_to_the_decode_floor():
    law = ControlLaw(dataclasses.replace(B, step_token_budget=Bounds(64, 4096, 512, 128)))
    d = budget(law, dataclasses.replace(DECODING, running=200, running_max=200, tpot_p50_s=0.5))
    assert (d.new, d.reason) == (264, "decode_floor")  # 200 decode rows + 64 prefill tokens


def test_budget_settles_before_its_tpot_rules_act_again():
    """The published TPOT P50 lags a budget change by tens of seconds: with a short period the TPOT rules wait
    budget_settle_s after a change, so the loop does not cut again on TPOTs from before its own cut."""
    fast = ControlLaw(dataclasses.replace(B, period_s=5.0))  # settle 30 s: 6 periods
    assert budget(fast, DECODING).reason == "tpot_objective"  # 2048 -> 1536
    for _ in range(5):
        d = budget(fast, DECODING)
        assert not d.changed and d.reason == "settling"
    d = budget(fast, DECODING)
    assert (d.old, d.new, d.reason) == (1536, 1152, "tpot_objective")
    d = budget(fast, dataclasses.replace(DECODING, running=1200, running_max=1200))
    assert d.reason == "decode_floor"  # the floor does not wait: decode rows need their tokens
    off = ControlLaw(dataclasses.replace(B, period_s=5.0, law=dataclasses.replace(B.law, budget_settle_s=0)))
    assert [budget(off, DECODING).reason for _ in range(2)] == ["tpot_objective"] * 2
