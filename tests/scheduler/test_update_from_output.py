"""Scheduler.update_from_output, the one copy of the post-step bookkeeping (pure Python): computed tokens,
sampled tokens and logprobs keyed by request id, token times from the clock or a given `now`, and the
finishes it decides (stop token, length, a request the runner failed), with their blocks freed."""

from __future__ import annotations

from sched_helpers import FakeClock, make, req, toks

from kvloop.engine.core.batch import StepResult
from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.core.sequence import SeqStatus, Sequence, TokenLogprob


def _sampling(batch) -> list[str]:
    return [item.seq.request_id for item in batch.items if item.samples]


def test_tokens_times_and_the_length_finish_by_request_id():
    clock = FakeClock(5.0)
    s = make(clock=clock, max_num_batched_tokens=8, idle_step_tokens=0)  # b's prompt in two chunks
    a, b = req("a", toks(1, 6), max_tokens=2), req("b", toks(2, 6), max_tokens=3)
    s.add(a)
    s.add(b)
    batch = s.schedule()  # a's whole prompt, b's first 2 tokens: only a samples
    assert [(i.seq.request_id, i.num_tokens) for i in batch.items] == [("a", 6), ("b", 2)]
    lp = TokenLogprob(11, -0.5, [])
    out = s.update_from_output(batch, StepResult({"a": 11}, logprobs={"a": lp}))
    assert [(x.seq.request_id, x.token, x.finish_reason, x.gap) for x in out] == [("a", 11, None, None)]
    assert a.num_computed_tokens == 6 and a.output_token_ids == [11] and a.logprobs == [lp]
    assert a.first_token_time == a.last_token_time == 5.0  # the scheduler's clock
    assert b.num_computed_tokens == 2 and b.num_output_tokens == 0 and b.first_token_time is None

    clock.t = 6.0
    batch = s.schedule()  # a decodes, b's prompt ends: both sample
    out = s.update_from_output(batch, StepResult({"a": 12, "b": 21}), now=7.5)  # a given `now` wins
    assert [(x.seq.request_id, x.token, x.finish_reason, x.gap) for x in out] == [
        ("a", 12, "length", 2.5), ("b", 21, None, None)]
    assert a.status is SeqStatus.FINISHED and a.finish_reason == "length" and a.finished_time == 6.0
    assert a.output_token_ids == [11, 12] and a.last_token_time == 7.5 and not a.block_table
    assert s.running == [b] and b.first_token_time == 7.5 and b.num_computed_tokens == 6


def test_stop_tokens_and_eos_finish_with_stop():
    s = make()
    stop = Sequence("stop", toks(3, 4), SamplingParams(max_tokens=9, temperature=0, stop_token_ids=[5]))
    eos = Sequence("eos", toks(4, 4), SamplingParams(max_tokens=9, temperature=0))
    ignored = Sequence("ignored", toks(5, 4), SamplingParams(max_tokens=9, temperature=0, ignore_eos=True))
    for q in (stop, eos, ignored):
        s.add(q)
    batch = s.schedule()
    out = s.update_from_output(batch, StepResult({"stop": 5, "eos": 2, "ignored": 2}), eos_token_ids={2})
    assert {x.seq.request_id: x.finish_reason for x in out} == {"stop": "stop", "eos": "stop",
                                                                "ignored": None}
    assert s.running == [ignored] and stop.output_token_ids == [5]


def test_a_request_the_runner_failed_is_finished_without_a_token():
    s = make()
    ok, bad = req("ok", toks(6, 4)), req("bad", toks(7, 4))
    s.add(ok)
    s.add(bad)
    batch = s.schedule()
    assert _sampling(batch) == ["ok", "bad"]
    out = s.update_from_output(batch, StepResult({"ok": 9}, errors={"bad": ("sampling", "nan")}))
    assert [(x.seq.request_id, x.token, x.finish_reason, x.error) for x in out] == [
        ("ok", 9, None, None), ("bad", None, "error", ("sampling", "nan"))]
    assert bad.is_finished and bad.num_output_tokens == 0 and bad.num_computed_tokens == 4
    assert s.running == [ok]
    s.check_integrity()
