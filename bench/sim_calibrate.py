"""Calibrates the simulator's CPU profile against real EngineCore steps on this machine.

Runs the embedded SmolLM2-135M through the real engine (prefix cache off, so every shape is what it
says) for a few decode batch sizes and prompt lengths, times every engine.step() (scheduler, runner
and bookkeeping: everything the simulator's step time stands for), records each step's shape, and fits
the cost model: efficiencies of bandwidth and peak on a log grid, then non-negative least squares for
the fixed, per-sequence and per-token overheads, minimising relative error. Few, short runs; the
other processes' CPU use during the runs is recorded (NoiseGuard) because this machine is shared.

    .venv/bin/python bench/sim_calibrate.py            # writes bench/results/sim_calibration.json
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np
from kvloop.engine.bench.guard import NoiseGuard
from kvloop.engine.sim.cost import CostModel, Efficiency
from kvloop.engine.sim.profiles import CALIBRATION_FILE, SMOLLM2_135M, THIS_CPU

# (sequences, prompt tokens): decode batch sizes over short and long contexts, and prefill lengths.
SHAPES = [(1, 64), (1, 1024), (4, 512), (8, 256), (16, 512), (32, 128), (32, 256), (64, 128)]
DECODE_STEPS = 20


def run_shapes(engine, shapes, decode_steps: int, seed: int = 0) -> list[dict]:
    from kvloop.engine.sampling import SamplingParams

    rng = random.Random(seed)
    rows: list[dict] = []
    orig = engine.runner.execute
    last: dict = {}

    def spy(batch):
        last["items"] = [(it.start, it.num_tokens, it.samples) for it in batch.items]
        return orig(batch)

    engine.runner.execute = spy
    n_req = 0
    for n, plen in shapes:
        for _ in range(n):
            prompt = [rng.randrange(100, 49152) for _ in range(plen)]
            engine.add_request(f"c{n_req}", prompt, SamplingParams(max_tokens=decode_steps, temperature=0.0,
                                                                   ignore_eos=True))
            n_req += 1
        while engine.has_unfinished():
            last.clear()
            t = time.perf_counter()
            engine.step()
            dt = time.perf_counter() - t
            if "items" in last:
                rows.append({"shape": [n, plen], "items": last["items"], "seconds": dt})
    return rows


def features(cost: CostModel, items) -> tuple[float, float, int, int]:
    """(memory seconds, compute seconds) at efficiency 1, sequences, tokens."""
    c = cost.step_for([tuple(x) for x in items])
    return c.bytes / cost.hw.mem_bw, c.flops / cost.hw.peak_flops, len(items), sum(x[1] for x in items)


def fit(rows: list[dict], model) -> dict:
    cost = CostModel(model, THIS_CPU, Efficiency(bw=1.0, flops=1.0))
    f = np.array([features(cost, r["items"]) for r in rows])
    y = np.array([r["seconds"] for r in rows])
    w = 1.0 / y  # relative error
    best = None
    for bw in np.geomspace(0.02, 1.0, 60):
        for fl in np.geomspace(0.02, 1.0, 60):
            roof = np.maximum(f[:, 0] / bw, f[:, 1] / fl)
            a = np.stack([np.ones_like(y), f[:, 2], f[:, 3]], 1)
            coef = _nnls((a * w[:, None]), (y - roof) * w)
            pred = roof + a @ coef
            err = float(np.sqrt(np.mean(((pred - y) / y) ** 2)))
            if best is None or err < best[0]:
                best = (err, bw, fl, coef, pred)
    err, bw, fl, coef, pred = best
    rel = (pred - y) / y
    return {"bw": float(bw), "flops": float(fl), "step_overhead_s": float(coef[0]), "seq_overhead_s": float(coef[1]),
            "token_overhead_s": float(coef[2]), "rms_rel_error": err, "max_abs_rel_error": float(np.max(np.abs(rel))),
            "steps": len(rows)}


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with x >= 0 by dropping negative coefficients (3 unknowns: exhaustive is fine)."""
    best, best_r = np.zeros(a.shape[1]), float(np.sum(b**2))
    for mask in range(1, 2 ** a.shape[1]):
        cols = [i for i in range(a.shape[1]) if mask >> i & 1]
        x, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
        if np.any(x < 0):
            continue
        r = float(np.sum((a[:, cols] @ x - b) ** 2))
        if r < best_r:
            best, best_r = np.zeros(a.shape[1]), r
            best[cols] = x
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(CALIBRATION_FILE))
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, as the benchmark)")
    ap.add_argument("--decode-steps", type=int, default=DECODE_STEPS)
    args = ap.parse_args(argv)
    from dataclasses import replace

    from kvloop.engine.config import EngineConfig
    from kvloop.engine.engine_core import EngineCore
    from kvloop.engine.kv.config import KVConfig
    from kvloop.engine.scheduler.scheduler import SchedulerConfig

    cfg = EngineConfig(kv_cache_tokens=16384,  # the largest shape holds ~9k tokens; fp32 KV is 45 KiB a token
                       scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=512),
                       kv=KVConfig(mode="continuous", host_cache_tokens=0), threads=args.threads, progress=False)
    engine = EngineCore(cfg)
    dtype = str(engine.dtype).removeprefix("torch.")
    model = replace(SMOLLM2_135M, dtype_bytes=4 if dtype == "float32" else 2)
    run_shapes(engine, [(1, 32), (4, 64)], 4, seed=99)  # warm-up, not fitted
    guard = NoiseGuard()
    with guard:
        rows = run_shapes(engine, SHAPES, args.decode_steps)
    result = {"machine": THIS_CPU.name, "dtype": dtype, "threads": args.threads, "model": model.name,
              "dtype_bytes": model.dtype_bytes, "fit": fit(rows, model), "noise": guard.report().as_dict(),
              "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("dtype", "fit")}, indent=1))
    print("noise:", {k: v for k, v in result["noise"].items() if k != "series"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
