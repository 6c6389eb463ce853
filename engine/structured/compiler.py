"""Compiles a GrammarSpec into an llguidance grammar for one tokenizer, with a bounded cache keyed by the
schema text (the same schema sent by many requests compiles once). llguidance was picked by measured mask
cost per step at batch 32 on this CPU (bench/structured_mask.py): it builds its parser lazily, so a compile
is about a millisecond where outlines-core took seconds on a free-form object, and it depends on nothing
(xgrammar pulls transformers and an unpinned torch requirement)."""

from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict

import llguidance

from kvloop.engine.core.grammar_spec import GrammarSpec
from kvloop.engine.structured.finite import has_finite_document
from kvloop.engine.tokenizer.tokenizer import Tokenizer

# Compact JSON: no free whitespace, so a model cannot spend its tokens on blank lines inside the object.
JSON_OPTIONS = {"whitespace_flexible": False}
# errors without the parser's state and grammar dump: they reach clients
LIMITS = llguidance.LLParserLimits(verbose_errors=False)
REFUSED = "response_format: the schema cannot be compiled: "


def library_error(text: str | None) -> str:
    """The first line of an llguidance error: its reason, without any state it appends."""
    lines = (text or "").strip().splitlines()
    return lines[0].strip() if lines else "rejected"


class GrammarError(ValueError):
    """The schema is invalid or uses what the grammar library cannot handle (a client error: 400)."""


class GrammarCompiler:
    def __init__(self, tokenizer: Tokenizer, vocab_size: int | None = None, cache_size: int = 256):
        self.vocab_size = vocab_size or tokenizer.vocab_size
        self.ll_tokenizer = llguidance.LLTokenizer(tokenizer.backend.to_str(), n_vocab=self.vocab_size,
                                                   eos_token=sorted(tokenizer.eos_token_ids))
        # schema text -> (grammar, None) or (None, why it was refused)
        self._cache: OrderedDict[str, tuple[str | None, str | None]] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()  # the API thread validates while the engine thread compiles
        self.hits = 0
        self.misses = 0

    def compile(self, spec: GrammarSpec) -> str:
        """The validated grammar for spec (llguidance's serialized form); GrammarError if it has none.
        Refusals are cached too, so that a client repeating a bad schema costs no new probe."""
        with self._lock:
            entry = self._cache.get(spec.key)
            if entry is not None:
                self._cache.move_to_end(spec.key)
                self.hits += 1
        if entry is None:
            try:
                entry = (self._build(spec), None)
            except GrammarError as exc:
                entry = (None, str(exc))
            with self._lock:
                self.misses += 1
                self._cache[spec.key] = entry
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        grammar, error = entry
        if error is not None:
            raise GrammarError(error)  # a new exception each time: a cached one would grow its traceback
        return grammar

    def _build(self, spec: GrammarSpec) -> str:
        if not has_finite_document(json.loads(spec.schema)):
            raise GrammarError(REFUSED + "it admits no finite JSON document (a $ref cycle with no way out, "
                               "or a required part that no value satisfies)")
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(spec.schema, defaults=JSON_OPTIONS)
            is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
                grammar, self.ll_tokenizer, limits=LIMITS)
        except Exception as exc:  # noqa: BLE001 - the library's own words go back to the client
            raise GrammarError(REFUSED + library_error(str(exc))) from exc
        if is_error:
            raise GrammarError(REFUSED + library_error(messages[0] if messages else ""))
        self._probe(grammar)
        return grammar

    def _probe(self, grammar: str) -> None:
        """The first mask and the first token, as a request's matcher will meet them: llguidance builds its
        parser lazily, so a grammar with no first token (a $ref to itself) validates and fails only here."""
        m = llguidance.LLMatcher(self.ll_tokenizer, grammar, limits=LIMITS)
        mask = m.compute_bitmask()
        first = next((i * 8 + b for i, byte in enumerate(mask) if byte for b in range(8) if byte >> b & 1),
                     None)  # the lowest allowed token
        if not m.is_error() and first is not None:
            m.consume_token(first)
        if m.is_error() or first is None:
            raise GrammarError(REFUSED + "no JSON document can be generated from it (the grammar stops at "
                               f"its first token: {library_error(m.get_error())})")


# keyed by the tokenizer itself, held weakly: an entry goes with its tokenizer, so a new tokenizer at a reused
# address cannot find the old one's compiler (a compiler does not hold its tokenizer, or it would never go)
_compilers: weakref.WeakKeyDictionary[Tokenizer, GrammarCompiler] = weakref.WeakKeyDictionary()
_compilers_lock = threading.Lock()


def compiler_for(tokenizer: Tokenizer, vocab_size: int | None = None) -> GrammarCompiler:
    """One compiler (and cache) per tokenizer, shared by the API edge that validates a schema and the
    engine that constrains with it."""
    with _compilers_lock:
        compiler = _compilers.get(tokenizer)
        if compiler is None or (vocab_size and compiler.vocab_size != vocab_size):
            compiler = _compilers[tokenizer] = GrammarCompiler(tokenizer, vocab_size)
        return compiler
