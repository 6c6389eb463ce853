"""response_format parsing: what each OpenAI shape becomes, and a clear ValueError for the rest."""

from __future__ import annotations

import json

import pytest

from kvloop.engine.core.grammar_spec import ANY_OBJECT, MAX_SCHEMA_CHARS, GrammarSpec, parse_response_format


def test_text_and_none_are_unconstrained():
    assert parse_response_format(None) is None
    assert parse_response_format({"type": "text"}) is None


def test_json_object_is_any_object():
    assert parse_response_format({"type": "json_object"}) == GrammarSpec("json_object", ANY_OBJECT)


def test_json_schema_key_is_the_schema_alone_in_its_key_order():
    def spec(name, schema, **extra):
        return parse_response_format({"type": "json_schema",
                                      "json_schema": {"name": name, "schema": schema, **extra}})

    a = spec("p", {"type": "object", "required": []}, strict=True)
    assert a.kind == "json_schema" and a.key == spec("q", {"type": "object", "required": []}).key
    assert json.loads(a.schema) == {"type": "object", "required": []}
    # property order is generation order, so a reordered schema is another grammar
    assert spec("p", {"required": [], "type": "object"}).key != a.key


@pytest.mark.parametrize("value, words", [
    ("json", "must be an object"),
    ({"type": "xml"}, "response_format.type"),
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": []}}, "json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": 3, "schema": {}}}, "json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "x", "strict": "yes", "schema": {}}},
     "json_schema.strict"),
    ({"type": "json_schema", "json_schema": {"schema": {"enum": ["x" * MAX_SCHEMA_CHARS]}}}, "at most"),
])
def test_bad_shapes_name_response_format(value, words):
    with pytest.raises(ValueError, match="response_format") as info:
        parse_response_format(value)
    assert words in str(info.value)
