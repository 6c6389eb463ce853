"""The first scheduler, without a model: token budget, chunked prefill, batch cap, preemption, no leaks."""

from __future__ import annotations

import pytest

from kvloop.engine.core.batch import StepResult
from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.core.sequence import Sequence
from kvloop.engine.kv.manager import KVCacheManager
from kvloop.engine.scheduler.scheduler import RequestRejected, Scheduler, SchedulerConfig


def make(num_blocks=64, block_size=4, **cfg) -> Scheduler:
    return Scheduler(SchedulerConfig(**cfg), KVCacheManager(num_blocks, block_size))


def seq(rid: str, n: int, max_tokens: int = 4) -> Sequence:
    return Sequence(rid, list(range(1, n + 1)), SamplingParams(max_tokens=max_tokens, temperature=0))


def fake_step(s: Scheduler, token: int = 7) -> None:
    """A step without a model: every sampling sequence gets `token`; the scheduler's
    bookkeeping applies it."""
    batch = s.schedule()
    s.update_from_output(batch,
                         StepResult({item.seq.request_id: token for item in batch.items if item.samples}))


def test_running_first_and_token_budget():
    s = make(max_num_batched_tokens=10, idle_step_tokens=0)  # the budget in every step, decoding or not
    a, b = seq("a", 25), seq("b", 3)
    s.add(a)
    s.add(b)
    batch = s.schedule()
    assert [i.num_tokens for i in batch.items] == [10]  # a's first chunk takes the whole budget
    a.num_computed_tokens = 10
    batch = s.schedule()
    assert [(i.seq.request_id, i.num_tokens) for i in batch.items] == [("a", 10)]
    a.num_computed_tokens = 20
    batch = s.schedule()
    assert [(i.seq.request_id, i.num_tokens) for i in batch.prefills] == [("a", 5), ("b", 3)]


def test_a_step_in_which_nothing_decodes_takes_the_idle_budget():
    s = make(max_num_batched_tokens=10, idle_step_tokens=30)
    a, b, c = seq("a", 25), seq("b", 3), seq("c", 25)
    s.add(a)
    s.add(b)
    batch = s.schedule()  # nothing decodes: both prompts whole, 28 tokens
    assert [(i.seq.request_id, i.num_tokens) for i in batch.items] == [("a", 25), ("b", 3)]
    s.update_from_output(batch, StepResult({"a": 7, "b": 7}))
    s.add(c)
    batch = s.schedule()  # a and b decode: the budget again, their two tokens and 8 of c's
    assert [(i.seq.request_id, i.num_tokens) for i in batch.items] == [("a", 1), ("b", 1), ("c", 8)]
    assert make(max_num_batched_tokens=10, idle_step_tokens=4).step_budget(lambda: False) == 10  # never below


def test_batch_cap_limits_running():
    s = make(max_num_seqs=2)
    for i in range(5):
        s.add(seq(str(i), 3))
    s.schedule()
    assert len(s.running) == 2 and len(s.waiting) == 3


def test_preemption_instead_of_oom_and_everything_finishes():
    s = make(num_blocks=8, block_size=4, max_num_batched_tokens=64)
    seqs = [seq(str(i), 6, max_tokens=10) for i in range(4)]
    for q in seqs:
        s.add(q)
    for _ in range(500):
        if not s.has_work():
            break
        fake_step(s)
        s.check_integrity()
    assert all(q.is_finished and q.num_output_tokens == 10 for q in seqs)
    assert s.num_preemptions > 0
    assert s.kv.num_free_blocks == s.kv.num_blocks


def test_rejects_what_can_never_run():
    s = make(num_blocks=4, block_size=4, max_model_len=100)
    with pytest.raises(RequestRejected) as err:
        s.add(seq("long", 98, max_tokens=10))
    assert err.value.reason == "too_long" and "100" in str(err.value)
    with pytest.raises(RequestRejected):
        s.add(seq("huge", 40))  # fits the context limit, not the pool
    with pytest.raises(RequestRejected):
        s.add(Sequence("empty", [], SamplingParams()))
