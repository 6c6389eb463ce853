"""The endpoints routers call before they pick a replica, in vLLM's shapes: /v1/chat/completions/render and
/v1/completions/render (checked exactly as the generating endpoints, nothing generated), /tokenize and
/detokenize."""

from __future__ import annotations

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}]


def test_chat_render_gives_the_prompt_tokens_the_chat_endpoint_uses(http, server):
    body = {"model": "default", "messages": MESSAGES, "max_tokens": 5, "temperature": 0, "stream": True,
            "request_id": "r1"}
    r = http.post("/v1/chat/completions/render", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    ids = server.engine.tokenizer.encode_chat(MESSAGES)
    assert out["token_ids"] == ids and out["request_id"] == "chatcmpl-r1" and out["model"] == "default"
    assert out["sampling_params"]["max_tokens"] == 5 and out["sampling_params"]["temperature"] == 0
    assert out["sampling_params"]["n"] == 1 and out["stream"] is True and out["features"] is None
    assert set(out) >= {"cache_salt", "priority", "kv_transfer_params", "stream_options"}
    used = http.post("/v1/chat/completions", json={**body, "stream": False}).json()
    assert used["usage"]["prompt_tokens"] == len(ids)


def test_completion_render_gives_one_request_per_prompt(http, server):
    tok = server.engine.tokenizer
    r = http.post("/v1/completions/render", json={"model": "default", "prompt": ["Hello", "The sky is"]})
    assert r.status_code == 200, r.text
    out = r.json()
    assert [o["token_ids"] for o in out] == [tok.encode("Hello"), tok.encode("The sky is")]
    assert all(o["request_id"].startswith("cmpl-") and o["sampling_params"]["max_tokens"] == 16 for o in out)


def test_render_refuses_what_the_endpoint_refuses(http):
    assert http.post("/v1/chat/completions/render", json={"model": "default", "messages": MESSAGES,
                                                          "bogus": 1}).json()["error"]["param"] == "bogus"
    r = http.post("/v1/chat/completions/render", json={"model": "nope", "messages": MESSAGES})
    assert r.status_code == 404
    r = http.post("/v1/completions/render", json={"model": "default", "prompt": "x", "min_tokens": 3,
                                                     "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens"
    r = http.post("/v1/completions/render", json={"model": "default", "prompt": "x", "max_tokens": 10**6})
    assert r.status_code == 400


def test_tokenize_prompt_and_messages_in_vllms_shape(http, server):
    tok = server.engine.tokenizer
    r = http.post("/tokenize", json={"model": "default", "prompt": "Hello world", "return_token_strs": True})
    assert r.status_code == 200, r.text
    out = r.json()
    ids = tok.encode("Hello world")
    assert out == {"count": len(ids), "max_model_len": server.async_engine.max_model_len, "tokens": ids,
                   "token_strs": [tok.token_text(t) for t in ids]}
    # the body vllm-router sends when render is missing: no model check needed, messages templated
    chat = http.post("/tokenize", json={"model": "default", "continue_final_message": False,
                                        "messages": MESSAGES}).json()
    assert chat["tokens"] == tok.encode_chat(MESSAGES) and chat["token_strs"] is None
    assert http.post("/tokenize", json={"prompt": "x", "add_special_tokens": False}).status_code == 200


def test_tokenize_refuses_bad_bodies(http):
    for body, param in (({"prompt": "x", "bogus": 1}, "bogus"), ({"prompt": 3}, "prompt"),
                        ({"messages": MESSAGES, "chat_template": "x"}, "chat_template"),
                        ({"messages": MESSAGES, "tools": [{"type": "function"}]}, "tools"),
                        ({"messages": [{"role": "user"}]}, "messages[0].content")):
        r = http.post("/tokenize", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
    assert http.post("/tokenize", json=[1, 2]).status_code == 400
    assert http.post("/tokenize", json={"model": "nope", "prompt": "x"}).status_code == 404


def test_detokenize_round_trips(http, server):
    ids = server.engine.tokenizer.encode("Round trip, please.")
    r = http.post("/detokenize", json={"model": "default", "tokens": ids})
    assert r.status_code == 200 and r.json() == {"prompt": "Round trip, please."}
    r = http.post("/detokenize", json={"tokens": [server.async_engine.vocab_size]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"
    assert http.post("/detokenize", json={"tokens": [-1]}).status_code == 400


def test_render_submits_nothing(server, http):
    http.post("/v1/chat/completions/render", json={"model": "default", "messages": MESSAGES})
    assert server.async_engine.num_in_flight == 0
    server.assert_no_leak()
