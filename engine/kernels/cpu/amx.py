"""Whether oneDNN multiplies bf16 in AMX tiles in this process. Where it does, torch's bf16 GEMM (the linears)
and its fused SDPA (prefill attention) outrun the CPU kernel's AVX512-BF16 routines past a few rows
(linear_bf16w.AMX_DENSE_ABOVE_ROWS, kernels/cpu/backend.py CpuBackend.extend)."""

from __future__ import annotations

from functools import cache

import torch

from kvloop.engine.core.cpu import cpu_capabilities


def available() -> bool:
    return _probe()


@cache
def _probe() -> bool:
    # A capability (core.cpu: the CPU has bf16 tiles), then a runtime request: Linux grants a process the
    # tiles' state only when asked (torch asks through arch_prctl).
    return cpu_capabilities().amx_bf16 and bool(torch.cpu._init_amx())
