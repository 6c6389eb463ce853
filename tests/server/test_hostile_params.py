"""Requests that used to stop the engine, a request failing alone inside the step, and every OpenAI
parameter either honoured or refused by name. The official openai client against the live server."""

from __future__ import annotations

import concurrent.futures
import functools
import json

import httpx
import pytest

openai = pytest.importorskip("openai")

MESSAGES = [{"role": "user", "content": "Name three colours."}]
PROMPT = "The capital of France is"


def greedy_text(oai, **kw) -> str:
    out = oai.completions.create(model="default", prompt=PROMPT, max_tokens=4, temperature=0, **kw)
    return out.choices[0].text


def assert_still_serving(http: httpx.Client, oai, server, reference: str) -> None:
    assert http.get("/health").status_code == 200
    assert server.async_engine.dead is None and server.async_engine._thread.is_alive()
    assert greedy_text(oai) == reference
    server.assert_no_leak()


def bad_request(call) -> dict:
    with pytest.raises(openai.BadRequestError) as err:
        call()
    return err.value.body


# Three parameters stopped the engine thread: a seed outside 64 bits (the generator's set-up), and a tiny
# temperature or top_p (probabilities inf/nan in the sampling). Now: a 400 at the edge, or served.
@pytest.mark.parametrize("kw,param", [
    ({"seed": 2**64}, "seed"),
    ({"seed": -(2**63) - 1}, "seed"),
    ({"temperature": 1e-40}, "temperature"),
    ({"temperature": 0.001}, "temperature"),
], ids=["seed_2_64", "seed_below_int64", "temperature_1e-40", "temperature_below_0.01"])
def test_engine_killers_are_400s_that_name_the_parameter(oai, http, server, kw, param):
    reference = greedy_text(oai)
    body = bad_request(lambda: oai.chat.completions.create(model="default", messages=MESSAGES, max_tokens=2,
                                                           **kw))
    assert body["param"] == param and param in body["message"]
    assert_still_serving(http, oai, server, reference)


def test_tiny_top_p_and_extreme_seeds_are_served(oai, http, server):
    reference = greedy_text(oai)
    assert greedy_text(oai) == reference
    # top_p below float32's smallest number keeps the top token: the greedy answer, through the sampler
    tiny = oai.completions.create(model="default", prompt=PROMPT, max_tokens=4, top_p=1e-300, seed=1)
    assert tiny.choices[0].text == reference
    # the largest int64 seed with n=2 (the second choice's seed is one more) and the smallest one
    for seed in (2**63 - 1, -(2**63)):
        out = oai.completions.create(model="default", prompt=PROMPT, max_tokens=3, n=2, seed=seed)
        assert len(out.choices) == 2
    assert_still_serving(http, oai, server, reference)


class FailsForSeed:
    """A logits processor that fails the rows of one seed from their third token on (so a stream has
    begun): a stand-in for any per-request fault."""

    name = "injected"

    def __init__(self, seed: int):
        self.seed = seed

    def wants(self, row) -> bool:
        return row.params.seed == self.seed and len(row.output_token_ids) >= 2

    def apply(self, logits, rows) -> None:
        raise RuntimeError("injected fault")


# run in the engine (the core process, where there is one): module-level, so that they pickle
def add_processor(proc, e) -> None:
    e.runner.sampler.processors.append(proc)


def remove_injected(e) -> None:
    e.runner.sampler.processors[:] = [p for p in e.runner.sampler.processors if p.name != FailsForSeed.name]


def break_forward_once(e) -> None:
    model = e.model

    def forward_once_broken(*args, **kwargs):
        del model.forward  # the next step runs the real forward again
        raise RuntimeError("device fault")

    model.forward = forward_once_broken


def step_failures(e) -> int:
    return e.step_failures


@pytest.fixture
def injected_fault(server):
    proc = FailsForSeed(4242)
    server.in_engine(functools.partial(add_processor, proc))
    yield proc
    server.in_engine(remove_injected)


