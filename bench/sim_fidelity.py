"""Simulator fidelity on this CPU: real engine runs of a short W1 variant per mode (through the
benchmark's own driver and targets) against the simulator on the same workloads and sizing.

The W1 variant: lengths x0.25 (500-token documents, 38-token answers, 50-token replies), 16 document
questions and 4 four-turn chats (32 requests), Poisson at 1 request/s, pools x0.25 (as the benchmark's
Sizing.scaled). One such run is small: which requests share a static batch or a step, and so the P99 of
32 TTFTs (the slowest request or two), moves by tens of percent with the arrival draw. So each mode runs on
several seeds (real and simulated alike). Throughput is the median over seeds; TTFT percentiles are taken
over the pooled requests of all seeds (32 x seeds TTFTs: a P99 of 160 rather than the maximum of 32). The
per-seed medians of P50/P99 are reported as well. The calibration (sim_calibrate.py) uses seed 1,
so the seeds here exclude it. Real runs are saved on their own (sim_fidelity_real.json, per mode and
seed), so that the simulated side can be recomputed after a new calibration without rerunning the
engine (--sim-only). Writes sim_fidelity.json, .md and .png (pooled TTFT CDFs, real against simulated).

--w5 [REAL_JSON] checks W5 at CPU scale instead (sim_fidelity_w5.py): the real engine's runs in a bench/w5.py
cpu results file (default bench/results/w5_cpu.json; read, not rerun) against the simulator on the same
workload and sizing, per system; writes sim_fidelity_w5.json (goals: simulated output throughput within 15% of
the real engine's, per system), .md and .png. --modes, --seeds, --rerun, --threads and --sim-only are W1's.

    .venv/bin/python bench/sim_fidelity.py --threads 1 [--modes static,...] [--seeds 0,2,3,4,5] [--sim-only]
    [--rerun] .venv/bin/python bench/sim_fidelity.py --w5 [bench/results/w5_cpu.json]
    [--systems a,b] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from kvloop.engine.bench import workloads as bw
from kvloop.engine.bench.goals import goal
from kvloop.engine.bench.machine import machine_info
from kvloop.engine.bench.metrics import percentile
from kvloop.engine.core.policy import policy_names
from kvloop.engine.sim.modes import Sizing

RESULTS = Path(__file__).resolve().parent / "results"
KEYS = (("throughput_tok_s", "output_throughput_tok_s"), ("ttft_p50_s", "ttft_p50_s"),
        ("ttft_p99_s", "ttft_p99_s"))
SCALE = 0.25
SEEDS = (0, 2, 3, 4, 5)
GOAL = 0.15


def rel_error(sim: float | None, real: float | None) -> float | None:
    """(sim - real) / real; None where either is missing or NaN, or real is 0."""
    if not all(isinstance(x, int | float) and not math.isnan(x) for x in (sim, real)) or not real:
        return None
    return (sim - real) / real


def workload(seed: int = 0) -> bw.Workload:
    return bw.w1(SCALE, num_doc_questions=16, num_sessions=4, rate=1.0, seed=seed)


def sim_sizing() -> Sizing:
    return Sizing().scaled(SCALE)  # the same sizes as the real runs


class StepTimer:
    """Wraps an engine's step (and its runner's execute): counts steps and their seconds and, when
    `rows` is given, records each step that ran a batch as {"shape": label(items), "items", "groups",
    "seconds"} with items = (start, num_tokens, samples) per scheduled sequence and groups = the decode
    rows' cascaded (members, shared tokens), planned after the timed step as the runner planned them."""

    def __init__(self, engine, rows: list[dict] | None = None, label=lambda items: [len(items)]):
        self.steps, self.seconds, self.rows, self.label = 0, 0.0, rows, label
        self._items: list | None = None
        self._decodes: tuple[list, list] = ([], [])
        step, execute = engine.step, engine.runner.execute
        cascade = engine.config.cascade != "off"

        def spy(batch):
            self._items = [(it.start, it.num_tokens, it.samples) for it in batch.items]
            if self.rows is not None and cascade:  # copies: a finished request's table is released
                self._decodes = ([list(it.seq.block_table) for it in batch.decodes],
                                 [it.start + 1 for it in batch.decodes])
            return execute(batch)

        def groups() -> list:
            tables, lens = self._decodes
            self._decodes = ([], [])
            if len(tables) < 2:
                return []
            cost = engine.scheduler.step_cost
            return [list(g) for g in cost.group_shapes(cost.plan(tables, lens))]

        def timed_step():
            self._items = None
            t = time.perf_counter()
            out = step()
            dt = time.perf_counter() - t
            self.steps += 1
            self.seconds += dt
            if self.rows is not None and self._items is not None:
                self.rows.append({"shape": self.label(self._items), "items": self._items, "groups": groups(),
                                  "seconds": dt})
            return out

        engine.runner.execute, engine.step = spy, timed_step


