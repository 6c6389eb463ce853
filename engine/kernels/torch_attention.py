"""The torch (CPU) attention path over the paged KV cache.

Grouped-query attention without repeating K/V heads: queries are viewed as [kv_heads, group, ...] and
multiplied against each KV head once. Products run in the model dtype (bf16 matmul is fast on this
CPU; bf16 SDPA is not), softmax in fp32."""

from __future__ import annotations

import torch
from kvloop.engine.runner.attention_meta import AttentionMetadata


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    n_kv, hd = k_cache.shape[-2:]
    k_cache.view(-1, n_kv, hd).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, n_kv, hd).index_copy_(0, slot_mapping, v)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                     context_lens: torch.Tensor, max_context: int, scale: float) -> torch.Tensor:
    """q [B, heads, hd] → [B, heads, hd]; each row attends to its first context_lens[b] cached tokens."""
    batch, heads, hd = q.shape
    n_kv = k_cache.shape[2]
    block_size = k_cache.shape[1]
    blocks = (max_context + block_size - 1) // block_size
    tables = block_tables[:, :blocks]
    span = blocks * block_size
    keys = k_cache[tables].view(batch, span, n_kv, hd)  # batched paged gather
    values = v_cache[tables].view(batch, span, n_kv, hd)
    qg = q.view(batch, n_kv, heads // n_kv, hd)
    scores = torch.matmul(qg, keys.permute(0, 2, 3, 1)).float()  # [B, kv, group, span]
    scores.mul_(scale)
    pad = torch.arange(span, device=q.device)[None, :] >= context_lens[:, None]
    scores.masked_fill_(pad[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    out = torch.matmul(probs, values.permute(0, 2, 1, 3))  # [B, kv, group, hd]
    return out.reshape(batch, heads, hd)


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                      seq_len: int, scale: float) -> torch.Tensor:
    """q [L, heads, hd]: the last L of seq_len tokens, causal over the paged prefix plus themselves."""
    q_len, heads, hd = q.shape
    n_kv = k_cache.shape[2]
    keys = k_cache[block_table].view(-1, n_kv, hd)[:seq_len]  # [S, kv, hd]
    values = v_cache[block_table].view(-1, n_kv, hd)[:seq_len]
    group = heads // n_kv
    qg = q.view(q_len, n_kv, group, hd).permute(1, 2, 0, 3)  # [kv, group, L, hd]
    scores = torch.matmul(qg, keys.permute(1, 2, 0)[:, None]).float()  # [kv, group, L, S]
    scores.mul_(scale)
    q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
    future = torch.arange(seq_len, device=q.device)[None, :] > q_pos[:, None]
    scores.masked_fill_(future, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    out = torch.matmul(probs, values.permute(1, 0, 2)[:, None])  # [kv, group, L, hd]
    return out.permute(2, 0, 1, 3).reshape(q_len, heads, hd)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                    scale: float) -> torch.Tensor:
    out = torch.empty_like(q)
    nd = meta.num_decode
    if nd:
        out[:nd] = decode_attention(q[:nd], k_cache, v_cache, meta.decode_block_tables, meta.decode_context_lens,
                                    meta.max_decode_context, scale)
    for chunk in meta.prefills:
        rows = slice(chunk.q_start, chunk.q_start + chunk.q_len)
        out[rows] = prefill_attention(q[rows], k_cache, v_cache, chunk.block_table, chunk.seq_len, scale)
    return out
