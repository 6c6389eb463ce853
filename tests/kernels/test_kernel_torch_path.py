"""The torch path behind the same interface (what CPU tensors get without the interpreter) agrees with the
reference and with the Triton kernels."""

from __future__ import annotations

import pytest
import torch
from kernel_ref import TOL, attention_ref, make_paged, new_generator
from kvloop.engine.kernels import triton as tk


def test_torch_backend_decode_and_extend(launches):
    gen, seed = new_generator()
    lens, scale = [9, 40], 0.125
    paged = make_paged(lens, 16, 2, 64, torch.float32, gen)
    q = torch.randn(2, 6, 64, generator=gen)
    out = tk.paged_decode_attention(
        q, paged.k_cache, paged.v_cache, paged.block_tables, torch.tensor(lens, dtype=torch.int32), scale,
        backend="torch",
    )
    ref = torch.cat([attention_ref(q[b : b + 1], paged.keys[b], paged.values[b], scale, None) for b in range(2)])
    torch.testing.assert_close(out, ref, atol=TOL[torch.float32][0], rtol=TOL[torch.float32][1])

    qe = torch.randn(7, 6, 64, generator=gen)
    qsl = torch.tensor([0, 4, 7], dtype=torch.int32)
    out = tk.paged_extend_attention(
        qe, paged.k_cache, paged.v_cache, paged.block_tables, qsl, torch.tensor(lens, dtype=torch.int32), scale,
        backend="torch",
    )
    ref = torch.cat([
        attention_ref(qe[:4], paged.keys[0], paged.values[0], scale, first_pos=5),
        attention_ref(qe[4:], paged.keys[1], paged.values[1], scale, first_pos=37),
    ])
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5, msg=lambda m: f"seed {seed}: {m}")
    launches("decode", times=0)
    launches("extend", times=0)


def test_unknown_backend_rejected():
    with pytest.raises(ValueError):
        tk.write_kv(*[torch.zeros(1)] * 4, torch.zeros(1, dtype=torch.int64), backend="cuda")
