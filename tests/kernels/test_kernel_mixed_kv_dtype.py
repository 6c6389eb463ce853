"""An fp32 model over a 16-bit KV cache (EngineConfig.kv_dtype): the Triton kernels take fp32 queries and
new K/V, store K/V rounded to the cache dtype, and return fp32 outputs. The references see the same
rounded keys and values, and the interpreter computes in fp32, so fp32 tolerances hold."""

from __future__ import annotations

import pytest
import torch
from kernel_ref import (
    DTYPES,
    assert_close,
    cascade_ref,
    make_cascade_paged,
    make_paged,
    new_generator,
    poisoned_alloc,
)

from kvloop.engine.kernels import reference
from kvloop.engine.kernels import triton as tk

S = tk.CascadeSegment
N_KV, GROUP, HD = 3, 3, 64
KV_DTYPES = ["bf16", "fp16"]


@pytest.mark.parametrize("kv", KV_DTYPES)
def test_decode_and_cascade_fp32_queries(kv, launches):
    gen, seed = new_generator()
    lens = [45, 40, 38, 20]
    segments = [S(0, 0, 16, (0, 1, 2)), S(1, 16, 37, (0, 1))]
    paged = make_cascade_paged(lens, segments, 16, N_KV, HD, DTYPES[kv], gen)
    q = torch.randn(len(lens), N_KV * GROUP, HD, generator=gen)
    ctx = torch.tensor(lens, dtype=torch.int32)
    ref = cascade_ref(q, paged, HD**-0.5)
    with poisoned_alloc():
        plain = tk.paged_decode_attention(q, paged.k_cache, paged.v_cache, paged.block_tables, ctx, HD**-0.5,
                                          num_splits=2)
        cascade = tk.cascade_decode_attention(q, paged.k_cache, paged.v_cache, paged.block_tables, ctx,
                                              HD**-0.5,
                                              segments)
    launches("cascade_shared")
    assert_close(plain, ref, torch.float32, seed)
    assert_close(cascade, ref, torch.float32, seed)


@pytest.mark.parametrize("kv", KV_DTYPES)
def test_extend_fp32_queries(kv, launches):
    gen, seed = new_generator()
    seqs = [(20, 9), (0, 17)]
    paged = make_paged([p + n for p, n in seqs], 16, N_KV, HD, DTYPES[kv], gen)
    q = torch.randn(sum(n for _, n in seqs), N_KV * GROUP, HD, generator=gen)
    qsl = torch.tensor([0, 9, 26], dtype=torch.int32)
    with poisoned_alloc():
        out = tk.paged_extend_attention(q, paged.k_cache, paged.v_cache, paged.block_tables, qsl,
                                        torch.tensor([29, 17], dtype=torch.int32), HD**-0.5)
    launches("extend")
    ref = torch.cat([reference.attention(q[:9], paged.keys[0], paged.values[0], HD**-0.5, 20),
                     reference.attention(q[9:], paged.keys[1], paged.values[1], HD**-0.5, 0)])
    assert_close(out, ref, torch.float32, seed)


@pytest.mark.parametrize("kv", KV_DTYPES)
def test_write_kv_rounds_to_the_cache_dtype(kv, launches):
    gen, _ = new_generator()
    cache_k = torch.zeros(4, 16, N_KV, HD, dtype=DTYPES[kv])
    cache_v = torch.zeros_like(cache_k)
    k = torch.randn(5, N_KV, HD, generator=gen)
    v = torch.randn(5, N_KV, HD, generator=gen)
    slots = torch.tensor([17, 3, -1, 63, 40])
    tk.write_kv(k, v, cache_k, cache_v, slots)
    launches("write_kv")
    keep = slots >= 0
    assert torch.equal(cache_k.view(-1, N_KV, HD)[slots[keep]], k[keep].to(DTYPES[kv]))
    assert torch.equal(cache_v.view(-1, N_KV, HD)[slots[keep]], v[keep].to(DTYPES[kv]))


def test_mismatched_caches_are_refused():
    q = torch.randn(1, N_KV * GROUP, HD)
    k = torch.zeros(2, 16, N_KV, HD, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="dtype mismatch"):
        tk.paged_decode_attention(q, k, k.half(), torch.zeros(1, 1, dtype=torch.int32),
                                  torch.ones(1, dtype=torch.int32), 0.125)
