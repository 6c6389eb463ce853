"""Whether oneDNN multiplies bf16 in AMX tiles on this CPU. Where it does, torch's bf16 GEMM (the linears) and its
fused SDPA (prefill attention) outrun the CPU kernel's AVX512-BF16 routines past a few rows; the measurements are
where each choice is made (linear_bf16w.AMX_DENSE_ABOVE_ROWS, kernels/cpu/backend.py CpuBackend.extend)."""

from __future__ import annotations

from functools import cache

import torch


def available() -> bool:
    return _probe()


@cache
def _probe() -> bool:
    # the CPU has the tiles and the OS granted this process their state (Linux grants it per process, on request)
    return bool(torch.cpu._is_amx_tile_supported() and torch.cpu._init_amx())