def test_a_request_failing_in_the_step_fails_alone(oai, http, server, injected_fault):
    reference = greedy_text(oai)

    def good() -> str:
        return oai.completions.create(model="default", prompt=PROMPT, max_tokens=12, temperature=0,
                                      extra_body={"ignore_eos": True}).choices[0].text

    def bad():
        return oai.completions.create(model="default", prompt=PROMPT, max_tokens=12, seed=4242,
                                      extra_body={"ignore_eos": True})

    def bad_stream() -> list[str]:
        reasons = []
        stream = oai.chat.completions.create(model="default", messages=MESSAGES, max_tokens=12, seed=4242,
                                             stream=True, extra_body={"ignore_eos": True})
        with pytest.raises(openai.APIError) as err:
            for chunk in stream:
                reasons += [c.finish_reason for c in chunk.choices if c.finish_reason]
        assert "injected fault" in str(err.value)
        return reasons

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        goods = [pool.submit(good) for _ in range(2)]
        failing = pool.submit(bad)
        streamed = pool.submit(bad_stream)
        with pytest.raises(openai.InternalServerError) as err:
            failing.result()
        assert err.value.status_code == 500 and err.value.body["code"] == "request_failed"
        assert "injected fault" in err.value.body["message"]
        assert streamed.result() == ["error"]
        assert len({g.result() for g in goods}) == 1
    metrics = http.get("/metrics").text
    assert 'kvloop:request_failures_total{model_name="' in metrics and 'stage="injected"} 2.0' in metrics
    assert_still_serving(http, oai, server, reference)


def test_raw_stream_ends_with_error_event_and_done(http, server, injected_fault):
    body = {"model": "default", "prompt": PROMPT, "max_tokens": 6, "seed": 4242, "stream": True,
            "ignore_eos": True}
    with http.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200  # a stream has begun before the step fails it
        events = [line.removeprefix("data: ") for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "request_failed" and error["type"] == "server_error"
    assert json.loads(events[-3])["choices"][0]["finish_reason"] == "error"
    assert len(events) >= 4  # the tokens before the fault were streamed
    server.assert_no_leak()


def test_a_failing_model_step_is_a_503_and_the_engine_goes_on(oai, http, server):
    reference = greedy_text(oai)
    server.in_engine(break_forward_once)
    with pytest.raises(openai.InternalServerError) as err:
        greedy_text(oai)
    assert err.value.status_code == 503 and err.value.body["code"] == "engine_error"
    assert "device fault" in err.value.body["message"]
    assert err.value.response.headers["retry-after"] == "1"
    assert "kvloop:step_failures_total" in http.get("/metrics").text
    assert server.in_engine(step_failures) >= 1
    assert_still_serving(http, oai, server, reference)


# ---- every parameter honoured or refused by name --------------------------------------------------------
def test_logit_bias_is_applied(oai, server):
    tok = server.engine.tokenizer
    target = tok.encode(" banana")[0]
    out = oai.completions.create(model="default", prompt=PROMPT, max_tokens=3, temperature=0,
                                 logit_bias={str(target): 100})
    assert out.choices[0].text == tok.token_text(target) * 3
    banned = tok.encode(greedy_text(oai))[0]
    avoided = oai.completions.create(model="default", prompt=PROMPT, max_tokens=1, temperature=0,
                                     logit_bias={str(banned): -100}, logprobs=0)
    assert tok.encode(avoided.choices[0].text)[0] != banned


def test_frequency_and_presence_penalties_change_a_repetitive_answer(oai, server):
    prompt = "one one one one one one one one"
    plain = oai.completions.create(model="default", prompt=prompt, max_tokens=16,
                                   temperature=0).choices[0].text
    ids = server.engine.tokenizer.encode(plain)
    assert len(set(ids)) < len(ids)  # the model repeats itself without a penalty
    for kw in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}):
        penalised = oai.completions.create(model="default", prompt=prompt, max_tokens=16, temperature=0, **kw)
        assert penalised.choices[0].text != plain, kw


