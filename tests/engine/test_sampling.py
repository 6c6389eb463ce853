"""Sampling parameters: validation, seeds, top-k/top-p, stop strings and ids, max_tokens, ignore_eos."""

from __future__ import annotations

import pytest
import torch

from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.runner.sampler import Sampler


@pytest.mark.parametrize("kwargs", [
    {"max_tokens": 0}, {"max_tokens": -3}, {"max_tokens": 1.5}, {"temperature": -0.1}, {"temperature": 3},
    {"top_p": 0}, {"top_p": 1.5}, {"top_k": -2}, {"seed": "x"}, {"stop": [""]}, {"stop": [3]},
    {"stop_token_ids": [-1]}, {"logprobs": 50}, {"temperature": float("nan")},
    {"seed": 2**64}, {"seed": -(2**63) - 1}, {"temperature": 1e-40}, {"temperature": 0.005},
    {"stop": ["x" * 257]}, {"presence_penalty": 2.5}, {"frequency_penalty": float("inf")},
    {"logit_bias": {5: 101}}, {"logit_bias": {-1: 1}}, {"logit_bias": {5: float("nan")}},
    {"logit_bias": {i: 1 for i in range(301)}},
])
def test_invalid_params_raise_clear_errors(kwargs):
    with pytest.raises(ValueError) as err:
        SamplingParams(**kwargs)
    assert str(err.value)


def test_sampler_respects_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    sampler = Sampler()
    seen_k = {sampler.sample(logits, [SamplingParams(top_k=2, seed=s)],
                             [f"k{s}"]).tokens[0] for s in range(60)}
    assert seen_k == {0, 1}
    seen_p = {sampler.sample(logits, [SamplingParams(top_p=0.7, seed=s)],
                             [f"p{s}"]).tokens[0] for s in range(60)}
    assert seen_p == {0, 1}  # 0.5 < 0.7, so token 1 is kept; 0.8 >= 0.7, so token 2 is not


def test_seeded_sampling_is_reproducible_and_seed_dependent(make_engine, tokenizer):
    ids = tokenizer.encode("Tell me a story about a cat.")

    def run(seed: int) -> list[int]:
        engine = make_engine(kv_cache_tokens=1024)
        engine.add_request("s", ids,
                           SamplingParams(max_tokens=12, temperature=1.0, seed=seed, ignore_eos=True))
        return engine.drain(max_steps=100)["s"].token_ids

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_stop_string_truncates_and_stops(make_engine, tokenizer):
    engine = make_engine(kv_cache_tokens=1024)
    ids = tokenizer.encode("Count: 1, 2, 3, 4, 5, 6,")
    engine.add_request("free", ids, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    free_text = engine.drain(max_steps=100)["free"].text
    stop = free_text.strip()[2:4]
    assert stop
    engine.add_request("stop", ids,
                       SamplingParams(max_tokens=12, temperature=0, stop=[stop], ignore_eos=True))
    out = engine.drain(max_steps=100)["stop"]
    assert out.finish_reason == "stop"
    assert out.text == free_text[: free_text.index(stop)]


def test_stop_token_ids_max_tokens_and_ignore_eos(make_engine, tokenizer):
    engine = make_engine(kv_cache_tokens=1024)
    ids = tokenizer.encode("The capital of France is")
    engine.add_request("a", ids, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    free = engine.drain(max_steps=50)["a"]
    assert free.finish_reason == "length" and len(free.token_ids) == 8
    engine.add_request("b", ids,
                       SamplingParams(max_tokens=8, temperature=0, stop_token_ids=[free.token_ids[2]]))
    stopped = engine.drain(max_steps=50)["b"]
    assert stopped.finish_reason == "stop" and stopped.token_ids == free.token_ids[:2]


def test_eos_ends_a_chat_reply(make_engine, tokenizer):
    engine = make_engine(kv_cache_tokens=2048)
    prompt = tokenizer.render_chat([{"role": "user", "content": "Say hello."}])
    engine.add_request("c", tokenizer.encode(prompt), SamplingParams(max_tokens=64, temperature=0))
    out = engine.drain(max_steps=100)["c"]
    assert out.finish_reason == "stop" and 2 not in out.token_ids and out.text


LOGITS = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 3))


class Boom:
    """A logits processor that raises for one request: the row of that request alone must fail."""

    name = "boom"

    def wants(self, row) -> bool:
        return True

    def apply(self, logits, rows) -> None:
        if any(r.request_id == "bad" for r in rows):
            raise RuntimeError("boom")
        logits[:, 3] += 100.0


def test_a_failing_processor_fails_its_row_only():
    out = Sampler([Boom()]).sample(LOGITS.clone(), [SamplingParams(temperature=0)] * 3, ["a", "bad", "c"])
    assert out.tokens == [3, None, 3]  # the other rows still got the processor's edit
    assert out.errors == {1: ("boom", "RuntimeError: boom")}


