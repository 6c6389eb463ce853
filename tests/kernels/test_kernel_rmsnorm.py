"""Optional fused RMSNorm (+ residual) against an fp32 reference that rounds the residual sum to the dtype."""

from __future__ import annotations

import pytest
import torch
from kernel_ref import DTYPES, TOL, new_generator, poisoned_alloc

from kvloop.engine.kernels import triton as tk


@pytest.mark.parametrize(("dtype_name", "hidden", "with_residual"), [
    ("fp32", 576, True), ("fp16", 64, False), ("bf16", 576, True), ("bf16", 128, False),
])
def test_rms_norm(dtype_name, hidden, with_residual, launches):
    dtype = DTYPES[dtype_name]
    gen, seed = new_generator()
    x = torch.randn(5, hidden, generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype)
    res = torch.randn(5, hidden, generator=gen).to(dtype) if with_residual else None
    with poisoned_alloc():
        got = tk.rms_norm(x, w, 1e-5, res)
    launches("rms_norm")
    s = (x.float() + res.float()).to(dtype) if with_residual else x
    ref = s.float() * torch.rsqrt(s.float().pow(2).mean(-1, keepdim=True) + 1e-5) * w.float()
    out = got[0] if with_residual else got
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.float(), ref, atol=atol, rtol=rtol, msg=lambda m: f"seed {seed}: {m}")
    if with_residual:
        # Exact on the GPU; the interpreter converts fp32 -> bf16 by truncation, so allow one bf16 ulp there.
        ulp = 2.0**-7 if dtype == torch.bfloat16 else 0.0
        torch.testing.assert_close(got[1], s, atol=0.0, rtol=ulp, msg=lambda m: f"seed {seed}: {m}")
