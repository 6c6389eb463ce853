"""Paged decode attention: one query token per sequence, grouped-query heads, split-K over the context.

Design: a program handles one (sequence, KV head, context split). All query heads that share the KV
head are processed together as the M rows of tl.dot (padded to 16, the smallest MMA tile), so every
K/V byte is read once per group rather than once per query head. Splitting the context (flash-decoding)
keeps the GPU full when batch * kv_heads is small (batch 1, long contexts); a second small kernel merges
the partial results by their log-sum-exp. When one split suffices the first kernel writes the output
directly and the merge is skipped. The split count depends only on tensor shapes (never on
context_lens' values), so the call does not synchronise with the host and can be graph-captured.

Cascade (cascade.py) reuses both kernels: the split kernel with a per-row start offset (HAS_START) attends
to each row's own suffix after its shared prefix, writing its splits at slot split_base onwards of a
workspace whose lower slots hold the shared-prefix partials; the merge kernel then combines them all.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import LAUNCHES, check_attention_dtypes, dot_config, is_interpreted, next_pow2, num_sms

LOG2E = 1.4426950408889634
MIN_PARTITION = 256  # tokens per split, at least: below this the merge costs more than it saves
# Launch knobs the GPU benchmark sweeps (bench/gpu); None means the built-in choice.
TUNING: dict[str, int | None] = {"block_n": None, "num_warps": None, "num_stages": 2}


@triton.jit
def decode_split_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, ctx_ptr, start_ptr, out_ptr, part_out_ptr, part_lse_ptr,
    scale_log2, partition, split_base,
    stride_qb, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_btb,
    stride_ob, stride_oh,
    stride_pb, stride_ph, stride_ps,
    stride_lb, stride_lh,
    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_T: tl.constexpr, PREC: tl.constexpr, SPLIT: tl.constexpr, HAS_START: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)

    ctx = tl.load(ctx_ptr + b)
    start = split * partition
    if HAS_START:  # cascade suffix: tokens before start_ptr[b] were attended as a shared prefix
        start += tl.load(start_ptr + b)
    end = tl.minimum(start + partition, ctx)  # end <= start: empty split, the loop does not run

    h = tl.arange(0, BLOCK_H)
    h_mask = h < GROUP
    heads = kvh * GROUP + h
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM

    q_off = b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_off, mask=h_mask[:, None] & d_mask[None, :], other=0.0).to(DOT_T)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * stride_btb
    for t0 in range(start, end, BLOCK_N):
        t = t0 + tl.arange(0, BLOCK_N)
        t_mask = t < end
        # Per-token page lookup: tiles need not align with pages, and pages need not be contiguous.
        blk = tl.load(bt_row + t // BLOCK_SIZE, mask=t_mask, other=0).to(tl.int64)
        slot = t % BLOCK_SIZE
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k_off = blk * stride_kb + slot * stride_ks + kvh * stride_kh
        k = tl.load(k_ptr + k_off[:, None] + d[None, :], mask=kv_mask, other=0.0).to(DOT_T)
        qk = tl.dot(q, tl.trans(k), input_precision=PREC) * scale_log2
        qk = tl.where(t_mask[None, :], qk, float("-inf"))
        # Every tile holds at least one valid token, so m_new is finite.
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v_off = blk * stride_vb + slot * stride_vs + kvh * stride_vh
        v = tl.load(v_ptr + v_off[:, None] + d[None, :], mask=kv_mask, other=0.0).to(DOT_T)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_T), v, input_precision=PREC)
        m_i = m_new

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    o = acc / l_safe[:, None]
    o_mask = h_mask[:, None] & d_mask[None, :]
    if SPLIT:
        slot = split_base + split
        p_off = (b.to(tl.int64) * stride_pb + heads[:, None] * stride_ph + slot * stride_ps + d[None, :])
        tl.store(part_out_ptr + p_off, o, mask=o_mask)
        lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(part_lse_ptr + b * stride_lb + heads * stride_lh + slot, lse, mask=h_mask)
    else:
        o_off = b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + d[None, :]
        tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=o_mask)


@triton.jit
def decode_merge_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, row_slots_ptr, num_splits, slot_base,
    stride_pb, stride_ph, stride_ps,
    stride_lb, stride_lh,
    stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, HAS_ROW_SLOTS: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    s_mask = s < num_splits
    if HAS_ROW_SLOTS:  # cascade: row b wrote shared slots [0, row_slots[b]) and the suffix's [slot_base, ...)
        s_mask = s_mask & ((s < tl.load(row_slots_ptr + b)) | (s >= slot_base))
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM

    lse = tl.load(part_lse_ptr + b * stride_lb + h * stride_lh + s, mask=s_mask, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # zero-length context: all weights 0, output 0
    w = tl.exp2(lse - m)
    denom = tl.sum(w, 0)
    denom = tl.where(denom > 0, denom, 1.0)
    p_off = b.to(tl.int64) * stride_pb + h * stride_ph + s[:, None] * stride_ps + d[None, :]
    parts = tl.load(part_out_ptr + p_off, mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    o = tl.sum(parts * w[:, None], 0) / denom
    o_off = b.to(tl.int64) * stride_ob + h * stride_oh + d
    tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=d_mask)


def choose_splits(batch: int, n_kv: int, max_tokens: int, device: torch.device) -> int:
    """Enough programs for about four waves of the GPU, each split at least MIN_PARTITION tokens."""
    programs = batch * n_kv
    want = triton.cdiv(4 * num_sms(device), max(programs, 1))
    return max(1, min(want, triton.cdiv(max_tokens, MIN_PARTITION)))


def tile_tokens(head_dim: int, dtype: torch.dtype) -> int:
    """Keys per loop iteration. Smaller under the interpreter so short test contexts span several tiles
    and several splits; smaller for fp32 (FMA dots) and wide heads, which spill registers at 64."""
    if TUNING["block_n"]:
        return int(TUNING["block_n"])
    if is_interpreted():
        return 16
    return 32 if dtype == torch.float32 or head_dim > 128 else 64


def decode_warps(dtype: torch.dtype) -> int:
    """fp32's exact dots run on FMA units and spill at 4 warps (seen in the AOT check with Triton 3.6)."""
    return int(TUNING["num_warps"] or (8 if dtype == torch.float32 else 4))


