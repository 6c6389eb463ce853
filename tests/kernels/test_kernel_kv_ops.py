"""write_kv and copy_blocks: exact copies into NaN-poisoned destinations, untouched slots stay NaN."""

from __future__ import annotations

import pytest
import torch
from kernel_ref import DTYPES, new_generator, strided_rows

from kvloop.engine.kernels import triton as tk

NAN = float("nan")


@pytest.mark.parametrize(
    ("dtype_name", "block_size", "n_kv", "head_dim"),
    [("fp32", 16, 1, 64), ("fp16", 32, 8, 128), ("bf16", 16, 3, 128)],
)
def test_write_kv_scatters_and_skips(dtype_name, block_size, n_kv, head_dim, launches):
    dtype = DTYPES[dtype_name]
    gen, seed = new_generator()
    num_blocks, n = 6, 11
    shape = (num_blocks, block_size, n_kv, head_dim)
    k_cache, v_cache = torch.full(shape, NAN, dtype=dtype), torch.full(shape, NAN, dtype=dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:n]
    slots[[2, 7]] = -1  # padding tokens
    k = strided_rows(n, n_kv, head_dim, dtype, gen)  # slices of a fused qkv projection
    v = strided_rows(n, n_kv, head_dim, dtype, gen)

    tk.write_kv(k, v, k_cache, v_cache, slots)
    launches("write_kv")

    keep = slots >= 0
    flat_k = k_cache.view(-1, n_kv, head_dim)
    flat_v = v_cache.view(-1, n_kv, head_dim)
    assert torch.equal(flat_k[slots[keep]], k[keep]), f"seed {seed}"
    assert torch.equal(flat_v[slots[keep]], v[keep]), f"seed {seed}"
    untouched = torch.ones(flat_k.shape[0], dtype=torch.bool)
    untouched[slots[keep]] = False
    assert flat_k[untouched].isnan().all() and flat_v[untouched].isnan().all(), f"seed {seed}"


@pytest.mark.parametrize(("dtype_name", "block_size"), [("fp32", 16), ("fp16", 32), ("bf16", 16)])
def test_copy_blocks_all_layers_k_and_v(dtype_name, block_size, launches):
    dtype = DTYPES[dtype_name]
    gen, seed = new_generator()
    layers, n_kv, head_dim = 3, 2, 64
    src = torch.randn(layers, 2, 7, block_size, n_kv, head_dim, generator=gen).to(dtype)
    dst = torch.full((layers, 2, 5, block_size, n_kv, head_dim), NAN, dtype=dtype)  # a different pool size
    src_ids = torch.tensor([6, 0, 3])
    dst_ids = torch.tensor([1, 4, 0])

    tk.copy_blocks(src, dst, src_ids, dst_ids)
    launches("copy_blocks")

    assert torch.equal(dst[:, :, dst_ids], src[:, :, src_ids]), f"seed {seed}"
    assert dst[:, :, [2, 3]].isnan().all(), "blocks outside dst_ids must be untouched"


def test_copy_blocks_falls_back_for_strided_caches(launches):
    """A cache whose block is not dense (e.g. a sliced head range) takes the torch path, still exact."""
    src = torch.randn(2, 2, 4, 16, 4, 64)[:, :, :, :, :2]
    dst = torch.zeros(2, 2, 4, 16, 2, 64)
    tk.copy_blocks(src, dst, torch.tensor([3]), torch.tensor([0]))
    launches("copy_blocks", times=0)
    assert torch.equal(dst[:, :, 0], src[:, :, 3])
