"""What this CPU computes natively, from /proc/cpuinfo's flags (pure Python: the engine, its kernels and the
benchmarks' machine record read the same answer)."""

from __future__ import annotations

import platform
from collections.abc import Iterable
from functools import cache
from pathlib import Path

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # bf16 dot products in hardware: AVX512-BF16 or AMX tiles


def has_native_bf16(flags: Iterable[str]) -> bool:
    return not set(NATIVE_BF16_FLAGS).isdisjoint(flags)


def cpuinfo_flags(cpuinfo: str) -> set[str]:
    """The first processor's flags."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


@cache
def cpu_has_native_bf16() -> bool:
    """bf16 FMA in hardware. Without it, oneDNN emulates bf16 GEMM (~3x slower than fp32, measured on an AVX2
    machine) and torch's bf16 SDPA takes a slow path; with it, both are the fast choice."""
    try:
        return has_native_bf16(cpuinfo_flags(Path("/proc/cpuinfo").read_text()))
    except OSError:
        return False


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
    flags = cpuinfo_flags(cpuinfo)
    model = platform.processor() or platform.machine()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            model = value.strip()
            break
    kept = sorted(f for f in flags if f in _NAMED or f.startswith(_PREFIXES))
    return {"model": model, "flags": kept, "native_bf16": has_native_bf16(flags)}
