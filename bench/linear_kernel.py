"""Weight streaming of the linear layers on the CPU: the bf16-weight kernel (engine/kernels/cpu/linear_bf16w,
fp32 arithmetic) and the int8-weight kernel (engine/kernels/cpu/linear_int8w: per-channel fp32 scales, fp32
arithmetic; --quantization int8, llama.cpp's Q8_0 counterpart) against torch's fp32 F.linear (the dense path
they replace on CPUs without native bf16), on the embedded model's shapes (fused q/k/v, o, fused gate/up,
down, the 49152-row head) at M = 1, 8, 16, 32 rows (decode) and 64, 256, 512 (prefill), with the bandwidth
each reaches: the bytes of weights read per call over its time (int8: a byte per weight plus the scales).

A decode step reads every layer's weights once, so each call here uses another copy of the weights (enough
copies that together they are several times the last-level cache): the numbers are streaming from memory,
not re-reading a cached matrix. "decode_step" sums one decode step's calls (30 layers and the head) at each
M. The machine's read bandwidth at the same thread count is measured too (the bound), other processes'
CPU use is sampled throughout and the CPU flags are recorded.

    .venv/bin/python bench/linear_kernel.py [--quick] [--threads 2] [--reps 10]

Writes bench/results/linear_kernel.json (--quick: linear_kernel_quick.json; --by-machine:
linear_kernel_<machine class>.json, amx / avx512bf16 / avx2, as bench/results/README.md names results)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from kvloop.engine.bench import machine  # the kernel benchmarks' shared run shape

RESULTS = Path(__file__).resolve().parent / "results"
LAYERS = 30
# the embedded SmolLM2-135M's linears as the engine fuses them: name -> (N, K, calls per decode step)
SHAPES = {"qkv": (960, 576, LAYERS), "o": (576, 576, LAYERS), "gate_up": (3072, 576, LAYERS),
          "down": (576, 1536, LAYERS), "lm_head": (49152, 576, 1)}
ROWS = (1, 8, 16, 32, 64, 256, 512)
PREFILL_ROWS = 64  # from here on a call is compute-bound: two copies cycled are enough
CYCLE_BYTES = 256 << 20  # fp32 bytes of the copies cycled per shape: several times a 32 MB last-level cache


def time_calls(fn, operands: list, reps: int) -> float:
    """Median seconds of one call, each call on the next operand (the cycle is warmed up once first)."""
    for op in operands:
        fn(op)
    times = []
    for _ in range(reps):
        for op in operands:
            t = time.perf_counter()
            fn(op)
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def run_shape(name: str, n: int, k: int, rows: tuple[int, ...], reps: int, cycle_bytes: int) -> list[dict]:
    import torch
    import torch.nn.functional as F

    from kvloop.engine.kernels.cpu import linear_bf16w, linear_int8w

    copies = max(2, min(64, -(-cycle_bytes // (n * k * 4))))
    gen = torch.Generator().manual_seed(0)
    dense = [torch.randn(n, k, generator=gen) * 0.02 for _ in range(copies)]
    packed = [linear_bf16w.pack(w) for w in dense]
    quantized = [linear_int8w.quantize(w) for w in dense]
    int8 = [(linear_int8w.pack(q), scale) for q, scale in quantized]
    int8_bytes = n * k + n * 4  # the int8 weights and their fp32 scales
    out = []
    for m in rows:
        x = torch.randn(m, k, generator=gen)
        used = slice(None) if m < PREFILL_ROWS else slice(2)
        kernel_s = time_calls(lambda p, x=x: linear_bf16w.linear(x, p, n), packed[used], reps)
        int8_s = time_calls(lambda ps, x=x: linear_int8w.linear(x, ps[0], ps[1], n), int8[used], reps)
        torch_s = time_calls(lambda w, x=x: F.linear(x, w), dense[used], reps)
        diff = (linear_bf16w.linear(x, packed[0],
                                    n) - F.linear(x, dense[0].to(torch.bfloat16).float())).abs().max()
        q, scale = quantized[0]
        int8_diff = (linear_int8w.linear(x, int8[0][0], scale,
                                         n) - F.linear(x, q.float() * scale[:, None])).abs().max()
        out.append({"shape": name, "n": n, "k": k, "m": m, "copies_cycled": len(dense[used]),
                    "kernel_ms": round(kernel_s * 1e3, 4),
                    "kernel_gbps": round(n * k * 2 / kernel_s / 1e9, 2),
                    "int8_ms": round(int8_s * 1e3, 4), "int8_gbps": round(int8_bytes / int8_s / 1e9, 2),
                    "torch_fp32_ms": round(torch_s * 1e3, 4),
                    "torch_fp32_gbps": round(n * k * 4 / torch_s / 1e9, 2),
                    "speedup": round(torch_s / kernel_s, 3), "int8_speedup": round(torch_s / int8_s, 3),
                    "max_abs_diff_vs_fp32_same_weights": float(diff),
                    "int8_max_abs_diff_vs_fp32_same_weights": float(int8_diff)})
    return out


def decode_step(rows: list[dict]) -> list[dict]:
    """One decode step's linears (every layer's and the head) at each M: summed times, bytes over time."""
    steps = []
    for m in sorted({r["m"] for r in rows}):
        at = [r for r in rows if r["m"] == m]
        calls = {r["shape"]: SHAPES[r["shape"]][2] for r in at}
        kernel_ms = sum(r["kernel_ms"] * calls[r["shape"]] for r in at)
        int8_ms = sum(r["int8_ms"] * calls[r["shape"]] for r in at)
        torch_ms = sum(r["torch_fp32_ms"] * calls[r["shape"]] for r in at)
        params = sum(r["n"] * r["k"] * calls[r["shape"]] for r in at)
        scales = sum(r["n"] * calls[r["shape"]] for r in at)
        steps.append({"m": m, "shapes": sorted(calls), "kernel_ms": round(kernel_ms, 3),
                      "kernel_gbps": round(params * 2 / kernel_ms / 1e6, 2), "int8_ms": round(int8_ms, 3),
                      "int8_gbps": round((params + 4 * scales) / int8_ms / 1e6, 2),
                      "torch_fp32_ms": round(torch_ms, 3),
                      "torch_fp32_gbps": round(params * 4 / torch_ms / 1e6, 2),
                      "speedup": round(torch_ms / kernel_ms, 3),
                      "int8_speedup": round(torch_ms / int8_ms, 3)})
    return steps


def goals(steps: list[dict], rows: list[dict], read_gbps: float) -> list[dict]:
    from kvloop.engine.bench.goals import goal

    one = next((s for s in steps if s["m"] == 1), None)
    speedups = [r["speedup"] for r in rows]
    int8_speedups = [r["int8_speedup"] for r in rows]
    return [
        goal("bf16-weight kernel: a decode step's weights at M=1, GB/s", one and one["kernel_gbps"], ">=",
             20.0),
        goal("the same as a share of the machine's read bandwidth",
             one and round(one["kernel_gbps"] / read_gbps, 3),
             ">=", 0.6),
        goal("decode step's linears at M=1: fp32 F.linear time / kernel time", one and one["speedup"], ">=",
             1.6),
        goal("kernel never slower than fp32 F.linear (min speedup over shapes and M)",
             min(speedups) if speedups else None, ">=", 1.0),
        goal("int8-weight kernel: a decode step's weight bytes at M=1, as a share of the machine's read "
             "bandwidth",
             one and round(one["int8_gbps"] / read_gbps, 3), ">=", 0.6),
        goal("int8 kernel never slower than fp32 F.linear (min speedup over shapes and M)",
             min(int8_speedups) if int8_speedups else None, ">=", 1.0),
    ]


def main() -> None:
    args = machine.kernel_bench_args(__doc__, "few copies, M=1 and 8, two repetitions: a smoke run",
                                     "passes over the cycled copies per case")
    from kvloop.engine.kernels.cpu import build, linear_bf16w, linear_int8w

    for kernel in (linear_bf16w, linear_int8w):
        if not kernel.available():
            raise SystemExit(f"the {kernel.KERNEL} kernel is not built: "
                             f"{build.unavailable_reason(kernel.KERNEL)}")
    rows_m, reps, cycle = ((1, 8, 256), 2, 64 << 20) if args.quick else (ROWS, args.reps, CYCLE_BYTES)
    read_gbps, rows, noise = machine.measure_against_bandwidth(args.quick, lambda: [
        r for name, (n, k, _) in SHAPES.items() for r in run_shape(name, n, k, rows_m, reps, cycle)])
    steps = decode_step(rows)
    result = machine.kernel_result("linear_kernel", args, read_gbps, noise, {}, rows=rows, decode_step=steps)
    result["goals"] = goals(steps, rows, read_gbps)
    path = machine.write_kernel_result(RESULTS, result, by_machine=args.by_machine)
    print(f"machine read bandwidth {read_gbps:.1f} GB/s ({args.threads} threads)")
    for r in rows:
        print(f"{r['shape']:>8} {r['n']:>5}x{r['k']:<5} M={r['m']:>3}: bf16w {r['kernel_ms']:8.3f} ms "
              f"({r['kernel_gbps']:5.1f} GB/s) x{r['speedup']}  int8w {r['int8_ms']:8.3f} ms "
              f"({r['int8_gbps']:5.1f} GB/s) x{r['int8_speedup']}  fp32 F.linear {r['torch_fp32_ms']:8.3f} "
              f"ms ({r['torch_fp32_gbps']:5.1f} GB/s)")
    for s in steps:
        print(f"decode step M={s['m']:>3}: bf16w {s['kernel_ms']:.2f} ms ({s['kernel_gbps']} GB/s) "
              f"x{s['speedup']}, int8w {s['int8_ms']:.2f} ms ({s['int8_gbps']} GB/s) x{s['int8_speedup']}, "
              f"fp32 {s['torch_fp32_ms']:.2f} ms ({s['torch_fp32_gbps']} GB/s)")
    machine.print_goals(result["goals"], path)


if __name__ == "__main__":
    main()
