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
from pathlib import Path

from kvloop.engine.bench.concurrent_tpot import measure_tpot
from kvloop.engine.bench.goals import goal
from kvloop.engine.bench.sizing import Sizing
from kvloop.engine.bench.systems import make_target, missing_reason

RESULTS = Path(__file__).resolve().parent / "results"
CONTEXT = 2000
MAX_TOKENS = 48


def measure_peer(peer: str, batches: list[int], per_doc: int, threads: int) -> dict:
    """llama.cpp gets a server per batch (-np = batch); vLLM one server for all batches
    (it compiles at start)."""
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
            out[str(b)] = measure_tpot(target, b, per_doc, seed=b, context=CONTEXT, max_tokens=MAX_TOKENS)
            print(peer, b, {k: v for k, v in out[str(b)].items() if k != "noise"}, flush=True)
    finally:
        if target is not None:
            target.close()
    return out


def quiet_goals(detail: dict) -> list[dict]:
    """The peers' numbers only count if the machine was quiet while each ran."""
    return [goal(f"{peer} batch {b}: other processes' cores during the run", r["noise"]["other_cores_mean"],
                 "<=", 0.3)
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
    args.out.write_text(json.dumps({**table, "goals": quiet_goals(detail), "_detail": detail,
                                    "_per_doc": args.per_doc,
                                    "_context": CONTEXT, "_threads": args.threads}, indent=1) + "\n")
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
