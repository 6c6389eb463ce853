"""Simulator fidelity on this CPU: real engine runs of a short W1 variant per mode (through the
benchmark's own driver and targets) against the simulator on the same workload and sizing.

The W1 variant: lengths x0.25 (500-token documents, 38-token answers, 50-token replies), 16 document
questions and 4 four-turn chats (32 requests), Poisson at 1 request/s, pools x0.25 (as the benchmark's
Sizing.scaled). Real runs are saved on their own (sim_fidelity_real.json), so that the simulated side
can be recomputed after a new calibration without rerunning the engine (--sim-only).

    .venv/bin/python bench/sim_fidelity.py [--modes static,continuous,...] [--sim-only]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kvloop.engine.bench import workloads as bw
from kvloop.engine.sim.modes import Sizing

RESULTS = Path(__file__).resolve().parent / "results"
KEYS = (("throughput_tok_s", "output_throughput_tok_s"), ("ttft_p50_s", "ttft_p50_s"), ("ttft_p99_s", "ttft_p99_s"))
SCALE = 0.25


def workload(seed: int = 0) -> bw.Workload:
    return bw.w1(SCALE, num_doc_questions=16, num_sessions=4, rate=1.0, seed=seed)


def sim_sizing() -> Sizing:
    return Sizing().scaled(SCALE)  # the same sizes as the real runs


def run_real(modes: list[str], threads: int | None, save=None) -> dict:
    from kvloop.engine.bench.driver import run_workload
    from kvloop.engine.bench.guard import NoiseGuard
    from kvloop.engine.bench.metrics import client_metrics, server_metrics
    from kvloop.engine.bench.systems import engine_target

    sizing = sim_sizing()
    out = {}
    for mode in modes:
        target = engine_target(mode, sizing, threads)
        try:
            res = run_workload(workload(), target, guard=NoiseGuard(max_other_cores=0.3))
        finally:
            target.close()
        server = server_metrics(res.samples)
        server.pop("kv_use_series", None)
        out[mode] = {"client": client_metrics(res.records), "server": server, "noise": res.noise.as_dict() | {
            "series": []}, "info": res.info, "wall_s": res.wall_s}
        c = out[mode]["client"]
        if save:
            save(mode, out[mode])  # each mode as soon as it is measured (these runs are slow here)
        print(f"real {mode:15s} {c['output_throughput_tok_s']:8.1f} tok/s TTFT p50 {c['ttft_p50_s']:.3f} "
              f"p99 {c['ttft_p99_s']:.3f} other cores {res.noise.other_cores_mean:.2f}", flush=True)
    return out


def run_sim(modes: list[str], calibration: str | None) -> dict:
    from kvloop.engine.sim.profiles import get_profile
    from kvloop.engine.sim.simulator import SimConfig, Simulator
    from kvloop.engine.sim.workload import BenchWorkload

    prof = get_profile("cpu", calibration)
    return {m: Simulator(prof, BenchWorkload(workload()), SimConfig(mode=m, sizing=sim_sizing())).run() for m in modes}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="static,continuous,continuous+lru,codesign")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--sim-only", action="store_true", help="reuse the saved real runs")
    ap.add_argument("--calibration", default=None)
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    real_file = RESULTS / "sim_fidelity_real.json"
    saved = json.loads(real_file.read_text()) if real_file.exists() else {}
    if not args.sim_only:
        def save(mode: str, row: dict) -> None:
            saved[mode] = row
            real_file.write_text(json.dumps(saved, indent=1, default=str) + "\n")

        run_real(modes, args.threads, save)
    modes = [m for m in modes if m in saved]
    sim = run_sim(modes, args.calibration)
    table = {}
    for m in modes:
        real_c, sim_c = saved[m]["client"], sim[m]["client"]
        row = {"real": {k: real_c[src] for k, src in KEYS}, "sim": {k: sim_c[src] for k, src in KEYS}}
        row["rel_error"] = {k: (row["sim"][k] - row["real"][k]) / row["real"][k] for k, _ in KEYS}
        row["real_noise_other_cores"] = saved[m]["noise"].get("other_cores_mean")
        table[m] = row
        print(f"{m:15s} " + "  ".join(f"{k} real {row['real'][k]:.3f} sim {row['sim'][k]:.3f} ({row['rel_error'][k]:+.0%})"
                                      for k, _ in KEYS))
    report = {"modes": table, "workload": {"name": "W1 x0.25 lengths, 16 questions + 4x4 chat turns, 1 req/s",
                                           "sizing": sim_sizing().__dict__},
              "calibration": str(args.calibration or "bench/results/sim_calibration.json")}
    (RESULTS / "sim_fidelity.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
