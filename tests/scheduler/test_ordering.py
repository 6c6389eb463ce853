"""queue_order work: the waiting queue by remaining uncached work, with an aging bound (pure Python, fake
clock)."""

from __future__ import annotations

import pytest
from sched_helpers import FakeClock, kv_config, make, req, run_all, step, toks

from kvloop.engine.scheduler.config import SchedulerConfig
from kvloop.engine.scheduler.ordering import WaitReference, order_by_work

DOC = toks(1, 64)  # 16 blocks of 4 tokens
DT = 0.05  # fake seconds per step


def _work(clock: FakeClock | None = None, **cfg):
    s = make(num_blocks=128, kv=kv_config(), clock=clock, queue_order="work", **cfg)
    s.add(req("warm", DOC + toks(99, 4), 2))
    run_all(s)  # DOC is cached, unreferenced
    return s


def _order(s, now: float = 0.0, aged_after: float = 1e9, max_queue: int = 64):
    order, prio = order_by_work(s.waiting, s.running, s.view, now, s.enqueued, aged_after, max_queue, 1,
                                s.kv.block_size)
    return [q.request_id for q in order], {q.request_id for q in order if id(q) in prio}


def test_fewest_uncached_tokens_first_with_the_cached_prefix_counted():
    clock = FakeClock()
    s = _work(clock, max_num_seqs=1)
    long_miss = req("miss40", toks(7, 40))
    cached = req("hit72", DOC + toks(8, 8))  # 72 tokens, 64 of them cached: 8 to compute
    short_miss = req("miss20", toks(9, 20))
    for q in (long_miss, cached, short_miss):
        s.add(q)
    assert _order(s) == (["hit72", "miss20", "miss40"], set())
    run_all(s, clock=clock, dt=0.001)  # well within the aging floor
    starts = sorted((long_miss, cached, short_miss), key=lambda q: q.first_scheduled_time)
    assert [q.request_id for q in starts] == ["hit72", "miss20", "miss40"]


def test_arrival_order_keeps_prefix_grouping():
    s = make(num_blocks=128, kv=kv_config(), max_num_seqs=1, queue_order="arrival")
    s.add(req("warm", DOC + toks(99, 4), 2))
    run_all(s)
    for q in (req("miss40", toks(7, 40)), req("hit72", DOC + toks(8, 8)), req("miss20", toks(9, 20))):
        s.add(q)
    s.schedule()
    assert [q.request_id for q in s.running] == ["hit72"]
    s.schedule()  # hit72 decodes; the cap holds the rest
    assert [q.request_id for q in s.waiting] == ["miss40", "miss20"]


def _stream(floor_s: float, factor: float = 2.0, steps: int = 200):
    """Two rows at a hard cap; one short cache hit arrives every step and each runs two steps, so whenever a
    row frees a hit is waiting with less work than the long cache miss queued behind them. Returns the
    miss's wait (None: it never started) and the bound it was aged at."""
    clock = FakeClock()
    s = _work(clock, max_num_seqs=2, cascade_cap_factor=1.0, aging_floor_s=floor_s, aging_factor=factor)
    hits = iter(req(f"h{i}", DOC + toks(100 + i, 4), 2) for i in range(steps + 2))
    s.add(next(hits))
    s.add(next(hits))
    step(s)
    clock.t += DT
    miss = req("miss", toks(7, 40), 2)
    s.add(miss)
    added, bound = clock.t, 0.0
    for _ in range(steps):
        s.add(next(hits))
        bound = s.waits.aged_after(factor, floor_s)
        step(s)
        s.check_integrity()
        clock.t += DT
        if miss.first_scheduled_time is not None:
            return miss.first_scheduled_time - added, bound
    return None, bound


def test_a_long_miss_behind_a_stream_of_short_hits_starts_within_the_bound():
    wait, bound = _stream(floor_s=0.5)
    assert wait is not None
    assert bound == 0.5  # the hits start at once: the median wait is near 0, the floor holds
    assert bound < wait <= bound + DT  # passed until aged, then first
    never, _ = _stream(floor_s=1e6)  # the same queue without the bound starves the miss
    assert never is None