def run_real(mode: str, seed: int, threads: int | None) -> dict:
    from kvloop.engine.bench.driver import run_workload
    from kvloop.engine.bench.guard import NoiseGuard
    from kvloop.engine.bench.metrics import client_metrics, server_metrics
    from kvloop.engine.bench.systems import engine_target

    target = engine_target(mode, sim_sizing(), threads)
    busy = StepTimer(target.engine)  # engine time vs the simulator's runner time: step cost vs scheduling
    try:
        res = run_workload(workload(seed), target, guard=NoiseGuard(max_other_cores=0.3))
    finally:
        target.close()
    server = server_metrics(res.samples)
    server.pop("kv_use_series", None)
    c = client_metrics(res.records)
    print(f"real {mode:15s} seed {seed}: {c['output_throughput_tok_s']:8.1f} tok/s TTFT p50 "
          f"{c['ttft_p50_s']:.3f} p99 {c['ttft_p99_s']:.3f} other cores {res.noise.other_cores_mean:.2f}",
          flush=True)
    return {"client": c, "server": server, "noise": res.noise.as_dict() | {"series": []}, "info": res.info,
            "machine": machine_info(),
            "wall_s": res.wall_s, "engine_steps": busy.steps, "engine_busy_s": busy.seconds,
            "ttfts": ttfts(res.records)}


def ttfts(records) -> list[float]:
    """Each completed request's TTFT, in request-id order (pooled across seeds for the percentiles)."""
    return [r.ttft for r in sorted(records, key=lambda r: r.request_id) if r.ok]


def run_sim(mode: str, seed: int, calibration: str | None) -> dict:
    from kvloop.engine.sim.profiles import get_profile
    from kvloop.engine.sim.simulator import SimConfig, Simulator
    from kvloop.engine.sim.workload import BenchWorkload

    prof = get_profile("cpu", calibration)
    sim = Simulator(prof, BenchWorkload(workload(seed)), SimConfig(mode=mode, sizing=sim_sizing()))
    out = sim.run()
    out["ttfts"] = ttfts(sim.rec.records.values())
    return out


def pooled(runs: list[dict]) -> dict:
    """Median throughput over seeds; TTFT P50/P99 over all seeds' requests together."""
    xs = [t for r in runs for t in r["ttfts"]]
    return {"throughput_tok_s": statistics.median(r["client"]["output_throughput_tok_s"] for r in runs),
            "ttft_p50_s": percentile(xs, 50), "ttft_p99_s": percentile(xs, 99), "requests": len(xs)}


def compare(saved: dict, modes: list[str], seeds: list[int], calibration: str | None) -> dict:
    table = {}
    for m in modes:
        have = [s for s in seeds if str(s) in saved.get(m, {})]
        if not have:
            continue
        runs = [saved[m][str(s)] for s in have]
        real = [r["client"] for r in runs]
        sims = [run_sim(m, s, calibration) for s in have]
        sim = [x["client"] for x in sims]
        if any("ttfts" not in r for r in runs):
            raise SystemExit(f"{m}: saved real runs without per-request TTFTs (rerun without --sim-only)")
        row = {"real": pooled(runs), "sim": pooled(sims), "seeds": have,
               "median_over_seeds": {"real": {k: statistics.median(r[src] for r in real) for k, src in KEYS},
                                     "sim": {k: statistics.median(r[src] for r in sim) for k, src in KEYS}},
               "per_seed": {str(s): {"real": {k: r[src] for k, src in KEYS},
                                     "sim": {k: x[src] for k, src in KEYS}}
                            for s, r, x in zip(have, real, sim, strict=True)},
               "busy_s": {"real": statistics.median(saved[m][str(s)].get("engine_busy_s") or 0 for s in have),
                          "sim": statistics.median(x["sim"]["runner_busy_s"] for x in sims)},
               "steps": {"real": statistics.median(saved[m][str(s)].get("engine_steps") or 0 for s in have),
                         "sim": statistics.median(x["sim"]["steps"] for x in sims)},
               "real_noise_other_cores": max(saved[m][str(s)]["noise"].get("other_cores_mean") or 0
                                             for s in have)}
        row["ttfts"] = {"real": sorted(t for r in runs for t in r["ttfts"]),
                        "sim": sorted(t for x in sims for t in x["ttfts"])}
        row["rel_error"] = {k: rel_error(row["sim"][k], row["real"][k]) for k, _ in KEYS}
        row["within_goal"] = all(e is not None and abs(e) <= GOAL for e in row["rel_error"].values())
        table[m] = row
        print(f"{m:15s} " + "  ".join(f"{k} real {row['real'][k]:.3f} sim {row['sim'][k]:.3f} "
                                      f"({row['rel_error'][k]:+.0%})" for k, _ in KEYS), flush=True)
    return table


