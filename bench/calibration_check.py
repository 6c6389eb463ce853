"""Does the simulator's CPU calibration price this machine's steps? A check to run before comparing the
simulator with real runs (the VM type's speed differs between instances: a fit from a faster one
priced W5 CPU steps 17% low).

Runs the real engine on a slice of W5 CPU (one system, W5's rates by default), records
every step's shape and time
(sim_fidelity.StepTimer: the scheduler, runner and bookkeeping the simulator's step time stands for) and
prices the same steps with the CPU profile's cost model under the calibration: real against
predicted seconds per step kind
(decode only; with a prefill chunk after a cached prefix; with a cold prefill chunk) and in all. Writes
<out>/calibration_check.{json,md,png}; quiet machine (the other processes' CPU use is recorded).

    .venv/bin/python bench/calibration_check.py                      # 240 s of W5 CPU, codesign (~5 min)
    .venv/bin/python bench/calibration_check.py --calibration /tmp/cal.json --seconds 120
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from sim_fidelity import StepTimer  # bench/ is on sys.path when run as a script
from w5 import engine_sizing

from kvloop.engine.bench.goals import goal
from kvloop.engine.bench.numbers import fmt

RESULTS = Path(__file__).resolve().parent / "results"
KINDS = ("decode", "prefill after a cached prefix", "cold prefill")
BOUND = 0.1  # the whole slice's predicted / real seconds - 1 (abs): the fidelity goals are 15% on whole runs


def step_kind(items) -> str:
    """A step by its prefill chunks, (start, num_tokens, samples) per scheduled row: none, one that starts
    after tokens already computed or cached, or only chunks from the start."""
    chunks = [start for start, n, _ in items if n > 1]
    if not chunks:
        return KINDS[0]
    return KINDS[1] if any(start > 0 for start in chunks) else KINDS[2]


def compare(rows: list[dict], cost) -> dict:
    """Real and predicted seconds per step kind and in all; rows as StepTimer records them."""
    kinds = {k: {"steps": 0, "real_s": 0.0, "predicted_s": 0.0} for k in KINDS}
    for r in rows:
        items = [tuple(x) for x in r["items"]]
        k = kinds[step_kind(items)]
        k["steps"] += 1
        k["real_s"] += r["seconds"]
        k["predicted_s"] += cost.step_for(items, [tuple(g) for g in r.get("groups", ())]).seconds
    total = {"steps": sum(k["steps"] for k in kinds.values()),
             "real_s": sum(k["real_s"] for k in kinds.values()),
             "predicted_s": sum(k["predicted_s"] for k in kinds.values())}
    for k in (*kinds.values(), total):
        k["ratio"] = k["predicted_s"] / k["real_s"] if k["real_s"] else None
    return {"kinds": kinds, "total": total}


def goals(table: dict, noise: dict | None) -> list[dict]:
    t = table["total"]
    out = [goal("predicted / real step seconds - 1 (abs), all steps",
                abs(t["ratio"] - 1) if t["ratio"] is not None else None, "<=", BOUND)]
    if noise is not None:
        out.append(goal("other processes' cores during the run (mean)", noise.get("other_cores_mean"), "<=",
                        0.3))
    return out


def markdown(report: dict) -> str:
    m = report["meta"]
    lines = ["# Calibration check: the CPU profile's step prices against real W5 CPU steps", "",
             f"{m['system']} on {m['seconds']:g} s of W5 CPU arrivals (rates {json.dumps(m['rates'])}, seed "
             f"{m['seed']}), calibration `{m['calibration']}`; machine: {m.get('machine', {}).get('model')}, "
             f"{m.get('machine', {}).get('cores')} cores, torch threads {m['threads']}.", "",
             "| step kind | steps | real s | predicted s | predicted / real |", "|---|---|---|---|---|"]
    for name, k in [*report["table"]["kinds"].items(), ("all", report["table"]["total"])]:
        lines.append(f"| {name} | {k['steps']} | {fmt(k['real_s'], 1)} | {fmt(k['predicted_s'], 1)} | "
                     f"{fmt(k['ratio'])} |")
    for label, speed in (("this run", (report.get("noise") or {}).get("speed")),
                         ("the calibration's runs", m.get("calibration_speed"))):
        if speed:  # the machine's own speed (engine/bench/speed_probe.py): the fit holds where they agree
            lines += ["", f"Speed probe during {label} (thread CPU ms, median and spread): " + ", ".join(
                f"{k} {fmt(speed[k]['median_ms'])} ({fmt(speed[k]['spread'])})" for k in ("compute",
                                                                                          "memory"))]
    lines += ["", "## Goals", ""] + [f"- {json.dumps(g, default=str)}" for g in report["goals"]]
    lines += ["", f"![calibration_check]({report['plot']})" if report.get("plot") else "", "", "## Command",
              "",
              f"    {m['command']}", ""]
    return "\n".join(lines)


def plot(report: dict, path: Path) -> str | None:
    from kvloop.engine.bench.w5_report import pyplot

    plt = pyplot()
    if plt is None:
        return None
    kinds = report["table"]["kinds"]
    names = list(kinds)
    fig, ax = plt.subplots(figsize=(7, 3.8))
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [kinds[n]["real_s"] for n in names], width=0.4, label="real")
    ax.bar([x + 0.2 for x in xs], [kinds[n]["predicted_s"] for n in names], width=0.4, label="predicted")
    ax.set_xticks(list(xs), names, fontsize=8)
    ax.set(ylabel="seconds (sum over steps)", title="Step time by kind: real engine vs the calibrated model")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path.name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", default="codesign", help="a W5 system name (bench/w5.py's)")
    ap.add_argument("--seconds", type=float, default=240.0,
                    help="seconds of W5 CPU arrivals (2 phases by default)")
    ap.add_argument("--phase-rates", default="0.482,0.231",
                    help="'chat,rag' requests/s (default: w5_cpu.json's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calibration", default=None, help="calibration JSON (default: the profile's)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    import torch

    from kvloop.engine.bench.driver import run_workload
    from kvloop.engine.bench.guard import NoiseGuard
    from kvloop.engine.bench.machine import machine_info
    from kvloop.engine.bench.w5_engine import variant_target
    from kvloop.engine.bench.w5_workload import parse_phase_rates, w5
    from kvloop.engine.sim.profiles import CALIBRATION_FILE, get_profile

    torch.set_num_threads(args.threads)
    rates = parse_phase_rates(args.phase_rates)
    wl = w5("w5", rates, seed=args.seed, duration_s=args.seconds)
    target, _ = variant_target(args.system, engine_sizing(wl), args.threads)
    rows: list[dict] = []
    StepTimer(target.engine, rows)
    guard = NoiseGuard()
    try:
        res = run_workload(wl, target, progress=False, guard=guard)
    finally:
        target.close()
    table = compare(rows, get_profile("cpu", args.calibration).cost_model())
    fitted = json.loads(Path(args.calibration or CALIBRATION_FILE).read_text())
    noise = {k: v for k, v in res.noise.as_dict().items() if k != "series"} if res.noise else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"meta": {"system": args.system, "seconds": args.seconds,
                       "rates": {"chat": rates[0], "rag": rates[1]},
                       "seed": args.seed, "threads": args.threads,
                       "calibration": str(args.calibration
                                          or CALIBRATION_FILE.relative_to(RESULTS.parents[1])),
                       "machine": machine_info(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                       "calibration_speed": (fitted.get("noise") or {}).get("speed"),
                       "command": ".venv/bin/python bench/calibration_check.py " + " ".join(sys.argv[1:])},
              "table": table, "noise": noise, "goals": goals(table, noise)}
    report["plot"] = plot(report, out / "calibration_check.png")
    (out / "calibration_check.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "calibration_check.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
