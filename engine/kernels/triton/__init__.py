"""Triton kernels for paged attention, behind one interface the runner calls.

Cache layout: per layer k_cache / v_cache are [num_blocks, block_size, n_kv_heads, head_dim]; a token's
slot is block_id * block_size + offset; block tables are int32 [num_seqs, max_blocks] padded with 0.

Dispatch (`backend=` keyword): by default Triton runs wherever it can (CUDA tensors, or CPU tensors when
TRITON_INTERPRET=1 was set before triton's first import) and the torch path (torch_ops) otherwise;
"triton" insists on Triton, "torch" forces the torch path. Copies across devices always use torch.
"""

from __future__ import annotations

import torch

from . import torch_ops
from ._common import LAUNCHES, is_interpreted, use_triton
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
    "torch_ops",
    "write_kv",
]


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor, *, backend: str | None = None,
) -> None:
    """k, v [N, n_kv, hd] into the caches at slot_mapping (int64 [N]; negative = skip), in place."""
    if use_triton(k.device, backend):
        write_kv_triton(k, v, k_cache, v_cache, slot_mapping)
    else:
        torch_ops.write_kv(k, v, k_cache, v_cache, slot_mapping)


def paged_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float, *, num_splits: int | None = None, backend: str | None = None,
) -> torch.Tensor:
    """q [B, n_heads, hd], one token per sequence over context_lens[b] cached tokens -> [B, n_heads, hd].
    num_splits overrides the split-K heuristic (tests use it to cover both paths)."""
    if use_triton(q.device, backend):
        return decode_triton(q, k_cache, v_cache, block_tables, context_lens, scale, num_splits)
    return torch_ops.paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale)


def cascade_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float, segments: list[CascadeSegment] | PackedCascade,
    *, num_splits: int | None = None, shared_splits: int | None = None, backend: str | None = None,
) -> torch.Tensor:
    """paged_decode_attention's result, with the rows of each segment attending to its shared tokens
    once, as a group (cascade.py). Pack the segments once per step (pack_segments) to reuse them
    across layers (pack_for). The torch path has no cascade here and computes the same attention row by row."""
    if use_triton(q.device, backend):
        return cascade_triton(q, k_cache, v_cache, block_tables, context_lens, scale, segments,
                              num_splits, shared_splits)
    return torch_ops.paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale)


def paged_extend_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, scale: float,
    *, max_q_len: int | None = None, backend: str | None = None,
) -> torch.Tensor:
    """q [T, n_heads, hd] packed; sequence s's queries are its last q_len of seq_lens[s] tokens, causal.
    Pass max_q_len when known: without it a CUDA launch sizes its grid by T to avoid a host sync."""
    if use_triton(q.device, backend):
        return extend_triton(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, max_q_len)
    return torch_ops.paged_extend_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale)


def copy_blocks(
    src: torch.Tensor, dst: torch.Tensor, src_ids: torch.Tensor, dst_ids: torch.Tensor,
    *, backend: str | None = None,
) -> None:
    """Block src_ids[i] -> dst_ids[i] for every layer and K and V; src/dst [L, 2, num_blocks, bs, n_kv, hd]."""
    same_device = src.device == dst.device == src_ids.device == dst_ids.device
    if same_device and inner_contiguous(src) and inner_contiguous(dst) and use_triton(src.device, backend):
        copy_blocks_triton(src, dst, src_ids, dst_ids)
    else:
        torch_ops.copy_blocks(src, dst, src_ids, dst_ids)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
    *, backend: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Optional fused RMSNorm over the last dim. With residual: returns (norm(x + residual), x + residual),
    the sum rounded to the input dtype as in Hugging Face Llama."""
    if use_triton(x.device, backend):
        return rms_norm_triton(x, weight, eps, residual)
    return torch_ops.rms_norm(x, weight, eps, residual)
