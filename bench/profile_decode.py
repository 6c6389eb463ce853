"""Where a decode step's time goes: per-op profile of kvloop decode steps (fp32 dense and int4, batch 1 and 32).

    .venv/bin/python bench/profile_decode.py
"""

from __future__ import annotations

import random
import time

import torch
from kvloop.engine.config import EngineConfig
from kvloop.engine.engine_core import EngineCore
from kvloop.engine.kv.config import KVConfig
from kvloop.engine.sampling import SamplingParams
from torch.profiler import ProfilerActivity, profile


def main() -> None:
    torch.set_num_threads(2)
    rng = random.Random(0)
    for quant in ("none", "int4"):
        engine = EngineCore(EngineConfig(dtype="float32", quantization=quant, progress=False, kv_cache_tokens=16384,
                                         kv=KVConfig(mode="continuous")))
        for batch in (1, 32):
            params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
            for i in range(batch):
                engine.add_request(f"{quant}{batch}-{i}", [rng.randrange(200, 40000) for _ in range(16)], params)
            for _ in range(5):  # prefill and warm-up
                engine.step()
            start = time.perf_counter()
            for _ in range(10):
                engine.step()
            per_step = (time.perf_counter() - start) / 10
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(5):
                    engine.step()
            print(f"== quant={quant} batch={batch}: {per_step * 1e3:.1f} ms/step, {batch / per_step:.0f} tok/s")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))
            engine.drain()


if __name__ == "__main__":
    main()
