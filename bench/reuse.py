"""KV reuse benchmark: time to first token cold versus a prefix served from each tier, and the admission
gate's hit rate versus plain LRU over a working-set sweep. Writes bench/results/reuse.json and reuse.md.

TTFT part (real model, embedded SmolLM2-135M, bf16, 2 torch threads): (a) the 4th turn of a chat whose
history is ~1000 tokens (100-token system prompt, 3 x (70-token user turn + 200-token reply), then a
70-token user turn) and (b) a 50-token question over a 2000-token document. Token ids are drawn from
the vocabulary by seed (no model-generated replies: the history's content does not change the cost).
Each tier is forced by the config: device (gate threshold 1), host (device gate never passes, host
tier on), disk (device gate never passes, no host tier, disk tier on; the files are in the OS page
cache, as on a warm node). Cold runs use mode `continuous` (no prefix cache). One warm request puts
the prefix in place, then each rep sends a new last turn / question to every engine in turn (the
tiers are interleaved, so load changes on a shared machine hit them alike); medians over the reps.
The token budget is the engine default (512 per step), so a cold 2000-token prompt takes 5 steps.

Sweep part (no model: a pure-Python simulation over the real KV manager with a do-nothing mover):
W4 of WORKLOADS.md, document QA only: 2000-token documents chosen by Zipf (s = 1.1), a unique 50-token
question each, requests served one at a time; the number of documents makes their KV 0.5x..4x the
device pool (1536 blocks of 16); one-off requests (unique 2000-token documents) are 0/33/66% of the
traffic. Token hit rate on the device tier, first 20% of requests excluded as warm-up, `codesign`
(gate + GCLOCK; no lower tiers, so that only the device policy differs) versus `continuous+lru`.

Usage: .venv/bin/python bench/reuse.py [--reps 5] [--sweep-requests 2000] [--skip-ttft] [--skip-sweep]"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path

from kvloop.engine.bench.goals import goal
from kvloop.engine.bench.guard import NoiseGuard

RESULTS = Path(__file__).parent / "results"
TIERS = {
    "device": {"admit_min_requests": 1, "host_cache_tokens": 0},
    "host": {"admit_min_requests": 10**9, "host_cache_tokens": 16384},
    "disk": {"admit_min_requests": 10**9, "host_cache_tokens": 0, "disk_admit_min_requests": 1},
}


def toks(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 49000) for _ in range(n)]


# ---- TTFT ------------------------------------------------------------------------------------------
def workloads(seed: int = 0):
    rng = random.Random(seed)
    history = toks(rng, 100)
    for _ in range(3):
        history += toks(rng, 70) + toks(rng, 200)
    doc = toks(rng, 2000)
    return history, doc, rng


def ttft(engine, rid: str, ids: list[int]) -> float:
    from kvloop.engine.core.sampling import SamplingParams

    seq = engine.add_request(rid, ids, SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
    engine.drain(max_steps=100)
    return seq.first_token_time - seq.arrival_time, seq


def run_ttft(reps: int, threads: int, dtype: str = "bfloat16") -> dict:
    import torch

    from kvloop.engine.config import EngineConfig
    from kvloop.engine.engine_core import EngineCore
    from kvloop.engine.kv.config import KVConfig
    from kvloop.engine.model.checkpoint import load_checkpoint
    from kvloop.engine.model.llama import LlamaModel
    from kvloop.engine.model.locate import embedded_model_path
    from kvloop.engine.tokenizer.tokenizer import Tokenizer

    torch.set_num_threads(threads)
    ckpt = load_checkpoint(embedded_model_path(), progress=False)
    model = LlamaModel(ckpt.config, ckpt.weights, getattr(torch, dtype))
    tok = Tokenizer.from_source(ckpt.tokenizer_source)
    history, doc, rng = workloads()
    out: dict = {}
    details: dict = {}


    def engine(**kv) -> EngineCore:
        cfg = EngineConfig(dtype=dtype, progress=False, kv_cache_tokens=4096, kv=KVConfig(**kv))
        return EngineCore(cfg, model=model, tokenizer=tok, fingerprint=ckpt.fingerprint, model_name=ckpt.name)

    with tempfile.TemporaryDirectory() as disk_dir:
        engines = {"cold": engine(mode="continuous")}
        for tier, kv in TIERS.items():
            engines[tier] = engine(**kv, **({"disk_dir": disk_dir} if tier == "disk" else {}))
        for kind, prefix, tail in (("chat", history, 70), ("doc", doc, 50)):
            for tier in TIERS:  # one warm request puts the prefix in place
                ttft(engines[tier], f"{tier}-{kind}-warm", prefix + toks(rng, tail))
                engines[tier].kv.flush()
            times: dict[str, list[float]] = {name: [] for name in engines}
            for r in range(reps):  # tiers interleaved per rep, so load changes hit them alike
                for name, eng in engines.items():
                    t, seq = ttft(eng, f"{name}-{kind}-{r}", prefix + toks(rng, tail))
                    eng.kv.flush()
                    want = {} if name == "cold" else {name: len(prefix) // 16 * 16}
                    assert seq.cached_tokens_by_tier == want, (name, seq.cached_tokens_by_tier)
                    times[name].append(t)
            for name, ts in times.items():
                out.setdefault(name, {})[f"{kind}_ttft_s"] = round(statistics.median(ts), 4)
                details[f"{name}_{kind}"] = {"ttft_s": [round(t, 4) for t in ts],
                                             "prompt_tokens": len(prefix) + tail}
                print(f"{name:6s} {kind}: median {statistics.median(ts):.3f}s  {[round(t, 3) for t in ts]}",
                      flush=True)
    for tier in TIERS:
        for kind in ("chat", "doc"):
            out[tier][f"{kind}_ratio"] = round(out["cold"][f"{kind}_ttft_s"] / out[tier][f"{kind}_ttft_s"], 2)
    out["_details"] = details
    return out


# ---- sweep -----------------------------------------------------------------------------------------
def simulate(mode: str, docs: int, one_off: float, requests: int, pool_blocks: int, seed: int = 0) -> float:
    from kvloop.engine.core.sampling import SamplingParams
    from kvloop.engine.core.sequence import Sequence
    from kvloop.engine.kv.config import KVConfig
    from kvloop.engine.kv.manager import KVCacheManager

    bs = 16
    kv = KVCacheManager(pool_blocks, bs, KVConfig(mode=mode, host_cache_tokens=0, watermark=0.0),
                        extra_key="sim")
    rng = random.Random(seed)
    bodies = [toks(random.Random(1000 + d), 2000) for d in range(docs)]
    weights = [1 / (d + 1) ** 1.1 for d in range(docs)]
    params = SamplingParams(max_tokens=1, temperature=0)
    warmup = requests // 5
    hit = total = 0
    for i in range(requests):
        body = toks(rng, 2000) if rng.random() < one_off else rng.choices(bodies, weights)[0]
        seq = Sequence(f"r{i}", body + toks(rng, 50), params)
        got = kv.lookup_prefix(seq)
        assert kv.allocate(seq, seq.num_tokens)
        seq.num_computed_tokens = seq.num_tokens
        kv.release(seq)
        if i >= warmup:
            hit += got
            total += seq.num_tokens
    kv.check_integrity([])
    return hit / total


def run_sweep(requests: int, pool_blocks: int = 1536) -> list[dict]:
    rows = []
    for factor in (0.5, 1.0, 2.0, 4.0):
        docs = max(1, round(factor * pool_blocks * 16 / 2000))
        for one_off in (0.0, 0.33, 0.66):
            gate = simulate("codesign", docs, one_off, requests, pool_blocks)
            lru = simulate("continuous+lru", docs, one_off, requests, pool_blocks)
            rows.append({"working_set_x": factor, "documents": docs, "one_off_share": one_off,
                         "gate_hit_rate": round(gate, 4), "lru_hit_rate": round(lru, 4)})
            print(f"sweep {factor}x docs={docs} one-off={one_off:.0%}: gate {gate:.3f}  lru {lru:.3f}",
                  flush=True)
    return rows


# ---- report ----------------------------------------------------------------------------------------
def goals(res: dict) -> list[dict]:
    """A hit from every tier beats recomputing (its worse of the chat and document TTFT speed-ups over cold),
    and the gate keeps at least LRU's hit rate in every cell of the working-set sweep."""
    out = [goal(f"{tier} hit: TTFT speed-up over cold, worse of chat and document",
                min(res[tier]["chat_ratio"], res[tier]["doc_ratio"]), ">=", 1.0)
           for tier in ("device", "host", "disk") if tier in res]
    if res.get("sweep"):
        out.append(goal("sweep: gate / LRU hit rate, worst cell",
                         min(c["gate_hit_rate"] / c["lru_hit_rate"] for c in res["sweep"]), ">=", 1.0))
    return out


