"""Chat prompts tokenized so that control tokens come only from the chat template. Encoding the rendered
prompt as one string would turn `<|im_start|>system` typed inside a user's message into the real control
token, letting a user forge turns. Instead, every special-token string inside a message's own text is
swapped for a private-use character before rendering; the rendered prompt is then split at the template's
special tokens (the only ones left), and each run between them is encoded with special tokens read as
plain text, the swapped strings put back. Without such strings in the messages this is the plain encode,
token for token: the tokenizer splits at special tokens and encodes the runs between them the same way."""

from __future__ import annotations

import re

from tokenizers import Tokenizer as HFTokenizer

PRIVATE_USE = range(0xE000, 0xF900)  # the BMP's private-use area: one character per distinct forged string


class ChatEncoder:
    def __init__(self, backend: HFTokenizer):
        self.backend = backend
        self.special_ids = {t.content: i for i, t in backend.get_added_tokens_decoder().items() if t.special}
        # longest first: at one position the longest special token wins, as in the tokenizer's own matching
        names = sorted(self.special_ids, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, names))) if names else None
        self._as_text = HFTokenizer.from_str(backend.to_str())  # a copy: the flag below is per tokenizer
        self._as_text.encode_special_tokens = True

    def sanitize(self, messages: list[dict]) -> tuple[list[dict], dict[str, str]]:
        """The messages with each special-token string in their text (all but the role) swapped for a
        private-use character absent from every message, and the map back."""
        if self._pattern is None:
            return messages, {}
        texts = [v for m in messages for k, v in m.items() if k != "role" and isinstance(v, str)]
        forged = sorted({s for t in texts for s in self._pattern.findall(t)})
        if not forged:
            return messages, {}
        used = set("".join(texts))
        free = (chr(c) for c in PRIVATE_USE if chr(c) not in used)
        swap = {s: c for s, c in zip(forged, free, strict=False)}
        if len(swap) < len(forged):
            raise ValueError("messages: too many distinct special-token strings in the text")

        def clean(key: str, value):
            if key == "role" or not isinstance(value, str):
                return value
            return self._pattern.sub(lambda m: swap[m.group()], value)

        return [{k: clean(k, v) for k, v in m.items()} for m in messages], {c: s for s, c in swap.items()}

    def encode(self, rendered: str, back: dict[str, str]) -> list[int]:
        """rendered: the template's output over sanitized messages; back: sanitize's map back."""
        if not back:
            return self.backend.encode(rendered, add_special_tokens=False).ids
        table = str.maketrans(back)
        ids: list[int] = []
        pos = 0
        for m in self._pattern.finditer(rendered):  # only the template's own special tokens are left
            ids += self._text(rendered[pos:m.start()], table)
            ids.append(self.special_ids[m.group()])
            pos = m.end()
        return ids + self._text(rendered[pos:], table)

    def _text(self, run: str, table: dict[int, str]) -> list[int]:
        return self._as_text.encode(run.translate(table), add_special_tokens=False).ids if run else []
