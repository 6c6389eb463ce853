"""W1 at GPU scale on a simulated H200 with Llama-3-8B (bench/results/sim_h200.json + .md + plots).

Parts (run separately, each writes bench/results/sim_h200_<part>.json; `report` merges them):
- compare: static vs continuous vs continuous+lru vs codesign at several Poisson rates (W1-gpu:
  200 documents, 4-turn chats; `--duration` seconds of arrivals each, then the drain);
- sweep:   the coordinator period (5, 10, 30, 60, 120 s) on codesign under a load that switches between
  a light and a heavy rate every `--phase` seconds, against codesign without the coordinator;
- gate:    codesign's device admission gate (keep a block only once several distinct requests used it)
  against a gate of 1 (keep every block, as LRU does) and continuous+lru, at each of `--rates`;
- speed:   CPU time of one simulated hour of W1-gpu per mode at each of `--rates` (`--sim-seconds` of
           arrivals, 3600 by default; a shorter run is scaled to an hour by its virtual seconds), with a goal
           of <= 120 CPU s per simulated hour for each run;
- report:  sim_h200.json, sim_h200.md and plots from the parts.

    .venv/bin/python bench/sim_h200.py compare --rates 10,25,40 --duration 120
    .venv/bin/python bench/sim_h200.py sweep --rates 8,30 --phase 180 --phases 4
    .venv/bin/python bench/sim_h200.py gate --rates 40,80 --duration 300
    .venv/bin/python bench/sim_h200.py speed --rates 10,20,40
    .venv/bin/python bench/sim_h200.py speed --rates 80 --modes codesign --sim-seconds 300 --tag _b
    .venv/bin/python bench/sim_h200.py report
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from kvloop.engine.core.policy import policy_names
from kvloop.engine.sim.profiles import get_profile
from kvloop.engine.sim.scenarios import gpu_sizing, gpu_w1, phased_w1
from kvloop.engine.sim.simulator import SimConfig, Simulator
from kvloop.engine.sim.workload import BenchWorkload
from kvloop.sidecar.settings import Bounds, Settings

RESULTS = Path(__file__).resolve().parent / "results"
PERIODS = (5.0, 10.0, 30.0, 60.0, 120.0)


def feedback(period: float) -> Settings:
    """The sidecar's defaults, with batch-cap bounds for a GPU (the default 1..64 suits the CPU), a
    conservative initial cap of 32 (so there is something to adapt) and a 0.5 s P99 TTFT objective."""
    return Settings(period_s=period, batch_cap=Bounds(16, 512, 64, 32), ttft_p99_s=0.5)


def summary(res: dict) -> dict:
    c, s, sim = res["client"], res["server"], res["sim"]
    hours = max(sim["virtual_s"], 1e-9) / 3600
    return {
        "throughput_tok_s": c["output_throughput_tok_s"], "throughput_req_s": c["request_throughput_req_s"],
        "ttft_p50_s": c["ttft_p50_s"], "ttft_p99_s": c["ttft_p99_s"], "tpot_p50_s": c["tpot_p50_s"],
        "itl_p99_s": c["itl_p99_s"], "e2e_p99_s": c["e2e_p99_s"], "completed": c["completed"],
        "failed": c["failed"], "oom_events": s["oom_events"], "oom_per_hour": (s["oom_events"] or 0) / hours,
        "preemptions": s["preemptions"], "kv_use_mean": s["kv_use_mean"], "kv_use_max": s["kv_use_max"],
        "kv_use_mean_while_waiting": s["kv_use_mean_while_waiting"], "hit_rate_total": s["hit_rate_total"],
        "hit_rate_device": s["hit_rate_device"], "hit_rate_host": s["hit_rate_host"],
        "virtual_s": sim["virtual_s"], "steps": sim["steps"], "wall_s": sim.get("wall_s"),
        "cpu_s": sim.get("cpu_s"),
        "static_batches": sim.get("static_batches"),
    }


def run(mode: str, wl, fb: Settings | None = None, sample_every: float = 1.0, kv: dict | None = None) -> dict:
    prof = get_profile("h200")
    t, cpu = time.perf_counter(), time.process_time()
    res = Simulator(prof, BenchWorkload(wl),
                    SimConfig(mode=mode, sizing=gpu_sizing(prof), feedback=fb, kv=kv or {},
                                                       sample_every_s=sample_every)).run()
    res["sim"]["wall_s"] = time.perf_counter() - t
    # this process's CPU time: what a quiet machine would take
    res["sim"]["cpu_s"] = time.process_time() - cpu
    return res


def part_compare(args) -> dict:
    out = {"duration_s": args.duration, "rates": {}}
    for rate in args.rates:
        row = {}
        for mode in args.modes:
            res = run(mode, gpu_w1(rate, args.duration, args.seed))
            row[mode] = summary(res)
            row[mode]["kv_series"] = res["server"]["kv_use_series"][::5]
            row[mode]["duration_s"] = args.duration
            print(f"rate {rate:g} {mode:15s}", {k: round(v, 3) if isinstance(v, float) else v
                                                 for k, v in row[mode].items() if k != "kv_series"},
                                                 flush=True)
        out["rates"][f"{rate:g}"] = row
    return out


def part_sweep(args) -> dict:
    rates = (args.rates * args.phases)[: args.phases] if len(args.rates) < args.phases else args.rates
    out = {"rates": rates, "phase_s": args.phase, "runs": {}}
    periods = ([] if args.no_baseline else [None]) + list(args.periods)
    for p in periods:
        wl = phased_w1(rates, args.phase, args.seed)
        res = run("codesign", wl, feedback(p) if p else None)
        row = summary(res)
        if p:
            row["changes"] = res["feedback"]["changes"]
            row["ticks"] = res["feedback"]["ticks"]
        out["runs"][f"{p:g}" if p else "none"] = row
        print(f"period {p}", {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()
                              if k != "changes"}, flush=True)
    return out


GATE_VARIANTS = (("continuous+lru", "continuous+lru", {}), ("codesign", "codesign", {}),
                 ("codesign, gate 1", "codesign", {"admit_min_requests": 1}))


def part_gate(args) -> dict:
    """codesign with its default device gate (a block stays cached on the device once 3 distinct requests
    used it; colder blocks go to the host tier) against a gate of 1 and against continuous+lru."""
    out = {"duration_s": args.duration, "rates": {}}
    for rate in args.rates:
        row = {}
        for name, mode, kv in GATE_VARIANTS:
            row[name] = summary(run(mode, gpu_w1(rate, args.duration, args.seed), kv=kv))
            row[name]["kv_overrides"] = kv
            print(f"rate {rate:g} {name:17s}", {k: round(row[name][k], 3) for k in (
                "throughput_tok_s", "ttft_p50_s", "ttft_p99_s", "hit_rate_device", "hit_rate_host")},
                flush=True)
        out["rates"][f"{rate:g}"] = row
    return out


def part_speed(args) -> dict:
    """One simulated hour per mode and rate (or `--sim-seconds` of arrivals, scaled to an hour by the run's
    virtual seconds, drain included); CPU time of building the workload and of the run."""
    from kvloop.engine.bench.machine import machine_info

    out: dict = {"runs": {}, "sim_seconds": args.sim_seconds, "machine": machine_info()}
    for rate in args.rates:
        for mode in args.modes:
            cpu = time.process_time()
            wl = gpu_w1(rate, args.sim_seconds, args.seed)
            build_cpu = time.process_time() - cpu
            s = summary(run(mode, wl, sample_every=5.0))
            s.update(rate=rate, mode=mode, workload_cpu_s=build_cpu, sim_seconds=args.sim_seconds,
                     cpu_s_per_sim_hour=s["cpu_s"] / s["virtual_s"] * 3600)
            out["runs"][f"{rate:g}/{mode}"] = s
            print(f"{args.sim_seconds:g} s of arrivals at {rate:g} req/s, {mode}:", {k: s[k] for k in (
                "cpu_s", "workload_cpu_s", "wall_s", "virtual_s", "steps", "throughput_tok_s", "failed")},
                flush=True)
            del wl
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=("compare", "sweep", "gate", "speed", "report"))
    ap.add_argument("--rates", default="10,25,40")
    ap.add_argument("--modes", default=",".join(policy_names()))
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--phase", type=float, default=180.0)
    ap.add_argument("--phases", type=int, default=4)
    ap.add_argument("--periods", default=",".join(f"{p:g}" for p in PERIODS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sim-seconds", type=float, default=3600.0, help="speed: seconds of arrivals per run")
    ap.add_argument("--no-baseline", action="store_true", help="sweep: skip codesign without the coordinator")
    ap.add_argument("--tag", default="", help="suffix for the part's file (parallel runs)")
    args = ap.parse_args(argv)
    args.rates = [float(x) for x in args.rates.split(",")]
    args.modes = args.modes.split(",")
    args.periods = [float(x) for x in args.periods.split(",")]
    if args.part == "report":
        from sim_h200_report import write_report  # bench/ is on sys.path when run as a script

        write_report(RESULTS)
        return 0
    t = time.perf_counter()
    data = {"compare": part_compare, "sweep": part_sweep, "gate": part_gate,
            "speed": part_speed}[args.part](args)
    data["part_wall_s"] = time.perf_counter() - t
    if args.part == "compare":
        from sim_h200_report import compare_goals

        data["goals"] = compare_goals(data)
    if args.part == "sweep" and not args.no_baseline:
        from sim_h200_report import sweep_goals

        data["goals"] = sweep_goals(data)
    if args.part == "gate":
        from sim_h200_report import gate_goals

        data["goals"] = gate_goals(data)
    if args.part == "speed":
        from sim_h200_report import speed_goals

        data["goals"] = speed_goals(data)
    data["args"] = {k: v for k, v in vars(args).items()}
    (RESULTS / f"sim_h200_{args.part}{args.tag}.json").write_text(json.dumps(data, indent=1,
                                                                             default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
