"""The vLLM / SGLang extension parameters that routers and their clients send: every one at its default is
served (the exact bodies vllm-router 0.1.17 and sglang-router 0.3.2 forwarded, logged in front of a live
server), those this server can honour exactly are honoured, and any other value is a 400 naming it."""

from __future__ import annotations

import json

import pytest

MESSAGES = [{"role": "user", "content": "Name three colours."}]
PROMPT = "The capital of France is"

# what vllm-router 0.1.17 added to an openai-client chat / completions request (temperature 0, 8 tokens)
VLLM_ROUTER_CHAT = {"logprobs": False, "no_stop_trim": False, "ignore_eos": False,
                    "continue_final_message": False, "skip_special_tokens": True, "separate_reasoning": True,
                    "stream_reasoning": True, "return_hidden_states": False, "include_reasoning": True}
SGLANG_ROUTER_CHAT = {k: v for k, v in VLLM_ROUTER_CHAT.items() if k != "include_reasoning"}
ROUTER_COMPLETION = {"echo": False, "no_stop_trim": False, "ignore_eos": False, "skip_special_tokens": True,
                     "return_hidden_states": False}
# other extensions at their defaults (vLLM's protocol)
DEFAULTS_BOTH = {"spaces_between_special_tokens": True, "min_tokens": 0, "priority": 0,
                 "include_stop_str_in_output": False, "min_p": 0, "repetition_penalty": 1,
                 "use_beam_search": False, "length_penalty": 1, "bad_words": [],
                 "return_tokens_as_token_ids": False}
DEFAULTS_CHAT = {"add_generation_prompt": True, "chat_template_kwargs": {}, "documents": [], "echo": False}


def chat(http, **extra):
    body = {"model": "default", "messages": MESSAGES, "max_tokens": 8, "temperature": 0, **extra}
    return http.post("/v1/chat/completions", json=body)


def completion(http, **extra):
    body = {"model": "default", "prompt": PROMPT, "max_tokens": 8, "temperature": 0, **extra}
    return http.post("/v1/completions", json=body)


@pytest.fixture(scope="module")
def plain(http) -> tuple[str, str]:
    """Greedy chat and completion text with no extension parameter."""
    a, b = chat(http), completion(http)
    assert a.status_code == 200 and b.status_code == 200
    return a.json()["choices"][0]["message"]["content"], b.json()["choices"][0]["text"]


@pytest.mark.parametrize("extra", [VLLM_ROUTER_CHAT, SGLANG_ROUTER_CHAT, {**DEFAULTS_BOTH, **DEFAULTS_CHAT},
                                   {"separate_reasoning": False, "stream_reasoning": False,
                                    "include_reasoning": False},
                                   {"add_special_tokens": True}],  # this tokenizer adds none: the same prompt
                         ids=["vllm-router", "sglang-router", "defaults", "reasoning-off", "special-tokens"])
def test_chat_extensions_at_defaults_serve_the_same_text(http, plain, extra):
    r = chat(http, **extra)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == plain[0]


@pytest.mark.parametrize("extra", [ROUTER_COMPLETION, DEFAULTS_BOTH, {"add_special_tokens": True},
                                   {"add_special_tokens": False}],
                         ids=["router", "defaults", "add_special_tokens", "no_special_tokens"])
def test_completion_extensions_at_defaults_serve_the_same_text(http, plain, extra):
    r = completion(http, **extra)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == plain[1]


REFUSED_BOTH = [("skip_special_tokens", False), ("spaces_between_special_tokens", False),
                ("return_hidden_states", True), ("priority", 1), ("min_p", 0.1), ("repetition_penalty", 1.1),
                ("use_beam_search", True), ("length_penalty", 2), ("cache_salt", "tenant"),
                ("truncate_prompt_tokens", 8), ("prompt_logprobs", 1), ("allowed_token_ids", [1, 2]),
                ("bad_words", ["red"]), ("kv_transfer_params", {"do_remote_decode": True}),
                ("return_tokens_as_token_ids", True), ("data_parallel_rank", 0), ("min_p", True)]
REFUSED_CHAT = [("continue_final_message", True), ("chat_template", "{{ messages }}"),
                ("chat_template_kwargs", {"enable_thinking": True}), ("documents", [{"text": "x"}]),
                ("echo", True), ("mm_processor_kwargs", {"a": 1})]


