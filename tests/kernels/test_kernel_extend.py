"""Paged extend attention (cached prefix + causal new tokens, packed over sequences) against the unpaged
fp32 reference; plus a consistency check that a one-token extend equals decode."""

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

N_KV = 2
# (dtype, block_size, group, head_dim, [(cached prefix, new query tokens) per sequence])
CASES = [
    ("fp32", 16, 1, 64, [(0, 19), (21, 5), (3, 1)]),
    ("fp32", 32, 8, 128, [(40, 7), (0, 33)]),
    ("fp16", 16, 3, 128, [(17, 18), (0, 1)]),
    ("fp16", 32, 1, 64, [(0, 45), (64, 3), (5, 20)]),
    ("bf16", 16, 8, 64, [(30, 2), (0, 17)]),
    ("bf16", 32, 3, 128, [(33, 16), (1, 1), (0, 9)]),
]


def _run(dtype_name, block_size, group, head_dim, seqs):
    dtype = DTYPES[dtype_name]
    gen, seed = new_generator()
    seq_lens = [p + n for p, n in seqs]
    paged = make_paged(seq_lens, block_size, N_KV, head_dim, dtype, gen)
    q = strided_rows(sum(n for _, n in seqs), N_KV * group, head_dim, dtype, gen)
    assert not q.is_contiguous()
    qsl = torch.tensor([0] + [n for _, n in seqs], dtype=torch.int32).cumsum(0).to(torch.int32)
    scale = head_dim**-0.5
    with poisoned_alloc():
        out = tk.paged_extend_attention(
            q, paged.k_cache, paged.v_cache, paged.block_tables, qsl,
            torch.tensor(seq_lens, dtype=torch.int32), scale
        )
    refs = [
        reference.attention(q[qsl[s] : qsl[s + 1]], paged.keys[s], paged.values[s], scale, first_pos=prefix)
        for s, (prefix, _) in enumerate(seqs)
    ]
    return out, torch.cat(refs), dtype, seed, paged, q, scale


@pytest.mark.parametrize(("dtype_name", "block_size", "group", "head_dim", "seqs"), CASES)
def test_extend_matches_reference(dtype_name, block_size, group, head_dim, seqs, launches):
    out, ref, dtype, seed, *_ = _run(dtype_name, block_size, group, head_dim, seqs)
    launches("extend")
    assert_close(out, ref, dtype, seed)


def test_single_token_extend_equals_decode():
    out, _, dtype, seed, paged, q, scale = _run("fp32", 16, 3, 64, [(20, 1), (47, 1), (0, 1)])
    lens = torch.tensor([21, 48, 1], dtype=torch.int32)
    with poisoned_alloc():
        dec = tk.paged_decode_attention(q, paged.k_cache, paged.v_cache, paged.block_tables, lens, scale)
    torch.testing.assert_close(out, dec, atol=1e-6, rtol=1e-6, msg=lambda m: f"seed {seed}: {m}")
