"""GPU check for the Triton kernels (issue 8), one command on an H200:

    bench/gpu/run_gpu_check.sh            # writes bench/results/gpu.json (and $OUT/gpu.json if set)
    bench/gpu/run_gpu_check.sh --dry-run  # CPU + TRITON_INTERPRET, tiny shapes: exercises every code path

Sections, each guarded so one failure cannot hide the others, the JSON rewritten after each:
ceilings (copy bandwidth, bf16 matrix throughput) -> correctness of every kernel against float64 ->
timings (decode at batch 64 / context 2k / Llama-3-8B heads against the copy bandwidth, a launch-config
sweep, cascade vs plain decode at batch 16 and 32 / context 2k with 16 rows per shared prefix, extend,
write_kv, copy_blocks) -> the engine decode-throughput hook (engine_decode.py) -> the engine's decode step
with 16 rows per cached shared prefix, cascade off / always / auto (engine_cascade.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Triton kernel GPU check")
    p.add_argument("--dry-run", action="store_true", help="CPU + interpreter on tiny shapes (no GPU needed)")
    p.add_argument("--out", type=Path, help="JSON path (default bench/results/gpu.json, or gpu_dryrun.json)")
    p.add_argument("--skip-engine", action="store_true")
    p.add_argument("--skip-sweep", action="store_true")
    p.add_argument("--engine-batches", default="1,32,256")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--gen-tokens", type=int, default=64)
    p.add_argument("--engine-budget-s", type=float, default=240.0)
    return p.parse_args(argv)


def section(report: dict[str, Any], name: str, out: Path, fn) -> Any:
    t0 = time.perf_counter()
    try:
        value = fn()
        report[name] = value
    except Exception as e:  # noqa: BLE001 - recorded; later sections still run
        value = None
        report[name] = {"status": "error", "error": f"{type(e).__name__}: {e}",
                        "traceback": traceback.format_exc()[-4000:]}
    report.setdefault("section_seconds", {})[name] = round(time.perf_counter() - t0, 2)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))
    print(f"[{name}] {time.perf_counter() - t0:.1f} s: {json.dumps(report[name], default=str)[:600]}",
          flush=True)
    return value


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
    from kvloop_path import ensure_kvloop

    how = ensure_kvloop()
    import torch
    import triton
    from kernel_bench import (
        bench_cascade,
        bench_decode,
        bench_extend,
        bench_write_and_copy,
        run_checks,
        sweep_decode,
    )
    from timing import copy_bandwidth, matmul_tflops

    from kvloop.engine.kernels import triton as tk

    device = torch.device("cpu" if args.dry_run else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --dry-run on a CPU machine", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    out = args.out or RESULTS / ("gpu_dryrun.json" if args.dry_run else "gpu.json")
    small = args.dry_run
    report: dict[str, Any] = {"meta": {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
        or "cpu",
        "dry_run": args.dry_run, "interpreted": tk.is_interpreted(), "torch": torch.__version__,
        "triton": triton.__version__, "kvloop_import": how, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }}

    def ceilings() -> dict[str, float]:
        copy = copy_bandwidth(device, (1 << 20) if small else (2 << 30))
        mm = matmul_tflops(device, 256 if small else 8192)
        return {"copy_GBps": copy["GBps"], "copy": copy, "matmul_TFLOPs": mm["TFLOPs"], "matmul": mm}

    ceil = section(report, "ceilings", out, ceilings) or {"copy_GBps": float("nan"),
                                                          "matmul_TFLOPs": float("nan")}
    checks = section(report, "checks", out, lambda: run_checks(tk, device, small)) or []

    llama = dict(n_heads=32, n_kv=8, hd=128)
    decode_shape = dict(batch=2, ctx=40, n_heads=4, n_kv=2, hd=64) if small else dict(batch=64, ctx=2048,
                                                                                      **llama)
    reps = 3 if small else 50

    def decode_goal() -> dict[str, Any]:
        r = bench_decode(tk, device, ceil["copy_GBps"], reps=reps, **decode_shape)
        r.update(target_fraction=0.7, met=r["fraction_of_copy"] >= 0.7)
        return r

    section(report, "decode_bandwidth", out, decode_goal)
    if not args.skip_sweep:
        section(report, "decode_sweep", out, lambda: sweep_decode(tk, device, ceil["copy_GBps"], decode_shape,
                                                                 reps=2 if small else 20))

    def cascade_timings() -> dict[str, Any]:
        if small:
            return {"batch4_share2": bench_cascade(tk, device, 4, 40, 2, 32, 4, 2, 64, reps=2)}
        # 1,888 shared tokens = 118 full blocks of a 2,000-token context; the rest is each row's own.
        return {f"batch{b}_share{s}": bench_cascade(tk, device, b, 2000, s, 1888, reps=50, **llama)
                for b, s in [(16, 16), (32, 16), (32, 4)]}

    section(report, "cascade_timing", out, cascade_timings)

    def other_timings() -> dict[str, Any]:
        if small:
            return {"decode_batch1_ctx": bench_decode(tk, device, ceil["copy_GBps"], 1, 60, 4, 2, 64, reps=2),
                    "extend": bench_extend(tk, device, 1, 8, 16, 4, 2, 64, reps=2),
                    **bench_write_and_copy(tk, device, 32, 2, 64, layers=2, n_blocks=4, reps=2)}
        return {
            "decode_batch1_ctx8k": bench_decode(tk, device, ceil["copy_GBps"], 1, 8192, reps=50, **llama),
            "decode_batch256_ctx1k": bench_decode(tk, device, ceil["copy_GBps"], 256, 1024, reps=30, **llama),
            "extend_4x(1k prefix + 1k new)": bench_extend(tk, device, 4, 1024, 1024, **llama),
            "extend_1x(0 + 4k new)": bench_extend(tk, device, 1, 0, 4096, **llama),
            **bench_write_and_copy(tk, device, 8192, 8, 128, layers=32, n_blocks=256),
        }

    section(report, "timings", out, other_timings)

    if not args.skip_engine:
        import engine_decode

        batches = [1, 2] if small else [int(b) for b in args.engine_batches.split(",")]
        section(report, "engine_decode", out, lambda: engine_decode.run(
            device, ceil, batches, 8 if small else args.prompt_len, 3 if small else args.gen_tokens,
            tiny=small, budget_s=args.engine_budget_s))
        import engine_cascade

        section(report, "engine_cascade", out, lambda: engine_cascade.run(
            device, [2, 4] if small else [16, 32], 2 if small else 16, 32 if small else 1888,
            8 if small else 112,
            3 if small else 32, tiny=small, budget_s=args.engine_budget_s / 2))

    ok = bool(checks) and all(c["ok"] for c in checks)
    report["summary"] = {
        "all_checks_ok": ok,
        "decode_fraction_of_copy": (report.get("decode_bandwidth") or {}).get("fraction_of_copy"),
        "engine_goal": (report.get("engine_decode") or {}).get("goal"),
        "cascade_speedup": {k: v.get("speedup") for k, v in (report.get("cascade_timing") or {}).items()
                            if isinstance(v, dict)},
        "engine_cascade_speedup": {b: (v.get("speedup_always"), v.get("speedup_auto"))
                                   for b, v in ((report.get("engine_cascade") or {}).get("batches")
                                                or {}).items()},
    }
    out.write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps(report["summary"], default=str))
    print(f"wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