@pytest.mark.parametrize(("name", "value"), REFUSED_BOTH + REFUSED_CHAT)
def test_chat_refuses_values_it_cannot_honour_by_name(http, server, name, value):
    r = chat(http, **{name: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == name and name in r.json()["error"]["message"]


@pytest.mark.parametrize(("name", "value"), REFUSED_BOTH)
def test_completion_refuses_values_it_cannot_honour_by_name(http, name, value):
    r = completion(http, **{name: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == name


def test_echo_with_logprobs_is_refused(http):
    r = completion(http, echo=True, logprobs=1)
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo"


def test_wrong_types_are_refused(http):
    for name, value in (("no_stop_trim", "yes"), ("min_tokens", -1), ("priority", 1.5), ("request_id", 7)):
        r = chat(http, **{name: value})
        assert r.status_code == 400 and r.json()["error"]["param"].startswith(name), (name, r.text)


def test_no_stop_trim_keeps_the_stop_string_as_include_stop_str_in_output(http, plain):
    text = plain[1]
    stop = text.strip().split()[1] if len(text.split()) > 1 else text[1:3]
    trimmed = completion(http, stop=[stop]).json()["choices"][0]
    kept = completion(http, stop=[stop], no_stop_trim=True).json()["choices"][0]
    vllm_kept = completion(http, stop=[stop], include_stop_str_in_output=True).json()["choices"][0]
    assert trimmed["finish_reason"] == kept["finish_reason"] == "stop"
    assert kept["text"] == vllm_kept["text"] == trimmed["text"] + stop


def test_completion_echo_prepends_the_prompt(http, oai, plain, server):
    r = completion(http, echo=True)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == PROMPT + plain[1]
    parts = [c.choices[0].text for c in oai.completions.create(
        model="default", prompt=PROMPT, max_tokens=8, temperature=0, echo=True, stream=True) if c.choices]
    assert parts[0] == PROMPT and "".join(parts) == PROMPT + plain[1]
    ids = server.engine.tokenizer.encode(PROMPT)
    by_ids = completion(http, echo=True, prompt=ids).json()["choices"][0]["text"]
    assert by_ids == server.engine.tokenizer.decode(ids) + plain[1]
    two = completion(http, echo=True, prompt=[PROMPT, "Hello"], n=2).json()["choices"]
    assert all(c["text"].startswith(p) for c, p in zip(two, [PROMPT, PROMPT, "Hello", "Hello"], strict=True))


def test_add_generation_prompt_false_leaves_the_assistant_header_out(http, server):
    tok = server.engine.tokenizer
    with_header = http.post("/tokenize", json={"messages": MESSAGES}).json()["tokens"]
    body = {"messages": MESSAGES, "add_generation_prompt": False}
    without = http.post("/tokenize", json=body).json()["tokens"]
    assert with_header == tok.encode_chat(MESSAGES) and without == tok.encode_chat(MESSAGES, False)
    assert len(without) < len(with_header) and with_header[:len(without)] == without
    r = chat(http, add_generation_prompt=False)
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(without)


def test_request_id_names_the_response_and_may_repeat(http, oai):
    for _ in range(2):  # engine requests keep their own ids: a repeated client id does not collide
        r = chat(http, request_id="router-7")
        assert r.status_code == 200 and r.json()["id"] == "chatcmpl-router-7"
    body = {"model": "default", "prompt": PROMPT, "max_tokens": 4, "stream": True, "request_id": "abc"}
    lines = [line for line in http.post("/v1/completions", json=body).text.splitlines()
             if line.startswith("data: {")]
    assert lines and all(json.loads(line[6:])["id"] == "cmpl-abc" for line in lines)


def test_the_server_keeps_serving_and_leaks_nothing(server, http):
    assert chat(http).status_code == 200
    server.assert_no_leak()


def test_min_tokens_is_honoured(http):
    """A stop token id that greedy emits at once is held back until min_tokens output tokens."""
    first = completion(http, max_tokens=1, logprobs=0).json()["choices"][0]
    assert first["text"]
    stop_id = http.post("/tokenize", json={"model": "default", "prompt": first["text"],
                                           "add_special_tokens": False}).json()["tokens"][0]
    stopped = completion(http, stop_token_ids=[stop_id]).json()
    assert stopped["usage"]["completion_tokens"] == 1 and stopped["choices"][0]["finish_reason"] == "stop"
    held = completion(http, stop_token_ids=[stop_id], min_tokens=4)
    assert held.status_code == 200, held.text
    assert held.json()["usage"]["completion_tokens"] >= 4
    assert completion(http, min_tokens=9).json()["error"]["param"] == "min_tokens"  # above max_tokens (8)
