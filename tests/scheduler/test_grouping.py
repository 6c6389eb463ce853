"""Prefix grouping with aging, and plain FCFS when the queue is long, under queue_order arrival (pure
Python; the work order has its own tests in test_ordering.py)."""

from __future__ import annotations

from functools import partial

import sched_helpers
from sched_helpers import FakeClock, kv_config, req, run_all, step, toks

make = partial(sched_helpers.make, queue_order="arrival")

DOC = toks(1, 64)


def _warm(s) -> None:
    s.add(req("warm", DOC + toks(99, 4), 2))
    run_all(s)


def test_requests_sharing_a_cached_prefix_go_first_until_the_cold_one_ages():
    clock = FakeClock()
    s = make(num_blocks=128, kv=kv_config(), clock=clock, max_num_seqs=1, aging_s=5.0)
    _warm(s)
    cold = req("cold", toks(7, 68))
    s.add(cold)
    clock.t = 1.0
    hot = [req(f"h{i}", DOC + toks(10 + i, 4)) for i in range(3)]
    for h in hot:
        s.add(h)
    s.schedule()
    assert s.running == [hot[0]]  # the cached document's question first, though the cold one came first
    clock.t = 5.0  # the cold request has waited its bound: it is next, ahead of any hit
    while s.running:
        step(s)
    s.add(req("h9", DOC + toks(30, 4)))
    s.schedule()
    assert s.running == [cold]
    run_all(s, clock=clock)


def test_aging_bounds_the_wait_under_a_stream_of_hits():
    clock = FakeClock()
    s = make(num_blocks=64, kv=kv_config(), clock=clock, max_num_seqs=2, aging_s=1.0)
    _warm(s)
    cold = req("cold", toks(7, 40), 4)
    s.add(cold)
    t_add = clock.t
    for i in range(400):  # a new hit arrives every step, forever preferred over the cold one without aging
        s.add(req(f"h{i}", DOC + toks(100 + i, 4), 4))
        step(s)
        s.check_integrity()
        clock.t += 0.05
        if cold.first_scheduled_time is not None:
            break
    assert cold.first_scheduled_time is not None
    # waited the bound, plus at most the steps for one running request to finish
    assert cold.first_scheduled_time - t_add <= 1.0 + 10 * 0.05


def test_a_request_waits_for_an_in_flight_prefix_instead_of_computing_it_twice():
    s = make(num_blocks=256, kv=kv_config(), max_num_batched_tokens=32)
    a = req("a", DOC + toks(2, 4))
    b = req("b", DOC + toks(3, 4))
    s.add(a)
    s.schedule()  # a prefills DOC in chunks of 32
    s.add(b)
    step_batch = s.schedule()
    assert b not in s.running and [i.seq for i in step_batch.items] == [a]
    run_all(s)
    assert b.num_cached_tokens >= 64  # it got the document as a hit


def test_plain_fcfs_above_the_queue_threshold():
    clock = FakeClock()
    s = make(num_blocks=128, kv=kv_config(), clock=clock, max_num_seqs=1, grouping_max_queue=2)
    _warm(s)
    cold = req("cold", toks(7, 40))
    s.add(cold)
    for i in range(3):
        s.add(req(f"h{i}", DOC + toks(10 + i, 4)))
    s.schedule()
    assert s.running == [cold]  # 4 waiting > 2: arrival order
    run_all(s)
