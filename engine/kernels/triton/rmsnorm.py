"""Optional fused kernel: RMSNorm with the residual add folded in (one read of x and residual, one write of
each result). Semantics follow Hugging Face Llama: the sum is rounded to the model dtype first (that is the
residual stream), then normalised in fp32 and scaled by the weight."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import LAUNCHES, check_dtype, next_pow2


@triton.jit
def rmsnorm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
    stride_x, stride_r, stride_o, stride_ro,
    n_cols, eps,
    HAS_RES: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_ro + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (xf * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm_triton(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    check_dtype(x, weight, *([residual] if residual is not None else []))
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    n_rows, n_cols = x2.shape
    out = torch.empty_like(x2, memory_format=torch.contiguous_format)
    res2 = residual.reshape(-1, n_cols) if residual is not None else x2
    if res2.stride(-1) != 1:
        res2 = res2.contiguous()
    res_out = torch.empty_like(out) if residual is not None else out
    if n_rows:
        LAUNCHES["rms_norm"] += 1
        block = next_pow2(n_cols)
        rmsnorm_kernel[(n_rows,)](
            x2, res2, weight, out, res_out,
            x2.stride(0), res2.stride(0), out.stride(0), res_out.stride(0),
            n_cols, eps,
            HAS_RES=residual is not None, BLOCK=block, num_warps=min(max(block // 256, 1), 16),
        )
    if residual is None:
        return out.view(x.shape)
    return out.view(x.shape), res_out.view(x.shape)
