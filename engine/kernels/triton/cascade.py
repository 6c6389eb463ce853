"""Cascade decode attention: rows that share a prefix attend to it once, as a group.

A decode step's rows are described by segments: a segment is a token range [start, end) that the listed
rows all hold in the same pages (same block ids; the last block of a range may instead be an equal copy,
since only the range's tokens are read). Levels nest: level 0 starts at token 0, level l + 1 starts where
the row's level-l segment ends (a system prompt shared by all, then a document shared by some). Each
row's deepest segment end is where its own suffix starts.

Three launches, whatever the number of groups and levels:
1. cascade_shared_kernel: a program takes one (segment, KV head, tile of stacked queries, split of the
   range). The member rows' query heads of that KV head are stacked as the M rows of tl.dot (rows x
   group heads), so each shared K/V tile is read once for the whole group, through the first member's
   block table. Output: a partial result and log-sum-exp per (row, head) in the row's slot for that level.
2. decode_split_kernel (decode.py) with a per-row start offset: each row's suffix, into the later slots.
3. decode_merge_kernel: the exact log-sum-exp merge of each row's slots. A row's levels are 0 .. k-1, so
   it skips the shared slots from k * shared_splits on (never written for it; no workspace fill needed).

Workspace: part_out [B, H, slots, D] fp32, part_lse [B, H, slots] fp32 (log2 units), where
slots = levels * shared_splits + suffix_splits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._common import LAUNCHES, dot_config, is_interpreted, next_pow2, num_sms
from .decode import LOG2E, check_decode_shapes, launch_merge, launch_split, plan_splits, tile_tokens

SHARED_MIN_PARTITION = 128  # shared tokens per split, at least: the stacked queries make each tile cheap
SEG_FIELDS = 5  # seg_info columns: token start, token end, first slot, first member, one past the last member


@dataclass(frozen=True)
class CascadeSegment:
    """Tokens [start, end) that `rows` (decode row indices) share, at nesting depth `level`."""

    level: int
    start: int
    end: int
    rows: tuple[int, ...]


@dataclass
class PackedCascade:
    """The segments in the int32 form the shared kernel takes, with the host-side sizes of the launch."""

    seg_info: torch.Tensor  # int32 [G, SEG_FIELDS]
    seg_rows: torch.Tensor  # int32 [sum of members]: rows of segment g at seg_info[g, 3] .. seg_info[g, 4]
    row_start: torch.Tensor  # int32 [B]: where each row's own suffix starts
    row_slots: torch.Tensor  # int32 [B]: the shared slots row b fills, levels it is in * shared_splits
    levels: int
    shared_splits: int
    shared_partition: int
    max_members: int
    min_row_start: int
    max_end: int  # the furthest shared token: the block tables must reach it


@triton.jit
def cascade_shared_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, seg_info_ptr, seg_rows_ptr, part_out_ptr, part_lse_ptr,
    scale_log2, partition, m_tiles,
    stride_qb, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_btb,
    stride_pb, stride_ph, stride_ps,
    stride_lb, stride_lh,
    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_T: tl.constexpr, PREC: tl.constexpr,
):
    g = tl.program_id(0)
    kvh = tl.program_id(1)
    m_tile = tl.program_id(2) % m_tiles
    split = tl.program_id(2) // m_tiles

    info = seg_info_ptr + g * 5
    tok_lo = tl.load(info)
    tok_hi = tl.load(info + 1)
    slot = tl.load(info + 2) + split
    mem_lo = tl.load(info + 3)
    mem_hi = tl.load(info + 4)

    # Stacked query rows: m -> (member m // GROUP, query head kvh * GROUP + m % GROUP).
    m = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    member = mem_lo + m // GROUP
    m_mask = member < mem_hi
    row = tl.load(seg_rows_ptr + member, mask=m_mask, other=0).to(tl.int64)
    heads = kvh * GROUP + m % GROUP
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    q_off = row[:, None] * stride_qb + heads[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_off, mask=m_mask[:, None] & d_mask[None, :], other=0.0).to(DOT_T)

    start = tok_lo + split * partition
    end = tl.minimum(start + partition, tok_hi)
    # a tile past the members: no work
    end = tl.where(m_tile * BLOCK_M < (mem_hi - mem_lo) * GROUP, end, start)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # Every member holds these tokens in the same pages: read them through the first member's table.
    bt_row = bt_ptr + tl.load(seg_rows_ptr + mem_lo).to(tl.int64) * stride_btb
    for t0 in range(start, end, BLOCK_N):
        t = t0 + tl.arange(0, BLOCK_N)
        t_mask = t < end
        blk = tl.load(bt_row + t // BLOCK_SIZE, mask=t_mask, other=0).to(tl.int64)
        in_blk = t % BLOCK_SIZE
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k_off = blk * stride_kb + in_blk * stride_ks + kvh * stride_kh
        k = tl.load(k_ptr + k_off[:, None] + d[None, :], mask=kv_mask, other=0.0).to(DOT_T)
        qk = tl.dot(q, tl.trans(k), input_precision=PREC) * scale_log2
        qk = tl.where(t_mask[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))  # finite: every tile holds at least one valid token
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v_off = blk * stride_vb + in_blk * stride_vs + kvh * stride_vh
        v = tl.load(v_ptr + v_off[:, None] + d[None, :], mask=kv_mask, other=0.0).to(DOT_T)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_T), v, input_precision=PREC)
        m_i = m_new

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    o = acc / l_safe[:, None]
    p_off = row[:, None] * stride_pb + heads[:, None] * stride_ph + slot * stride_ps + d[None, :]
    tl.store(part_out_ptr + p_off, o, mask=m_mask[:, None] & d_mask[None, :])
    lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
    tl.store(part_lse_ptr + row * stride_lb + heads * stride_lh + slot, lse, mask=m_mask)


def shared_tiles(members: int, group: int, head_dim: int, dtype: torch.dtype) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps). M covers the stacked queries up to 64 (the GPU's efficient MMA
    tile; more members take more tiles), 32 for fp32 (its exact FMA dots spill at 64 x 128, seen in the
    AOT check); 16 is the smallest tile tl.dot takes. The interpreter gets small key tiles so short test
    prefixes still span several of them."""
    block_m = min(32 if dtype == torch.float32 else 64, max(16, next_pow2(members * group)))
    if is_interpreted():
        return block_m, 16, 4
    block_n = 32 if dtype == torch.float32 or head_dim > 128 else 64
    return block_m, block_n, 8 if dtype == torch.float32 or block_m * head_dim > 4096 else 4


