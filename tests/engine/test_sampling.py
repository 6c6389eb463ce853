"""Sampling parameters: validation, seeds, top-k/top-p, stop strings and ids, max_tokens, ignore_eos."""

from __future__ import annotations

import pytest
import torch
from kvloop.engine.runner.sampler import Sampler
from kvloop.engine.sampling import SamplingParams


@pytest.mark.parametrize("kwargs", [
    {"max_tokens": 0}, {"max_tokens": -3}, {"max_tokens": 1.5}, {"temperature": -0.1}, {"temperature": 3},
    {"top_p": 0}, {"top_p": 1.5}, {"top_k": -2}, {"seed": "x"}, {"stop": [""]}, {"stop": [3]},
    {"stop_token_ids": [-1]}, {"logprobs": 50}, {"temperature": float("nan")},
])
def test_invalid_params_raise_clear_errors(kwargs):
    with pytest.raises(ValueError) as err:
        SamplingParams(**kwargs)
    assert str(err.value)


def test_sampler_respects_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    sampler = Sampler()
    seen_k = {sampler.sample(logits, [SamplingParams(top_k=2, seed=s)], [f"k{s}"])[0][0] for s in range(60)}
    assert seen_k == {0, 1}
    seen_p = {sampler.sample(logits, [SamplingParams(top_p=0.7, seed=s)], [f"p{s}"])[0][0] for s in range(60)}
    assert seen_p == {0, 1}  # 0.5 < 0.7, so token 1 is kept; 0.8 >= 0.7, so token 2 is not


def test_seeded_sampling_is_reproducible_and_seed_dependent(make_engine, tokenizer):
    ids = tokenizer.encode("Tell me a story about a cat.")

    def run(seed: int) -> list[int]:
        engine = make_engine(kv_cache_tokens=1024)
        engine.add_request("s", ids, SamplingParams(max_tokens=12, temperature=1.0, seed=seed, ignore_eos=True))
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
    engine.add_request("stop", ids, SamplingParams(max_tokens=12, temperature=0, stop=[stop], ignore_eos=True))
    out = engine.drain(max_steps=100)["stop"]
    assert out.finish_reason == "stop"
    assert out.text == free_text[: free_text.index(stop)]


def test_stop_token_ids_max_tokens_and_ignore_eos(make_engine, tokenizer):
    engine = make_engine(kv_cache_tokens=1024)
    ids = tokenizer.encode("The capital of France is")
    engine.add_request("a", ids, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    free = engine.drain(max_steps=50)["a"]
    assert free.finish_reason == "length" and len(free.token_ids) == 8
    engine.add_request("b", ids, SamplingParams(max_tokens=8, temperature=0, stop_token_ids=[free.token_ids[2]]))
    stopped = engine.drain(max_steps=50)["b"]
    assert stopped.finish_reason == "stop" and stopped.token_ids == free.token_ids[:2]


def test_eos_ends_a_chat_reply(make_engine, tokenizer):
    engine = make_engine(kv_cache_tokens=2048)
    prompt = tokenizer.render_chat([{"role": "user", "content": "Say hello."}])
    engine.add_request("c", tokenizer.encode(prompt), SamplingParams(max_tokens=64, temperature=0))
    out = engine.drain(max_steps=100)["c"]
    assert out.finish_reason == "stop" and 2 not in out.token_ids and out.text
