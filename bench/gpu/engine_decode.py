"""ENGINE DECODE-THROUGHPUT HOOK: the whole engine (scheduler, runner, Triton kernels) on a random-weight
Llama-3-8B-shaped model, decode tokens/s at several batch sizes against the roofline built from the
measured ceilings. Imports kvloop.engine lazily: if its API is missing or fails, the section reports
why and the kernel sections are unaffected.

Decode step time is isolated from prefill by difference: generate(max_tokens=1) and
generate(max_tokens=1+gen) on fresh random prompts (no prefix-cache hits), (t_long - t_short) / gen.
"""

from __future__ import annotations

import random
import time
import traceback
from dataclasses import dataclass
from typing import Any

import torch
from timing import sync

LLAMA3_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                 num_kv_heads=8, head_dim=128, rope_theta=500000.0, rms_eps=1e-5, tie_embeddings=False,
                 max_position=8192)
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
            head_dim=16, rope_theta=10000.0, rms_eps=1e-5, tie_embeddings=False, max_position=256)


@dataclass
class Shape:
    vocab: int
    hidden: int
    inter: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool

    @classmethod
    def of(cls, c: dict[str, Any]) -> Shape:
        return cls(c["vocab_size"], c["hidden_size"], c["intermediate_size"], c["num_layers"], c["num_heads"],
                   c["num_kv_heads"], c["head_dim"], c["tie_embeddings"])

    def matmul_params(self) -> int:
        """Parameters read by matrix products each step (every layer plus the output head)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        per_layer = self.hidden * (q + 2 * kv) + q * self.hidden + 3 * self.hidden * self.inter
        return self.layers * per_layer + self.vocab * self.hidden

    def kv_bytes_per_token(self, elem: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * elem


def roofline(shape: Shape, batch: int, avg_ctx: float, elem: int, copy_gbps: float,
             tflops: float) -> dict[str, float]:
    """Lower bound on one decode step: max(bytes / bandwidth, FLOPs / matrix throughput)."""
    weight_bytes = shape.matmul_params() * elem + batch * shape.hidden * elem  # + embedding rows gathered
    kv_bytes = batch * avg_ctx * shape.kv_bytes_per_token(elem)
    flops = (2 * shape.matmul_params() * batch
             + 4 * shape.layers * shape.heads * shape.head_dim * avg_ctx * batch)
    t_mem = (weight_bytes + kv_bytes) / (copy_gbps * 1e9)
    t_flop = flops / (tflops * 1e12)
    step = max(t_mem, t_flop)
    return {"weight_GB": weight_bytes / 1e9, "kv_GB": kv_bytes / 1e9, "TFLOP": flops / 1e12,
            "step_ms": step * 1e3, "bound": "memory" if t_mem >= t_flop else "compute", "tok_s": batch / step}


def _build(config_kw: dict[str, Any], dtype: torch.dtype, device: str, num_blocks: int, max_batch: int):
    from kvloop.engine.llm import LLM
    from kvloop.engine.model.config import ModelConfig

    config = ModelConfig(**config_kw)
    extras = dict(max_num_seqs=max_batch, max_num_batched_tokens=8192, progress=False)
    try:
        return LLM.from_random(config, dtype=dtype, device=device, num_blocks=num_blocks, block_size=16,
                               **extras)
    except TypeError:  # the API as specified takes no scheduler knobs: build it plainly
        return LLM.from_random(config, dtype=dtype, device=device, num_blocks=num_blocks, block_size=16)


def _timed_generate(llm, prompts: list[list[int]], max_tokens: int, device: torch.device) -> float:
    from kvloop.engine.core.sampling import SamplingParams

    sync(device)
    t0 = time.perf_counter()
    llm.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0))
    sync(device)
    return time.perf_counter() - t0


def run(device: torch.device, ceilings: dict[str, float], batches: list[int], prompt_len: int, gen: int,
        tiny: bool, budget_s: float) -> dict[str, Any]:
    config_kw = TINY if tiny else LLAMA3_8B
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    elem = torch.finfo(dtype).bits // 8
    shape = Shape.of(config_kw)
    result: dict[str, Any] = {"model": "tiny" if tiny else "llama-3-8b-shaped (random weights)",
                              "dtype": str(dtype), "prompt_len": prompt_len, "gen_tokens": gen, "batches": {}}
    t_start = time.perf_counter()
    try:
        per_seq_blocks = -(-(prompt_len + gen + 2) // 16)
        llm = _build(config_kw, dtype, device.type, num_blocks=max(batches) * per_seq_blocks * 2 + 64,
                     max_batch=max(batches))
        result["build_s"] = round(time.perf_counter() - t_start, 1)
    except Exception as e:  # noqa: BLE001 - engine API missing or broken: report, keep the kernel results
        result.update(status="skipped", reason=f"{type(e).__name__}: {e}",
                      traceback=traceback.format_exc()[-3000:])
        return result
    rng = random.Random(0)

    def prompts(batch: int) -> list[list[int]]:
        return [[rng.randrange(config_kw["vocab_size"]) for _ in range(prompt_len)] for _ in range(batch)]

    try:
        _timed_generate(llm, prompts(2), 3, device)  # warm-up: kernel compilation, allocator
    except Exception as e:  # noqa: BLE001
        result.update(status="failed", reason=f"warm-up: {type(e).__name__}: {e}",
                      traceback=traceback.format_exc()[-3000:])
        return result
    for batch in batches:
        if time.perf_counter() - t_start > budget_s:
            result["batches"][str(batch)] = {"status": "skipped",
                                             "reason": f"over the {budget_s:.0f} s budget"}
            continue
        try:
            t_short = _timed_generate(llm, prompts(batch), 1, device)
            t_long = _timed_generate(llm, prompts(batch), 1 + gen, device)
            step = max(t_long - t_short, 1e-9) / gen
            roof = roofline(shape, batch, prompt_len + gen / 2, elem, ceilings["copy_GBps"],
                            ceilings["matmul_TFLOPs"])
            result["batches"][str(batch)] = {
                "prefill_plus_1_s": t_short, "total_s": t_long, "decode_step_ms": step * 1e3,
                "decode_tok_s": batch / step, "roofline": roof,
                "fraction_of_roofline": (batch / step) / roof["tok_s"],
            }
        except Exception as e:  # noqa: BLE001
            result["batches"][str(batch)] = {"status": "failed", "reason": f"{type(e).__name__}: {e}",
                                             "traceback": traceback.format_exc()[-2000:]}
    goal = result["batches"].get(str(max(batches)), {})
    result["goal"] = {"batch": max(batches), "target_fraction": 0.5,
                      "fraction": goal.get("fraction_of_roofline"),
                      "met": bool(goal.get("fraction_of_roofline", 0) >= 0.5)}
    result["status"] = "ok"
    return result
