"""What a benchmark result must say about the machine it ran on: CPU model, SIMD/matrix flags, cores, and
(for the kernel benchmarks) its memory read bandwidth, the bound a streaming kernel is compared with.

The kernel benchmarks (bench/attention_kernel.py, bench/linear_kernel.py) share one run shape, kept here:
the same command line, the bandwidth and their cases measured under the quiet-machine guard, the result
assembled with these facts and written to bench/results."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from kvloop.engine.core.cpu import CpuCapabilities, cpu_capabilities, cpu_flags

T = TypeVar("T")

def machine_info() -> dict:
    import torch

    return {**cpu_flags(), "cores": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version()}


def machine_read_gbps(reps: int, size_mb: int) -> float:
    """Read bandwidth at torch's current thread count: a sum over `size_mb` of fp32, median of `reps`."""
    import torch

    x = torch.ones(size_mb << 18)  # fp32: 4 bytes each
    x.sum()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - t)
    return x.numel() * 4 / statistics.median(times) / 1e9


def kernel_bench_args(doc: str, quick_help: str, reps_help: str) -> argparse.Namespace:
    """A kernel benchmark's command line (--quick, --threads, --reps, --by-machine), parsed; torch set to
    those threads."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help=quick_help)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=10, help=reps_help)
    p.add_argument("--by-machine", action="store_true",
                   help="name the file <bench>_<machine class>.json (amx, avx512bf16, avx2): one per kind of "
                   "CPU")
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    return args


def measure_against_bandwidth(quick: bool, measure: Callable[[], T]) -> tuple[float, T, dict]:
    """(read bandwidth GB/s, measure()'s result, the noise report): both timed under one NoiseGuard."""
    from kvloop.engine.bench.guard import NoiseGuard

    with NoiseGuard() as guard:
        read_gbps = machine_read_gbps(3 if quick else 7, 64 if quick else 512)
        measured = measure()
    return read_gbps, measured, guard.report().as_dict()


def kernel_result(bench: str, args: argparse.Namespace, read_gbps: float, noise: dict, facts: dict,
                  **body) -> dict:
    """A kernel benchmark's result: what ran where (`facts`: the bench's own, e.g. its
    kernel build), then `body`."""
    return {"bench": bench, "quick": args.quick, "threads": args.threads, "cpu": cpu_flags(), **facts,
            "machine_read_gbps": round(read_gbps, 2), "noise": noise, **body}


def machine_class(cpu: dict | Iterable[str] | None = None) -> str:
    """The kind of CPU a results file's name carries (bench/results/README.md): "amx" (AMX tiles with bf16),
    "avx512bf16" (AVX512-BF16, no AMX), "avx2" (neither), "other" (not even AVX2). `cpu`: a recorded CPU
    (cpu_flags() or machine_info(): its "flags"), or the flags themselves; None: this CPU."""
    if cpu is None:
        caps = cpu_capabilities()
    else:
        flags = (cpu.get("flags") or cpu.get("cpu_flags") or ()) if isinstance(cpu, dict) else cpu
        caps = CpuCapabilities("", frozenset(flags))
    if caps.amx_bf16:
        return "amx"
    if caps.avx512_bf16:
        return "avx512bf16"
    return "avx2" if caps.avx2_fma else "other"


def write_kernel_result(results: Path, result: dict, by_machine: bool = False) -> Path:
    """bench/results/<bench>.json (<bench>_quick.json for a smoke run); by_machine:
    <bench>_<machine class>.json
    (machine_class of the result's own CPU record), so that each kind of CPU keeps its own file."""
    results.mkdir(exist_ok=True)
    stem = f"{result['bench']}_{machine_class(result['cpu'])}" if by_machine else result["bench"]
    path = results / f"{stem}{'_quick' if result['quick'] else ''}.json"
    path.write_text(json.dumps(result, indent=1))
    return path


def print_goals(goals: list[dict], path: Path) -> None:
    for g in goals:
        print(f"goal {'met' if g['met'] else 'NOT met'}: {g['name']}: {g['value']} {g['op']} {g['bound']}")
    print(f"wrote {path}")
