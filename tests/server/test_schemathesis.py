"""schemathesis against the server's own OpenAPI schema, on the live server: no 5xx, whatever the input.

Bounded: a few dozen examples per operation, no shrinking, and generation kept short (max_tokens and n
are clamped before sending) so the whole run stays well under a minute on a 2-core machine."""

from __future__ import annotations

import collections

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402


def _short(value, chars: int = 120):
    if isinstance(value, str):
        return value[:chars]
    if isinstance(value, list):
        return [_short(v, chars) for v in value[:4]]
    if isinstance(value, dict):
        return {k: _short(v, chars) for k, v in value.items()}
    return value


def clamp(body) -> None:
    """Keeps accepted requests cheap: short prompts, a couple of tokens, one choice. Types are kept, so
    what the server validates is unchanged."""
    if not isinstance(body, dict):
        return
    for key in ("max_tokens", "max_completion_tokens"):
        if isinstance(body.get(key), int) and not isinstance(body.get(key), bool) and body[key] > 2:
            body[key] = 2
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = 2  # no limit: completions default to 16 tokens, chat runs to the context end
    if isinstance(body.get("n"), int) and not isinstance(body.get("n"), bool) and body["n"] > 1:
        body["n"] = 1
    for key in ("prompt", "messages"):
        if key in body:
            body[key] = _short(body[key])


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
        @settings(max_examples=12, deadline=None, derandomize=True, phases=[Phase.generate], database=None,
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
