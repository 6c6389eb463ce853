"""The torch reference for paged attention: each sequence's tokens gathered back out of the pages, then
plain softmax attention, in float64 unless asked otherwise. No performance tricks and no code shared
with the backends beyond the cache layout, so every backend and kernel is checked against it (the tests,
and the GPU check in bench/gpu).

Layout as everywhere: k_cache / v_cache [num_blocks, block_size, kv_heads, head_dim]; q [rows, heads,
head_dim] with query head h reading KV head h // (heads // kv_heads)."""

from __future__ import annotations

import torch

from kvloop.engine.kernels.attention_meta import AttentionMetadata


def gather(cache: torch.Tensor, table_row: torch.Tensor, n: int,
           dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The first n tokens of one sequence, [n, kv_heads, head_dim], read through its block table."""
    block_size = cache.shape[1]
    pages = cache[table_row[: -(-n // block_size)].long()]
    return pages.reshape(-1, *cache.shape[2:])[:n].to(dtype)


def attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                  first_pos: int | None = None,
                  dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of q [Tq, H, D] over k, v [Tk, KV, D] → (out [Tq, H, D], the natural log-sum-exp
    of the scaled scores [Tq, H]), in `dtype`. first_pos: q[0]'s position for a causal mask (None: every
    key is visible)."""
    group = q.shape[1] // k.shape[1]
    k = k.to(dtype).repeat_interleave(group, dim=1)
    v = v.to(dtype).repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->qhk", q.to(dtype), k) * scale
    if first_pos is not None:
        q_pos = first_pos + torch.arange(q.shape[0], device=q.device)
        hidden = torch.arange(k.shape[0], device=q.device)[None, :] > q_pos[:, None]
        scores = scores.masked_fill(hidden[:, None, :], float("-inf"))
    return torch.einsum("qhk,khd->qhd", scores.softmax(-1), v), scores.logsumexp(-1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, first_pos: int | None = None,
              dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return attention_lse(q, k, v, scale, first_pos, dtype)[0]


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 context_lens: torch.Tensor | list[int], scale: float,
                 dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """q [B, H, D], row b over its first context_lens[b] tokens → [B, H, D] in `dtype` (an empty context
    gives zeros)."""
    out = torch.zeros(q.shape, dtype=dtype, device=q.device)
    lens = context_lens.tolist() if isinstance(context_lens, torch.Tensor) else context_lens
    for b, n in enumerate(lens):
        if n > 0:
            k, v = gather(k_cache, block_tables[b], n, dtype), gather(v_cache, block_tables[b], n, dtype)
            out[b] = attention(q[b : b + 1], k, v, scale, None, dtype)[0]
    return out


def paged_extend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 query_start_loc: torch.Tensor | list[int], seq_lens: torch.Tensor | list[int], scale: float,
                 dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """q [T, H, D] packed by sequence: sequence s's queries q[start[s]:start[s + 1]] are the last ones of
    its seq_lens[s] tokens, causal → [T, H, D] in `dtype`."""
    out = torch.zeros(q.shape, dtype=dtype, device=q.device)
    starts = query_start_loc.tolist() if isinstance(query_start_loc, torch.Tensor) else query_start_loc
    lens = seq_lens.tolist() if isinstance(seq_lens, torch.Tensor) else seq_lens
    for s, n in enumerate(lens):
        lo, hi = starts[s], starts[s + 1]
        if hi > lo:
            k, v = gather(k_cache, block_tables[s], n, dtype), gather(v_cache, block_tables[s], n, dtype)
            out[lo:hi] = attention(q[lo:hi], k, v, scale, n - (hi - lo), dtype)
    return out


def paged_step(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
               scale: float, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A whole step as a backend's forward sees it (decode rows, then prefill chunks) → [N, H, D] in
    `dtype`. Any cascade plan is ignored: grouping never changes the result."""
    out = torch.zeros(q.shape, dtype=dtype, device=q.device)
    n = meta.num_decode
    out[:n] = paged_decode(q[:n], k_cache, v_cache, meta.decode_block_tables, meta.decode_context_lens, scale,
                           dtype)
    for chunk in meta.prefills:
        rows = slice(chunk.q_start, chunk.q_start + chunk.q_len)
        k = gather(k_cache, chunk.block_table, chunk.seq_len, dtype)
        v = gather(v_cache, chunk.block_table, chunk.seq_len, dtype)
        out[rows] = attention(q[rows], k, v, scale, chunk.seq_len - chunk.q_len, dtype)
    return out


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """k, v [N, KV, D] stored at slot_mapping (block_id * block_size + offset; negative: skipped)."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(-1, *k_cache.shape[2:])[slots] = k[keep].to(k_cache.dtype)
    v_cache.view(-1, *v_cache.shape[2:])[slots] = v[keep].to(v_cache.dtype)
