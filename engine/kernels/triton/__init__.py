"""Triton kernels for paged attention: what the triton attention backend (engine/kernels/triton_backend.py)
launches, and the GPU check measures.

Cache layout: per layer k_cache / v_cache are [num_blocks, block_size, n_kv_heads, head_dim]; a token's
slot is block_id * block_size + offset; block tables are int32 [num_seqs, max_blocks] padded with 0.

Every function runs its Triton kernel or raises (CPU tensors need TRITON_INTERPRET=1 set before triton's
first import): there is no torch fallback here. The one exception is a block copy between devices or
between non-contiguous pools, which is torch indexing by nature.
"""

from __future__ import annotations

import torch

from ._common import LAUNCHES, is_interpreted, require_triton
from .block_copy import copy_blocks_triton, inner_contiguous
from .cascade import (
    CascadeSegment,
    PackedCascade,
    cascade_triton,
    pack_for,
    pack_segments,
    segments_from_groups,
)
from .decode import decode_triton
from .extend import extend_triton
from .kv_write import write_kv_triton
from .rmsnorm import rms_norm_triton

__all__ = [
    "LAUNCHES",
    "CascadeSegment",
    "PackedCascade",
    "cascade_decode_attention",
    "copy_blocks",
    "is_interpreted",
    "pack_for",
    "pack_segments",
    "paged_decode_attention",
    "paged_extend_attention",
    "rms_norm",
    "segments_from_groups",
    "write_kv",
]


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """k, v [N, n_kv, hd] into the caches at slot_mapping (int64 [N]; negative = skip), in place."""
    require_triton(k.device)
    write_kv_triton(k, v, k_cache, v_cache, slot_mapping)


def paged_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float, *, num_splits: int | None = None,
) -> torch.Tensor:
    """q [B, n_heads, hd], one token per sequence over context_lens[b] cached tokens -> [B, n_heads, hd].
    num_splits overrides the split-K heuristic (tests use it to cover both paths)."""
    require_triton(q.device)
    return decode_triton(q, k_cache, v_cache, block_tables, context_lens, scale, num_splits)


def cascade_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float, segments: list[CascadeSegment] | PackedCascade,
    *, num_splits: int | None = None, shared_splits: int | None = None,
) -> torch.Tensor:
    """paged_decode_attention's result, with the rows of each segment attending to its shared tokens
    once, as a group (cascade.py). Pack the segments once per step (pack_segments) to reuse them
    across layers (pack_for)."""
    require_triton(q.device)
    return cascade_triton(q, k_cache, v_cache, block_tables, context_lens, scale, segments, num_splits,
                          shared_splits)


def paged_extend_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, scale: float, *, max_q_len: int | None = None,
) -> torch.Tensor:
    """q [T, n_heads, hd] packed; sequence s's queries are its last q_len of seq_lens[s] tokens, causal.
    Pass max_q_len when known: without it a CUDA launch sizes its grid by T to avoid a host sync."""
    require_triton(q.device)
    return extend_triton(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, max_q_len)


def copy_blocks(src: torch.Tensor, dst: torch.Tensor, src_ids: torch.Tensor, dst_ids: torch.Tensor) -> None:
    """Block src_ids[i] -> dst_ids[i] for every layer and K and V; src/dst [L, 2, num_blocks, bs, n_kv, hd].
    Between devices, or pools whose blocks are not contiguous inside, torch indexing does the copy."""
    same_device = src.device == dst.device == src_ids.device == dst_ids.device
    if same_device and inner_contiguous(src) and inner_contiguous(dst):
        require_triton(src.device)
        copy_blocks_triton(src, dst, src_ids, dst_ids)
    else:
        blocks = src.index_select(2, src_ids.to(src.device))
        dst.index_copy_(2, dst_ids.to(dst.device), blocks.to(dst.device, non_blocking=True))


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Optional fused RMSNorm over the last dim. With residual: returns (norm(x + residual), x + residual),
    the sum rounded to the input dtype as in Hugging Face Llama."""
    require_triton(x.device)
    return rms_norm_triton(x, weight, eps, residual)