def segments_from_groups(groups: Sequence) -> list[CascadeSegment]:
    """Segments from a runner's cascade groups (engine/cascade/plan.py: rows, start_token,
    num_tokens; a group's ancestors hold all of its rows). Its level is the number of groups before it
    in the chain of its rows."""
    ordered = sorted(groups, key=lambda g: g.start_token)
    return [
        CascadeSegment(
            level=sum(1 for h in ordered if h.start_token < g.start_token and g.rows[0] in h.rows),
            start=g.start_token, end=g.start_token + g.num_tokens, rows=tuple(g.rows),
        )
        for g in ordered
    ]


def validate_segments(segments: Sequence[CascadeSegment], batch: int) -> tuple[list[int], list[int]]:
    """Each row's segments must be levels 0, 1, ... covering [0, its suffix start) without gaps.
    Returns the suffix start and the number of levels per row."""
    by_row: dict[int, dict[int, CascadeSegment]] = {}
    for seg in segments:
        if not seg.rows:
            raise ValueError(f"cascade segment {seg} has no rows")
        if not 0 <= seg.start < seg.end:
            raise ValueError(f"cascade segment {seg} has an empty or negative token range")
        for r in seg.rows:
            if not 0 <= r < batch:
                raise ValueError(f"cascade segment {seg} names row {r}, outside the batch of {batch}")
            if by_row.setdefault(r, {}).setdefault(seg.level, seg) is not seg:
                raise ValueError(f"row {r} is in two cascade segments at level {seg.level}")
    starts, depth = [0] * batch, [0] * batch
    for r, levels in by_row.items():
        depth[r] = len(levels)
        for level in range(len(levels)):
            seg = levels.get(level)
            if seg is None or seg.start != starts[r]:
                raise ValueError(f"row {r}: cascade level {level} must start where level {level - 1} ends "
                                 f"(token {starts[r]}), got {seg}")
            starts[r] = seg.end
    return starts, depth


def pack_segments(
    segments: Sequence[CascadeSegment], batch: int, n_kv: int, block_n: int, device: torch.device,
    shared_splits: int | None = None,
) -> PackedCascade:
    """Host-side layout of a step's segments (built once per plan). The shared range's split count
    follows the decode kernel's rule: about four waves of programs, each at least SHARED_MIN_PARTITION
    tokens; shared_splits overrides it (tests cover several)."""
    starts, depth = validate_segments(segments, batch)
    levels = 1 + max((s.level for s in segments), default=-1)
    longest = max((s.end - s.start for s in segments), default=1)
    max_members = max((len(s.rows) for s in segments), default=1)
    if shared_splits is None:
        programs = max(len(segments), 1) * n_kv
        want = triton.cdiv(4 * num_sms(device), programs)
        shared_splits = max(1, min(want, triton.cdiv(longest, SHARED_MIN_PARTITION)))
    partition = triton.cdiv(triton.cdiv(longest, shared_splits), block_n) * block_n
    shared_splits = triton.cdiv(longest, partition)
    info, rows = [], []
    for seg in segments:
        info.append([seg.start, seg.end, seg.level * shared_splits, len(rows), len(rows) + len(seg.rows)])
        rows.extend(seg.rows)
    return PackedCascade(
        seg_info=torch.tensor(info, dtype=torch.int32).view(-1, SEG_FIELDS).to(device),
        seg_rows=torch.tensor(rows or [0], dtype=torch.int32).to(device),
        row_start=torch.tensor(starts, dtype=torch.int32).to(device),
        row_slots=torch.tensor([d * shared_splits for d in depth], dtype=torch.int32).to(device),
        levels=levels, shared_splits=shared_splits, shared_partition=partition, max_members=max_members,
        min_row_start=min(starts, default=0), max_end=max((s.end for s in segments), default=0),
    )


