"""The decode step-cost function the scheduler and the simulator share, and codesign admission through
it: a request joining a running group comes first; past the batch cap, requests run while the priced
step stays within the cap's plain price (a joiner costs only its suffix, a group's savings make room);
aged requests still win; continuous+lru keeps the cap a row count."""

from __future__ import annotations

import pytest
from sched_helpers import FakeClock, kv_config, req, run_all, step, toks

from kvloop.engine.cascade.cost import AttentionCost, cost_for
from kvloop.engine.cascade.step_cost import StepCost
from kvloop.engine.kv.manager import KVCacheManager
from kvloop.engine.scheduler.scheduler import Scheduler, SchedulerConfig

# Tiny blocks and contexts: coefficients under which a pair sharing 64 tokens already pays
CHEAP = AttentionCost(call_us=1.0, row_us=0.0, token_us=1.0, token_row_us=0.01, merge_us=0.1)
DOC = toks(1, 64)
BS = 4


def test_a_grouped_step_is_priced_below_the_plain_one():
    sc = StepCost(cost_for("bfloat16"), layers=30, block_size=16)
    # 16 rows of 2,000 tokens, the first 1,904 (119 blocks) one shared document: W1's document QA
    tables = [list(range(119)) + [1000 + 10 * r + i for i in range(7)] for r in range(16)]
    ctx = [2000 + r for r in range(16)]
    plain = sc.decode_us(ctx)
    grouped = sc.price_us(tables, ctx)
    assert grouped < plain
    assert grouped == pytest.approx(plain - 30 * cost_for("bfloat16").group_gain_us(16, 1904))
    # nothing shared: the plan is empty and the price is the plain one
    alone = [[10_000 * (r + 1) + i for i in range(126)] for r in range(16)]
    assert sc.price_us(alone, ctx) == pytest.approx(plain)
    # common scope (continuous+lru) with one row off the document: no group, plain price
    off = tables[:15] + [alone[0]]
    assert StepCost(cost_for("bfloat16"), 30, 16, "common").price_us(off, ctx) == pytest.approx(plain)
    assert sc.price_us(off, ctx) < plain  # nested still groups the fifteen


def test_join_saving_follows_the_group_gain():
    sc = StepCost(cost_for("bfloat16"), layers=2, block_size=16)
    a = sc.attention
    assert sc.join_saving_us(0, 2000) == 0.0 and sc.join_saving_us(16, 0) == 0.0
    assert sc.join_saving_us(1, 32) == 0.0  # a pair over 32 tokens does not pay on this machine
    assert sc.join_saving_us(16,
                             1904) == pytest.approx(2 * (a.group_gain_us(17, 1904) - a.group_gain_us(16,
                                                                                                     1904)))


def sched(mode: str = "codesign", clock: FakeClock | None = None, **cfg) -> Scheduler:
    cfg.setdefault("max_num_batched_tokens", 4096)
    return Scheduler(SchedulerConfig(**cfg), KVCacheManager(256, BS, kv_config(mode)), clock=clock,
                     attention=CHEAP)


def _group_running(s: Scheduler, n: int, clock: FakeClock | None = None) -> list:
    """Caches DOC, then starts n requests on it: they decode with DOC's blocks shared."""
    s.add(req("warm", DOC + toks(99, 3), 1))
    run_all(s)
    rows = [req(f"g{i}", DOC + toks(10 + i, 3), 50) for i in range(n)]
    for r in rows:
        s.add(r)
    step(s)
    assert s.running == rows
    return rows


def test_a_request_joining_a_running_group_goes_before_a_cold_one_of_equal_age():
    clock = FakeClock()
    s = sched(clock=clock, max_num_seqs=3, aging_s=5.0, cascade_cap_factor=1.0)
    _group_running(s, 2)
    # the cold one has the longer cached prefix (a document no running row reads): by prefix hit alone it
    # would go first; joining the running group saves reads in every decode step, so the joiner does
    other = toks(2, 96)
    s.add(req("warm2", other + toks(98, 3), 1))
    while s.waiting or any(r.request_id == "warm2" for r in s.running):
        step(s)
    cold, joiner = req("cold", other + toks(30, 3)), req("joiner", DOC + toks(31, 3))
    s.add(cold)
    s.add(joiner)
    assert s.view.peek(cold).blocks > s.view.peek(joiner).blocks
    s.schedule()
    assert joiner in s.running and cold not in s.running
    run_all(s, clock=clock)


def test_joiners_run_past_the_cap_within_the_priced_budget_cold_ones_do_not():
    s = sched(max_num_seqs=2, cascade_cap_factor=2.0)
    _group_running(s, 2)
    cold = req("cold", toks(3, 67))
    joiners = [req(f"j{i}", DOC + toks(40 + i, 3)) for i in range(3)]
    s.add(cold)
    for j in joiners:
        s.add(j)
    step(s)
    # cap 2, ceiling 4: two joiners fit the budget (the group's gain pays for them), the cold one waits
    assert len(s.running) == 4 and cold in s.waiting and joiners[2] in s.waiting
    tables = [r.block_table for r in s.running]
    ctx = [r.num_tokens for r in s.running]
    plain_two = s.step_cost.decode_us(ctx) * 2 / 4
    assert s.step_cost.price_us(tables, ctx) <= plain_two * 1.05  # contexts grew by a token since admission
    run_all(s)


def test_room_a_running_group_saves_admits_a_short_cold_request_past_the_cap():
    s = sched(max_num_seqs=2, cascade_cap_factor=2.0)
    _group_running(s, 2)
    short = req("short", toks(3, 9))  # its plain row costs less than the pair's cascade saves
    s.add(short)
    step(s)
    assert short in s.running and len(s.running) == 3
    run_all(s)


@pytest.mark.parametrize(("mode", "factor"), [("codesign", 1.0), ("continuous+lru", 2.0)])
def test_the_cap_stays_a_row_count_without_the_factor_or_outside_codesign(mode, factor):
    s = sched(mode, max_num_seqs=2, cascade_cap_factor=factor)
    _group_running(s, 2)
    s.add(req("j", DOC + toks(40, 3)))
    step(s)
    assert len(s.running) == 2 and not s.may_admit_past_cap()
    run_all(s)


def test_an_aged_request_holds_the_next_slot_past_the_cap():
    clock = FakeClock()
    s = sched(clock=clock, max_num_seqs=2, cascade_cap_factor=2.0, aging_s=1.0)
    rows = _group_running(s, 2)
    cold = req("cold", toks(3, 67))
    s.add(cold)
    clock.t += 2.0  # the cold request has waited past its bound
    joiner = req("j", DOC + toks(40, 3))
    s.add(joiner)
    step(s)
    # the aged request does not fit the priced budget past the cap, and nobody passes it
    assert len(s.running) == 2 and joiner in s.waiting
    s.finish(rows[0], "abort")
    step(s)
    assert cold in s.running  # first slot within the cap goes to the aged request
    run_all(s, clock=clock)
