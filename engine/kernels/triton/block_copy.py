"""Copy whole KV blocks between (or within) caches shaped [num_layers, 2, num_blocks, block_size, n_kv,
head_dim], for all layers and both K and V: block src_ids[i] of src goes to block dst_ids[i] of dst.
Used for swaps, promotions and copy-on-write. The two caches may hold different numbers of blocks.
Different devices (GPU <-> host) go through torch, which Triton cannot do."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import LAUNCHES, check_dtype

COPY_BLOCK = 2048  # elements per program; a 16-token, 8-head, 128-dim block is 16384 elements


@triton.jit
def copy_blocks_kernel(
    src_ptr, dst_ptr, src_ids_ptr, dst_ids_ptr,
    s_stride_l, s_stride_kv, s_stride_b,
    d_stride_l, d_stride_kv, d_stride_b,
    block_numel,
    BLOCK: tl.constexpr,
):
    pair = tl.program_id(0)
    layer_kv = tl.program_id(1)
    chunk = tl.program_id(2)
    layer = layer_kv // 2
    kv = layer_kv % 2
    src_blk = tl.load(src_ids_ptr + pair).to(tl.int64)
    dst_blk = tl.load(dst_ids_ptr + pair).to(tl.int64)
    off = chunk.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = off < block_numel
    s_base = layer.to(tl.int64) * s_stride_l + kv * s_stride_kv + src_blk * s_stride_b
    d_base = layer.to(tl.int64) * d_stride_l + kv * d_stride_kv + dst_blk * d_stride_b
    x = tl.load(src_ptr + s_base + off, mask=mask, other=0.0)
    tl.store(dst_ptr + d_base + off, x, mask=mask)


def inner_contiguous(t: torch.Tensor) -> bool:
    """The block's own three dims are dense, so one block is block_numel consecutive elements."""
    _, _, _, bs, n_kv, hd = t.shape
    return t.stride(5) == 1 and t.stride(4) == hd and t.stride(3) == n_kv * hd


def copy_blocks_triton(src: torch.Tensor, dst: torch.Tensor, src_ids: torch.Tensor,
                       dst_ids: torch.Tensor) -> None:
    check_dtype(src, dst)
    num_layers = src.shape[0]
    block_numel = src[0, 0, 0].numel()
    n_pairs = src_ids.shape[0]
    if n_pairs == 0:
        return
    LAUNCHES["copy_blocks"] += 1
    grid = (n_pairs, num_layers * 2, triton.cdiv(block_numel, COPY_BLOCK))
    copy_blocks_kernel[grid](
        src, dst, src_ids, dst_ids,
        src.stride(0), src.stride(1), src.stride(2),
        dst.stride(0), dst.stride(1), dst.stride(2),
        block_numel,
        BLOCK=COPY_BLOCK, num_warps=4,
    )
