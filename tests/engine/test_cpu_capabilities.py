"""engine/core/cpu.py: the CPU's capabilities parsed from /proc/cpuinfo's text (pure, no torch)."""

from __future__ import annotations

import pytest

from kvloop.engine.bench.machine import machine_class
from kvloop.engine.core.cpu import CpuCapabilities, cpu_capabilities, parse_cpuinfo

XEON_FLAGS = "fpu sse2 avx avx2 fma f16c avx512f avx512bw avx512_bf16 amx_tile amx_bf16 amx_int8"
TWO_PROCESSORS = f"""processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Some Xeon
flags\t\t: {XEON_FLAGS}
bogus line without a colon

processor\t: 1
model name\t: Another model
flags\t\t: fpu sse2
"""
PROPERTIES = ("avx2_fma", "avx512_bf16", "amx_tile", "amx_bf16", "native_bf16", "onednn_bf16")


def caps_of(flags: str) -> CpuCapabilities:
    return parse_cpuinfo(f"flags\t: {flags}\n")


def test_the_first_processors_model_and_every_flag():
    caps = parse_cpuinfo(TWO_PROCESSORS)
    assert caps.model == "Some Xeon" and caps.flags == frozenset(XEON_FLAGS.split())
    assert caps.avx2_fma and caps.avx512_bf16 and caps.amx_tile and caps.amx_bf16 and caps.native_bf16
    assert not caps.onednn_bf16  # no avx512vl, avx512dq listed


@pytest.mark.parametrize("flags,true", [
    ("avx2 fma", {"avx2_fma"}),
    ("avx2 fma avx512f avx512bw avx512_bf16", {"avx2_fma", "avx512_bf16", "native_bf16"}),
    ("avx512_bf16", {"native_bf16"}),  # AVX512-BF16's products, but not what the kernels' routines need
    ("amx_bf16", set()),  # bf16 tiles need the tiles
    ("amx_tile", {"amx_tile"}),
    ("avx512bw avx512vl", set()),
    ("avx512bw avx512vl avx512dq", {"onednn_bf16"}),
    ("avx2 avx_ne_convert", {"onednn_bf16"}),
    ("avx2_fake fma avx512_bf16x amx_tile_x", set()),  # whole names only, never a part of one
])
def test_each_capability_needs_every_flag_it_names(flags, true):
    caps = caps_of(flags)
    assert {name for name in PROPERTIES if getattr(caps, name)} == true


def test_no_cpuinfo_is_no_capability_and_the_fallback_model():
    caps = parse_cpuinfo("", fallback_model="aarch64")
    assert caps == CpuCapabilities("aarch64", frozenset())
    assert not any(getattr(caps, name) for name in PROPERTIES)
    assert caps.record() == {"model": "aarch64", "flags": [], "native_bf16": False}


def test_the_record_keeps_the_kernel_families_and_the_cache_key_every_flag():
    caps = parse_cpuinfo(TWO_PROCESSORS)
    recorded = "amx_bf16 amx_int8 amx_tile avx avx2 avx512_bf16 avx512bw avx512f f16c fma".split()
    assert caps.record() == {"model": "Some Xeon", "flags": recorded, "native_bf16": True}
    assert caps.cache_key == "Some Xeon " + " ".join(sorted(caps.flags))
    assert "fpu" in caps.cache_key.split()  # -march=native code depends on more than the recorded flags


@pytest.mark.parametrize("flags,cls", [("avx2 fma", "avx2"), ("sse2", "other"),
                                       ("avx2 fma avx512f avx512bw avx512_bf16", "avx512bf16"),
                                       ("avx2 fma avx512f avx512bw avx512_bf16 amx_tile amx_bf16", "amx")])
def test_the_bench_machine_class_reads_the_capabilities(flags, cls):
    assert machine_class({"flags": flags.split()}) == cls
    assert machine_class(flags.split()) == cls


def test_this_cpu_is_read_once():
    assert cpu_capabilities() is cpu_capabilities()
