"""Grammar compiling, matchers and bitmasks on the real tokenizer (no model)."""

from __future__ import annotations

import json

import pytest
import torch
from structured_helpers import PERSON_SPEC

from kvloop.engine.core.grammar_spec import parse_response_format
from kvloop.engine.structured.bitmask import allocate_bitmask, allowed_tokens, apply_bitmask
from kvloop.engine.structured.compiler import GrammarError
from kvloop.engine.structured.matcher import GrammarMatcher, GrammarStateError


def test_apply_bitmask_masks_exactly_the_cleared_bits():
    vocab = 100
    bitmask = allocate_bitmask(2, vocab)
    allowed = [{0, 31, 32, 63, 99}, {5}]
    for row, ids in enumerate(allowed):
        for t in ids:  # set bit t of row: word t // 32, bit t % 32 (bit 31 is the int32 sign bit)
            word = int(bitmask[row, t // 32]) & 0xFFFFFFFF | (1 << (t % 32))
            bitmask[row, t // 32] = word - (1 << 32) if word >= 1 << 31 else word
    logits = torch.zeros(2, vocab)
    apply_bitmask(logits, bitmask)
    for row, ids in enumerate(allowed):
        assert set(torch.isfinite(logits[row]).nonzero().flatten().tolist()) == ids
    assert allowed_tokens(bitmask, vocab).sum().item() == 6


def test_compile_is_cached_by_schema_text(tokenizer):
    from kvloop.engine.structured.compiler import GrammarCompiler

    c = GrammarCompiler(tokenizer)
    first = c.compile(PERSON_SPEC)
    again = c.compile(parse_response_format({"type": "json_schema", "json_schema": {
        "name": "other", "schema": json.loads(PERSON_SPEC.schema)}}))
    assert again is first and (c.misses, c.hits) == (1, 1)


def test_one_compiler_per_tokenizer_object_and_it_goes_with_the_tokenizer(tokenizer):
    import gc
    import weakref

    from kvloop.engine.structured import compiler as compiler_module
    from kvloop.engine.tokenizer.tokenizer import Tokenizer

    other = Tokenizer(tokenizer.backend, tokenizer.chat_template, set(tokenizer.eos_token_ids))
    mine = compiler_module.compiler_for(other)
    assert compiler_module.compiler_for(other) is mine and compiler_module.compiler_for(tokenizer) is not mine
    gone, mine_ref = weakref.ref(other), weakref.ref(mine)
    del other, mine
    gc.collect()
    # the compiler went with its tokenizer: nothing is left for a new one that may reuse the address
    assert gone() is None and mine_ref() is None


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {"$ref": "#/definitions/missing"}}},  # dangling reference
    {"type": "strnig"},  # not a JSON Schema type
    {"type": "string", "minLength": 5, "maxLength": 2},  # unsatisfiable
])
def test_schemas_the_library_refuses_raise_a_grammar_error(compiler, schema):
    spec = parse_response_format({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    with pytest.raises(GrammarError, match="response_format") as info:
        compiler.compile(spec)
    prefix = "response_format: the schema cannot be compiled: "
    assert str(info.value).startswith(prefix) and str(info.value)[len(prefix):].strip()  # the library's words


def _walk(compiler, tokenizer, spec, text: str) -> GrammarMatcher:
    """Feeds text's tokens one by one, checking that the mask allowed each before accepting it."""
    m = GrammarMatcher(compiler, spec)
    bitmask = allocate_bitmask(1, compiler.vocab_size)
    for token in tokenizer.encode(text):
        m.fill(bitmask[0])
        assert allowed_tokens(bitmask, compiler.vocab_size)[0, token], f"token {token} masked in {text!r}"
        m.accept(token)
    return m


def test_a_valid_document_walks_to_termination_and_then_only_eos_is_allowed(compiler, tokenizer):
    m = _walk(compiler, tokenizer, PERSON_SPEC, '{"name":"Ada","age":36,"city":"Oslo"}')
    assert m.accepting
    bitmask = allocate_bitmask(1, compiler.vocab_size)
    m.fill(bitmask[0])
    allowed = set(allowed_tokens(bitmask, compiler.vocab_size)[0].nonzero().flatten().tolist())
    assert allowed == tokenizer.eos_token_ids


def test_eos_is_masked_before_the_document_is_complete(compiler, tokenizer):
    m = _walk(compiler, tokenizer, PERSON_SPEC, '{"name":"Ada"')
    bitmask = allocate_bitmask(1, compiler.vocab_size)
    m.fill(bitmask[0])
    allowed = allowed_tokens(bitmask, compiler.vocab_size)[0]
    assert not any(allowed[t] for t in tokenizer.eos_token_ids) and allowed.any()


def test_a_token_the_grammar_forbids_raises_a_clear_error(compiler, tokenizer):
    m = _walk(compiler, tokenizer, PERSON_SPEC, "{\"name\":\"Ada\"")
    bad = tokenizer.encode("]")[0]
    with pytest.raises(GrammarStateError, match=f"does not allow token {bad}"):
        m.accept(bad)


def test_json_object_accepts_any_object_and_not_an_array(compiler, tokenizer):
    spec = parse_response_format({"type": "json_object"})
    assert _walk(compiler, tokenizer, spec, '{"a":[1,2,{"b":null}],"c":"x"}').accepting
    m = GrammarMatcher(compiler, spec)
    with pytest.raises(GrammarStateError):
        m.accept(tokenizer.encode("[")[0])
