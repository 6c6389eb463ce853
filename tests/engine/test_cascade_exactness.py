"""Shared-prefix decode is exact: with the real model in fp32, greedy tokens are identical with cascade
forced on every shared prefix and with it off, for groups of 1, 2 and 16 rows, nested prefixes, prefixes
ending mid-block and on a block edge, rows joining and finishing between steps, preempted and resumed
rows, and prefixes that came back from the host and disk tiers. No block leaks."""

from __future__ import annotations

import random

import pytest

from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.kv.config import KVConfig


def toks(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 40000) for _ in range(n)]


SYSTEM = toks(1, 40)  # 2 full blocks shared by nearly all rows, ending mid-block
DOC_A = toks(2, 88)  # SYSTEM + DOC_A = 128 tokens: the document ends on a block edge
DOC_B = toks(3, 50)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


def run_schedule(engine, schedule: dict[int, list[tuple[str, list[int], int]]], max_steps: int = 200,
                 preempt_at: dict[int, str] | None = None) -> dict[str, list[int]]:
    """schedule: step -> requests (id, prompt, max_tokens) added before that step; preempt_at: step ->
    request id preempted (by the scheduler's own rule for its kind) before that step."""
    final = {}
    for step in range(max_steps):
        for rid, prompt, n in schedule.get(step, []):
            engine.add_request(rid, prompt, greedy(n))
        victim_id = (preempt_at or {}).get(step)
        if victim_id is not None:
            victim = next(s for s in engine.scheduler.running if s.request_id == victim_id)
            engine.scheduler.preempt(victim)
        final.update({o.request_id: o.token_ids for o in engine.step() if o.finished})
        if step > max(schedule) and not engine.has_unfinished():
            break
    engine.scheduler.check_integrity()
    assert engine.kv.num_referenced_blocks == 0
    return final


def both(make_engine, schedule, **kwargs):
    """The same schedule with cascade off and forced on: tokens must match; returns the cascading engine."""
    preempt_at = kwargs.pop("preempt_at", None)
    expected = run_schedule(make_engine(cascade="off", **kwargs), schedule, preempt_at=preempt_at)
    engine = make_engine(cascade="always", **kwargs)
    got = run_schedule(engine, schedule, preempt_at=preempt_at)
    assert got == expected
    assert sum(len(v) for v in got.values()) == sum(n for reqs in schedule.values() for _, _, n in reqs)
    return engine


KV = KVConfig(min_prefix_tokens=16, admit_min_requests=1, host_cache_tokens=0)


def test_groups_of_1_2_16_nested_joining_and_finishing(make_engine):
    warm = [("warm-a", SYSTEM + DOC_A, 1), ("warm-b", SYSTEM + DOC_B, 1)]
    # the first ten rows outlive the last six's arrival, then finish at different steps
    doc_a = [(f"a{i}", SYSTEM + DOC_A + toks(100 + i, 3 + i % 5), 9 + i % 4 if i < 10 else 2 + i % 3)
             for i in range(16)]
    doc_b = [(f"b{i}", SYSTEM + DOC_B + toks(200 + i, 6), 5) for i in range(2)]
    schedule = {0: warm, 3: doc_a[:10] + doc_b[:1], 5: [("solo", toks(300, 20), 6)],
                6: doc_a[10:] + doc_b[1:]}
    engine = both(make_engine, schedule, kv=KV, kv_cache_tokens=4096, max_num_batched_tokens=512)
    sizes = engine.runner.cascade_group_sizes
    assert sizes[16] > 0 and sizes[2] > 0, sizes  # the 16 document rows, the 2 others
    assert any(n >= 17 for n in sizes)  # the system prompt shared by both documents' rows (nested)


@pytest.mark.parametrize("kind_host", [1024, 0], ids=["swap", "recompute"])
def test_preempted_and_resumed_rows(make_engine, kind_host):
    rows = [(f"r{i}", SYSTEM + DOC_A + toks(400 + i, 4), 8) for i in range(4)]
    schedule = {0: [("warm", SYSTEM + DOC_A, 1)], 2: rows}
    kv = KVConfig(min_prefix_tokens=16, admit_min_requests=1, host_cache_tokens=kind_host)
    engine = both(make_engine, schedule, kv=kv, kv_cache_tokens=2048, preempt_at={6: "r1"})
    assert engine.snapshot().num_preemptions_by_kind["swap" if kind_host else "recompute"] == 1
    assert engine.runner.cascade_group_sizes[4] > 0
    # rebuilt after the preemption (a swapped row can be back within the step: its preemption count tells)
    assert engine.runner.planner.builds >= 2


@pytest.mark.parametrize("tier", ["host", "disk"])
def test_shared_prefix_from_a_lower_tier(make_engine, tmp_path, tier):
    kv = (KVConfig(min_prefix_tokens=16, host_cache_tokens=1024,
                   host_admit_min_requests=1) if tier == "host" else
          KVConfig(min_prefix_tokens=16, host_cache_tokens=0, disk_dir=str(tmp_path),
                   disk_admit_min_requests=1))
    rows = [(f"q{i}", SYSTEM + DOC_A + toks(500 + i, 5), 4) for i in range(3)]
    for cascade in ("off", "always"):
        engine = make_engine(cascade=cascade, kv=kv, kv_cache_tokens=256)
        run_schedule(engine, {0: [("warm", SYSTEM + DOC_A + toks(499, 5), 1)]})
        # takes the 16-block pool: the prefix goes down
        run_schedule(engine, {0: [("filler", toks(498, 250), 1)]})
        if tier == "disk":
            engine.kv.flush()
        seqs = [engine.add_request(rid, p, greedy(n)) for rid, p, n in rows]
        out = run_schedule(engine, {0: []})
        assert any(tier in s.cached_tokens_by_tier for s in seqs), [s.cached_tokens_by_tier for s in seqs]
        if cascade == "off":
            expected = out
    assert out == expected
    assert engine.runner.cascade_group_sizes[3] > 0
