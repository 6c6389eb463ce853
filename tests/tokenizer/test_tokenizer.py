"""The tokenizer built from GGUF metadata agrees with transformers'; chat template; streaming UTF-8."""

from __future__ import annotations

import pytest

from kvloop.engine.model.locate import embedded_model_path

TEXTS = [
    "Hello, world! 12345 the   spaces\n\nnew lines",
    "café naïve 日本語 emoji 🎉 x=3.14159",
    "<|im_start|>user\nhi<|im_end|>",
    "  leading and trailing  ",
    "don't I'll we've 2024-11-29\ttab",
]


@pytest.fixture(scope="module")
def hf_tokenizer():
    transformers = pytest.importorskip("transformers")
    path = embedded_model_path()
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_transformers(tokenizer, hf_tokenizer, text):
    assert tokenizer.encode(text) == hf_tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(tokenizer.encode(text)) == hf_tokenizer.decode(
        hf_tokenizer.encode(text, add_special_tokens=False), skip_special_tokens=True)


def test_chat_template_matches_transformers(tokenizer, hf_tokenizer):
    for messages in (
        [{"role": "user", "content": "What is 2+2?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}],
    ):
        ours = tokenizer.render_chat(messages)
        assert ours == hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours.endswith("<|im_start|>assistant\n")


def test_eos_is_im_end(tokenizer):
    assert tokenizer.eos_token_ids == {2}


def test_incremental_detokenizer_never_emits_broken_utf8(tokenizer):
    text = "naïve café — 日本語のテキスト 🎉🚀 done"
    ids = tokenizer.encode(text)
    detok = tokenizer.detokenizer()
    pieces = [detok.add(t) for t in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) + detok.flush() == text
    assert sum(1 for p in pieces if p == "") > 0  # some tokens were partial characters and held back