def real_goals(saved: dict) -> list[dict]:
    """The saved real runs' own goal: each ran on a quiet machine (the worst run's other processes' cores)."""
    worst = max((run["noise"].get("other_cores_mean") or 0.0 for runs in saved.values()
                 for run in runs.values()),
                default=None)
    return [goal("other processes' cores during the real runs (mean, worst run)", worst, "<=", 0.3)]


def real_machine(saved: dict, modes: list[str]) -> dict | None:
    """The machine the compared real runs ran on (None where a run did not record it, or they differ)."""
    machines = [run.get("machine") for m in modes for run in saved.get(m, {}).values()]
    return machines[0] if machines and all(x == machines[0] for x in machines) else None


def w1_goals(table: dict) -> list[dict]:
    """Per mode, |simulated / real - 1| of throughput, TTFT P50 and P99 (the table's
    within_goal: all three)."""
    return [goal(f"{m}: simulated / real {k} - 1 (abs)",
                 abs(e) if (e := row["rel_error"][k]) is not None else None,
                 "<=", GOAL, values=[row["sim"][k], row["real"][k]])
            for m, row in table.items() for k, _ in KEYS]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default=",".join(policy_names()))
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    ap.add_argument("--rerun", action="store_true", help="rerun saved (mode, seed) pairs too")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--sim-only", action="store_true", help="reuse the saved real runs")
    ap.add_argument("--calibration", default=None)
    ap.add_argument("--w5", nargs="?", const=str(RESULTS / "w5_cpu.json"), default=None, metavar="REAL_JSON",
                    help="W5 instead of W1: a bench/w5.py cpu results file (default "
                    "bench/results/w5_cpu.json)")
    ap.add_argument("--systems", default=None, help="--w5: comma list of the file's systems (default: all)")
    ap.add_argument("--jobs", type=int, default=1, help="--w5: systems simulated in parallel processes")
    ap.add_argument("--out", default=str(RESULTS), help="--w5: output folder")
    ap.add_argument("--name", default=None,
                    help="--w5: file stem (default sim_fidelity_w5; one per real file compared)")
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    if args.w5:
        from sim_fidelity_w5 import run_w5  # bench/ is on sys.path when run as a script

        return run_w5(args.w5, args.systems, args.calibration, args.jobs, args.out, argv, args.name)
    modes = [m for m in args.modes.split(",") if m]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    real_file = RESULTS / "sim_fidelity_real.json"
    saved = json.loads(real_file.read_text()) if real_file.exists() else {}
    # per mode and seed; drop the old one-seed layout and the file's goals (rewritten with every run)
    saved = {m: v for m, v in saved.items() if m != "goals" and "client" not in v}
    if not args.sim_only:
        for seed in seeds:  # seeds outside, modes inside: a noisy stretch hits one seed of each mode
            for mode in modes:
                if str(seed) in saved.get(mode, {}) and "ttfts" in saved[mode][str(seed)] and not args.rerun:
                    continue  # already measured (a long run can be resumed)
                saved.setdefault(mode, {})[str(seed)] = run_real(mode, seed, args.threads)
                real_file.write_text(json.dumps(saved | {"goals": real_goals(saved)}, indent=1, default=str)
                                     + "\n")  # each run as it lands
    table = compare(saved, modes, seeds, args.calibration)
    report = {"modes": table, "goal_rel_error": GOAL,
              "workload": {"name": "W1 x0.25 lengths, 16 questions + 4x4 chat turns, 1 req/s",
                           "seeds": seeds, "sizing": sim_sizing().__dict__},
              "statistic": "throughput: median over seeds; TTFT P50/P99: over all seeds' requests pooled "
                           "(median_over_seeds has the per-seed medians); real and simulated alike",
              "calibration": str(args.calibration or "bench/results/sim_calibration.json"),
              "goals": w1_goals(table), "machine": real_machine(saved, modes)}
    (RESULTS / "sim_fidelity.json").write_text(json.dumps(report, indent=1) + "\n")
    from sim_fidelity_report import write_report  # bench/ is on sys.path when run as a script

    write_report(RESULTS, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
