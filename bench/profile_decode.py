"""Where a decode step's time goes: per-op profile of kvloop decode steps (fp32 dense and int4, batch 1 and 32).

    .venv/bin/python bench/profile_decode.py
"""
import time

import torch
from kvloop.engine.config import EngineConfig
from kvloop.engine.engine_core import EngineCore
from kvloop.engine.kv.config import KVConfig
from kvloop.engine.sampling import SamplingParams
from torch.profiler import ProfilerActivity, profile

torch.set_num_threads(2)
import random

rng = random.Random(0)
for quant in ("none", "int4"):
    e = EngineCore(EngineConfig(dtype="float32", quantization=quant, progress=False, kv_cache_tokens=16384, kv=KVConfig(mode="continuous")))
    for B in (1, 32):
        for i in range(B):
            e.add_request(f"{quant}{B}-{i}", [rng.randrange(200, 40000) for _ in range(16)], SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
        for _ in range(5): e.step()
        t = time.perf_counter(); n = 0
        for _ in range(10): e.step(); n += 1
        dt = (time.perf_counter() - t) / n
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(5): e.step()
        print(f"== quant={quant} batch={B}: {dt*1e3:.1f} ms/step, {B/dt:.0f} tok/s")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))
        e.drain()
