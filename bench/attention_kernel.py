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

Writes bench/results/attention_kernel.json (--quick: attention_kernel_quick.json)."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from decode_shared import cpu_flags, layout  # a sibling script: the same block layout and CPU record

RESULTS = Path(__file__).resolve().parent / "results"
HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16
LAYER_BYTES_TARGET = 256 << 20  # all layers' K/V together, several times a 32 MB last-level cache


def machine_read_gbps(reps: int, size_mb: int) -> float:
    import torch

    x = torch.ones(size_mb << 18)  # fp32: 4 bytes each
    x.sum()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - t)
    return x.numel() * 4 / statistics.median(times) / 1e9


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
                             decode_block_tables=torch.tensor(tables), decode_context_lens=torch.full((batch,), ctx),
                             max_decode_context=ctx)
    q = torch.randn(batch, HEADS, HEAD_DIM, generator=gen)
    scale = HEAD_DIM ** -0.5
    kv_bytes = 2 * batch * ctx * KV_HEADS * HEAD_DIM * dtype.itemsize  # what one layer's call must read
    paths = {"torch": torch_decode.decode_attention}
    if kernel is not None:
        paths["kernel"] = kernel()
    row: dict = {"batch": batch, "context": ctx, "kv_dtype": kv_dtype, "layers_cycled": n_layers, "kv_bytes": kv_bytes}
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
        goal("kernel bandwidth at batch 16, context 2000, bf16 KV, as a share of the machine's read bandwidth",
             round(share, 3) if share is not None else None, ">=", 0.6),
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes, one repetition: a smoke run")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=10, help="passes over the cycled layers per case")
    args = p.parse_args()

    import torch

    from kvloop.engine.bench.guard import NoiseGuard
    from kvloop.engine.kernels.cpu import build

    torch.set_num_threads(args.threads)
    kernel = None
    if build.load():
        from kvloop.engine.kernels.cpu.paged_decode import CpuDecode

        kernel = CpuDecode
    batches, ctx, reps, budget, stream_mb = (((8,), 500, 1, 16 << 20, 64) if args.quick
                                             else ((8, 16, 32), 2000, args.reps, LAYER_BYTES_TARGET, 512))
    with NoiseGuard() as guard:
        read_gbps = machine_read_gbps(3 if args.quick else 7, stream_mb)
        rows = [run_case(b, ctx, kv, reps, budget, kernel) for kv in ("float32", "bfloat16") for b in batches]
    result = {"bench": "attention_kernel", "quick": args.quick, "threads": args.threads, "cpu": cpu_flags(),
              "kernel": build.simd() if kernel is not None else None,
              "kernel_unavailable": build.unavailable_reason(), "machine_read_gbps": round(read_gbps, 2),
              "noise": guard.report().as_dict(), "rows": rows}
    result["goals"] = goals(rows, read_gbps)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / ("attention_kernel_quick.json" if args.quick else "attention_kernel.json")
    path.write_text(json.dumps(result, indent=1))
    print(f"machine read bandwidth {read_gbps:.1f} GB/s ({args.threads} threads); kernel: {result['kernel']}")
    for r in rows:
        print(f"batch {r['batch']:>2} ctx {r['context']} {r['kv_dtype']:>8}: torch {r['torch_ms']:8.3f} ms "
              f"({r['torch_gbps']:5.1f} GB/s)" + (f"  kernel {r['kernel_ms']:7.3f} ms ({r['kernel_gbps']:5.1f} GB/s)"
                                                   f"  x{r['speedup']}" if kernel is not None else ""))
    for g in result["goals"]:
        print(f"goal {'met' if g['met'] else 'NOT met'}: {g['name']}: {g['value']} {g['op']} {g['bound']}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
