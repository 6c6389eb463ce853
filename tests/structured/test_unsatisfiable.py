"""Schemas with no document (a $ref cycle with no way out, `not`, contradictions) are refused when compiled,
before any request runs on them, in words without the grammar library's internal state; recursive schemas
with a base case still compile and walk."""

from __future__ import annotations

import pytest

from kvloop.engine.core.grammar_spec import parse_response_format
from kvloop.engine.structured.bitmask import allocate_bitmask
from kvloop.engine.structured.compiler import GrammarError
from kvloop.engine.structured.finite import has_finite_document
from kvloop.engine.structured.matcher import GrammarMatcher

SELF = {"$ref": "#"}
MUTUAL = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
REQUIRED_SELF = {"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]}
MUTUAL_OBJECTS = {"$defs": {
    "a": {"type": "object", "properties": {"n": {"type": "integer"}, "b": {"$ref": "#/$defs/b"}},
          "required": ["n", "b"]},
    "b": {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "required": ["a"]}},
    "$ref": "#/$defs/a"}
NONEMPTY_SELF_ARRAY = {"type": "array", "items": {"$ref": "#"}, "minItems": 1}
LINKED_LIST = {"type": "object", "properties": {"v": {"type": "integer"},
                                                "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
               "required": ["v", "next"]}
TREE = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}},
        "required": ["kids"]}
CHAIN = {"$defs": {"a": {"$ref": "#/$defs/b"},
                   "b": {"type": "array", "minItems": 2, "items": {"$ref": "#/$defs/c"}},
                   "c": {"enum": [1]}}, "$ref": "#/$defs/a"}
INTERNALS = ("<state>", "non-verbose", "Parser", "lexer", "\n")


def spec_of(schema):
    return parse_response_format({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})


@pytest.mark.parametrize("schema, finite", [
    (SELF, False), (MUTUAL, False), (REQUIRED_SELF, False), (MUTUAL_OBJECTS, False),
    (NONEMPTY_SELF_ARRAY, False),
    (LINKED_LIST, True), (TREE, True), (CHAIN, True),
    ({"properties": {"x": {"$ref": "#"}}, "required": ["x"]}, True),  # no type: any non-object is a document
    ({"$ref": "https://example.com/s.json"}, True),  # not local: the library's to judge
])
def test_finite_document_check(schema, finite):
    assert has_finite_document(schema) is finite


def test_a_deeply_nested_schema_is_not_a_recursion_error():
    deep: dict = {"type": "string"}
    for _ in range(3000):
        deep = {"type": "object", "properties": {"a": deep}, "required": ["a"]}
    assert has_finite_document(deep)


@pytest.mark.parametrize("schema, words", [
    (SELF, "no finite JSON document"), (MUTUAL, "no finite JSON document"),
    (REQUIRED_SELF, "no finite JSON document"), (MUTUAL_OBJECTS, "no finite JSON document"),
    (NONEMPTY_SELF_ARRAY, "no finite JSON document"),
    ({"not": {}}, "not"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "Unsatisfiable"),
    ({"type": "object", "properties": {"x": False}, "required": ["x"]}, "no value satisfies"),
])
def test_schemas_with_no_document_are_refused_at_compile_in_plain_words(compiler, schema, words):
    for _ in range(2):  # the refusal is cached, and raised afresh
        with pytest.raises(GrammarError) as info:
            compiler.compile(spec_of(schema))
        message = str(info.value)
        assert message.startswith("response_format: the schema cannot be compiled: ") and words in message
        assert not any(s in message for s in INTERNALS), message


def test_the_first_token_probe_catches_what_the_fixpoint_cannot_see(compiler, monkeypatch):
    """With the fixpoint switched off, llguidance itself refuses a self-reference at its first mask."""
    from kvloop.engine.structured import compiler as compiler_module

    monkeypatch.setattr(compiler_module, "has_finite_document", lambda schema: True)
    with pytest.raises(GrammarError, match="first token") as info:
        compiler.compile(spec_of({"$defs": {"z": {"$ref": "#/$defs/z"}}, "$ref": "#/$defs/z"}))
    assert not any(s in str(info.value) for s in INTERNALS), str(info.value)


@pytest.mark.parametrize("schema", [LINKED_LIST, TREE, CHAIN])
def test_recursive_schemas_with_a_way_out_compile_and_mask(compiler, schema):
    m = GrammarMatcher(compiler, spec_of(schema))
    bitmask = allocate_bitmask(1, compiler.vocab_size)
    m.fill(bitmask[0])
    assert bitmask.any()
