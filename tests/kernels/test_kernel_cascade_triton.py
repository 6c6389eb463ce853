"""Cascade decode attention (Triton, under the interpreter) against float64: the result must equal each
row's plain attention over its whole context, for groups of 1, 2 and 16 rows, shared prefixes ending
mid-block and on a block edge, several groups per step and nested prefixes; the shared kernel's partial
outputs and log-sum-exps must equal float64 attention over the shared range alone."""

from __future__ import annotations

import math

import pytest
import torch
from kernel_ref import (
    DTYPES,
    assert_close,
    cascade_ref,
    make_cascade_paged,
    new_generator,
    poisoned_alloc,
    strided_rows,
)

from kvloop.engine.kernels import reference
from kvloop.engine.kernels import triton as tk
from kvloop.engine.kernels.triton.cascade import cascade_partials, pack_segments
from kvloop.engine.kernels.triton.decode import launch_merge

S = tk.CascadeSegment
SIXTEEN = tuple(range(16))
# name -> (dtype, block_size, n_kv, group, head_dim, context lengths, segments, num_splits, shared_splits)
CASES = {
    "group_of_1_mid_block": ("fp32", 16, 3, 3, 64, [50, 30], [S(0, 0, 40, (0,))], None, None),
    "group_of_2_block_edge": ("fp16", 16, 3, 3, 64, [40, 33, 20], [S(0, 0, 32, (0, 1))], 2, None),
    "group_of_16_mid_block": ("bf16", 16, 2, 4, 64, [71 + 2 * i for i in range(16)], [S(0, 0, 70, SIXTEEN)],
                              None, 3),
    "group_of_16_gqa3_edge": ("fp32", 32, 3, 3, 64, [65 + i % 5 for i in range(16)], [S(0, 0, 64, SIXTEEN)],
                              2, 2),
    "two_documents": ("fp16", 16, 2, 3, 64, [40, 35, 50, 70, 65, 9],
                      [S(0, 0, 33, (0, 1, 2)), S(0, 0, 64, (3, 4))], None, None),
    "nested": ("fp32", 16, 2, 3, 64, [70, 62, 49, 40, 38, 25, 30],
               [S(0, 0, 20, (0, 1, 2, 3, 4, 5)), S(1, 20, 48, (0, 1, 2)), S(1, 20, 37, (3, 4)),
                S(2, 48, 60, (0, 1))], 2, 2),
    "nested_bf16_shared_by_all": ("bf16", 16, 3, 3, 64, [60, 58, 45, 44],
                                  [S(0, 0, 16, (0, 1, 2, 3)), S(1, 16, 41, (0, 1)), S(1, 16, 43, (2, 3))],
                                  None, None),
}


def build(name: str):
    dtype_name, bs, n_kv, group, hd, lens, segments, splits, shared_splits = CASES[name]
    dtype = DTYPES[dtype_name]
    gen, seed = new_generator()
    paged = make_cascade_paged(lens, segments, bs, n_kv, hd, dtype, gen)
    # as the runner hands it: a fused-projection slice
    q = strided_rows(len(lens), n_kv * group, hd, dtype, gen)
    return paged, q, torch.tensor(lens, dtype=torch.int32), dtype, seed


