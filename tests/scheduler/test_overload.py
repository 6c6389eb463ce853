"""A pool far too small for the load: every request completes or is rejected with a reason; none is
lost and none hangs (pure Python, every mode, integrity checked every step)."""

from __future__ import annotations

import random

import pytest
from sched_helpers import FakeClock, kv_config, make, req, step, toks

from kvloop.engine.scheduler.scheduler import RequestRejected

DOCS = [toks(50 + d, 48) for d in range(3)]


@pytest.mark.parametrize("mode", ["static", "continuous", "continuous+lru", "codesign", "codesign/work"])
def test_tiny_pool_nothing_lost_nothing_hangs(mode):
    rng = random.Random(mode)
    clock = FakeClock()
    mode, _, order = mode.partition("/")
    kv = kv_config("continuous" if mode == "static" else mode,
                   host_cache_tokens=64 if mode == "codesign" else 0)
    s = make(num_blocks=40, kv=kv, clock=clock, mode=mode, max_waiting=12, max_num_batched_tokens=64,
             aging_s=0.5, queue_order=order or "arrival")
    seqs, rejected = [], {}
    for _tick in range(200):
        for _ in range(rng.choice([0, 0, 1, 2, 3])):  # bursts
            prompt = rng.choice(DOCS) + toks(1000 + len(seqs),
                                             rng.randint(2, 12)) if rng.random() < 0.6 else \
                toks(2000 + len(seqs), rng.randint(4, 60))
            q = req(f"r{len(seqs)}", prompt, rng.randint(1, 40))
            seqs.append(q)
            try:
                s.add(q)
            except RequestRejected as e:
                rejected[q.request_id] = e.reason
        step(s)
        s.check_integrity()
        clock.t += 0.02
    for _ in range(20000):
        if not s.has_work():
            break
        step(s)
        s.check_integrity()
        clock.t += 0.02
    assert not s.has_work(), "hung"
    failed = {q.request_id for q in s.take_failed()}
    for q in seqs:
        if q.request_id in rejected:
            assert rejected[q.request_id] in ("queue_full", "too_long")
        elif q.request_id in failed:
            assert mode == "static" and q.finish_reason == "error" and q.error
        else:
            assert q.finish_reason == "length" and q.num_output_tokens == q.params.max_tokens
    assert rejected and s.num_rejections == len(rejected)
    assert s.kv.num_referenced_blocks == 0
    if mode == "static":
        assert s.num_oom_events == len(failed) > 0
    else:
        assert s.num_oom_events == 0  # preemption (or the admission gate) instead of OOM
