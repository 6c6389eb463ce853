"""SLO accounting: the prompt-length allowance, the TPOT bound, failures and aborts, on the scheduler's
clock."""

from __future__ import annotations

import pytest
from sched_helpers import FakeClock, make, req, step, toks

from kvloop.engine.core.slo import CPU_SLO, GPU_SLO, Slo
from kvloop.engine.scheduler.slo_ledger import SloLedger


def test_bounds_follow_the_prompt():
    assert CPU_SLO.ttft_bound(0) == 2.0 and CPU_SLO.ttft_bound(3000) == pytest.approx(5.0)
    assert GPU_SLO.ttft_bound(5000) == pytest.approx(2.0) and GPU_SLO.tpot_s == 0.1
    assert CPU_SLO.miss(4.9, 3000, 0.2) is None
    assert CPU_SLO.miss(5.1, 3000, 0.2) == "ttft"
    assert CPU_SLO.miss(1.0, 10, 0.26) == "tpot"
    assert CPU_SLO.miss(1.0, 10, None) is None  # one token: no TPOT to judge
    assert CPU_SLO.miss(None, 10, None) == "failed"
    assert CPU_SLO.slack(1.0, 0, 0.125) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        Slo(ttft_base_s=0)


def test_scheduler_counts_outcomes_on_its_clock():
    clock = FakeClock()
    s = make(clock=clock, mode="continuous", slo_ttft_s=0.05, slo_ttft_per_1k_s=0.0, slo_tpot_s=0.02)
    s.add(req("fast", toks(1, 8), max_tokens=3))
    for _ in range(3):
        step(s)
        clock.t += 0.01
    late = req("late", toks(2, 8), max_tokens=3)
    late.arrival_time = -1.0  # waited a second before it came in
    s.add(late)
    for _ in range(3):
        step(s)
        clock.t += 0.01
    gone = req("gone", toks(3, 8), max_tokens=3)
    s.add(gone)
    s.finish(gone, "abort")  # the client's choice: not judged
    broken = req("broken", toks(4, 8), max_tokens=3)
    s.add(broken)
    s.fail(broken, "boom")
    led: SloLedger = s.slo_ledger
    assert led.good == 1 and led.missed["ttft"] == 1 and led.missed["failed"] == 1 and led.missed["tpot"] == 0
    assert led.slack_count == 2
