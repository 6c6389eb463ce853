"""The torch decode path before in-place reads and cascade (moved out of the engine): every row's whole
context copied out of the cache and padded to the longest row. Kept only as decode_shared.py's "today"
baseline; the engine's decode is engine/kernels/torch_decode.py."""

from __future__ import annotations

import torch

from kvloop.engine.kernels.attention_meta import AttentionMetadata
from kvloop.engine.kernels.torch_backend import gather_blocks


def decode_gathered(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                    scale: float) -> torch.Tensor:
    """q [B, heads, hd] → [B, heads, hd], ignoring any cascade plan. One batched matmul per KV head: the
    head's [span, hd] slice of the gathered keys has unit inner stride, so BLAS reads it in place."""
    batch, heads, hd = q.shape
    n_kv, block_size = k_cache.shape[2], k_cache.shape[1]
    blocks = (meta.max_decode_context + block_size - 1) // block_size
    tables = meta.decode_block_tables[:, :blocks]
    span = blocks * block_size
    keys = gather_blocks(k_cache, tables).view(batch, span, n_kv, hd)
    values = gather_blocks(v_cache, tables).view(batch, span, n_kv, hd)
    if keys.dtype != q.dtype:  # 16-bit KV under a wider model dtype: widened after the copy, as prefill does
        keys, values = keys.to(q.dtype), values.to(q.dtype)
    group = heads // n_kv
    qg = q.view(batch, n_kv, group, hd)
    scores = torch.empty(batch, n_kv, group, span, dtype=torch.float32, device=q.device)
    for h in range(n_kv):
        scores[:, h] = torch.bmm(qg[:, h], keys[:, :, h].transpose(1, 2))
    scores.mul_(scale)
    context_lens = meta.decode_context_lens
    if int(context_lens.min()) < span:
        pad = torch.arange(span, device=q.device)[None, :] >= context_lens[:, None]
        scores.masked_fill_(pad[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    out = torch.empty(batch, n_kv, group, hd, dtype=q.dtype, device=q.device)
    for h in range(n_kv):
        out[:, h] = torch.bmm(probs[:, h], values[:, :, h])
    return out.view(batch, heads, hd)
