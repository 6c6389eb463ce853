"""ENGINE CASCADE HOOK: the whole engine's decode step with rows sharing a cached prefix, cascade off,
always (every shared prefix of two or more rows) and auto (the runner's step-cost gate, whose
coefficients were measured on a CPU: this shows whether it picks right on the GPU).

Every batch first warms the prefix cache with one request, so all rows hit the same pages; decode step
time is isolated by difference as in engine_decode.py: (t(1 + gen tokens) - t(1 token)) / gen.
"""

from __future__ import annotations

import random
import time
import traceback
from collections import Counter
from typing import Any

import torch
from engine_decode import LLAMA3_8B, TINY, _build, _timed_generate


def _set_mode(llm, mode: str, auto_planner) -> None:
    """Switch the runner's cascade mode in place (one model in memory for all modes)."""
    from kvloop.engine.cascade.plan import CascadePlanner

    runner = llm.engine.runner
    runner.cascade = mode
    runner.planner = auto_planner if mode == "auto" else CascadePlanner(
        runner.block_size, lambda members, tokens: members > 1, nested=auto_planner.nested)


def run(device: torch.device, batches: list[int], share: int, shared_len: int, tail_len: int, gen: int,
        tiny: bool, budget_s: float) -> dict[str, Any]:
    config_kw = TINY if tiny else LLAMA3_8B
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    result: dict[str, Any] = {"model": "tiny" if tiny else "llama-3-8b-shaped (random weights)",
                              "dtype": str(dtype),
                              "rows_per_share": share, "shared_len": shared_len, "tail_len": tail_len,
                              "gen_tokens": gen, "batches": {}}
    t_start = time.perf_counter()
    try:
        per_row = -(-(tail_len + gen + 18) // 16)
        groups = -(-max(batches) // share)
        llm = _build(config_kw, dtype, device.type, num_blocks=2 * (groups * (shared_len // 16 + 1)
                     + max(batches) * per_row) + 64, max_batch=max(batches))
        auto_planner = llm.engine.runner.planner
    except Exception as e:  # noqa: BLE001 - engine API missing or broken: report, keep the other results
        result.update(status="skipped", reason=f"{type(e).__name__}: {e}",
                      traceback=traceback.format_exc()[-3000:])
        return result
    rng = random.Random(1)
    vocab = config_kw["vocab_size"]

    def tokens(n: int) -> list[int]:
        return [rng.randrange(vocab) for _ in range(n)]

    for batch in batches:
        if time.perf_counter() - t_start > budget_s:
            result["batches"][str(batch)] = {"status": "skipped",
                                             "reason": f"over the {budget_s:.0f} s budget"}
            continue
        row: dict[str, Any] = {}
        try:
            prefixes = [tokens(shared_len) for _ in range(-(-batch // share))]
            _timed_generate(llm, prefixes, 1, device)  # the shared prefixes enter the prefix cache

            def prompts(prefixes: list[list[int]] = prefixes, batch: int = batch) -> list[list[int]]:
                return [prefixes[i // share] + tokens(tail_len) for i in range(batch)]

            sizes = llm.engine.runner.cascade_group_sizes
            for mode in ("off", "always", "auto"):
                _set_mode(llm, mode, auto_planner)
                before = Counter(sizes)
                t_short = _timed_generate(llm, prompts(), 1, device)
                t_long = _timed_generate(llm, prompts(), 1 + gen, device)
                step = max(t_long - t_short, 1e-9) / gen
                row[mode] = {"decode_step_ms": step * 1e3, "decode_tok_s": batch / step,
                             "cascaded_group_sizes": dict(sizes - before)}  # members -> steps cascaded
            row["speedup_always"] = row["off"]["decode_step_ms"] / row["always"]["decode_step_ms"]
            row["speedup_auto"] = row["off"]["decode_step_ms"] / row["auto"]["decode_step_ms"]
        except Exception as e:  # noqa: BLE001
            row.update(status="failed", reason=f"{type(e).__name__}: {e}",
                       traceback=traceback.format_exc()[-2000:])
        result["batches"][str(batch)] = row
    _set_mode(llm, "auto", auto_planner)
    result["status"] = "ok"
    return result
