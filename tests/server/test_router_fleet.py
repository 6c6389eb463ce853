"""vllm-router (the router scripts/serve_fleet.sh runs) in front of the one live test server: the official
openai client gets a chat completion, a streamed one and a completion through it, 200 OK with the same
greedy text as directly. (Its cache-aware policy posts each request to /v1/*/render first, for the token
ids, and falls back to /tokenize on a 404: seen through a logging proxy, the render answer is used.)
Skipped when the vllm-router binary is missing (it comes with the dev extras)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from live_process import router_binary, running

from .conftest import _free_port

MESSAGES = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="session")
def router_url(server, tmp_path_factory) -> Iterator[str]:
    binary = router_binary()
    if binary is None:
        pytest.skip("vllm-router is not installed")
    port, metrics_port = _free_port(), _free_port()
    url = f"http://127.0.0.1:{port}"
    with running([binary, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", server.url,
                  "--policy", "cache_aware", "--prometheus-port", str(metrics_port),
                  "--health-check-endpoint", "/ready", "--log-level", "warning"],
                 tmp_path_factory.mktemp("router") / "router.log", f"{url}/v1/models", "vllm-router",
                 ready_s=60, stop_s=10):
        yield url


@pytest.fixture(scope="session")
def routed(router_url):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"{router_url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_chat_through_the_router_equals_direct(oai, routed):
    kw = dict(model="default", messages=MESSAGES, max_tokens=10, temperature=0)
    direct = oai.chat.completions.create(**kw).choices[0].message.content
    raw = routed.chat.completions.with_raw_response.create(**kw)
    assert raw.http_response.status_code == 200
    assert raw.parse().choices[0].message.content == direct and direct


def test_streamed_chat_through_the_router_equals_direct(oai, routed):
    kw = dict(model="default", messages=MESSAGES, max_tokens=10, temperature=0)
    direct = oai.chat.completions.create(**kw).choices[0].message.content
    parts = [c.choices[0].delta.content or "" for c in routed.chat.completions.create(**kw, stream=True)
             if c.choices]
    assert "".join(parts) == direct


def test_completion_through_the_router_equals_direct(oai, routed):
    kw = dict(model="default", prompt="The capital of France is", max_tokens=8, temperature=0)
    direct = oai.completions.create(**kw).choices[0].text
    raw = routed.completions.with_raw_response.create(**kw)
    assert raw.http_response.status_code == 200 and raw.parse().choices[0].text == direct
    parts = [c.choices[0].text for c in routed.completions.create(**kw, stream=True) if c.choices]
    assert "".join(parts) == direct


def test_a_refusal_reaches_the_client_through_the_router(routed):
    openai = pytest.importorskip("openai")
    with pytest.raises(openai.BadRequestError) as info:
        routed.completions.create(model="default", prompt="x", max_tokens=2, extra_body={"min_tokens": 3})
    assert "min_tokens" in str(info.value)