def unread_entries_poisoned(paged, segments, lens: list[int]) -> torch.Tensor:
    """The block tables with every entry the cascade must not read pointed at page 0 (all NaN): shared
    tokens are read only through each segment's first member, a row's own table only from its suffix on."""
    bs = paged.k_cache.shape[1]
    starts = [0] * len(lens)
    for seg in segments:
        for r in seg.rows:
            starts[r] = max(starts[r], seg.end)
    keep = torch.zeros_like(paged.block_tables, dtype=torch.bool)
    for seg in segments:
        keep[seg.rows[0], seg.start // bs : -(-seg.end // bs)] = True
    for r, n in enumerate(lens):
        keep[r, starts[r] // bs : -(-n // bs)] = True
    return torch.where(keep, paged.block_tables, torch.zeros_like(paged.block_tables))


@pytest.mark.parametrize("name", list(CASES))
def test_cascade_matches_float64(name, launches):
    paged, q, ctx, dtype, seed = build(name)
    _, _, _, _, hd, lens, segments, splits, shared_splits = CASES[name]
    tables = unread_entries_poisoned(paged, segments, lens)
    if any(len(seg.rows) > 1 for seg in segments):  # the poisoning really hides pages from the kernels
        assert (tables == 0).sum() > (paged.block_tables == 0).sum()
    with poisoned_alloc():
        out = tk.cascade_decode_attention(q, paged.k_cache, paged.v_cache, tables, ctx, hd**-0.5, segments,
                                          num_splits=splits, shared_splits=shared_splits)
    launches("cascade_shared")
    launches("decode")
    launches("decode_merge")
    assert_close(out, cascade_ref(q, paged, hd**-0.5), dtype, seed)


@pytest.mark.parametrize("name", ["nested", "group_of_16_mid_block"])
def test_shared_partials_and_lse(name):
    """Each (row, level) slot holds float64 attention over that level's shared range alone, and its
    log-sum-exp (log2 units in the kernel)."""
    paged, q, ctx, dtype, seed = build(name)
    _, _, _, _, hd, lens, segments, splits, shared_splits = CASES[name]
    with poisoned_alloc():
        part_out, part_lse, packed = cascade_partials(q, paged.k_cache, paged.v_cache, paged.block_tables,
                                                      ctx,
                                                      hd**-0.5, segments, splits, shared_splits)
    for seg in segments:
        for r in seg.rows:
            ref, ref_lse = reference.attention_lse(q[r : r + 1], paged.keys[r][seg.start : seg.end],
                                           paged.values[r][seg.start : seg.end], hd**-0.5)
            first = seg.level * packed.shared_splits
            slots = slice(first, first + packed.shared_splits)
            lse = part_lse[r, :, slots].double() * math.log(2)  # log2 -> natural log
            merged_lse = lse.logsumexp(-1)
            weights = (lse - merged_lse[:, None]).exp().nan_to_num(0.0)
            data = part_out[r, :, slots].double().nan_to_num(0.0)  # empty splits may hold anything
            merged = (weights[..., None] * data).sum(1)
            torch.testing.assert_close(merged_lse, ref_lse[0], atol=1e-4, rtol=1e-5,
                                       msg=lambda m: f"seed {seed}: {m}")
            torch.testing.assert_close(merged, ref[0], atol=1e-5, rtol=1e-5,
                                       msg=lambda m: f"seed {seed}: {m}")


def test_packed_plan_reused_across_layers(launches):
    """A step packs its segments once and every layer reuses them: same result as packing per call."""
    paged, q, ctx, dtype, seed = build("two_documents")
    segments = CASES["two_documents"][6]
    packed = pack_segments(segments, q.shape[0], paged.k_cache.shape[2], 16, q.device)
    out = tk.cascade_decode_attention(q, paged.k_cache, paged.v_cache, paged.block_tables, ctx, 0.125, packed)
    again = tk.cascade_decode_attention(q, paged.k_cache, paged.v_cache, paged.block_tables, ctx, 0.125,
                                        segments)
    assert torch.equal(out, again)
    launches("cascade_shared", times=2)


def test_no_segments_is_plain_decode(launches):
    paged, q, ctx, dtype, seed = build("group_of_2_block_edge")
    with poisoned_alloc():
        out = tk.cascade_decode_attention(q, paged.k_cache, paged.v_cache, paged.block_tables, ctx, 0.125, [])
    launches("cascade_shared", times=0)
    plain = tk.paged_decode_attention(q, paged.k_cache, paged.v_cache, paged.block_tables, ctx, 0.125)
    torch.testing.assert_close(out, plain, atol=2e-3, rtol=2e-3)
    assert_close(out, cascade_ref(q, paged, 0.125), dtype, seed)


def test_merge_skips_slots_never_written():
    """Row 0 is in level 0 only (slot 0) and row 1 in no level: the level-1 slot (1), and level 0's for
    row 1, stay unwritten (NaN data and lse here) and the merge must skip them; slot 2 is the suffix."""
    part_out = torch.full((2, 2, 3, 64), float("nan"))
    part_lse = torch.full((2, 2, 3), float("nan"))
    part_out[0, :, 0], part_lse[0, :, 0] = 1.0, 1.0  # log2 units: weight 2 against the suffix's 1
    part_out[:, :, 2], part_lse[:, :, 2] = 4.0, 0.0
    out = torch.empty(2, 2, 64)
    launch_merge(part_out, part_lse, out, torch.tensor([1, 0], dtype=torch.int32), slot_base=2)
    torch.testing.assert_close(out[0], torch.full_like(out[0], (2 * 1.0 + 4.0) / 3))
    assert torch.equal(out[1], torch.full_like(out[1], 4.0))


@pytest.mark.parametrize(("segments", "message"), [
    ([S(1, 0, 16, (0,))], "level 0"),
    ([S(0, 0, 16, (0,)), S(1, 20, 30, (0,))], "must start where"),
    ([S(0, 0, 16, (0, 1)), S(0, 0, 32, (1,))], "two cascade segments"),
    ([S(0, 0, 16, (5,))], "outside the batch"),
    ([S(0, 8, 8, (0,))], "empty"),
    ([S(0, 0, 8, ())], "no rows"),
])
def test_bad_plans_are_refused(segments, message):
    with pytest.raises(ValueError, match=message):
        pack_segments(segments, 2, 2, 16, torch.device("cpu"))


def test_plan_must_fit_the_call():
    paged, q, ctx, dtype, seed = build("group_of_2_block_edge")
    args = (q, paged.k_cache, paged.v_cache, paged.block_tables, ctx, 0.125)
    with pytest.raises(ValueError, match="packed for 2 rows"):
        tk.cascade_decode_attention(*args, pack_segments([S(0, 0, 16, (0, 1))], 2, 3, 16, q.device))
    with pytest.raises(ValueError, match="past the block tables"):
        tk.cascade_decode_attention(*args, [S(0, 0, paged.block_tables.shape[1] * 16 + 1, (0, 1))])