def test_unsampleable_rows_fail_alone():
    # torch.multinomial raises on nan; a row whose every logit is -inf has nothing to sample
    logits = LOGITS.clone()
    logits[0] = float("nan")
    logits[2] = float("-inf")
    out = Sampler().sample(logits, [SamplingParams(seed=1), SamplingParams(seed=1, logprobs=2),
                                    SamplingParams(temperature=0)], ["a", "b", "c"])
    assert out.tokens[0] is None and out.tokens[2] is None and out.tokens[1] in range(4)
    assert set(out.errors) == {0, 2} and out.errors[0][0] == "sampling"
    assert out.logprobs[1] is not None and len(out.logprobs[1].top) == 2


def test_tiny_top_p_keeps_the_top_token():
    # a top_p below float32's smallest number used to drop every token, and multinomial raised on the nan
    for top_p in (1e-300, 5e-324):
        out = Sampler().sample(LOGITS[:1].clone(), [SamplingParams(top_p=top_p, seed=3)], ["a"])
        assert out.tokens == [0] and not out.errors


def test_logit_bias_and_penalties():
    sampler = Sampler()
    biased = sampler.sample(LOGITS[:1].clone(), [SamplingParams(temperature=0, logit_bias={2: 100})], ["a"])
    assert biased.tokens == [2]
    banned = sampler.sample(LOGITS[:1].clone(), [SamplingParams(temperature=0, logit_bias={0: -100})], ["a"])
    assert banned.tokens == [1]

    class Seq:  # what the penalties read: the tokens generated so far
        output_token_ids = [0, 0, 1]

    seq = Seq()
    plain = sampler.sample(LOGITS[:1].clone(), [SamplingParams(temperature=0)], ["a"], [seq])
    assert plain.tokens == [0]
    penalised = sampler.sample(LOGITS[:1].clone(), [SamplingParams(temperature=0, frequency_penalty=1.0)],
                               ["a"], [seq])
    assert penalised.tokens == [2]  # 0 lost 2, 1 lost 1: log 0.15 beats log 0.5 - 2 and log 0.3 - 1
    present = sampler.sample(LOGITS[:1].clone(), [SamplingParams(temperature=0, presence_penalty=2.0)],
                             ["a"], [seq])
    assert present.tokens == [2]


def test_request_failing_in_the_step_fails_alone_and_frees_its_blocks(make_engine, tokenizer):
    engine = make_engine(kv_cache_tokens=1024)
    engine.runner.sampler.processors.append(Boom())
    ids = tokenizer.encode("The capital of France is")
    for rid in ("a", "bad", "c"):
        engine.add_request(rid, ids, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    final = engine.drain(max_steps=50)
    assert final["bad"].finish_reason == "error" and "boom" in final["bad"].error
    assert final["a"].finish_reason == final["c"].finish_reason == "length"
    assert final["a"].token_ids == final["c"].token_ids and len(final["a"].token_ids) == 4
    assert engine.request_failures == {"boom": 1}
    engine.scheduler.check_integrity()
    assert not engine.scheduler.running and not engine.has_unfinished()


def test_a_failing_model_step_fails_its_requests_and_the_engine_goes_on(make_engine, tokenizer):
    engine = make_engine(kv_cache_tokens=1024)
    ids = tokenizer.encode("The capital of France is")
    engine.add_request("ref", ids, SamplingParams(max_tokens=4, temperature=0))
    reference = engine.drain(max_steps=50)["ref"].token_ids
    forward = engine.model.forward

    def broken(*args, **kwargs):
        raise RuntimeError("device lost")

    engine.model.forward = broken
    try:
        engine.add_request("x", ids, SamplingParams(max_tokens=4, temperature=0))
        engine.add_request("y", ids + ids, SamplingParams(max_tokens=4, temperature=0))
        final = engine.drain(max_steps=10)
    finally:
        engine.model.forward = forward
    assert {r: o.finish_reason for r, o in final.items()} == {"x": "error", "y": "error"}
    assert "device lost" in final["x"].error and engine.step_failures == 1
    engine.scheduler.check_integrity()
    engine.add_request("after", ids, SamplingParams(max_tokens=4, temperature=0))
    assert engine.drain(max_steps=50)["after"].token_ids == reference


def test_a_request_failing_in_output_processing_fails_alone(make_engine, tokenizer):
    engine = make_engine(kv_cache_tokens=1024)
    ids = tokenizer.encode("The capital of France is")
    for rid in ("a", "bad"):
        engine.add_request(rid, ids, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))

    class BrokenDetokenizer:  # stands in for any fault of detokenization or stop handling
        text = ""

        def add(self, token_id: int) -> str:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "broken")

    engine._states["bad"].detok = BrokenDetokenizer()
    final = engine.drain(max_steps=50)
    assert final["bad"].finish_reason == "error" and final["bad"].error_stage == "output"
    assert "UnicodeDecodeError" in final["bad"].error
    assert final["a"].finish_reason == "length" and len(final["a"].token_ids) == 4
    engine.scheduler.check_integrity()
    assert not engine.has_unfinished() and engine.request_failures == {"output": 1}
