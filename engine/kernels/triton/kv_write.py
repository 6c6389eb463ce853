"""Scatter new K/V rows into their pages: token i goes to slot slot_mapping[i] (block * block_size +
offset); a negative slot (padding) is skipped. One program per token moves all its KV heads at once."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import LAUNCHES, check_dtype, is_interpreted, next_pow2


@triton.jit
def write_kv_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kcs, stride_kch,
    stride_vcb, stride_vcs, stride_vch,
    N_KV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    n_heads = tl.where(slot >= 0, N_KV, 0)  # a skipped token masks every head
    mask = (h[:, None] < n_heads) & (d[None, :] < HEAD_DIM)

    k = tl.load(k_ptr + t * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask, other=0.0)
    kc_off = blk * stride_kcb + off * stride_kcs + h[:, None] * stride_kch + d[None, :]
    tl.store(kc_ptr + kc_off, k.to(kc_ptr.dtype.element_ty), mask=mask)
    v = tl.load(v_ptr + t * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask, other=0.0)
    vc_off = blk * stride_vcb + off * stride_vcs + h[:, None] * stride_vch + d[None, :]
    tl.store(vc_ptr + vc_off, v.to(vc_ptr.dtype.element_ty), mask=mask)


def write_kv_triton(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    check_dtype(k, v)  # the new K/V may be wider than the cache (an fp32 model, 16-bit KV): rounded on store
    check_dtype(k_cache, v_cache)
    if k.dtype != k_cache.dtype and is_interpreted():
        # The interpreter truncates fp32 -> bf16 (any rounding mode asked); the GPU rounds to nearest even,
        # as torch does, so round here to store what the GPU would.
        k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
    n_tokens, n_kv, head_dim = k.shape
    if n_tokens == 0:
        return
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("caches must have a contiguous head_dim")
    LAUNCHES["write_kv"] += 1
    write_kv_kernel[(n_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        N_KV=n_kv, HEAD_DIM=head_dim, BLOCK_SIZE=k_cache.shape[1],
        BLOCK_H=next_pow2(n_kv), BLOCK_D=next_pow2(head_dim),
        num_warps=4 if n_kv * head_dim >= 1024 else 1,
    )
