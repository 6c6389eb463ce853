"""One request's grammar state: fill its row of a token bitmask, accept the sampled token, tell whether
the grammar has terminated. An impossible state raises GrammarStateError instead of producing a mask
that lets anything (or nothing) through; the sampler fails that request alone."""

from __future__ import annotations

import llguidance
import torch

from kvloop.engine.core.grammar_spec import GrammarSpec
from kvloop.engine.structured.compiler import LIMITS, GrammarCompiler, library_error


class GrammarStateError(RuntimeError):
    pass


class GrammarMatcher:
    def __init__(self, compiler: GrammarCompiler, spec: GrammarSpec):
        self._m = llguidance.LLMatcher(compiler.ll_tokenizer, compiler.compile(spec), limits=LIMITS)
        self._check("start")
        self.num_accepted = 0

    def fill(self, bitmask_row: torch.Tensor) -> None:
        """Writes the allowed-token bits into bitmask_row (a contiguous int32 [words] CPU tensor)."""
        if not (bitmask_row.dtype == torch.int32 and bitmask_row.is_contiguous() and bitmask_row.dim() == 1):
            raise ValueError("a bitmask row must be a contiguous 1-D int32 tensor")
        self._m.unsafe_compute_mask_ptr(bitmask_row.data_ptr(), bitmask_row.numel() * 4)
        self._check("mask")

    def accept(self, token: int) -> None:
        if not self._m.consume_token(token):
            raise GrammarStateError(f"the grammar does not allow token {token} after {self.num_accepted} "
                                    f"tokens: {library_error(self._m.get_error())}")
        self.num_accepted += 1

    @property
    def accepting(self) -> bool:
        """What was generated so far is a complete document (more may still follow)."""
        return self._m.is_accepting()

    def _check(self, when: str) -> None:
        if self._m.is_error():
            raise GrammarStateError(f"grammar error at {when}: {library_error(self._m.get_error())}")
