"""Timing with CUDA events (median of many runs, inputs rotated across buffers so caches cannot help),
plus the two measured ceilings: device copy bandwidth and bf16 matrix-product throughput. On the CPU
(--dry-run) the same functions use perf_counter so their code paths run."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_rotating(
    fns: Sequence[Callable[[], object]], device: torch.device, warmup: int = 5, reps: int = 50
) -> dict[str, float]:
    """Run fns[i % len(fns)] for i in range(reps); each fn uses its own inputs. Milliseconds."""
    for i in range(warmup):
        fns[i % len(fns)]()
    sync(device)
    times: list[float] = []
    if device.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            starts[i].record()
            fns[i % len(fns)]()
            ends[i].record()
        torch.cuda.synchronize(device)
        times = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
    else:
        for i in range(reps):
            t0 = time.perf_counter()
            fns[i % len(fns)]()
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return {
        "median_ms": statistics.median(times),
        "p10_ms": times[len(times) // 10],
        "p90_ms": times[(len(times) * 9) // 10],
        "reps": reps,
    }


def copy_bandwidth(device: torch.device, nbytes: int, reps: int = 30) -> dict[str, float]:
    """Device-to-device copy, bytes read plus bytes written per second (how decode kernels are counted)."""
    pairs = [(torch.empty(nbytes, dtype=torch.uint8, device=device),
              torch.empty(nbytes, dtype=torch.uint8, device=device))
             for _ in range(2)]
    for src, _ in pairs:
        src.random_(0, 255)
    t = time_rotating([lambda s=s, d=d: d.copy_(s) for s, d in pairs], device, warmup=3, reps=reps)
    return {"bytes": nbytes, "median_ms": t["median_ms"], "GBps": 2 * nbytes / (t["median_ms"] * 1e-3) / 1e9}


def matmul_tflops(device: torch.device, n: int, dtype: torch.dtype = torch.bfloat16,
                  reps: int = 10) -> dict[str, float]:
    """Dense matrix-product throughput on random data: the compute ceiling for the roofline."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    t = time_rotating([lambda: a @ b], device, warmup=3, reps=reps)
    return {"n": n, "median_ms": t["median_ms"], "TFLOPs": 2 * n**3 / (t["median_ms"] * 1e-3) / 1e12}
