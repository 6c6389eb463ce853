"""Decode/prefill speed of kvloop against transformers `generate`, same weights and dtype, side by side.

Each measurement runs in its own subprocess (so peak RSS is that system's own), systems interleaved over
repetitions, medians reported. Other processes' CPU use is sampled during the run: these machines are
shared, and a busy neighbour collapses torch's OpenMP threads.

    .venv/bin/python bench/decode.py            # writes bench/results/decode.json and decode.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
SINGLE_TOKENS = 128
BATCH = 32
BATCH_TOKENS = 64
PREFILL = 2000
METRICS = ("single_stream_tok_s", "batch32_decode_tok_s", "prefill_2000_tok_s")


def prompt_ids(n: int, seed: int) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(200, 40000) for _ in range(n)]


# ---- workers (run in a subprocess) ---------------------------------------------------------------
def kvloop_worker(dtype: str, quant: str, threads: int) -> dict:
    import torch
    from kvloop.engine.config import EngineConfig
    from kvloop.engine.engine_core import EngineCore
    from kvloop.engine.kv.config import KVConfig
    from kvloop.engine.sampling import SamplingParams
    from kvloop.engine.scheduler.scheduler import SchedulerConfig

    torch.set_num_threads(threads)
    # no prefix cache: every prompt is computed, as transformers computes it
    cfg = EngineConfig(dtype=dtype, quantization=quant, progress=False, kv_cache_tokens=16384,
                       scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=PREFILL),
                       kv=KVConfig(mode="continuous"))
    engine = EngineCore(cfg)

    def decode_rate(prompts: list[list[int]], new_tokens: int) -> float:
        params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
        for i, p in enumerate(prompts):
            engine.add_request(f"r{time.monotonic_ns()}-{i}", p, params)
        started, produced = None, 0
        while engine.has_unfinished():
            outs = engine.step()
            if started is None and len(outs) == len(prompts):  # every prompt prefilled: decode starts now
                started = time.perf_counter()
                continue
            if started is not None:
                produced += sum(len(o.new_token_ids) + (o.finish_reason == "stop") for o in outs)
        return produced / (time.perf_counter() - started)

    def prefill_rate() -> float:
        engine.add_request(f"p{time.monotonic_ns()}", prompt_ids(PREFILL, 99), SamplingParams(max_tokens=1))
        t = time.perf_counter()
        engine.drain()
        return PREFILL / (time.perf_counter() - t)

    decode_rate([prompt_ids(16, 1)], 8)  # warm-up
    return {
        "single_stream_tok_s": decode_rate([prompt_ids(16, 2)], SINGLE_TOKENS),
        "batch32_decode_tok_s": decode_rate([prompt_ids(16, 10 + i) for i in range(BATCH)], BATCH_TOKENS),
        "prefill_2000_tok_s": prefill_rate(),
    }


def transformers_worker(dtype: str, threads: int) -> dict:
    import torch
    import transformers
    from kvloop.engine.model.locate import embedded_model_path

    torch.set_num_threads(threads)
    path = embedded_model_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              dtype=getattr(torch, dtype))
    model.eval()

    def timed(ids: torch.Tensor, new: int) -> float:
        with torch.no_grad():
            t = time.perf_counter()
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, pad_token_id=2)
            return time.perf_counter() - t

    def decode_rate(ids: torch.Tensor, new: int) -> float:
        # decode only: time for `new` tokens minus time for the first (prefill + one token)
        return ids.shape[0] * (new - 1) / (timed(ids, new) - timed(ids, 1))

    single = torch.tensor([prompt_ids(16, 2)])
    batch = torch.tensor([prompt_ids(16, 10 + i) for i in range(BATCH)])
    timed(torch.tensor([prompt_ids(16, 1)]), 8)  # warm-up
    return {
        "single_stream_tok_s": decode_rate(single, SINGLE_TOKENS),
        "batch32_decode_tok_s": decode_rate(batch, BATCH_TOKENS),
        "prefill_2000_tok_s": PREFILL / timed(torch.tensor([prompt_ids(PREFILL, 99)]), 1),
    }


def run_worker(args: argparse.Namespace) -> None:
    if args.worker == "kvloop":
        result = kvloop_worker(args.dtype, args.quant, args.threads)
    else:
        result = transformers_worker(args.dtype, args.threads)
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(result), flush=True)


# ---- the driver -----------------------------------------------------------------------------------
def busy_seconds() -> tuple[float, float]:
    """(CPU seconds used machine-wide, CPU seconds used by our finished child processes)."""
    import psutil

    t = psutil.cpu_times()
    busy = t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0) + getattr(t, "steal", 0)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return busy, children.ru_utime + children.ru_stime


def measure(system: dict, threads: int) -> tuple[dict, float]:
    """Runs one worker; returns its result and the CPU other processes used meanwhile (% of one core)."""
    cmd = [sys.executable, __file__, "--worker", system["worker"], "--dtype", system["dtype"],
           "--quant", system.get("quant", "none"), "--threads", str(threads)]
    busy0, ours0 = busy_seconds()
    t = time.time()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env={**os.environ, "TQDM_DISABLE": "1"})
    busy1, ours1 = busy_seconds()
    others = max(0.0, (busy1 - busy0) - (ours1 - ours0)) / max(time.time() - t, 1e-9) * 100
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT ")), others


def machine() -> dict:
    import torch
    from kvloop.engine.engine_core import cpu_has_native_bf16

    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__,
            "native_bf16": cpu_has_native_bf16(), "python": platform.python_version()}


SYSTEMS = {
    "kvloop": {"worker": "kvloop", "dtype": "bfloat16"},
    "transformers": {"worker": "transformers", "dtype": "bfloat16"},
    "kvloop-fp32": {"worker": "kvloop", "dtype": "float32"},
    "transformers-fp32": {"worker": "transformers", "dtype": "float32"},
    "kvloop-fp32-int4": {"worker": "kvloop", "dtype": "float32", "quant": "int4"},
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", choices=("kvloop", "transformers"))
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--quant", default="none")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--noisy-limit", type=float, default=25.0, help="%% of a core other processes may use")
    args = p.parse_args()
    if args.worker:
        run_worker(args)
        return
    names = args.systems.split(",")
    runs: dict[str, list[dict]] = {n: [] for n in names}
    noise: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(args.reps):  # interleaved: every system once per repetition
        for name in names:
            result, busy = measure(SYSTEMS[name], args.threads)
            runs[name].append(result)
            noise[name].append(round(busy, 1))
            print(f"rep {rep} {name}: {result} (others used {busy:.0f}% of a core)", flush=True)
    summary = {n: {k: round(statistics.median(r[k] for r in runs[n]), 2) for k in (*METRICS, "peak_rss_mib")}
               for n in names}
    report = {"machine": machine(), "dtype": "bfloat16", "threads": args.threads, "reps": args.reps,
              "other_processes_cpu_percent": noise,
              "noisy": any(max(v) > args.noisy_limit for v in noise.values()),
              **summary,
              "ratios_kvloop_over_transformers": {
                  dt: {k: round(summary[a][k] / summary[b][k], 2) for k in METRICS}
                  for dt, (a, b) in {"bfloat16": ("kvloop", "transformers"),
                                     "float32": ("kvloop-fp32", "transformers-fp32")}.items()
                  if a in summary and b in summary},
              "command": " ".join(["bench/decode.py", *sys.argv[1:]])}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "decode.json").write_text(json.dumps(report, indent=2) + "\n")
    rows = ["| system | dtype | single stream tok/s | batch-32 decode tok/s | 2000-token prefill tok/s | peak RSS MiB |",
            "|---|---|---|---|---|---|"]
    for n in names:
        s, sys_cfg = summary[n], SYSTEMS[n]
        dtype = sys_cfg["dtype"] + (f" + {sys_cfg['quant']} weights" if sys_cfg.get("quant") else "")
        rows.append(f"| {n} | {dtype} | {s['single_stream_tok_s']} | {s['batch32_decode_tok_s']} | "
                    f"{s['prefill_2000_tok_s']} | {s['peak_rss_mib']:.0f} |")
    note = ("\n\nMedians of {} interleaved repetitions, {} torch threads. Other processes' CPU during each run "
            "(% of one core): {}. {}\n").format(args.reps, args.threads, json.dumps(noise),
                                               "NOISY: numbers are not trustworthy." if report["noisy"] else "Quiet.")
    (RESULTS / "decode.md").write_text("# Decode and prefill speed\n\n" + "\n".join(rows) + note)
    print("\n".join(rows) + note)


if __name__ == "__main__":
    main()