def markdown(res: dict) -> str:
    lines = ["# KV reuse benchmark", "",
             "Written by `bench/reuse.py`; setup and caveats in its docstring and in `meta`.", ""]
    if "cold" in res:
        lines += ["| tier | chat 4th turn TTFT (s) | ratio | 2000-token doc question TTFT (s) | ratio |",
                  "|---|---|---|---|---|",
                  f"| cold | {res['cold']['chat_ttft_s']:.3f} | 1 | {res['cold']['doc_ttft_s']:.3f} | 1 |"]
        for tier in ("device", "host", "disk"):
            r = res[tier]
            lines.append(f"| {tier} | {r['chat_ttft_s']:.3f} | {r['chat_ratio']:.1f}x | "
                         f"{r['doc_ttft_s']:.3f} | {r['doc_ratio']:.1f}x |")
        lines.append("")
    if res.get("sweep"):
        lines += ["Device-tier token hit rate, gate (codesign) vs plain LRU (simulation over the real KV "
                  "manager):", "",
                  "| working set / pool | one-off share | gate | LRU |", "|---|---|---|---|"]
        for row in res["sweep"]:
            lines.append(f"| {row['working_set_x']}x ({row['documents']} docs) | {row['one_off_share']:.0%} "
                         f"| {row['gate_hit_rate']:.3f} | {row['lru_hit_rate']:.3f} |")
        lines.append("")
    m = res.get("meta", {})
    if m.get("noise"):
        n = m["noise"]
        lines.append(f"Machine noise during the TTFT runs: other processes used {n['other_cores_mean']:.2f} "
                     f"CPU cores on average (max {n['other_cores_max']:.2f}) of "
                     f"{n['cpu_count']} (load average {m.get('load_average_start', [0])[0]:.1f} at the "
                     f"start, {m.get('load_average_end', [0])[0]:.1f} at the end). The machine was shared "
                     "with other developers and saturated, so absolute times are several times what a quiet "
                     "machine gives; the tiers were interleaved per rep, so the ratios are the meaningful "
                     "numbers.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--sweep-requests", type=int, default=2000)
    ap.add_argument("--skip-ttft", action="store_true")
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    path = args.out / "reuse.json"
    res = json.loads(path.read_text()) if path.exists() else {}
    meta = res.setdefault("meta", {})
    meta.update(model="SmolLM2-135M-Instruct (embedded)", dtype=args.dtype, threads=args.threads,
                reps=args.reps,
                python=sys.version.split()[0], load_average_start=os.getloadavg())
    if not args.skip_ttft:
        with NoiseGuard() as noise:
            ttft_res = run_ttft(args.reps, args.threads, args.dtype)
        meta["ttft_details"] = ttft_res.pop("_details")
        res.update(ttft_res)
        meta["noise"] = noise.report().as_dict()
    if not args.skip_sweep:
        meta["sweep"] = {"pool_blocks": 1536, "block_size": 16, "requests": args.sweep_requests,
                         "warmup_share": 0.2,
                         "simulated": True}
        res["sweep"] = run_sweep(args.sweep_requests)
    meta["load_average_end"] = os.getloadavg()
    res["goals"] = goals(res)
    ordered = {k: res[k] for k in ("goals", "cold", "device", "host", "disk", "sweep", "meta") if k in res}
    args.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(ordered, indent=2) + "\n")
    (args.out / "reuse.md").write_text(markdown(ordered))
    print(markdown(ordered))


if __name__ == "__main__":
    main()
