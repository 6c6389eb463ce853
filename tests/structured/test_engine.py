"""Structured output inside the batcher, with the real model (fp32, greedy): the grammar constrains its
own row only, finishes the request with `stop`, and keeps its state through preemption and cache hits."""

from __future__ import annotations

import json

import jsonschema
import pytest
from structured_helpers import PERSON, PERSON_SPEC

from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.kv.config import KVConfig

MAX_TOKENS = 40


def prompt(tokenizer, who: str = "a person") -> list[int]:
    text = tokenizer.render_chat([{"role": "user",
                                   "content": f"Describe {who} as JSON with name, age and city."}])
    return tokenizer.encode(text)


def constrained(n: int = MAX_TOKENS) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, grammar=PERSON_SPEC)


def plain(n: int = 12) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


def check_done(eng) -> None:
    eng.scheduler.check_integrity()
    assert eng.kv.num_referenced_blocks == 0
    assert eng.runner.sampler.processors[-1]._matchers == {}  # every finished request's matcher forgotten


@pytest.fixture(scope="module")
def alone(make_engine, tokenizer):
    eng = make_engine(kv=KVConfig(mode="continuous"))
    eng.add_request("g", prompt(tokenizer), constrained())
    out = eng.drain(max_steps=200)["g"]
    check_done(eng)
    return out


def test_a_constrained_request_returns_schema_valid_json_and_stops(alone):
    jsonschema.validate(json.loads(alone.text), PERSON)
    assert alone.finish_reason == "stop" and alone.num_output_tokens < MAX_TOKENS


def test_unconstrained_rows_are_untouched_and_the_constrained_row_is_unchanged_among_them(make_engine,
                                                                                          tokenizer,
                                                                                        alone):
    others = [prompt(tokenizer, w) for w in ("a cat", "the sea", "a house")]
    ref = make_engine(kv=KVConfig(mode="continuous"))
    for i, p in enumerate(others):
        ref.add_request(f"u{i}", p, plain())
    expected = {k: v.token_ids for k, v in ref.drain(max_steps=200).items()}
    eng = make_engine(kv=KVConfig(mode="continuous"))
    eng.add_request("u0", others[0], plain())
    eng.add_request("g", prompt(tokenizer), constrained())
    eng.add_request("u1", others[1], plain())
    eng.add_request("u2", others[2], plain())
    final = eng.drain(max_steps=300)
    assert {k: final[k].token_ids for k in expected} == expected
    assert final["g"].token_ids == alone.token_ids
    check_done(eng)


@pytest.mark.parametrize("kind", ["swap", "recompute"])
def test_grammar_state_survives_preemption(make_engine, tokenizer, alone, kind):
    host = 4096 if kind == "swap" else 0
    eng = make_engine(kv=KVConfig(mode="codesign", host_cache_tokens=host))
    eng.add_request("g", prompt(tokenizer), constrained())
    eng.add_request("u", prompt(tokenizer, "a dog"), plain(30))
    final = {}
    for _ in range(6):  # prefill and a few constrained tokens
        final.update({o.request_id: o for o in eng.step() if o.finished})
    victim = next(s for s in eng.scheduler.running if s.request_id == "g")
    assert 0 < victim.num_output_tokens < len(alone.token_ids)
    assert eng.scheduler.preempt(victim) == kind
    final.update(eng.drain(max_steps=300))
    assert final["g"].token_ids == alone.token_ids and final["g"].finish_reason == "stop"
    assert eng.snapshot().num_preemptions_by_kind[kind] == 1
    check_done(eng)


def test_a_prefix_cache_hit_gives_the_same_output_as_cold(make_engine, tokenizer, alone):
    eng = make_engine(kv=KVConfig(mode="continuous+lru"))
    eng.add_request("warm", prompt(tokenizer), plain(2))  # fills the cache with the same prompt
    eng.drain(max_steps=100)
    eng.add_request("g", prompt(tokenizer), constrained())
    out = eng.drain(max_steps=200)["g"]
    assert out.num_cached_tokens > 0
    assert out.token_ids == alone.token_ids
    check_done(eng)


def test_json_object_returns_an_object(make_engine, tokenizer):
    from kvloop.engine.core.grammar_spec import parse_response_format

    eng = make_engine(kv=KVConfig(mode="continuous"))
    params = SamplingParams(max_tokens=60, temperature=0,
                            grammar=parse_response_format({"type": "json_object"}))
    eng.add_request("o", prompt(tokenizer), params)
    out = eng.drain(max_steps=200)["o"]
    if out.finish_reason == "stop":
        assert isinstance(json.loads(out.text), dict)
    else:  # a free-form object may not close within max_tokens; what there is still starts as one
        assert out.finish_reason == "length" and out.text.startswith("{")
    check_done(eng)
