"""Token bitmasks: one bit per vocabulary entry, 32 to an int32 word, lowest bit first (the layout every
structured-generation library writes), and applying them to logits."""

from __future__ import annotations

import torch

# bit i of a word; 1 << 31 wraps to the int32 sign bit, which is the bit we want
_BITS = torch.tensor([1 << i if i < 31 else -(1 << 31) for i in range(32)], dtype=torch.int32)


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def allocate_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    return torch.zeros(rows, bitmask_words(vocab_size), dtype=torch.int32)


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool [rows, vocab]: True where the bitmask allows the token."""
    rows, words = bitmask.shape
    return ((bitmask.unsqueeze(-1) & _BITS) != 0).view(rows, words * 32)[:, :vocab_size]


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Sets the logits of disallowed tokens to -inf, in place. logits [rows, vocab], bitmask [rows, words]."""
    vocab = logits.shape[-1]
    if bitmask.shape[-1] * 32 < vocab:
        raise ValueError(f"bitmask of {bitmask.shape[-1]} words cannot cover a vocabulary of {vocab}")
    logits.masked_fill_(~allowed_tokens(bitmask, vocab), float("-inf"))
