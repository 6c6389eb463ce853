"""The same four operations in plain torch: the CPU path behind the dispatching interface, and the
route for copies between devices. Arithmetic in fp32, results in the input dtype."""

from __future__ import annotations

import torch


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_flat = k_cache.view(-1, *k_cache.shape[2:])  # [num_blocks * block_size, n_kv, hd]
    v_flat = v_cache.view(-1, *v_cache.shape[2:])
    k_flat[slots] = k[keep].to(k_cache.dtype)
    v_flat[slots] = v[keep].to(v_cache.dtype)


def _gather(cache: torch.Tensor, table_row: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """[n_tokens, n_kv, hd] in fp32 for one sequence, read through its block table."""
    block_size = cache.shape[1]
    n_blocks = -(-n_tokens // block_size)
    pages = cache[table_row[:n_blocks].long()]  # [n_blocks, block_size, n_kv, hd]
    return pages.reshape(-1, *cache.shape[2:])[:n_tokens].float()


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal_from: int | None) -> torch.Tensor:
    """q [Tq, H, D], k/v [Tk, KV, D] fp32; query i sits at position causal_from + i when causal."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    if causal_from is not None:
        q_pos = causal_from + torch.arange(q.shape[0], device=q.device)
        k_pos = torch.arange(k.shape[0], device=q.device)
        scores = scores.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def paged_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float,
) -> torch.Tensor:
    out = torch.zeros_like(q)
    for b, n in enumerate(context_lens.tolist()):
        if n > 0:
            k = _gather(k_cache, block_tables[b], n)
            v = _gather(v_cache, block_tables[b], n)
            out[b] = _attend(q[b : b + 1], k, v, scale, None)[0].to(q.dtype)
    return out


def paged_extend_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, scale: float,
) -> torch.Tensor:
    out = torch.zeros_like(q)
    starts = query_start_loc.tolist()
    for s, n in enumerate(seq_lens.tolist()):
        lo, hi = starts[s], starts[s + 1]
        if hi > lo:
            k = _gather(k_cache, block_tables[s], n)
            v = _gather(v_cache, block_tables[s], n)
            out[lo:hi] = _attend(q[lo:hi], k, v, scale, n - (hi - lo)).to(q.dtype)
    return out


def copy_blocks(src: torch.Tensor, dst: torch.Tensor, src_ids: torch.Tensor, dst_ids: torch.Tensor) -> None:
    blocks = src.index_select(2, src_ids.to(src.device))
    dst.index_copy_(2, dst_ids.to(dst.device), blocks.to(dst.device, non_blocking=True))


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    if residual is not None:
        x = (x.float() + residual.float()).to(x.dtype)
    xf = x.float()
    out = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)
    return out if residual is None else (out, x)
