"""The sidecar's control law runs in virtual time at its configured period and its targets reach the
scheduler and KV manager."""

from dataclasses import replace

import pytest

from kvloop.engine.bench import workloads as bw
from kvloop.sidecar.settings import Bounds, Settings


@pytest.mark.parametrize("period", [2.0, 5.0])
def test_law_runs_at_the_period(simulate, period):
    settings = Settings(period_s=period)
    sim, res = simulate("codesign", feedback=settings)
    end = res["sim"]["virtual_s"]
    ticks = sim.coord.ticks
    assert ticks == pytest.approx([period * (k + 1) for k in range(len(ticks))])
    assert len(ticks) == int(end // period)
    assert res["feedback"]["ticks"] == len(ticks)
    assert sim.coord.sample_every == min(1.0, period / 4)


def test_targets_are_applied(simulate):
    # A queue that outlasts the cap: the law raises the cap and the scheduler sees it.
    settings = replace(Settings(period_s=2.0), batch_cap=Bounds(1, 64, 8, 2))
    wl = bw.w1(0.25, num_doc_questions=30, num_sessions=0, rate=50.0)
    sim, res = simulate("codesign", wl=wl, feedback=settings)
    changes = res["feedback"]["changes"]
    caps = [c for c in changes if c["knob"] == "batch_cap"]
    assert caps, changes
    assert sim.scheduler.batch_cap == sim.coord.law.batch_cap == caps[-1]["new"]
    assert sim.kv.watermark == sim.coord.law.watermark


def test_cap_starts_from_the_pool_and_is_placed_by_the_first_footprint(simulate):
    settings = replace(Settings(period_s=5.0), batch_cap=Bounds(1, 256, 8, None))
    sim, res = simulate("codesign", feedback=settings)
    start = sim.coord.decisions[0]
    assert (start["knob"], start["reason"], start["trigger"]) == ("batch_cap", "engine_start", "start")
    pool, ctx = sim.kv.num_blocks, -(-sim.scheduler.config.max_model_len // sim.kv.block_size)
    assert start["new"] == max(1, int(0.9 * pool / ctx + 1e-9))  # the pool at the engine's max context
    placed = next(d for d in sim.coord.decisions if d["reason"] == "memory_derived_start")
    assert placed["trigger"] == "event" and placed["t"] <= 2.0  # within a second or two of the first request
    assert placed["new"] == placed["inputs"]["memory_max"] == min(256, int(0.9 * pool / placed["inputs"][
        "footprint_blocks"] + 1e-9))
    assert sim.scheduler.batch_cap == sim.coord.law.batch_cap


def test_step_token_budget_steered_to_the_tpot_objective(simulate):
    # An objective no step can meet while prefills wait: the budget comes down in bounded steps, and the
    # scheduler runs with what the coordinator targets.
    settings = replace(Settings(period_s=2.0, law_kind="rules"), tpot_p50_s=1e-4,
                       step_token_budget=Bounds(16, 4096, 64, None))
    wl = bw.w1(0.25, num_doc_questions=30, num_sessions=0, rate=50.0)
    sim, res = simulate("codesign", wl=wl, feedback=settings)
    budgets = [d for d in res["feedback"]["changes"] if d["knob"] == "step_token_budget"
               and d["trigger"] != "start"]
    assert budgets and {d["reason"] for d in budgets} <= {"tpot_objective", "nothing_decoding",
                                                          "decode_floor"}
    assert any(d["reason"] == "tpot_objective" and d["new"] < d["old"] for d in budgets)
    assert all(abs(d["new"] - d["old"]) <= 64 for d in budgets)
    assert sim.scheduler.step_token_budget == sim.coord.law.step_token_budget < 256  # SMOKE_SIZING's budget
    assert sim.coord.tpot.samples  # the finished requests' TPOTs, as the engine hook keeps them
