"""An engine with a TPOT target: the engine reports each step's wall time to the scheduler's gate, which holds
admission while steps are slower than the target; every request still finishes, with the
tokens it gets alone."""

from __future__ import annotations

import random

from kvloop.engine.core.sampling import SamplingParams


def test_a_target_no_step_meets_admits_one_at_a_time_and_changes_no_token(make_engine, tokenizer):
    rng = random.Random(3)
    prompts = {f"r{i}": [rng.randrange(100, 40000) for _ in range(rng.randrange(4, 24))] for i in range(5)}
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    free = make_engine(kv_cache_tokens=2048)
    held = make_engine(kv_cache_tokens=2048, tpot_target_ms=0.001)  # far below any step of this model
    for rid, ids in prompts.items():
        free.add_request(rid, ids, params)
    expected = free.drain(max_steps=200)
    held.add_request("r0", prompts["r0"], params)
    # its prefill, then
    final = {out.request_id: out for _ in range(2) for out in held.step() if out.finished}
    # a decode step: the first the gate measures
    for rid, ids in prompts.items():
        if rid != "r0":
            held.add_request(rid, ids, params)
    most_running = 0
    for _ in range(300):
        for out in held.step():
            if out.finished:
                final[out.request_id] = out
        most_running = max(most_running, len(held.scheduler.running))
        if not held.has_unfinished():
            break
    assert {rid: o.token_ids for rid, o in final.items()} == {rid: o.token_ids for rid, o in expected.items()}
    snap = held.snapshot()
    assert most_running == 1 and snap.tpot_holds > 0
    assert snap.tpot_target_s == 1e-6 and snap.decode_step_s > snap.tpot_target_s
    assert free.snapshot().tpot_target_s == 0 and free.snapshot().tpot_holds == 0
    held.scheduler.check_integrity()
    assert held.kv.num_free_blocks == held.kv.num_blocks
