"""Fast-forward reads the live knobs through the scheduler (Scheduler.step_budget, row_ceiling), not the
configured values: a step budget and a batch cap lowered below the running rows give the run that schedule()
gives, the inter-token gaps of the rows the budget leaves out of a step included."""

from __future__ import annotations

import json

import pytest

from kvloop.engine.bench import workloads as bw
from kvloop.engine.sim.modes import Sizing
from kvloop.engine.sim.profiles import get_profile
from kvloop.engine.sim.simulator import SimConfig, Simulator
from kvloop.engine.sim.workload import BenchWorkload

SIZING = Sizing(kv_cache_tokens=32768, host_cache_tokens=8192, disk_cache_tokens=0, max_num_seqs=48,
                max_num_batched_tokens=512, static_batch=4)


def run(mode: str, fast: bool) -> tuple[dict, list[int]]:
    sim = Simulator(get_profile("cpu", calibration="/nonexistent"),
                    BenchWorkload(bw.w1(0.25, num_doc_questions=40, num_sessions=12, rate=30.0)),
                    SimConfig(mode=mode, sizing=SIZING, fast_forward=fast))
    sched, lowered = sim.scheduler, []
    observe = sim._observe

    def lower_at_a_sample() -> None:
        """At the first sample (both paths stop there) with 20 rows or more, all decoding: the knobs drop."""
        sampled = sim.now >= sim._next_sample
        observe()
        if sampled and not lowered and len(sched.running) >= 20 and all(
                s.num_uncomputed_tokens == 1 and s.first_token_time is not None for s in sched.running):
            lowered.append(len(sched.running))
            sched.set_step_token_budget(16)
            sched.set_batch_cap(8)

    sim._observe = lower_at_a_sample
    return sim.run(), lowered


@pytest.mark.parametrize("mode", ["continuous", "continuous+lru", "codesign"])  # static: batches of 4
def test_knobs_lowered_below_the_running_rows(mode):
    (fast, lowered), (slow, _) = run(mode, True), run(mode, False)
    assert lowered and lowered[0] > 16
    assert fast["sim"]["steps"] == slow["sim"]["steps"]
    assert fast["client"].pop("itl_mean_s") == pytest.approx(slow["client"].pop("itl_mean_s"), rel=1e-12)
    assert json.dumps(fast["client"], sort_keys=True) == json.dumps(slow["client"], sort_keys=True)
    assert fast["server"] == slow["server"]
