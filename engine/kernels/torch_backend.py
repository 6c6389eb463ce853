"""The torch attention backend (the default on CPU): K/V writes and prefill attention here, decode rows
in torch_decode (in place over the paged cache, with cascade over shared prefixes).

Prefill attention is torch's SDPA (its fused CPU kernel, grouped-query heads without repeating K/V) in fp32,
and in 16-bit where the CPU has native bf16. A 16-bit model on a CPU without it (an explicit --dtype) takes
matmuls in the model dtype and softmax in fp32 instead: there SDPA's 16-bit path is the slow one."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from kvloop.engine.core.cpu import cpu_has_native_bf16
from kvloop.engine.kernels import torch_decode
from kvloop.engine.kernels.attention_meta import AttentionMetadata
from kvloop.engine.kernels.backend import AttentionBackend


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    n_kv, hd = k_cache.shape[-2:]
    k_cache.view(-1, n_kv, hd).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, n_kv, hd).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def gather_blocks(cache: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """cache [num_blocks, block_size, kv, hd], tables [...] → [..., block_size, kv, hd]
    (one row copy per block)."""
    flat = cache.view(cache.shape[0], -1).index_select(0, tables.reshape(-1))
    return flat.view(*tables.shape, *cache.shape[1:])


def _visible(q_len: int, seq_len: int, device: torch.device) -> torch.Tensor:
    """[q_len, seq_len] bool: which positions each of the last q_len of seq_len tokens attends to."""
    q_pos = torch.arange(seq_len - q_len, seq_len, device=device)
    return torch.arange(seq_len, device=device)[None, :] <= q_pos[:, None]


@functools.lru_cache(maxsize=4)
def _additive_mask(q_len: int, seq_len: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """_visible as SDPA adds it (0 or -inf), built once for every layer of a step: from a bool mask SDPA built
    this in each call (5% of a 2,000-token prefill on an AMX Xeon)."""
    return torch.where(_visible(q_len, seq_len, device), 0.0, float("-inf")).to(dtype)


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      block_table: torch.Tensor,
                      seq_len: int, scale: float) -> torch.Tensor:
    """q [L, heads, hd]: the last L of seq_len tokens, causal over the paged prefix plus themselves."""
    q_len, heads, hd = q.shape
    n_kv = k_cache.shape[2]
    keys = gather_blocks(k_cache, block_table).view(-1, n_kv, hd)[:seq_len]  # [S, kv, hd]
    values = gather_blocks(v_cache, block_table).view(-1, n_kv, hd)[:seq_len]
    if keys.dtype != q.dtype:  # 16-bit KV under a wider model dtype
        keys, values = keys.to(q.dtype), values.to(q.dtype)
    if q.dtype == torch.float32 or q.device.type != "cpu" or cpu_has_native_bf16():
        # the fused kernel: faster than matmul + softmax in fp32, and in bf16 with native bf16
        # (docs/engine_history.md, prefill attention)
        whole = q_len == seq_len  # a whole prompt: the kernel's own causal mask skips the upper half's blocks
        out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], keys.transpose(0, 1)[None],
                                             values.transpose(0, 1)[None], scale=scale, enable_gqa=True,
                                             attn_mask=None if whole else _additive_mask(q_len, seq_len,
                                                                                         q.dtype, q.device),
                                             is_causal=whole)
        return out[0].transpose(0, 1).contiguous()
    # 16-bit without native bf16: SDPA's path is slow there, so matmul in the model dtype and softmax in fp32
    visible = _visible(q_len, seq_len, q.device)
    group = heads // n_kv
    qg = q.view(q_len, n_kv, group, hd).permute(1, 2, 0, 3)  # [kv, group, L, hd]
    scores = torch.matmul(qg, keys.permute(1, 2, 0)[:, None]).float()  # [kv, group, L, S]
    scores.mul_(scale)
    scores.masked_fill_(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    out = torch.matmul(probs, values.permute(1, 0, 2)[:, None])  # [kv, group, L, hd]
    return out.permute(2, 0, 1, 3).reshape(q_len, heads, hd)


class TorchBackend(AttentionBackend):
    name = "torch"

    def __init__(self, device: torch.device | None = None):
        self.device = device

    def write_kv(self, k, v, k_cache, v_cache, meta: AttentionMetadata) -> None:
        write_kv(k, v, k_cache, v_cache, meta.slot_mapping)

    def decode(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        return torch_decode.decode_attention(q, k_cache, v_cache, meta, scale)

    def extend(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        first = meta.num_decode  # q holds the prefill rows only
        if len(meta.prefills) == 1:
            chunk = meta.prefills[0]
            return prefill_attention(q, k_cache, v_cache, chunk.block_table, chunk.seq_len, scale)
        out = torch.empty_like(q)
        for chunk in meta.prefills:
            rows = slice(chunk.q_start - first, chunk.q_start - first + chunk.q_len)
            out[rows] = prefill_attention(q[rows], k_cache, v_cache, chunk.block_table, chunk.seq_len, scale)
        return out