def plan_splits(
    batch: int, n_kv: int, max_tokens: int, block_n: int, device: torch.device, num_splits: int | None = None
) -> tuple[int, int]:
    """(splits, partition): partitions are whole tiles, so a requested count can shrink for short tables."""
    splits = num_splits or choose_splits(batch, n_kv, max_tokens, device)
    partition = triton.cdiv(triton.cdiv(max_tokens, splits), block_n) * block_n
    return max(1, triton.cdiv(max_tokens, partition)), partition


def check_decode_shapes(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[torch.Tensor,
                                                                                                int]:
    """q with a unit inner stride, and the GQA group size; raises on shapes the kernels cannot take."""
    check_attention_dtypes(q, k_cache, v_cache)
    n_heads, n_kv = q.shape[1], k_cache.shape[2]
    if n_heads % n_kv:
        raise ValueError(f"n_heads {n_heads} is not a multiple of n_kv_heads {n_kv}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("caches must have a contiguous head_dim")
    return (q if q.stride(-1) == 1 else q.contiguous()), n_heads // n_kv


def launch_split(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float, splits: int, partition: int, block_n: int,
    out: torch.Tensor | None, part_out: torch.Tensor | None, part_lse: torch.Tensor | None,
    row_start: torch.Tensor | None = None, split_base: int = 0,
) -> None:
    """One launch of decode_split_kernel: straight into out (out given), or splits into the workspace
    part_out [B, H, slots, D] / part_lse [B, H, slots] at slots split_base ... split_base + splits - 1."""
    batch, n_heads, head_dim = q.shape
    n_kv = k_cache.shape[2]
    split = out is None
    if split:
        assert part_out is not None and part_lse is not None
        out = part_out  # unused by the kernel; any tensor will do for the pointer arguments
    else:
        part_out = part_lse = out
    dot_t, prec = dot_config(k_cache.dtype)
    LAUNCHES["decode"] += 1
    decode_split_kernel[(batch, n_kv, splits)](
        q, k_cache, v_cache, block_tables, context_lens, context_lens if row_start is None else row_start,
        out, part_out, part_lse,
        scale * LOG2E, partition, split_base,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0) if not split else 0, out.stride(1) if not split else 0,
        part_out.stride(0) if split else 0, part_out.stride(1) if split else 0,
        part_out.stride(2) if split else 0,
        part_lse.stride(0) if split else 0, part_lse.stride(1) if split else 0,
        GROUP=n_heads // n_kv, BLOCK_SIZE=k_cache.shape[1], HEAD_DIM=head_dim,
        BLOCK_H=max(16, next_pow2(n_heads // n_kv)), BLOCK_D=next_pow2(head_dim), BLOCK_N=block_n,
        DOT_T=dot_t, PREC=prec, SPLIT=split, HAS_START=row_start is not None,
        num_warps=decode_warps(k_cache.dtype), num_stages=TUNING["num_stages"],
    )


def launch_merge(
    part_out: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor,
    row_slots: torch.Tensor | None = None, slot_base: int = 0,
) -> None:
    """out[b, h] = the log-sum-exp weighted mean of the workspace's slots. With row_slots (cascade), row b
    merges only slots [0, row_slots[b]) and [slot_base, slots): the others were never written for it."""
    batch, n_heads, slots, head_dim = part_out.shape
    LAUNCHES["decode_merge"] += 1
    decode_merge_kernel[(batch, n_heads)](
        part_out, part_lse, out, part_lse if row_slots is None else row_slots, slots, slot_base,
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, BLOCK_D=next_pow2(head_dim), BLOCK_S=next_pow2(slots),
        HAS_ROW_SLOTS=row_slots is not None, num_warps=4,
    )


def decode_triton(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float, num_splits: int | None = None,
) -> torch.Tensor:
    q, _ = check_decode_shapes(q, k_cache, v_cache)
    batch, n_heads, head_dim = q.shape
    out = torch.empty_like(q)
    if batch == 0:
        return out

    # an upper bound on context_lens, known without a sync
    max_tokens = block_tables.shape[1] * k_cache.shape[1]
    block_n = tile_tokens(head_dim, k_cache.dtype)
    splits, partition = plan_splits(batch, k_cache.shape[2], max_tokens, block_n, q.device, num_splits)
    if splits == 1:
        launch_split(q, k_cache, v_cache, block_tables, context_lens, scale, 1, partition, block_n, out, None,
                     None)
        return out
    part_out = torch.empty(batch, n_heads, splits, head_dim, device=q.device, dtype=torch.float32)
    part_lse = torch.empty(batch, n_heads, splits, device=q.device, dtype=torch.float32)
    launch_split(q, k_cache, v_cache, block_tables, context_lens, scale, splits, partition, block_n,
                 None, part_out, part_lse)
    launch_merge(part_out, part_lse, out)
    return out
