"""With the real model (fp32, greedy): preempted requests, swapped or recomputed, produce exactly the
tokens of an unpreempted run; static mode's out-of-memory events reach the caller as errors."""

from __future__ import annotations

import pytest
from sched_helpers import toks

from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.kv.config import KVConfig

N = 10
PROMPTS = [toks(i, 40) for i in range(3)]  # 3 blocks of 16; the 9th output token needs a 4th


def greedy(n: int = N) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def reference(make_engine) -> dict[str, list[int]]:
    eng = make_engine(kv=KVConfig(mode="continuous"))
    out = {}
    for i, p in enumerate(PROMPTS):  # one at a time: no batching, no preemption
        eng.add_request(f"r{i}", p, greedy())
        out[f"r{i}"] = eng.drain(max_steps=100)[f"r{i}"].token_ids
    return out


@pytest.mark.parametrize("kind", ["swap", "recompute"])
def test_forced_preemption_gives_the_same_tokens(make_engine, reference, kind):
    host = 1024 if kind == "swap" else 0
    eng = make_engine(kv=KVConfig(mode="codesign", host_cache_tokens=host))
    for i, p in enumerate(PROMPTS):
        eng.add_request(f"r{i}", p, greedy())
    final = {}
    for _ in range(3):  # prefill and a few decodes
        final.update({o.request_id: o for o in eng.step() if o.finished})
    victim = eng.scheduler.running[-1]
    assert 0 < victim.num_output_tokens < N
    assert eng.scheduler.preempt(victim) == kind
    final.update(eng.drain(max_steps=200))
    assert {k: v.token_ids for k, v in final.items()} == reference
    assert eng.snapshot().num_preemptions_by_kind[kind] == 1
    eng.scheduler.check_integrity()


@pytest.mark.parametrize("host", [1024, 0])
def test_preemption_under_a_small_pool_gives_the_same_tokens(make_engine, reference, host):
    # 7 blocks: two requests start (3 blocks each) and cannot both grow to 4; no decode
    # reserve, so growth preempts
    eng = make_engine(kv_cache_tokens=112, decode_reserve_tokens=0,
                      kv=KVConfig(mode="codesign", host_cache_tokens=host, watermark=0.0))
    for i, p in enumerate(PROMPTS):
        eng.add_request(f"r{i}", p, greedy())
    final = eng.drain(max_steps=400)
    assert {k: v.token_ids for k, v in final.items()} == reference
    by_kind = eng.snapshot().num_preemptions_by_kind
    assert by_kind["swap" if host else "recompute"] > 0
    assert eng.kv.num_referenced_blocks == 0


def test_static_oom_events_fail_requests_with_an_error(make_engine):
    eng = make_engine(mode="static", kv_cache_tokens=128, static_batch_size=3, static_fill_timeout_s=0.0)
    for i, p in enumerate(PROMPTS):
        eng.add_request(f"r{i}", p, greedy())
    final = eng.drain(max_steps=200)
    reasons = sorted(o.finish_reason for o in final.values())
    assert reasons == ["error", "length", "length"]
    err = next(o for o in final.values() if o.finish_reason == "error")
    assert "out of memory" in err.error
    snap = eng.snapshot()
    assert snap.num_oom_events == 1 and snap.scheduler_mode == "static" and snap.kv_mode == "continuous"
