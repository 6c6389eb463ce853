"""Static mode (fill timeout, no joining mid-batch, up-front reservation, OOM events) and the bounded
waiting queue (pure Python)."""

from __future__ import annotations

import pytest
from sched_helpers import FakeClock, kv_config, make, req, run_all, step, toks

from kvloop.engine.config import EngineConfig
from kvloop.engine.core.policy import get_policy, policy_names
from kvloop.engine.scheduler.scheduler import RequestRejected


def _static(clock: FakeClock, num_blocks: int = 64, **kw):
    return make(num_blocks=num_blocks, kv=kv_config("continuous"), clock=clock, mode="static",
                static_batch_size=4,
                static_fill_timeout_s=0.5, **kw)


def test_static_waits_to_fill_then_runs_without_joining():
    clock = FakeClock()
    s = _static(clock)
    first = [req(f"a{i}", toks(i, 8), 3) for i in range(2)]
    for q in first:
        s.add(q)
    assert not s.schedule() and not s.running  # two of four: waits for the fill timeout
    clock.t = 0.5
    s.schedule()
    assert s.running == first
    late = req("late", toks(9, 8), 3)
    s.add(late)
    while s.running:
        step(s)
        assert late not in s.running  # no joining mid-batch
        clock.t += 0.01
    clock.t += 0.5
    s.schedule()
    assert s.running == [late]
    run_all(s)
    assert s.num_oom_events == 0 and s.static.batches == [2, 1]


def test_static_full_batch_goes_at_once_with_prompt_plus_max_tokens_reserved():
    clock = FakeClock()
    s = _static(clock)
    for i in range(4):
        s.add(req(str(i), toks(i, 8), 8))
    s.schedule()
    assert len(s.running) == 4
    assert all(len(q.block_table) == 4 for q in s.running)  # (8 + 8) / 4 blocks each, up front
    run_all(s)


def test_static_oom_fails_requests_whose_reservation_does_not_fit():
    clock = FakeClock(1.0)
    s = _static(clock, num_blocks=16)
    seqs = [req(str(i), toks(i, 16), 8) for i in range(4)]  # 6 blocks each: two fit in 16
    for q in seqs:
        s.add(q)
    s.schedule()
    assert s.num_oom_events == 2
    failed = s.take_failed()
    assert failed == seqs[2:] and all(q.finish_reason == "error" and "out of memory" in q.error
                                      for q in failed)
    run_all(s)
    assert [q.finish_reason for q in seqs] == ["length", "length", "error", "error"]


def test_static_oom_retry_runs_them_in_a_later_batch():
    clock = FakeClock(1.0)
    s = _static(clock, num_blocks=16, static_oom="retry")
    seqs = [req(str(i), toks(i, 16), 8) for i in range(4)]
    for q in seqs:
        s.add(q)
    run_all(s, clock=clock)
    assert all(q.finish_reason == "length" for q in seqs)
    assert s.num_oom_events == 2 and s.static.batches == [2, 2]


def test_bounded_queue_rejects_with_queue_full():
    s = make(kv=kv_config(), max_waiting=3)
    for i in range(3):
        s.add(req(str(i), toks(i, 8)))
    with pytest.raises(RequestRejected) as err:
        s.add(req("x", toks(9, 8)))
    assert err.value.reason == "queue_full"
    assert s.num_rejections == 1 and s.rejections == {"queue_full": 1}
    run_all(s)
    s.add(req("y", toks(10, 8)))  # room again
    run_all(s)


def test_request_larger_than_the_pool_is_rejected_not_left_to_hang():
    s = make(num_blocks=8, kv=kv_config())
    with pytest.raises(RequestRejected) as err:
        s.add(req("big", toks(1, 20), 20))  # 10 blocks at full length
    assert err.value.reason == "too_long"


@pytest.mark.parametrize("mode", policy_names())
def test_engine_mode_sets_scheduler_and_kv(mode):
    cfg = EngineConfig(mode=mode)
    assert cfg.scheduler.mode == mode
    assert cfg.kv.mode == get_policy(mode).cache.name  # static: over the no-cache `continuous` cache policy
