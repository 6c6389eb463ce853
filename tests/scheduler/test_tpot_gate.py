"""Admission held to a TPOT target: the gate's measurement and bar, and the scheduler that consults it."""

from __future__ import annotations

import pytest
from sched_helpers import kv_config, make, req, run_all, step, toks

from kvloop.engine.scheduler.config import SchedulerConfig
from kvloop.engine.scheduler.tpot_gate import BAR_FLOOR, TpotGate


def test_without_a_target_the_gate_is_always_open():
    gate = TpotGate(None)
    gate.observe(10.0)
    assert gate.open(5) and gate.holds == 0 and gate.step_s is None


def test_the_gate_holds_while_recent_steps_are_slower_than_the_bar():
    gate = TpotGate(100.0)
    assert gate.open(3)  # nothing measured yet
    for _ in range(3):
        gate.observe(0.300)
    assert not gate.open(3) and gate.holds == 1
    assert gate.open(0)  # a lone request always gets its chance
    for _ in range(20):
        gate.observe(0.010)
    assert gate.open(3) and gate.holds == 1


def test_the_bar_follows_the_long_run_mean_within_its_floor():
    gate = TpotGate(100.0)
    for _ in range(2000):  # a long run of slow steps winds the bar down, never below the floor
        gate.observe(0.5)
    assert gate.bar_s == pytest.approx(BAR_FLOOR * 0.1)
    for _ in range(2000):  # fast steps bring it back to the target, never above it
        gate.observe(0.01)
    assert gate.bar_s == pytest.approx(0.1)


def test_config_refuses_a_target_of_zero():
    with pytest.raises(ValueError, match="tpot_target_ms"):
        SchedulerConfig(tpot_target_ms=0)


@pytest.mark.parametrize("mode", ["continuous+lru", "codesign"])
def test_admission_waits_for_the_step_time_and_every_request_finishes(mode):
    s = make(num_blocks=256, kv=kv_config(mode), max_num_seqs=8, tpot_target_ms=50.0)
    s.add(req("a", toks(1, 12), max_tokens=6))
    step(s)
    assert [q.request_id for q in s.running] == ["a"]
    s.add(req("b", toks(2, 12), max_tokens=6))
    s.observe_step(0.2, decoded=True)  # a's decode steps are slower than the target: b waits
    s.observe_step(0.3, decoded=False)  # a step in which nobody decoded is no time per output token
    step(s)
    assert [q.request_id for q in s.running] == ["a"] and [q.request_id for q in s.waiting] == ["b"]
    assert s.tpot_gate.holds == 1
    for _ in range(6):
        s.observe_step(0.01, decoded=True)
    step(s)
    assert {q.request_id for q in s.running} == {"a", "b"}
    assert run_all(s) > 0 and s.requests_finished == 2


def test_a_held_queue_never_starves_an_idle_engine():
    """Slow steps hold admission only while something runs: when the last row finishes, the head starts."""
    s = make(num_blocks=256, kv=kv_config("codesign"), max_num_seqs=8, tpot_target_ms=1.0)
    s.add(req("r0", toks(0, 10), max_tokens=3))
    step(s)
    s.observe_step(1.0, decoded=True)
    for i in range(1, 4):
        s.add(req(f"r{i}", toks(i, 10), max_tokens=3))
    while s.has_work():
        step(s)
        s.observe_step(1.0, decoded=True)  # every step far slower than the target
        assert len(s.running) <= 1
    assert s.requests_finished == 4 and s.tpot_gate.holds > 0
    s.check_integrity()
