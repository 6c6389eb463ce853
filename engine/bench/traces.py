"""W3 trace readers (pure Python): the Azure LLM inference CSV and Mooncake-style JSONL.

Azure rows (`arrived_at` s, `num_prefill_tokens`, `num_decode_tokens`) become unique synthetic prompts.
Mooncake rows (`timestamp` ms, `input_length`, `output_length`, `hash_ids`) share prefixes: each hash id is
one 512-token block (scaled by `length_scale`) of synthetic tokens derived from the id, so equal ids are
equal token blocks."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

from kvloop.engine.bench.workloads import VOCAB_HIGH, VOCAB_LOW, RequestSpec, Workload

MOONCAKE_BLOCK = 512


def _rand_tokens(seed: int | str, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(n)]


def read_azure_csv(path: str | Path, limit: int | None = None, time_scale: float = 1.0,
                   length_scale: float = 1.0, seed: int = 0) -> Workload:
    """time_scale stretches inter-arrival times (0.5: twice the rate); lengths scaled by length_scale."""
    wl = Workload("W3-azure",
                  params={"trace": str(path), "time_scale": time_scale, "length_scale": length_scale})
    with open(path, newline="") as f:
        rows = csv.DictReader(f)
        t0 = None
        for i, row in enumerate(rows):
            if limit is not None and i >= limit:
                break
            t = float(row["arrived_at"])
            t0 = t if t0 is None else t0
            n_in = max(1, round(int(row["num_prefill_tokens"]) * length_scale))
            n_out = max(1, round(int(row["num_decode_tokens"]) * length_scale))
            wl.requests.append(RequestSpec(f"a{i}", "trace", (t - t0) * time_scale,
                                           _rand_tokens(f"{seed}:a{i}", n_in), n_out))
    return wl


def read_mooncake_jsonl(path: str | Path, limit: int | None = None, time_scale: float = 1.0,
                        length_scale: float = 1.0, seed: int = 0) -> Workload:
    block = max(1, round(MOONCAKE_BLOCK * length_scale))
    wl = Workload("W3-mooncake", params={"trace": str(path), "time_scale": time_scale,
                                         "length_scale": length_scale, "block_tokens": block})
    blocks: dict[int, list[int]] = {}
    with open(path) as f:
        t0 = None
        for i, line in enumerate(x for x in f if x.strip()):
            if limit is not None and i >= limit:
                break
            row = json.loads(line)
            t = float(row["timestamp"]) / 1000.0
            t0 = t if t0 is None else t0
            n_in = max(1, round(int(row["input_length"]) * length_scale))
            prompt: list[int] = []
            for h in row.get("hash_ids", []):
                if h not in blocks:
                    blocks[h] = _rand_tokens(f"{seed}:h{h}", block)
                prompt += blocks[h]
            # the last block is usually partial; lengths beyond the ids are unique filler
            prompt = prompt[:n_in] + _rand_tokens(f"{seed}:m{i}", max(0, n_in - len(prompt)))
            group = f"h{row['hash_ids'][0]}" if row.get("hash_ids") else ""
            wl.requests.append(RequestSpec(f"m{i}", "trace", (t - t0) * time_scale, prompt,
                                           max(1, round(int(row["output_length"]) * length_scale)), group))
    return wl
