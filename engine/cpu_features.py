"""What this CPU computes natively, from /proc/cpuinfo's flags (pure Python: the engine, its kernels and the
benchmarks' machine record read the same answer)."""

from __future__ import annotations

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
