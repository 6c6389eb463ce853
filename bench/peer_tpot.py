"""Peers' TPOT at the shapes of bench/decode_shared.py: `batch` concurrent requests with 2,000-token
contexts, `per_doc` of them sharing one document (the rest of each context is the row's own question),
for llama.cpp's server (-np = batch, prompt cache on) and vLLM's CPU backend (prefix caching on).
Writes bench/results/peer_tpot.json in the {peer: {batch: tpot_ms}} form decode_shared.py's --peers reads.

Each round first sends every document once (so both peers serve the shared part from their caches, as
our rows do), then the batch at once; TPOT per request = (last token - first token) / (tokens - 1),
median over requests. Start-up is not timed. Run it alone on a quiet machine:

    .venv/bin/python bench/peer_tpot.py [--batches 8,16,32] [--per-doc 16] [--threads 2]   # ~10 min
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from kvloop.engine.bench.goals import goal
from kvloop.engine.bench.guard import NoiseGuard
from kvloop.engine.bench.sizing import Sizing
from kvloop.engine.bench.systems import make_target, missing_reason

RESULTS = Path(__file__).resolve().parent / "results"
CONTEXT = 2000
MAX_TOKENS = 48


def prompts(batch: int, per_doc: int, seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """Documents and the batch's prompts (document + a unique question), token ids of plain text range."""
    rng = random.Random(seed)
    question = 112
    doc_len = CONTEXT - question - MAX_TOKENS
    docs = [[rng.randrange(1000, 40000) for _ in range(doc_len)] for _ in range(-(-batch // per_doc))]
    rows = [docs[i // per_doc] + [rng.randrange(1000, 40000) for _ in range(question)] for i in range(batch)]
    return docs, rows


def run_batch(target, rows: list[list[int]], tag: str) -> list[float]:
    """Submits every row at once; returns each request's TPOT in ms."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    count: dict[str, int] = {}
    for i, p in enumerate(rows):
        target.submit(f"{tag}-{i}", p, MAX_TOKENS)
    done = 0
    deadline = time.monotonic() + 900
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
    return [1000 * (last[r] - first[r]) / (count[r] - 1) for r in first if count[r] > 1]


def measure(target, batch: int, per_doc: int) -> dict:
    docs, rows = prompts(batch, per_doc, seed=batch)
    run_batch(target, [d + [7] for d in docs], f"warm{batch}")  # the documents into the prefix cache
    with NoiseGuard() as guard:
        tpots = run_batch(target, rows, f"b{batch}")
    return {"tpot_ms_p50": statistics.median(tpots), "requests": len(tpots), "noise": guard.report().as_dict()}


def measure_peer(peer: str, batches: list[int], per_doc: int, threads: int) -> dict:
    """llama.cpp gets a server per batch (-np = batch); vLLM one server for all batches (it compiles at start)."""
    names = {b: f"llama.cpp-bf16-np{b}" if peer == "llama.cpp" else "vllm-cpu-bf16" for b in batches}
    out: dict = {}
    target, started = None, None
    try:
        for b in batches:
            why = missing_reason(names[b])
            if why:
                out[str(b)] = {"status": "not run", "why": why}
                continue
            if started != names[b]:
                if target is not None:
                    target.close()
                target = make_target(names[b], Sizing(max_context=CONTEXT + 64), threads)
                target.start()
                started = names[b]
            out[str(b)] = measure(target, b, per_doc)
            print(peer, b, {k: v for k, v in out[str(b)].items() if k != "noise"}, flush=True)
    finally:
        if target is not None:
            target.close()
    return out


def quiet_goals(detail: dict) -> list[dict]:
    """The peers' numbers only count if the machine was quiet while each ran."""
    return [goal(f"{peer} batch {b}: other processes' cores during the run", r["noise"]["other_cores_mean"], "<=", 0.3)
            for peer, runs in detail.items() for b, r in runs.items() if "noise" in r]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", default="8,16,32")
    p.add_argument("--per-doc", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--peers", default="llama.cpp,vllm-cpu")
    p.add_argument("--out", type=Path, default=RESULTS / "peer_tpot.json")
    args = p.parse_args(argv)
    detail: dict = {}
    table: dict = {}
    batches = [int(x) for x in args.batches.split(",")]
    for peer in args.peers.split(","):
        detail[peer] = measure_peer(peer, batches, args.per_doc, args.threads)
        table[peer] = {b: r["tpot_ms_p50"] for b, r in detail[peer].items() if "tpot_ms_p50" in r}
    args.out.write_text(json.dumps({**table, "goals": quiet_goals(detail), "_detail": detail, "_per_doc": args.per_doc,
                                    "_context": CONTEXT, "_threads": args.threads}, indent=1) + "\n")
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
