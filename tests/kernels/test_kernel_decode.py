"""Paged decode attention against the unpaged fp32 reference, over a pairwise cover of dtype, block size,
GQA ratio, head dim and split-K (auto or forced)."""

from __future__ import annotations

import pytest
import torch
from kernel_ref import (
    DTYPES,
    assert_close,
    make_paged,
    new_generator,
    poisoned_alloc,
    strided_rows,
)

from kvloop.engine.kernels import reference
from kvloop.engine.kernels import triton as tk
from kvloop.engine.kernels.triton.decode import choose_splits, plan_splits, tile_tokens

N_KV = 2
# (dtype, block_size, group, head_dim, num_splits or None for the heuristic, context lengths)
CASES = [
    ("fp32", 16, 1, 64, None, [1, 17, 70]),
    ("fp32", 32, 8, 128, 3, [5, 64, 95]),
    ("fp32", 16, 3, 64, 2, [33, 2]),
    ("fp16", 16, 3, 128, None, [16, 47, 130]),
    ("fp16", 32, 1, 64, 2, [31, 100, 1]),
    ("fp16", 32, 8, 64, None, [600, 9]),  # long enough for the heuristic to split
    ("bf16", 16, 8, 64, 4, [3, 77, 129]),
    ("bf16", 32, 3, 128, None, [40, 1, 66]),
    ("bf16", 16, 1, 128, 2, [50, 18]),
]


@pytest.mark.parametrize(("dtype_name", "block_size", "group", "head_dim", "splits", "lens"), CASES)
def test_decode_matches_reference(dtype_name, block_size, group, head_dim, splits, lens, launches):
    dtype = DTYPES[dtype_name]
    gen, seed = new_generator()
    paged = make_paged(lens, block_size, N_KV, head_dim, dtype, gen)
    if group == 3:  # some cases read q as a slice of a fused projection
        q = strided_rows(len(lens), N_KV * group, head_dim, dtype, gen)
    else:
        q = torch.randn(len(lens), N_KV * group, head_dim, generator=gen).to(dtype)
    context_lens = torch.tensor(lens, dtype=torch.int32)
    scale = head_dim**-0.5

    with poisoned_alloc():
        out = tk.paged_decode_attention(
            q, paged.k_cache, paged.v_cache, paged.block_tables, context_lens, scale, num_splits=splits
        )
    launches("decode")
    max_tokens = paged.block_tables.shape[1] * block_size
    planned, _ = plan_splits(len(lens), N_KV, max_tokens, tile_tokens(head_dim, dtype), q.device, splits)
    if splits is not None:
        assert planned == splits, "the forced split count must take effect for this case to mean anything"
    launches("decode_merge", times=int(planned > 1))  # the split path really ran (or really did not)

    ref = torch.cat([reference.attention(q[b : b + 1], paged.keys[b], paged.values[b], scale,
                                         None) for b in range(len(lens))])
    assert_close(out, ref, dtype, seed)


def test_decode_split_heuristic_is_shape_only():
    """The split count depends on shapes, never on context values (no host sync, graph-capturable)."""
    cpu = torch.device("cpu")
    assert choose_splits(1, 8, 2048, cpu) > 1  # batch 1: split the context
    assert choose_splits(64, 8, 2048, cpu) == 1  # plenty of programs already
    assert choose_splits(1, 8, 100, cpu) == 1  # too short to be worth a merge


@pytest.mark.parametrize("splits", [None, 2])
def test_decode_empty_context_gives_zeros(splits, launches):
    """Padding rows (context 0, e.g. a batch padded for graph capture) come out as zeros, never NaN."""
    gen, seed = new_generator()
    paged = make_paged([0, 40], 16, N_KV, 64, torch.float16, gen)
    q = torch.randn(2, N_KV * 3, 64, generator=gen).to(torch.float16)
    with poisoned_alloc():
        out = tk.paged_decode_attention(
            q, paged.k_cache, paged.v_cache, paged.block_tables, torch.tensor([0, 40], dtype=torch.int32),
            0.125,
            num_splits=splits,
        )
    launches("decode")
    assert torch.equal(out[0], torch.zeros_like(out[0])), f"seed {seed}"
    ref = reference.attention(q[1:], paged.keys[1], paged.values[1], 0.125, None)
    assert_close(out[1:], ref, torch.float16, seed)
