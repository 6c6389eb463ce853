"""What a benchmark result must say about the machine it ran on: CPU model, SIMD/matrix flags, cores."""

from __future__ import annotations

import os
import platform
from pathlib import Path

# the flags that decide which kernels are fast: AVX2/FMA everywhere, AVX-512 families, AMX tiles
_PREFIXES = ("avx512", "amx")
_NAMED = ("avx", "avx2", "fma", "f16c", "avx_vnni")


def cpu_flags(cpuinfo: str | None = None) -> dict:
    """{"model": name, "flags": the relevant flags present, sorted, "native_bf16": AVX512-BF16 or AMX-BF16}."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    flags: set[str] = set()
    model = platform.processor() or platform.machine()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags" and not flags:
            flags = set(value.split())
        elif key.strip() == "model name":
            model = value.strip()
    kept = sorted(f for f in flags if f in _NAMED or f.startswith(_PREFIXES))
    return {"model": model, "flags": kept, "native_bf16": "avx512_bf16" in flags or "amx_bf16" in flags}


def machine_info() -> dict:
    import torch

    return {**cpu_flags(), "cores": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version()}
