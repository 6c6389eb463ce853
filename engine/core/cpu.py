"""What this CPU can do, read once from /proc/cpuinfo: the one source that the engine's dtype and weight
choices, the kernels' build key and AMX switch, and the benchmarks' machine record read (no torch)."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from functools import cache
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# The flags a benchmark result records: the SIMD and matrix families that decide which kernels are fast.
RECORDED_FLAGS = frozenset({
    "avx", "avx2", "fma", "f16c", "avx_vnni",
    "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512ifma", "avx512vbmi", "avx512pf",
    "avx512er", "avx512_vbmi2", "avx512_vnni", "avx512_bitalg", "avx512_vpopcntdq", "avx512_4vnniw",
    "avx512_4fmaps", "avx512_vp2intersect", "avx512_bf16", "avx512_fp16",
    "amx_tile", "amx_bf16", "amx_int8", "amx_fp16", "amx_complex",
})


@dataclass(frozen=True)
class CpuCapabilities:
    model: str
    flags: frozenset[str]  # every flag the first processor lists

    @property
    def avx2_fma(self) -> bool:
        """The kernels' vector path (csrc/simd.h)."""
        return {"avx2", "fma"} <= self.flags

    @property
    def avx512_bf16(self) -> bool:
        """AVX512F/BW with AVX512-BF16: the kernels' bf16-pair routines (csrc/simd512.h)."""
        return {"avx512f", "avx512bw", "avx512_bf16"} <= self.flags

    @property
    def amx_tile(self) -> bool:
        """AMX tile registers are present (using them also takes the OS's grant: kernels/cpu/amx.py)."""
        return "amx_tile" in self.flags

    @property
    def amx_bf16(self) -> bool:
        """bf16 products in AMX tiles, what oneDNN's bf16 GEMM and the kernels' tile routines use."""
        return self.amx_tile and "amx_bf16" in self.flags

    @property
    def onednn_bf16(self) -> bool:
        """oneDNN reorders bf16 weights (kernels/cpu/linear_onednn.py): AVX512BW/VL/DQ or AVX-NE-CONVERT."""
        return {"avx512bw", "avx512vl", "avx512dq"} <= self.flags or "avx_ne_convert" in self.flags

    @property
    def native_bf16(self) -> bool:
        """bf16 dot products in hardware. Without them oneDNN emulates bf16 GEMM (slower than fp32) and
        torch's bf16 SDPA takes a slow path; with them both are the fast choice (docs/engine_history.md)."""
        return "avx512_bf16" in self.flags or self.amx_bf16

    @property
    def cache_key(self) -> str:
        """What a build for this CPU depends on (-march=native, compiled steps): the model and every flag."""
        return " ".join([self.model, *sorted(self.flags)])

    def record(self) -> dict:
        """A benchmark result's machine record: {"model", "flags": those recorded, sorted, "native_bf16"}."""
        return {"model": self.model, "flags": sorted(self.flags & RECORDED_FLAGS),
                "native_bf16": self.native_bf16}


def parse_cpuinfo(text: str, fallback_model: str = "") -> CpuCapabilities:
    """The first processor's model name and flags from /proc/cpuinfo's text."""
    model, flags = None, None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key == "flags" and flags is None:
            flags = frozenset(value.split())
        if model is not None and flags is not None:
            break
    return CpuCapabilities(model or fallback_model, flags or frozenset())


@cache
def cpu_capabilities() -> CpuCapabilities:
    """This CPU's, read once. Without /proc/cpuinfo (off Linux): no flags, every choice the portable one."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        text = ""
    return parse_cpuinfo(text, platform.processor() or platform.machine())


def cpu_has_native_bf16() -> bool:
    """Shorthand for cpu_capabilities().native_bf16 (a seam tests replace)."""
    return cpu_capabilities().native_bf16


def cpu_flags() -> dict:
    """This CPU's machine record (CpuCapabilities.record)."""
    return cpu_capabilities().record()
