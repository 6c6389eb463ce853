"""Decode attention per layer on the CPU: the torch path (engine/kernels/torch_decode.py, in place over the
paged cache) against the CPU kernel (engine/kernels/cpu), at batch 8, 16 and 32, context 2,000, KV cache in
fp32 and bf16 (queries in fp32, the engine's default model dtype), with the memory bandwidth each reaches:
bytes of K/V read per call over its time. The embedded model's attention shape: 9 query heads, 3 KV heads,
head_dim 64, 16-token blocks, laid out as decode_shared.py lays them (nothing shared).

A decode step reads every layer's cache once, so each call here reads another layer's cache (enough
layers that together they are several times the last-level cache). The machine's read bandwidth at the
same thread count (a sum over 512 MB) is measured too: the bound the kernel is compared with. Other
processes' CPU use is sampled throughout and the CPU flags are recorded.

    .venv/bin/python bench/attention_kernel.py [--quick] [--threads 2] [--reps 10]

Writes bench/results/attention_kernel.json (--quick: attention_kernel_quick.json; --by-machine:
attention_kernel_<machine class>.json, amx / avx512bf16 / avx2, as bench/results/README.md names results)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from decode_shared import layout  # a sibling script: the same block layout

from kvloop.engine.bench import machine  # the kernel benchmarks' shared run shape

RESULTS = Path(__file__).resolve().parent / "results"
HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16
LAYER_BYTES_TARGET = 256 << 20  # all layers' K/V together, several times a 32 MB last-level cache


def run_case(batch: int, ctx: int, kv_dtype: str, reps: int, layer_budget: int, kernel) -> dict:
    import torch

    from kvloop.engine.kernels import torch_decode
    from kvloop.engine.kernels.attention_meta import AttentionMetadata

    dtype = getattr(torch, kv_dtype)
    tables = layout(batch, ctx, 1, BLOCK)
    num_blocks = 1 + max(max(t) for t in tables)
    shape = (num_blocks, BLOCK, KV_HEADS, HEAD_DIM)
    layer_bytes = 2 * num_blocks * BLOCK * KV_HEADS * HEAD_DIM * dtype.itemsize
    n_layers = max(2, min(30, -(-layer_budget // layer_bytes)))
    gen = torch.Generator().manual_seed(0)
    caches = [(torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype))
              for _ in range(n_layers)]
    meta = AttentionMetadata(slot_mapping=torch.zeros(batch, dtype=torch.long), num_decode=batch,
                             decode_block_tables=torch.tensor(tables),
                             decode_context_lens=torch.full((batch,), ctx),
                             max_decode_context=ctx)
    q = torch.randn(batch, HEADS, HEAD_DIM, generator=gen)
    scale = HEAD_DIM ** -0.5
    kv_bytes = 2 * batch * ctx * KV_HEADS * HEAD_DIM * dtype.itemsize  # what one layer's call must read
    paths = {"torch": torch_decode.decode_attention}
    if kernel is not None:
        paths["kernel"] = kernel()
    row: dict = {"batch": batch, "context": ctx, "kv_dtype": kv_dtype, "layers_cycled": n_layers,
                 "kv_bytes": kv_bytes}
    outs = {}
    for name, fn in paths.items():
        for k, v in caches:  # warm-up: work lists built, pages touched
            outs[name] = fn(q, k, v, meta, scale)
        times = []
        for _ in range(reps):
            for k, v in caches:
                t = time.perf_counter()
                fn(q, k, v, meta, scale)
                times.append(time.perf_counter() - t)
        ms = statistics.median(times) * 1e3
        row[f"{name}_ms"] = round(ms, 4)
        row[f"{name}_gbps"] = round(kv_bytes / ms / 1e6, 2)
    if kernel is not None:
        row["speedup"] = round(row["torch_ms"] / row["kernel_ms"], 3)
        row["max_abs_diff"] = float((outs["torch"] - outs["kernel"]).abs().max())
    return row


def goals(rows: list[dict], read_gbps: float) -> list[dict]:
    from kvloop.engine.bench.goals import goal

    speedups = [r.get("speedup") for r in rows]
    at16 = [r for r in rows if r["batch"] == 16 and r["kv_dtype"] == "bfloat16" and "kernel_gbps" in r]
    share = at16[0]["kernel_gbps"] / read_gbps if at16 else None
    return [
        goal("kernel never slower than the torch path (min speedup over all cases)",
             min(speedups) if speedups and None not in speedups else None, ">=", 1.0),
        goal("kernel bandwidth at batch 16, context 2000, bf16 KV, as a share of the machine's "
             "read bandwidth",
             round(share, 3) if share is not None else None, ">=", 0.6),
    ]


def main() -> None:
    args = machine.kernel_bench_args(__doc__, "tiny sizes, one repetition: a smoke run",
                                     "passes over the cycled layers per case")
    from kvloop.engine.kernels.cpu import build

    kernel = None
    if build.load():
        from kvloop.engine.kernels.cpu.paged_decode import CpuDecode

        kernel = CpuDecode
    batches, ctx, reps, budget = (((8,), 500, 1, 16 << 20) if args.quick
                                  else ((8, 16, 32), 2000, args.reps, LAYER_BYTES_TARGET))
    read_gbps, rows, noise = machine.measure_against_bandwidth(args.quick, lambda: [
        run_case(b, ctx, kv, reps, budget, kernel) for kv in ("float32", "bfloat16") for b in batches])
    facts = {"kernel": build.simd() if kernel is not None else None,
             "kernel_unavailable": build.unavailable_reason()}
    result = machine.kernel_result("attention_kernel", args, read_gbps, noise, facts, rows=rows)
    result["goals"] = goals(rows, read_gbps)
    path = machine.write_kernel_result(RESULTS, result, by_machine=args.by_machine)
    print(f"machine read bandwidth {read_gbps:.1f} GB/s ({args.threads} threads); kernel: {result['kernel']}")
    for r in rows:
        print(f"batch {r['batch']:>2} ctx {r['context']} {r['kv_dtype']:>8}: torch {r['torch_ms']:8.3f} ms "
              f"({r['torch_gbps']:5.1f} GB/s)"
              + (f"  kernel {r['kernel_ms']:7.3f} ms ({r['kernel_gbps']:5.1f} GB/s)"
                                                   f"  x{r['speedup']}" if kernel is not None else ""))
    machine.print_goals(result["goals"], path)


if __name__ == "__main__":
    main()
