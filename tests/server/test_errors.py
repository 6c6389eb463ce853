"""Malformed and hostile requests: each gets its status and an OpenAI-shaped error; the
server keeps serving."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from .conftest import MAX_MODEL_LEN, MAX_PENDING, _serve_args

CHAT, COMP = "/v1/chat/completions", "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]


def chat(**kw) -> dict:
    return {"model": "default", "messages": MSG, "max_tokens": 2, **kw}


def comp(**kw) -> dict:
    return {"model": "default", "prompt": "hi", "max_tokens": 2, **kw}


def nested(depth: int) -> bytes:
    return b'{"model": "default", "messages": ' + b"[" * depth + b"]" * depth + b"}"


# (name, method, path, json body or raw bytes, expected status)
CASES = [
    ("messages_not_list", "POST", CHAT, chat(messages="hi"), 400),
    ("messages_empty", "POST", CHAT, chat(messages=[]), 400),
    ("message_without_role", "POST", CHAT, chat(messages=[{"content": "x"}]), 400),
    ("unknown_role", "POST", CHAT, chat(messages=[{"role": "wizard", "content": "x"}]), 400),
    ("content_is_int", "POST", CHAT, chat(messages=[{"role": "user", "content": 5}]), 400),
    ("image_part", "POST", CHAT, chat(messages=[{"role": "user", "content": [{"type": "image_url",
                                                                             "image_url": {"url": "x"}}]}]),
                                                                             400),
    ("max_tokens_negative", "POST", CHAT, chat(max_tokens=-5), 400),
    ("max_tokens_zero", "POST", CHAT, chat(max_tokens=0), 400),
    ("max_tokens_huge", "POST", CHAT, chat(max_tokens=10**6), 400),
    ("max_tokens_over_int32", "POST", CHAT, chat(max_tokens=2**63), 400),
    ("max_tokens_string", "POST", CHAT, chat(max_tokens="ten"), 400),
    ("max_tokens_float", "POST", CHAT, chat(max_tokens=1.5), 400),
    ("temperature_high", "POST", CHAT, chat(temperature=5), 400),
    ("temperature_negative", "POST", CHAT, chat(temperature=-1), 400),
    ("temperature_nan", "POST", CHAT, b'{"model": "default", "messages": [{"role": "user", "content": "x"}], '
                                      b'"temperature": NaN}', 400),
    ("top_p_zero", "POST", CHAT, chat(top_p=0), 400),
    ("top_p_above_one", "POST", CHAT, chat(top_p=1.5), 400),
    ("n_zero", "POST", CHAT, chat(n=0), 400),
    ("n_huge", "POST", CHAT, chat(n=1000), 400),
    ("stop_int", "POST", CHAT, chat(stop=5), 400),
    ("stop_too_many", "POST", CHAT, chat(stop=["a"] * 40), 400),
    ("stop_empty_string", "POST", CHAT, chat(stop=[""]), 400),
    ("unknown_model", "POST", CHAT, chat(model="gpt-17"), 404),
    ("missing_model", "POST", CHAT, {"messages": MSG}, 400),
    ("top_logprobs_without_logprobs", "POST", CHAT, chat(top_logprobs=5), 400),
    ("top_logprobs_too_many", "POST", CHAT, chat(logprobs=True, top_logprobs=50), 400),
    ("stream_string", "POST", CHAT, chat(stream="yes"), 400),
    ("stream_options_without_stream", "POST", CHAT, chat(stream_options={"include_usage": True}), 400),
    ("seed_string", "POST", CHAT, chat(seed="abc"), 400),
    ("user_int", "POST", CHAT, chat(user=12), 400),
    ("presence_penalty_out_of_range", "POST", CHAT, chat(presence_penalty=-2.5), 400),
    ("frequency_penalty_out_of_range", "POST", CHAT, chat(frequency_penalty=9), 400),
    ("body_not_json", "POST", CHAT, b"{bad json", 400),
    ("body_invalid_utf8", "POST", CHAT,
     b'{"model": "default", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
     400),
    ("body_json_array", "POST", CHAT, [1, 2], 400),
    ("body_empty", "POST", CHAT, b"", 400),
    ("body_deeply_nested", "POST", CHAT, nested(100_000), 400),
    ("body_10_MB", "POST", CHAT, b'{"model": "default", "x": "' + b"a" * (10 << 20) + b'"}', 413),
    ("prompt_over_context", "POST", CHAT,
     chat(messages=[{"role": "user", "content": "hello " * 2 * MAX_MODEL_LEN}]),
     400),
    ("completion_prompt_missing", "POST", COMP, {"model": "default"}, 400),
    ("completion_prompt_empty_list", "POST", COMP, comp(prompt=[]), 400),
    ("completion_prompt_empty_string", "POST", COMP, comp(prompt=""), 400),
    ("completion_token_out_of_vocab", "POST", COMP, comp(prompt=[999_999_999]), 400),
    ("completion_token_negative", "POST", COMP, comp(prompt=[-1, 5]), 400),
    ("completion_mixed_prompt_list", "POST", COMP, comp(prompt=["a", 1]), 400),
    ("completion_too_many_prompts", "POST", COMP, comp(prompt=["a"] * 100), 400),
    ("completion_too_many_choices", "POST", COMP, comp(prompt=["a"] * 8, n=16), 400),
    ("completion_logprobs_too_many", "POST", COMP, comp(logprobs=100), 400),
    ("completion_echo_with_logprobs", "POST", COMP, comp(echo=True, logprobs=1), 400),
    ("completion_over_context", "POST", COMP, comp(prompt=[5] * MAX_MODEL_LEN), 400),
    ("unknown_model_get", "GET", "/v1/models/nope", None, 404),
    ("unknown_route", "POST", "/v1/nothing", comp(), 404),
    ("wrong_method", "GET", CHAT, None, 405),
]


def send(http: httpx.Client, method: str, path: str, body) -> httpx.Response:
    if body is None:
        return http.request(method, path)
    if isinstance(body, bytes):
        return http.request(method, path, content=body, headers={"content-type": "application/json"})
    return http.request(method, path, json=body)


def assert_openai_error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, (resp.status_code, resp.text[:300])
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str)
    return err


def test_at_least_thirty_distinct_cases():
    assert len({c[0] for c in CASES}) == len(CASES) >= 30


@pytest.mark.parametrize("name,method,path,body,status", CASES, ids=[c[0] for c in CASES])
def test_malformed_request(http, name, method, path, body, status):
    err = assert_openai_error(send(http, method, path, body), status)
    if name in ("prompt_over_context", "completion_over_context", "max_tokens_huge"):
        assert str(MAX_MODEL_LEN) in err["message"], err  # states the limit and the length
    if name == "unknown_model":
        assert err["code"] == "model_not_found"


@pytest.mark.parametrize("path,body", [
    (CHAT, b'{"model": "default", "messages": [{"role": "user", "content": "a\\ud800b"}], "max_tokens": 2}'),
    (COMP, b'{"model": "default", "prompt": ["ok", "a\\udfffb"], "max_tokens": 2}')],
    ids=["chat", "completion"])
def test_lone_surrogate_is_a_client_error(http, path, body):
    assert_openai_error(send(http, "POST", path, body), 400)


def test_still_serving_after_hostile_requests(http, server):
    for _name, method, path, body, _status in CASES[:10]:
        send(http, method, path, body)
    resp = http.post(CHAT, json=chat(max_tokens=3, temperature=0))
    assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] is not None
    server.assert_no_leak()


def test_overload_gets_429_with_retry_after(http, server):
    body = comp(prompt="Tell me a long story.", max_tokens=200, n=16, stream=True, temperature=0,
                ignore_eos=True)
    with http.stream("POST", COMP, json=body) as first:
        assert first.status_code == 200
        lines = first.iter_lines()  # keep a reference: a dropped iterator closes the connection
        next(lines)
        assert server.async_engine.num_in_flight == 16
        resp = http.post(COMP, json=comp(n=MAX_PENDING - 16 + 1))
        assert_openai_error(resp, 429)
        assert int(resp.headers["retry-after"]) >= 1
    server.assert_no_leak()
    assert http.post(COMP, json=comp()).status_code == 200


def test_api_key_and_not_ready(server, core_engine):
    """A second app on an engine that never starts: 503 while not ready, 401 without the key."""
    from kvloop.engine.server.launch import build_server

    app, _ = build_server(core_engine, _serve_args(api_key="s3cret"))
    transport = httpx.ASGITransport(app=app)

    async def run():
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            assert_openai_error(await c.post(CHAT, json=chat()), 401)
            assert_openai_error(await c.post(CHAT, json=chat(), headers={"Authorization": "Bearer wrong"}),
                                401)
            ok = {"Authorization": "Bearer s3cret"}
            assert (await c.get("/v1/models", headers=ok)).status_code == 200
            assert_openai_error(await c.post(CHAT, json=chat(), headers=ok), 503)
            assert_openai_error(await c.get("/ready"), 503)
            assert (await c.get("/health")).status_code == 200  # alive, just not ready
            assert "access-control-allow-origin" not in (await c.get("/health",
                                                                     headers={"Origin": "http://x"})).headers

    asyncio.run(run())


def test_engine_failed_request_is_503_not_500(server, core_engine):
    """A request the scheduler fails (static mode's out-of-memory) comes back as an OpenAI-shaped 503."""
    from kvloop.engine.core.sampling import SamplingParams
    from kvloop.engine.output_processor import RequestOutput
    from kvloop.engine.server.async_engine import AsyncEngine
    from kvloop.engine.server.serving import to_api_error

    eng = AsyncEngine(core_engine)
    group = eng.new_group()

    async def run():
        eng._loop = asyncio.get_running_loop()
        group.add("r1", [1, 2, 3], SamplingParams(), None)
        eng._inbox.clear()  # never reaches the engine: the failure is injected below
        eng._dispatch([RequestOutput("r1", "", "", [], [], True, "error", 3, 0, error="out of memory")], 0.0)
        _, item = await group.next()
        return to_api_error(item)

    err = asyncio.run(run())
    assert err.status == 503 and "out of memory" in err.message and err.headers["Retry-After"] == "1"
    assert eng.num_in_flight == 0