def pack_for(
    segments: Sequence[CascadeSegment], q: torch.Tensor, k_cache: torch.Tensor,
    shared_splits: int | None = None,
) -> PackedCascade:
    """pack_segments for decode queries q [B, H, D] over this cache (tile sizes follow dtype and head dim)."""
    # not member-dependent
    _, block_n, _ = shared_tiles(1, q.shape[1] // k_cache.shape[2], q.shape[2], k_cache.dtype)
    return pack_segments(segments, q.shape[0], k_cache.shape[2], block_n, q.device, shared_splits)


def cascade_partials(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float, segments: Sequence[CascadeSegment] | PackedCascade,
    num_splits: int | None = None, shared_splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, PackedCascade]:
    """Launches 1 and 2: the filled workspace (part_out, part_lse in log2 units) and its layout."""
    q, group = check_decode_shapes(q, k_cache, v_cache)
    batch, n_heads, head_dim = q.shape
    n_kv, block_size = k_cache.shape[2], k_cache.shape[1]
    packed = segments if isinstance(segments, PackedCascade) else pack_for(segments, q, k_cache,
                                                                           shared_splits)
    # Host-side checks only (no sync): that each segment's rows hold its tokens is the plan's contract.
    if packed.row_start.shape[0] != batch:
        raise ValueError(f"cascade plan packed for {packed.row_start.shape[0]} rows, called with {batch}")
    if packed.max_end > block_tables.shape[1] * block_size:
        raise ValueError(f"cascade segment ends at token {packed.max_end}, past the block tables' "
                         f"{block_tables.shape[1] * block_size} tokens")
    block_m, block_n, warps = shared_tiles(packed.max_members, group, head_dim, k_cache.dtype)

    # The suffix splits: an upper bound on the longest suffix, known without reading context_lens.
    suffix_bound = max(block_tables.shape[1] * block_size - packed.min_row_start, 1)
    suffix_n = tile_tokens(head_dim, k_cache.dtype)
    splits, partition = plan_splits(batch, n_kv, suffix_bound, suffix_n, q.device, num_splits)
    base = packed.levels * packed.shared_splits
    part_lse = torch.empty(batch, n_heads, base + splits, device=q.device, dtype=torch.float32)
    part_out = torch.empty(batch, n_heads, base + splits, head_dim, device=q.device, dtype=torch.float32)

    groups = packed.seg_info.shape[0]
    if groups:
        m_tiles = triton.cdiv(packed.max_members * group, block_m)
        dot_t, prec = dot_config(k_cache.dtype)
        LAUNCHES["cascade_shared"] += 1
        cascade_shared_kernel[(groups, n_kv, m_tiles * packed.shared_splits)](
            q, k_cache, v_cache, block_tables, packed.seg_info, packed.seg_rows, part_out, part_lse,
            scale * LOG2E, packed.shared_partition, m_tiles,
            q.stride(0), q.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            block_tables.stride(0),
            part_out.stride(0), part_out.stride(1), part_out.stride(2),
            part_lse.stride(0), part_lse.stride(1),
            GROUP=group, BLOCK_SIZE=block_size, HEAD_DIM=head_dim,
            BLOCK_M=block_m, BLOCK_D=next_pow2(head_dim), BLOCK_N=block_n,
            DOT_T=dot_t, PREC=prec, num_warps=warps, num_stages=2,
        )
    launch_split(q, k_cache, v_cache, block_tables, context_lens, scale, splits, partition, suffix_n,
                 None, part_out, part_lse, row_start=packed.row_start, split_base=base)
    return part_out, part_lse, packed


def cascade_triton(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float, segments: Sequence[CascadeSegment] | PackedCascade,
    num_splits: int | None = None, shared_splits: int | None = None,
) -> torch.Tensor:
    out = torch.empty_like(q)
    if q.shape[0] == 0:
        return out
    part_out, part_lse, packed = cascade_partials(q, k_cache, v_cache, block_tables, context_lens, scale,
                                                  segments, num_splits, shared_splits)
    launch_merge(part_out, part_lse, out, packed.row_slots, packed.levels * packed.shared_splits)
    return out
