"""response_format through the live server with the openai client: json_schema output validates against
its schema (streamed and not, chat and completions, alone and among 32 concurrent unconstrained requests);
bad schemas are 400s naming response_format. Greedy, small schemas, small max_tokens."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "city": {"enum": ["Paris", "Rome", "Oslo"]}},
          "required": ["name", "age", "city"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
ASK = [{"role": "user", "content": "Describe a person as JSON with name, age and city."}]
MAX_TOKENS = 40


def chat(oai, **kw):
    return oai.chat.completions.create(model="default", messages=ASK, max_tokens=MAX_TOKENS, temperature=0,
                                       **kw)


@pytest.fixture(scope="module")
def alone(oai):
    return chat(oai, response_format=FORMAT).choices[0]


def test_chat_json_schema_validates(alone, server):
    jsonschema.validate(json.loads(alone.message.content), PERSON)
    assert alone.finish_reason == "stop"
    server.assert_no_leak()


def test_chat_json_schema_streamed_validates_and_matches(oai, alone):
    stream = chat(oai, response_format=FORMAT, stream=True)
    parts, reasons = [], []
    for chunk in stream:
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            reasons.append(c.finish_reason)
    text = "".join(parts)
    jsonschema.validate(json.loads(text), PERSON)
    assert text == alone.message.content and reasons[-1] == "stop"


def test_completions_accepts_response_format(oai, tokenizer):
    prompt = tokenizer.render_chat(ASK)
    out = oai.completions.create(model="default", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                 extra_body={"response_format": FORMAT}).choices[0]
    jsonschema.validate(json.loads(out.text), PERSON)
    assert out.finish_reason == "stop"


def test_json_object_gives_an_object(oai):
    out = chat(oai, response_format={"type": "json_object"}).choices[0]
    text = out.message.content
    assert text.startswith("{")
    if out.finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


def test_among_32_concurrent_unconstrained_requests(oai, server, alone, monkeypatch):
    monkeypatch.setattr(server.async_engine, "max_pending", 64)  # 33 in flight at once, over the fixture's 24

    def plain(i: int):
        return oai.completions.create(model="default", prompt=f"Item {i}: the weather is", max_tokens=6,
                                      temperature=0).choices[0]

    with ThreadPoolExecutor(33) as pool:
        others = [pool.submit(plain, i) for i in range(32)]
        constrained = pool.submit(chat, oai, response_format=FORMAT)
        results = [f.result(timeout=120) for f in others]
        choice = constrained.result(timeout=120).choices[0]
    assert all(r.finish_reason in ("stop", "length") for r in results)
    jsonschema.validate(json.loads(choice.message.content), PERSON)
    assert choice.message.content == alone.message.content  # greedy: batching does not change it
    server.assert_no_leak()


@pytest.mark.parametrize("fmt, words", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strnig"}}},
     "cannot be compiled"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "minLength": 3,
                                                                     "maxLength": 1}}}, "cannot be compiled"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "https://example.com/s.json"}}},
     "cannot be compiled"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "json_schema.schema"),
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "yaml"}, "response_format"),
])
def test_bad_response_formats_are_400s_naming_it(oai, server, fmt, words):
    with pytest.raises(openai.BadRequestError) as info:
        chat(oai, response_format=fmt)
    body = info.value.body
    assert body["param"].startswith("response_format") and words in body["message"], body
    server.assert_no_leak()


@pytest.mark.parametrize("schema", [
    {"$ref": "#"},
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    {"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]},
    {"not": {}},
])
def test_recursive_or_unsatisfiable_schemas_are_400s_without_library_internals(oai, server, schema):
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    for call in (lambda: chat(oai, response_format=fmt),
                 lambda: oai.completions.create(model="default", prompt="{", max_tokens=4,
                                               extra_body={"response_format": fmt})):
        with pytest.raises(openai.BadRequestError) as info:
            call()
        body = info.value.body
        assert body["param"] == "response_format" and "cannot be compiled" in body["message"], body
        assert not any(s in body["message"] for s in ("<state>", "non-verbose", "Parser", "\n")), body
    server.assert_no_leak()
