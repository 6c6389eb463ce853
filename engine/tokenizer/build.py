"""Builds a `tokenizers.Tokenizer` from GGUF metadata (byte-level BPE) or from a tokenizer.json."""

from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

# Split patterns of the byte-level BPE pre-tokenizers we support, by GGUF `tokenizer.ggml.pre` name.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# name -> (split each digit on its own first, split regex)
PRE_TOKENIZERS: dict[str, tuple[bool, str]] = {
    "default": (False, _GPT2_SPLIT),
    "gpt2": (False, _GPT2_SPLIT),
    "smollm": (True, _GPT2_SPLIT),
    "starcoder": (True, _GPT2_SPLIT),
    "llama-bpe": (False, _LLAMA3_SPLIT),
    "llama3": (False, _LLAMA3_SPLIT),
    "qwen2": (False, _QWEN2_SPLIT),
}
_CONTROL, _USER_DEFINED = 3, 4


def tokenizer_from_gguf(meta: dict) -> Tokenizer:
    if meta.get("model") != "gpt2":
        raise ValueError(
            f"GGUF tokenizer model {meta.get('model')!r} is not supported: only byte-level BPE ('gpt2') is"
        )
    pre = meta.get("pre") or "default"
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"unknown GGUF pre-tokenizer {pre!r}; known: {sorted(PRE_TOKENIZERS)}")
    split_digits, pattern = PRE_TOKENIZERS[pre]
    tokens: list[str] = meta["tokens"]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in meta["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=False))
    steps = [pre_tokenizers.Split(Regex(pattern), behavior="isolated")]
    if split_digits:
        steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    types = meta.get("token_types") or []
    special = [AddedToken(tokens[i], special=True,
                          normalized=False) for i, t in enumerate(types) if t in (_CONTROL, _USER_DEFINED)]
    tok.add_special_tokens(special)
    return tok


def tokenizer_from_file(path: str) -> Tokenizer:
    return Tokenizer.from_file(path)
