"""Prompt-lookup speculation (engine/scheduler/speculation.py, verified in runner/model_runner.py) is exact:
greedy outputs identical token for token with speculation ngram and off on prompts that copy (fp32, several
concurrent rows, cascade forced on), with stop strings, stop tokens and max_tokens landing mid-acceptance, a
JSON schema's grammar, seeded sampling, preemption under a tiny pool, a prefix-cache hit after speculation;
no block leaks. The proposals are accepted (the counters move)."""

from __future__ import annotations

import pytest

from kvloop.engine.core.sampling import SamplingParams

COPY_PROMPTS = [
    "Repeat this text exactly: The quick brown fox jumps over the lazy dog. The quick brown fox",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "Copy the list: apple, banana, cherry, date, elderberry, fig. Again: apple, banana,",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
]


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, **kw)


def run(engine, requests: list[tuple[str, list[int], SamplingParams]], max_steps: int = 400) -> dict:
    for rid, ids, params in requests:
        engine.add_request(rid, ids, params)
    final = engine.drain(max_steps=max_steps)
    engine.scheduler.check_integrity()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
    return final


def both(make_engine, requests, **kw) -> tuple[dict, dict, object]:
    off = run(make_engine(speculation="off", **kw), requests)
    spec_engine = make_engine(speculation="ngram", speculation_max_tokens=4, **kw)
    on = run(spec_engine, requests)
    return off, on, spec_engine


def same(off: dict, on: dict) -> None:
    assert off.keys() == on.keys()
    for rid in off:
        assert on[rid].token_ids == off[rid].token_ids, rid
        assert on[rid].text == off[rid].text, rid
        assert on[rid].finish_reason == off[rid].finish_reason, rid


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer.encode(p) for p in COPY_PROMPTS]


def test_greedy_identical_alone(make_engine, prompts):
    for i, ids in enumerate(prompts):
        off, on, eng = both(make_engine, [(f"r{i}", ids, greedy(40, ignore_eos=True))],
                            kv_cache_tokens=2048)
        same(off, on)
    stats = eng.scheduler.speculator.stats
    assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens > 0


def test_greedy_identical_concurrent_cascade(make_engine, prompts):
    reqs = [(f"r{i}", ids, greedy(30, ignore_eos=True)) for i, ids in enumerate(prompts)]
    # a shared prefix, so cascade groups form among the rows' own entries
    shared = prompts[1]
    reqs += [(f"s{i}", shared + prompts[i][:5], greedy(24, ignore_eos=True)) for i in range(3)]
    off, on, eng = both(make_engine, reqs, kv_cache_tokens=4096, cascade="always",
                        max_num_batched_tokens=64)
    same(off, on)
    assert eng.scheduler.speculator.stats.num_accepted_tokens > 0


def test_stops_mid_acceptance(make_engine, tokenizer, prompts):
    ids = prompts[3]  # counts on: proposals accepted several at a time
    reqs = [("len", ids, greedy(7, ignore_eos=True)),
            ("str", ids, greedy(40, ignore_eos=True, stop=[" 17,"])),
            ("tok", ids, greedy(40, ignore_eos=True, stop_token_ids=tokenizer.encode(" 16")[:1]))]
    off, on, _ = both(make_engine, reqs, kv_cache_tokens=2048)
    same(off, on)
    assert on["str"].finish_reason == "stop" and on["len"].finish_reason == "length"


def test_logprobs_and_seeded_sampling(make_engine, prompts):
    reqs = [("lp", prompts[0], greedy(20, ignore_eos=True, logprobs=2)),
            ("seed", prompts[1], SamplingParams(max_tokens=30, temperature=0.8, seed=5, ignore_eos=True)),
            ("pen", prompts[2], greedy(20, ignore_eos=True, frequency_penalty=0.5))]
    off, on, _ = both(make_engine, reqs, kv_cache_tokens=2048)
    same(off, on)
    assert [lp.token_id for lp in on["lp"].new_logprobs] == on["lp"].token_ids  # drained: all of them


def test_preemption_tiny_pool_no_leak(make_engine, prompts):
    reqs = [(f"r{i}", ids, greedy(40, ignore_eos=True)) for i, ids in enumerate(prompts)]
    off, on, eng = both(make_engine, reqs, kv_cache_tokens=12 * 16, max_num_batched_tokens=48)
    same(off, on)
    assert eng.scheduler.num_preemptions > 0


def test_prefix_cache_hit_after_speculation(make_engine, prompts):
    ids = prompts[1]
    off = run(make_engine(speculation="off", kv_cache_tokens=2048), [("a", ids, greedy(40, ignore_eos=True))])
    eng = make_engine(speculation="ngram", kv_cache_tokens=2048)
    first = run(eng, [("a", ids, greedy(40, ignore_eos=True))])
    same(off, first)
    # the whole first answer as a prompt: its blocks (accepted tokens only) come from the cache
    again = ids + first["a"].token_ids
    cold = run(make_engine(speculation="off", kv_cache_tokens=2048), [("b", again, greedy(16, ignore_eos=True))])
    hit = run(eng, [("b", again, greedy(16, ignore_eos=True))])
    assert hit["b"].num_cached_tokens > len(ids)
    same(cold, hit)
