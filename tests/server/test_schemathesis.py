"""schemathesis against the server's own OpenAPI schema, on the live server: no 5xx, whatever the input.

Bounded: a few dozen examples per operation, no shrinking, and generation kept short (max_tokens and n
are clamped before sending) so the whole run stays well under a minute on a 2-core machine."""

from __future__ import annotations

import collections

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402


def clamp(body) -> None:
    """Keeps accepted requests cheap: a handful of tokens, few choices."""
    if not isinstance(body, dict):
        return
    for key in ("max_tokens", "max_completion_tokens"):
        if isinstance(body.get(key), int) and not isinstance(body.get(key), bool) and body[key] > 4:
            body[key] = 4
    if "max_tokens" not in body and "max_completion_tokens" not in body and "messages" in body:
        body["max_tokens"] = 4  # chat without a limit would run to the context end
    if isinstance(body.get("n"), int) and body["n"] > 2:
        body["n"] = 2
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) and len(prompt) > 4:
        body["prompt"] = prompt[:4]


MODES = ["positive", "negative"]


@pytest.mark.parametrize("mode", MODES)
def test_no_server_errors(server, mode):
    # Driven by hand rather than through schemathesis' pytest plugin, which does not run under pytest 9.
    from schemathesis import GenerationMode

    api = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    operations = [r.ok() for r in api.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/chat/completions", "/v1/completions", "/v1/models"}
    seen: list[int] = []

    for op in operations:
        if mode == "negative" and op.method.upper() == "GET":
            continue  # nothing to make invalid: no body; a free-form path string has no invalid value
        @given(case=op.as_strategy(generation_mode=GenerationMode(mode)))
        @settings(max_examples=20, deadline=None, derandomize=True, phases=[Phase.generate], database=None,
                  suppress_health_check=list(HealthCheck))
        def run(case):
            clamp(case.body)
            if mode == "positive" and isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
                case.body["model"] = "default"  # else nearly every valid body is a 404 for an unknown model
            response = case.call(base_url=server.url, timeout=60)
            seen.append(response.status_code)
            case.validate_response(response, checks=[not_a_server_error])

        run()
    counts = collections.Counter(seen)
    assert counts and all(code < 500 for code in counts), counts
    if mode == "positive":
        assert counts[200] > 0, counts  # some generated requests really ran through the engine
    server.assert_no_leak()
