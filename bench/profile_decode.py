"""Where a decode step's time goes: per-op profile of kvloop decode steps (fp32 dense and int4, batch 1
and 32, 16-token prompts by default; `--prompt-tokens 2000` shows decode at W1's document length).

    .venv/bin/python bench/profile_decode.py
    .venv/bin/python bench/profile_decode.py --quant none --batches 1,16 --prompt-tokens 16,2000 \\
        --out bench/results/decode_long_context_profile.txt
"""

from __future__ import annotations

import argparse
import io
import random
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from kvloop.engine.config import EngineConfig
from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.engine_core import EngineCore
from kvloop.engine.kv.config import KVConfig


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quant", default="none,int4")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--prompt-tokens", default="16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="also write the report here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rng = random.Random(0)
    batches = [int(b) for b in args.batches.split(",")]
    prompts = [int(p) for p in args.prompt_tokens.split(",")]
    out = io.StringIO()
    for quant in args.quant.split(","):
        engine = EngineCore(EngineConfig(dtype="auto" if quant == "auto" else "float32", quantization=quant,
                                         progress=False,
                                         kv_cache_tokens=max(batches) * (max(prompts) + 64) + 1024,
                                         kv=KVConfig(mode="continuous"), threads=args.threads))
        for plen in prompts:
            for batch in batches:
                params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
                for i in range(batch):
                    engine.add_request(f"{quant}{plen}-{batch}-{i}",
                                       [rng.randrange(200, 40000) for _ in range(plen)],
                                       params)
                while any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running) or \
                        engine.scheduler.waiting:
                    engine.step()  # prefill
                for _ in range(3):  # warm-up
                    engine.step()
                start = time.perf_counter()
                for _ in range(10):
                    engine.step()
                per_step = (time.perf_counter() - start) / 10
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    for _ in range(5):
                        engine.step()
                head = (f"== quant={quant} batch={batch} context~{plen}: {per_step * 1e3:.1f} ms/step, "
                        f"{batch / per_step:.0f} tok/s ({args.threads} threads)")
                print(head, file=out)
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8), file=out)
                engine.drain()
    print(out.getvalue())
    if args.out:
        Path(args.out).write_text(out.getvalue())


if __name__ == "__main__":
    main()
