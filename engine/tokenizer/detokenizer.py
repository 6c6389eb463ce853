"""Incremental detokenization for streaming: emits text only once it is complete UTF-8.

Byte-level BPE tokens can split a multi-byte character; decoding such a prefix yields U+FFFD. We keep a
small window of earlier tokens as context and hold text back until it no longer ends in U+FFFD."""

from __future__ import annotations

from typing import Protocol


class Decoder(Protocol):
    def decode(self, ids: list[int]) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, decoder: Decoder):
        self._decoder = decoder
        self._ids: list[int] = []
        self._prefix_offset = 0  # start of the context window
        self._read_offset = 0  # tokens before this have been emitted
        self.text = ""

    def add(self, token_id: int) -> str:
        """Appends one token; returns the newly completed text (possibly empty)."""
        self._ids.append(token_id)
        prefix_text = self._decoder.decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decoder.decode(self._ids[self._prefix_offset :])
        if len(full_text) <= len(prefix_text) or full_text.endswith("\ufffd"):
            return ""
        delta = full_text[len(prefix_text) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """At the end of a sequence: whatever is held back, even if it is an incomplete character."""
        prefix_text = self._decoder.decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decoder.decode(self._ids[self._prefix_offset :])
        delta = full_text[len(prefix_text) :] if len(full_text) > len(prefix_text) else ""
        self._prefix_offset = self._read_offset = len(self._ids)
        self.text += delta
        return delta
