"""Shared by the model tests: one prompt's logits straight from a model, without an engine."""

from __future__ import annotations

import torch

from kvloop.engine.kernels.attention_meta import AttentionMetadata, PrefillChunk
from kvloop.engine.model.llama import LlamaModel


def one_prompt_logits(model: LlamaModel, ids: list[int]) -> torch.Tensor:
    """The logits of every position of ids (at most 32 tokens), prefilled in one chunk over two
    non-contiguous blocks."""
    kv = model.new_kv_cache(4, 16)
    table = torch.tensor([2, 0])
    slots = torch.tensor([int(table[i // 16]) * 16 + i % 16 for i in range(len(ids))])
    meta = AttentionMetadata(slots, 0, torch.zeros(0, 1, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                             [PrefillChunk(0, len(ids), len(ids), table)])
    return model.logits(model.forward(torch.tensor(ids), torch.arange(len(ids)), meta, kv))
