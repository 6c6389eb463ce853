"""Extend (prefill) attention over packed variable-length queries with a paged prefix.

Sequence s owns query rows q[query_start_loc[s]:query_start_loc[s+1]]: the last q_len tokens of its
seq_lens[s] tokens, whose K/V are already in the pages. A program handles one (sequence, query head,
tile of BLOCK_M queries) and streams keys 0 .. min(seq_len, last query position + 1) from the pages
with an online softmax; the causal mask (key position <= query position) covers both the cached
prefix (always visible) and the new tokens. One kernel, no separate prefix/self-attention passes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import LAUNCHES, check_attention_dtypes, dot_config, is_interpreted, next_pow2

LOG2E = 1.4426950408889634


@triton.jit
def extend_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, qsl_ptr, seq_lens_ptr, out_ptr,
    scale_log2,
    stride_qt, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_btb,
    stride_ot, stride_oh,
    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_T: tl.constexpr, PREC: tl.constexpr,
):
    s = tl.program_id(0)
    h = tl.program_id(1)
    m_tile = tl.program_id(2)
    kvh = h // GROUP

    q_start = tl.load(qsl_ptr + s)
    q_len = tl.load(qsl_ptr + s + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + s)
    prefix = seq_len - q_len

    m_off = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = m_off < q_len
    q_pos = prefix + m_off
    # Keys up to the tile's last query; a tile past this sequence's queries reads nothing.
    kv_end = tl.where(m_tile * BLOCK_M < q_len, tl.minimum(seq_len, prefix + (m_tile + 1) * BLOCK_M), 0)

    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    rows = (q_start + m_off).to(tl.int64)
    q_off = rows[:, None] * stride_qt + h * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_off, mask=m_mask[:, None] & d_mask[None, :], other=0.0).to(DOT_T)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    bt_row = bt_ptr + s.to(tl.int64) * stride_btb
    for n0 in range(0, kv_end, BLOCK_N):
        t = n0 + tl.arange(0, BLOCK_N)
        t_mask = t < kv_end
        blk = tl.load(bt_row + t // BLOCK_SIZE, mask=t_mask, other=0).to(tl.int64)
        slot = t % BLOCK_SIZE
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k_off = blk * stride_kb + slot * stride_ks + kvh * stride_kh
        k = tl.load(k_ptr + k_off[:, None] + d[None, :], mask=kv_mask, other=0.0).to(DOT_T)
        qk = tl.dot(q, tl.trans(k), input_precision=PREC) * scale_log2
        visible = t_mask[None, :] & (t[None, :] <= q_pos[:, None])
        qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(qk - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v_off = blk * stride_vb + slot * stride_vs + kvh * stride_vh
        v = tl.load(v_ptr + v_off[:, None] + d[None, :], mask=kv_mask, other=0.0).to(DOT_T)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_T), v, input_precision=PREC)
        m_i = m_new

    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_off = rows[:, None] * stride_ot + h * stride_oh + d[None, :]
    tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


def extend_tiles(head_dim: int, dtype: torch.dtype) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps), chosen so the AOT check (aot.py) sees no register spills on sm_80 or
    sm_90: 8 warps for 128-wide heads and for fp32 (whose exact dots run on FMA units). The interpreter
    gets small tiles because its cost grows with the padded work."""
    if is_interpreted():
        return 16, 32, 4
    if dtype == torch.float32 or head_dim > 128:
        return 32, 32, 8
    return 64, 64, 8 if head_dim > 64 else 4


def extend_triton(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, scale: float, max_q_len: int | None = None,
) -> torch.Tensor:
    dtype = check_attention_dtypes(q, k_cache, v_cache)
    total, n_heads, head_dim = q.shape
    _, block_size, n_kv, _ = k_cache.shape
    if n_heads % n_kv:
        raise ValueError(f"n_heads {n_heads} is not a multiple of n_kv_heads {n_kv}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("caches must have a contiguous head_dim")
    q = q if q.stride(-1) == 1 else q.contiguous()
    out = torch.empty_like(q)
    num_seqs = seq_lens.shape[0]
    if total == 0 or num_seqs == 0:
        return out
    if max_q_len is None:
        # Exact when the metadata lives on the host; otherwise the total is a bound that needs no sync.
        on_host = query_start_loc.device.type == "cpu"
        max_q_len = int(query_start_loc.diff().max()) if on_host else total
    block_m, block_n, warps = extend_tiles(head_dim, dtype)
    dot_t, prec = dot_config(dtype)

    LAUNCHES["extend"] += 1
    grid = (num_seqs, n_heads, triton.cdiv(max(max_q_len, 1), block_m))
    extend_kernel[grid](
        q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, out,
        scale * LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=n_heads // n_kv, BLOCK_SIZE=block_size, HEAD_DIM=head_dim,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=next_pow2(head_dim),
        DOT_T=dot_t, PREC=prec,
        num_warps=warps, num_stages=2,
    )
    return out