def test_the_bound_follows_the_median_recent_wait():
    ref = WaitReference(window=4)
    assert ref.aged_after(2.0, 0.5) == 0.5  # nothing measured yet: the floor
    for w in (0.1, 3.0, 0.2, 5.0):
        ref.record(w)
    assert ref.median == pytest.approx(1.6)
    assert ref.aged_after(2.0, 0.5) == pytest.approx(3.2)
    for w in (1.0, 1.0, 1.0):  # the window forgets the oldest
        ref.record(w)
    assert ref.median == 1.0


def test_aged_requests_go_first_in_arrival_order_and_hold_their_place():
    clock = FakeClock()
    s = _work(clock, max_num_seqs=1)
    s.add(req("miss40", toks(7, 40)))
    clock.t += 1.0
    s.add(req("miss20", toks(9, 20)))
    clock.t += 1.0
    s.add(req("hit72", DOC + toks(8, 8)))
    # waits 2, 1, 0 s: the two misses are aged past 0.5 s, oldest first, ahead of the hit
    assert _order(s, now=clock.t, aged_after=0.5) == (["miss40", "miss20", "hit72"], {"miss40", "miss20"})


def test_beyond_max_queue_the_rest_wait_in_arrival_order():
    s = _work(max_num_seqs=1)
    for q in (req("miss40", toks(7, 40)), req("miss20", toks(9, 20)), req("hit72", DOC + toks(8, 8)),
              req("hit68", DOC + toks(10, 4))):
        s.add(q)
    # the two oldest are ordered by work (peeked); the others follow as they came
    assert _order(s, max_queue=2) == (["miss20", "miss40", "hit72", "hit68"], set())


def test_a_preempted_request_is_not_passed():
    """A pool that holds the prompts but not everyone's decode growth: a preempted request goes back to the
    queue, and shorter requests that arrive after it do not start before it starts again."""
    clock = FakeClock()
    s = make(num_blocks=24, kv=kv_config(host_cache_tokens=0, watermark=0.0), clock=clock,
             decode_reserve_tokens=0, queue_order="work")
    for i in range(4):
        s.add(req(str(i), toks(i, 14), 20))
    while not s.num_preemptions:
        step(s)
        clock.t += DT
    (preempted,) = [q for q in s.waiting if q.num_preemptions]
    short = [req(f"s{i}", toks(50 + i, 4), 2) for i in range(3)]
    for q in short:
        s.add(q)
    order, priority = _order(s)
    assert order[0] == preempted.request_id and priority == {preempted.request_id}
    restarted = None
    for _ in range(500):
        step(s)
        s.check_integrity()
        if restarted is None and preempted in s.running:
            restarted = clock.t
        clock.t += DT
        if not s.has_work():
            break
    assert not s.has_work() and restarted is not None
    assert all(q.first_scheduled_time >= restarted for q in short)


def test_queue_order_is_checked():
    with pytest.raises(ValueError, match="queue_order"):
        SchedulerConfig(queue_order="lpm")
    with pytest.raises(ValueError, match="aging_factor"):
        SchedulerConfig(aging_factor=-1.0)


def test_work_order_is_the_default():
    from kvloop.engine.scheduler.config import SchedulerConfig

    assert SchedulerConfig().queue_order == "work"


def test_slo_order_is_earliest_deadline_first_and_lost_ones_last():
    s = make(num_blocks=128, kv=kv_config(), queue_order="slo", slo_ttft_s=1.0, slo_ttft_per_1k_s=0.0)
    s.add(req("warm", DOC + toks(99, 4), 2))
    run_all(s)  # DOC is cached
    lost = req("lost", toks(5, 20))
    lost.arrival_time = -5.0  # its 1 s bound ran out at -4.0
    early_miss = req("early_miss", toks(7, 40))
    early_miss.arrival_time = 0.0  # due at 1.0
    late_hit = req("late_hit", DOC + toks(8, 8))
    late_hit.arrival_time = 0.5  # due at 1.5: its cached prefix does not let it pass an earlier deadline
    for q in (lost, late_hit, early_miss):
        s.add(q)
    order, _ = order_by_work(s.waiting, s.running, s.view, 0.2, s.enqueued, 1e9, 64, 1, s.kv.block_size,
                             deadline=s._ttft_deadline)
    assert [q.request_id for q in order] == ["early_miss", "late_hit", "lost"]
