"""A request's greedy output is the same alone or among 16 concurrent requests arriving at different steps."""

from __future__ import annotations

import random

from kvloop.engine.core.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def test_alone_equals_among_sixteen(make_engine, tokenizer):
    rng = random.Random(7)
    target = tokenizer.encode("The three laws of thermodynamics state that")
    others = [[rng.randrange(100, 40000) for _ in range(rng.randrange(3, 60))] for _ in range(16)]

    alone = make_engine(kv_cache_tokens=2048)
    alone.add_request("target", target, GREEDY)
    expected = alone.drain(max_steps=200)["target"].token_ids

    busy = make_engine(kv_cache_tokens=4096, max_num_batched_tokens=48)
    pending = [(f"o{i}", ids) for i, ids in enumerate(others)]
    final = {}
    for step in range(400):
        if step == 3:
            busy.add_request("target", target, GREEDY)
        if pending and step % 2 == 0:  # staggered arrivals, some before the target, most after
            rid, ids = pending.pop()
            busy.add_request(rid, ids,
                             SamplingParams(max_tokens=rng.randrange(4, 20), temperature=0, ignore_eos=True))
        for out in busy.step():
            if out.finished:
                final[out.request_id] = out
        if not pending and not busy.has_unfinished():
            break
    assert len(final) == 17
    assert final["target"].token_ids == expected
    busy.scheduler.check_integrity()
    assert busy.kv.num_free_blocks == busy.kv.num_blocks
