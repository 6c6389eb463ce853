"""The engine's tokenizer facade: encode, decode, chat template, end-of-sequence ids."""

from __future__ import annotations

from tokenizers import Tokenizer as HFTokenizer

from kvloop.engine.tokenizer.build import tokenizer_from_file, tokenizer_from_gguf
from kvloop.engine.tokenizer.chat_encode import ChatEncoder
from kvloop.engine.tokenizer.chat_template import ChatTemplate
from kvloop.engine.tokenizer.detokenizer import IncrementalDetokenizer


class Tokenizer:
    def __init__(self, backend: HFTokenizer, chat_template: ChatTemplate, eos_token_ids: set[int],
                 bos_token_id: int | None = None, add_bos: bool = False):
        self.backend = backend
        self.chat_template = chat_template
        self.eos_token_ids = eos_token_ids
        self.bos_token_id = bos_token_id
        self.add_bos = add_bos
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self._chat_encoder: ChatEncoder | None = None  # built on first use: it copies the backend

    @classmethod
    def from_source(cls, source: dict) -> Tokenizer:
        if source["kind"] == "gguf":
            backend = tokenizer_from_gguf(source)
            tokens = source["tokens"]
            eos = {source["eos_token_id"]} if source.get("eos_token_id") is not None else set()
            bos_id = source.get("bos_token_id")
            bos = tokens[bos_id] if bos_id is not None else ""
            template = ChatTemplate(source.get("chat_template"), bos, tokens[min(eos)] if eos else "")
            return cls(backend, template, eos, bos_id, bool(source.get("add_bos_token")))
        backend = tokenizer_from_file(source["tokenizer_json"])
        eos_id = source.get("eos_token_id")
        eos = set(eos_id) if isinstance(eos_id, list) else ({eos_id} if eos_id is not None else set())
        eos_tok = _token_text(source.get("eos_token"))
        if eos_tok and backend.token_to_id(eos_tok) is not None:
            eos.add(backend.token_to_id(eos_tok))
        bos_tok = _token_text(source.get("bos_token"))
        bos_id = backend.token_to_id(bos_tok) if bos_tok else None
        template = ChatTemplate(source.get("chat_template"), bos_tok or "", eos_tok or "")
        return cls(backend, template, eos, bos_id, bool(source.get("add_bos_token")))

    def encode(self, text: str) -> list[int]:
        """Raw text, special-token strings in it read as the control tokens they name
        (a completions prompt)."""
        return self._with_bos(self.backend.encode(text, add_special_tokens=False).ids)

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """The chat template over messages, tokenized so that control tokens come from the template alone:
        special-token text inside a message stays text (chat_encode.py)."""
        if self._chat_encoder is None:
            self._chat_encoder = ChatEncoder(self.backend)
        clean, back = self._chat_encoder.sanitize(messages)
        return self._with_bos(self._chat_encoder.encode(self.render_chat(clean, add_generation_prompt), back))

    def _with_bos(self, ids: list[int]) -> list[int]:
        if self.add_bos and self.bos_token_id is not None and (not ids or ids[0] != self.bos_token_id):
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(ids, skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        """The text one token stands for on its own (for logprobs)."""
        return self.backend.decode([token_id], skip_special_tokens=False)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return self.chat_template.render(messages, add_generation_prompt)

    def detokenizer(self) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self)


def _token_text(tok) -> str | None:
    if isinstance(tok, dict):
        return tok.get("content")
    return tok