def test_text_parts_equal_the_joined_string(oai):
    parts = [{"type": "text", "text": "Name three "}, {"type": "text", "text": "colours."}]
    a = oai.chat.completions.create(model="default", messages=[{"role": "user", "content": parts}],
                                    max_tokens=6, temperature=0)
    b = oai.chat.completions.create(model="default", messages=MESSAGES, max_tokens=6, temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_safety_identifier_and_defaults_are_accepted(oai):
    out = oai.chat.completions.create(model="default", messages=MESSAGES, max_tokens=2, temperature=0,
                                      service_tier="auto", store=False, modalities=["text"],
                                      tool_choice="none",
                                      extra_body={"safety_identifier": "tenant-a", "prompt_cache_key": "k"})
    assert out.choices[0].message.content is not None


CHAT_REFUSED = [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"parallel_tool_calls": True}, "parallel_tool_calls"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ({"reasoning_effort": "low"}, "reasoning_effort"),
    ({"store": True}, "store"),
    ({"metadata": {"a": "b"}}, "metadata"),
    ({"service_tier": "priority"}, "service_tier"),
    ({"response_format": {"type": "bogus"}}, "response_format"),
    ({"extra_body": {"repetition_penalty": 1.2}}, "repetition_penalty"),
    ({"extra_body": {"stream_options": {"include_usage": True, "bogus": 1}}, "stream": True},
     "stream_options.bogus"),
    ({"logit_bias": {"99999999": 5}}, "logit_bias"),
    ({"logit_bias": {"abc": 5}}, "logit_bias"),
    ({"logit_bias": {"5": 100.5}}, "logit_bias.5"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"},
                                                 {"type": "image_url", "image_url": {"url": "http://x"}}]}]},
     "messages[0].content[1].type"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "",
                                                                                        "format": "wav"}}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "assistant", "content": None,
                    "tool_calls": [{"id": "1", "type": "function",
                                    "function": {"name": "f", "arguments": "{}"}}]},
                   {"role": "user", "content": "hi"}]}, "messages[0].tool_calls"),
    ({"seed": 2**63}, "seed"),
    ({"extra_body": {"top_k": 2**31}}, "top_k"),
    ({"extra_body": {"stop": ["x" * 257]}}, "stop"),
]


@pytest.mark.parametrize("kw,param", CHAT_REFUSED, ids=[p for _, p in CHAT_REFUSED])
def test_chat_parameter_refused_by_name(oai, kw, param):
    kw = {"messages": MESSAGES, **kw}
    body = bad_request(lambda: oai.chat.completions.create(model="default", max_tokens=2, **kw))
    assert body["param"] is not None and body["param"].startswith(param), body
    assert body["type"] == "invalid_request_error"


COMPLETION_REFUSED = [
    ({"best_of": 2}, "best_of"),
    ({"echo": True, "logprobs": 1}, "echo"),  # echo alone is served; with logprobs it needs prompt logprobs
    ({"suffix": "end"}, "suffix"),
    ({"extra_body": {"min_tokens": 3}}, "min_tokens"),  # above max_tokens (2)
    ({"max_tokens": 2**40}, "max_tokens"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
]


@pytest.mark.parametrize("kw,param", COMPLETION_REFUSED, ids=[p for _, p in COMPLETION_REFUSED])
def test_completion_parameter_refused_by_name(oai, kw, param):
    kw = {"max_tokens": 2, **kw}
    body = bad_request(lambda: oai.completions.create(model="default", prompt=PROMPT, **kw))
    assert body["param"] is not None and body["param"].startswith(param), body


def test_best_of_equal_to_n_is_served(oai):
    out = oai.completions.create(model="default", prompt=PROMPT, max_tokens=2, n=2, best_of=2, seed=3)
    assert len(out.choices) == 2
