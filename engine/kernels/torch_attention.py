"""The torch (CPU) attention path over the paged KV cache: K/V writes, prefill attention, and dispatch
of decode rows to torch_decode (in place, with cascade over shared prefixes).

Grouped-query attention without repeating K/V heads: queries are viewed as [kv_heads, group, ...] and
multiplied against each KV head once. Products run in the model dtype (bf16 matmul is fast on this
CPU; bf16 SDPA is not), softmax in fp32."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from kvloop.engine.kernels import torch_decode
from kvloop.engine.runner.attention_meta import AttentionMetadata


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    n_kv, hd = k_cache.shape[-2:]
    k_cache.view(-1, n_kv, hd).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, n_kv, hd).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def gather_blocks(cache: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """cache [num_blocks, block_size, kv, hd], tables [...] → [..., block_size, kv, hd] (one row copy per block)."""
    flat = cache.view(cache.shape[0], -1).index_select(0, tables.reshape(-1))
    return flat.view(*tables.shape, *cache.shape[1:])


def decode_attention_gathered(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                     context_lens: torch.Tensor, max_context: int, scale: float) -> torch.Tensor:
    """The previous decode path, kept as the reference and the benchmark baseline: copies every row's whole
    context out of the cache and pads rows to the longest. q [B, heads, hd] → [B, heads, hd].

    One batched matmul per KV head: the head's [span, hd] slice of the gathered keys has unit inner stride,
    so BLAS reads it in place, where a single matmul over all heads would first copy a permuted view."""
    batch, heads, hd = q.shape
    n_kv = k_cache.shape[2]
    block_size = k_cache.shape[1]
    blocks = (max_context + block_size - 1) // block_size
    tables = block_tables[:, :blocks]
    span = blocks * block_size
    keys = gather_blocks(k_cache, tables).view(batch, span, n_kv, hd)
    values = gather_blocks(v_cache, tables).view(batch, span, n_kv, hd)
    group = heads // n_kv
    qg = q.view(batch, n_kv, group, hd)
    scores = torch.empty(batch, n_kv, group, span, dtype=torch.float32, device=q.device)
    for h in range(n_kv):
        scores[:, h] = torch.bmm(qg[:, h], keys[:, :, h].transpose(1, 2))
    scores.mul_(scale)
    if int(context_lens.min()) < span:
        pad = torch.arange(span, device=q.device)[None, :] >= context_lens[:, None]
        scores.masked_fill_(pad[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    out = torch.empty(batch, n_kv, group, hd, dtype=q.dtype, device=q.device)
    for h in range(n_kv):
        out[:, h] = torch.bmm(probs[:, h], values[:, :, h])
    return out.view(batch, heads, hd)


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                      seq_len: int, scale: float) -> torch.Tensor:
    """q [L, heads, hd]: the last L of seq_len tokens, causal over the paged prefix plus themselves."""
    q_len, heads, hd = q.shape
    n_kv = k_cache.shape[2]
    keys = gather_blocks(k_cache, block_table).view(-1, n_kv, hd)[:seq_len]  # [S, kv, hd]
    values = gather_blocks(v_cache, block_table).view(-1, n_kv, hd)[:seq_len]
    if keys.dtype != q.dtype:  # 16-bit KV under a wider model dtype
        keys, values = keys.to(q.dtype), values.to(q.dtype)
    q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
    visible = torch.arange(seq_len, device=q.device)[None, :] <= q_pos[:, None]
    if q.dtype == torch.float32:
        # fp32 SDPA runs a fused kernel here, about 2.5x faster than matmul + softmax (measured, L=512, S=2000)
        out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], keys.transpose(0, 1)[None],
                                             values.transpose(0, 1)[None], attn_mask=visible, scale=scale,
                                             enable_gqa=True)
        return out[0].transpose(0, 1).contiguous()
    # 16-bit: SDPA takes a slow path on this CPU, so matmul in the model dtype and softmax in fp32
    group = heads // n_kv
    qg = q.view(q_len, n_kv, group, hd).permute(1, 2, 0, 3)  # [kv, group, L, hd]
    scores = torch.matmul(qg, keys.permute(1, 2, 0)[:, None]).float()  # [kv, group, L, S]
    scores.mul_(scale)
    scores.masked_fill_(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    out = torch.matmul(probs, values.permute(1, 0, 2)[:, None])  # [kv, group, L, hd]
    return out.permute(2, 0, 1, 3).reshape(q_len, heads, hd)


def decode_gathered(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                    scale: float) -> torch.Tensor:
    """The previous path behind the decode_rows interface (ignores any cascade plan)."""
    return decode_attention_gathered(q, k_cache, v_cache, meta.decode_block_tables, meta.decode_context_lens,
                                     meta.max_decode_context, scale)


# The decode rows' attention; bench/decode_shared.py swaps in decode_gathered to measure the previous path.
decode_rows = torch_decode.decode_attention


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                    scale: float) -> torch.Tensor:
    out = torch.empty_like(q)
    nd = meta.num_decode
    if nd:
        out[:nd] = decode_rows(q[:nd], k_cache, v_cache, meta, scale)
    for chunk in meta.prefills:
        rows = slice(chunk.q_start, chunk.q_start + chunk.q_len)
        out[rows] = prefill_attention(q[rows], k_cache, v_cache, chunk.block_table, chunk.seq_len, scale)
    return out
