"""The TPOT target (SchedulerConfig.tpot_target_ms, scheduler/tpot_gate.py) against fixed batch caps, in the
simulator on W1 at full length (rate 4, the real W1 run's pool): does the gate hold the TPOT P50 it is given,
and what throughput does it keep against the best hand-chosen cap that meets the same TPOT? Both modes,
codesign and continuous+lru, each with a sweep of fixed caps and of targets. Writes
bench/results/<name>.{json,md,png}.

    .venv/bin/python bench/tpot_target.py --calibration bench/results/sim_calibration_avx512bf16.json \
        --name tpot_target_sim_avx512bf16     # seconds; the simulator calibrated on the AVX512-BF16 AMD

Goals, per mode and target: TPOT P50 <= 1.05 x the target; throughput >= 0.97 x the best fixed cap whose TPOT
P50 is within the target (the gate, which knows nothing of the workload, as good as a cap tuned to it)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from kvloop.engine.bench import workloads as bw
from kvloop.engine.bench.goals import goal
from kvloop.engine.bench.machine import machine_info
from kvloop.engine.bench.numbers import fmt
from kvloop.engine.bench.w5_variants import Variant, sized
from kvloop.engine.sim.profiles import get_profile
from kvloop.engine.sim.scenarios import sizing_for
from kvloop.engine.sim.simulator import SimConfig, Simulator
from kvloop.engine.sim.workload import BenchWorkload

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ("codesign", "continuous+lru")
CAPS = (8, 12, 16, 20, 24, 32, 48, 64)
TARGETS = (60.0, 80.0, 100.0, 120.0)
TPOT_SLACK = 1.05  # TPOT P50 at most this times the target
CAP_SHARE = 0.97  # throughput at least this share of the best fixed cap within the target


def simulate(v: Variant, profile, sizing, rate: float) -> dict:
    run_sizing = sized(v, sizing)
    sim = Simulator(profile, BenchWorkload(bw.w1(1.0, seed=0, rate=rate)),
                    SimConfig(mode=v.mode, sizing=run_sizing))
    c = sim.run()["client"]
    return {"system": v.name, "mode": v.mode, "cap": run_sizing.max_num_seqs, "tpot_target_ms": v.tpot_ms,
            "throughput_tok_s": c["output_throughput_tok_s"], "ttft_p50_s": c["ttft_p50_s"],
            "ttft_p99_s": c["ttft_p99_s"], "tpot_p50_s": c["tpot_p50_s"], "tpot_p99_s": c["tpot_p99_s"],
            "completed": c["completed"], "failed": c["failed"], "holds": sim.scheduler.tpot_gate.holds}


def best_cap_within(runs: list[dict], mode: str, tpot_s: float) -> dict | None:
    """The fixed-cap run of `mode` with the highest throughput among those whose TPOT P50 is within tpot_s."""
    fits = [r for r in runs if r["mode"] == mode and r["tpot_target_ms"] is None
            and r["tpot_p50_s"] <= tpot_s]
    return max(fits, key=lambda r: r["throughput_tok_s"]) if fits else None


def goals(runs: list[dict]) -> list[dict]:
    out = []
    for r in runs:
        target = r["tpot_target_ms"]
        if target is None:
            continue
        out.append(goal(f"{r['system']}: TPOT P50 / target", r["tpot_p50_s"] * 1000 / target, "<=",
                        TPOT_SLACK))
        best = best_cap_within(runs, r["mode"], target / 1000)
        out.append(goal(f"{r['system']}: throughput / best fixed cap within the target", r["throughput_tok_s"]
                        / best["throughput_tok_s"] if best else None, ">=", CAP_SHARE,
                        cap=best["system"] if best else None))
    return out


def markdown(report: dict) -> str:
    m = report["meta"]
    lines = ["# The TPOT target against fixed batch caps (simulator, W1 full length)", "", m["summary"], "",
             f"Profile `{m['profile']}` with calibration `{m['calibration']}`; W1 at {m['rate']:g} "
             f"requests/s, {m['num_requests']} requests, device pool {m['kv_cache_tokens']} tokens.", "",
             "| system | cap | TPOT target ms | out tok/s | TTFT P50 s | TTFT P99 s | TPOT P50 ms | TPOT P99 "
             "ms | held admissions |", "|---|---|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        lines.append(f"| {r['system']} | {r['cap']} | {fmt(r['tpot_target_ms'], 0)} | "
                     f"{fmt(r['throughput_tok_s'], 1)} | {fmt(r['ttft_p50_s'], 2)} | "
                     f"{fmt(r['ttft_p99_s'], 2)} | {fmt(r['tpot_p50_s'], 1, 1000)} | "
                     f"{fmt(r['tpot_p99_s'], 0, 1000)} | {r['holds']} |")
    lines += ["", "## Goals", ""] + ["- " + json.dumps(g, default=str) for g in report["goals"]]
    lines += ["", "## Plots", "", f"![{m['name']}]({m['name']}.png)", "", "## Commands", "",
              f"    {m['command']}", ""]
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode, color in zip(MODES, ("tab:blue", "tab:orange"), strict=True):
        caps = [r for r in report["runs"] if r["mode"] == mode and r["tpot_target_ms"] is None]
        ax.plot([r["tpot_p50_s"] * 1000 for r in caps], [r["throughput_tok_s"] for r in caps], "o-",
                color=color,
                label=f"{mode}, fixed caps")
        for r in caps:
            ax.annotate(str(r["cap"]), (r["tpot_p50_s"] * 1000, r["throughput_tok_s"]), fontsize=7,
                        textcoords="offset points", xytext=(3, -9))
        held = [r for r in report["runs"] if r["mode"] == mode and r["tpot_target_ms"] is not None]
        ax.plot([r["tpot_p50_s"] * 1000 for r in held], [r["throughput_tok_s"] for r in held], "*",
                color=color,
                markersize=12, label=f"{mode}, TPOT target")
        for r in held:
            ax.annotate(f"{r['tpot_target_ms']:g} ms", (r["tpot_p50_s"] * 1000, r["throughput_tok_s"]),
                        fontsize=7,
                        textcoords="offset points", xytext=(4, 4))
    ax.set_xlabel("TPOT P50 (ms)")
    ax.set_ylabel("output tokens/s")
    ax.set_title("W1 full length, simulated: fixed caps (numbers) and TPOT targets (stars)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calibration", default=None,
                   help="the CPU profile's calibration (default: its default file)")
    p.add_argument("--rate", type=float, default=4.0)
    p.add_argument("--kv-cache-tokens", type=int, default=93200, help="the real W1 full run's device pool")
    p.add_argument("--name", default="tpot_target_sim")
    p.add_argument("--out", default=str(RESULTS))
    a = p.parse_args(argv)
    profile = get_profile("cpu", a.calibration)
    sizing = sizing_for(profile, a.kv_cache_tokens)
    variants = [Variant(m, cap=c) for m in MODES for c in CAPS] + [Variant(m,
                                                                           tpot_ms=t) for m in MODES
                                                                           for t in TARGETS]
    t0 = time.process_time()
    runs = [simulate(v, profile, sizing, a.rate) for v in variants]
    command = " ".join([".venv/bin/python", "bench/tpot_target.py",
                        *(argv if argv is not None else sys.argv[1:])])
    report = {"meta": {"name": a.name, "profile": profile.name, "calibration": a.calibration, "rate": a.rate,
                       "kv_cache_tokens": a.kv_cache_tokens,
                       "num_requests": runs[0]["completed"] + runs[0]["failed"],
                       "cpu_s": round(time.process_time() - t0, 1), "machine": machine_info(),
                       "command": command,
                       "summary": "Each row one simulated run of the same workload. A fixed cap bounds the "
                                  "running requests; a TPOT target (`mode@tpotN`) leaves the default cap and "
                                  "holds admission while the recent decode steps are slower than the target "
                                  "(scheduler/tpot_gate.py)."},
              "runs": runs, "goals": goals(runs)}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{a.name}.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / f"{a.name}.md").write_text(markdown(report))
    plot(report, out / f"{a.name}.png")
    for g in report["goals"]:
        print(("met   " if g["met"] else "MISSED"), g["name"], fmt(g["value"], 3), g["op"], g["bound"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
