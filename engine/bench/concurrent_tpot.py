"""TPOT of `batch` concurrent requests with long contexts, through any target (a server over HTTP, usually).

`per_doc` requests share one document (the rest of each context is the row's own question). Each round
first sends every document once, so a server with a prefix cache serves the shared part from it, then the
batch at once; TPOT per request = (last token - first token) / (tokens - 1), median over requests.
Used by bench/peer_tpot.py and bench/decode.py, so every system is measured by the same client code."""

from __future__ import annotations

import random
import statistics
import time

from kvloop.engine.bench.guard import NoiseGuard
from kvloop.engine.bench.targets.base import Target

QUESTION = 112  # tokens of each row's own question at the full shape


def tpot_prompts(batch: int, per_doc: int, seed: int, context: int, max_tokens: int) -> tuple[list[list[int]],
                                                                                              list[list[int]]]:
    """Documents and the batch's prompts (document + a unique question): token ids of plain text range.
    Prompt + output = `context` tokens."""
    rng = random.Random(seed)
    question = min(QUESTION, context // 4)
    doc_len = context - question - max_tokens
    docs = [[rng.randrange(1000, 40000) for _ in range(doc_len)] for _ in range(-(-batch // per_doc))]
    rows = [docs[i // per_doc] + [rng.randrange(1000, 40000) for _ in range(question)] for i in range(batch)]
    return docs, rows


def run_batch(target: Target, rows: list[list[int]], tag: str, max_tokens: int,
              deadline_s: float = 900) -> list[float]:
    """Submits every row at once; returns each request's TPOT in ms. Raises on a request's error."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    count: dict[str, int] = {}
    for i, p in enumerate(rows):
        target.submit(f"{tag}-{i}", p, max_tokens)
    done = 0
    deadline = time.monotonic() + deadline_s
    while done < len(rows) and time.monotonic() < deadline:
        for ev in target.poll(1.0):
            if ev.done:
                done += 1
                if ev.error:
                    raise RuntimeError(f"{tag}: {ev.error}")
                continue
            first.setdefault(ev.request_id, ev.t)
            last[ev.request_id] = ev.t
            count[ev.request_id] = count.get(ev.request_id, 0) + ev.num_new_tokens
    if done < len(rows):
        raise TimeoutError(f"{tag}: {len(rows) - done} of {len(rows)} requests unfinished after "
                           f"{deadline_s:.0f} s")
    return [1000 * (last[r] - first[r]) / (count[r] - 1) for r in first if count[r] > 1]


def measure_tpot(target: Target, batch: int, per_doc: int, seed: int, context: int, max_tokens: int) -> dict:
    """One round: the documents into the cache, then the batch, timed under the quiet-machine guard."""
    docs, rows = tpot_prompts(batch, per_doc, seed, context, max_tokens)
    run_batch(target, [d + [7] for d in docs], f"warm{batch}-{seed}", max_tokens)
    with NoiseGuard() as guard:
        tpots = run_batch(target, rows, f"b{batch}-{seed}", max_tokens)
    return {"tpot_ms_p50": statistics.median(tpots), "requests": len(tpots),
            "noise": guard.report().as_dict()}
