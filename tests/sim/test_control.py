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
