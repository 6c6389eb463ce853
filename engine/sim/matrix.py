"""The robustness matrix on the simulated H200 (issue 57): systems x traces x loads, judged by the GPU SLO.

For each trace, continuous+lru's capacity at the SLO is found by a short sweep (matrix_sweep.py); each system
then runs at 0.5x, 1x and 1.5x of it. The fixed defaults (codesign) and every coordinator system get a
capacity sweep too, for the capacity goal. Writes <out-dir>/<stem>.json (meta, traces, sweeps with the rates
tried, cells, goals computed from them), .md and a heat map of goodput against continuous+lru's.

    python -m kvloop.engine.sim.matrix [--systems ...] [--traces ...] [--w1-s 120 ...]
(bench/matrix.py h200 calls main(argv) with the same arguments.)"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

from kvloop.engine.bench.metrics import GOOD_SHARE_FOR_CAPACITY
from kvloop.engine.core.slo import GPU_SLO
from kvloop.engine.sim import matrix_report as report
from kvloop.engine.sim.matrix_sweep import Runner, sweep
from kvloop.engine.sim.matrix_traces import SWEEP_START, TRACES, TraceOptions, Traces

SYSTEMS = ("codesign", "codesign+coord", "continuous+lru", "static")
LOADS = (0.5, 1.0, 1.5)
ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else list(argv)
    d = TraceOptions()
    p = argparse.ArgumentParser(prog="python -m kvloop.engine.sim.matrix", description=__doc__.split("\n")[0])
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   help="comma-separated names `kvloop simulate --modes` accepts (continuous+lru and "
                        "codesign are added where missing: the loads and the goals are relative to them)")
    p.add_argument("--traces", default=",".join(TRACES), help=f"comma-separated, of {', '.join(TRACES)}")
    p.add_argument("--loads", default=",".join(f"{x:g}" for x in LOADS), help="x continuous+lru's capacity")
    p.add_argument("--capacity-systems", default=None,
                   help="systems that get a capacity sweep besides continuous+lru (default: codesign and "
                        "every +coord system)")
    p.add_argument("--w1-s", type=float, default=d.w1_s, help="W1-gpu: seconds of arrivals per run")
    p.add_argument("--w5-s", type=float, default=d.w5_s, help="W5-gpu: seconds of arrivals per run")
    p.add_argument("--w5-phase-s", type=float, default=d.w5_phase_s, help="W5-gpu: phase length")
    p.add_argument("--mooncake-s", type=float, default=d.mooncake_s, help="mooncake: seconds of arrivals")
    p.add_argument("--mooncake", type=Path, default=d.mooncake_path, help="the synthetic trace (JSONL)")
    p.add_argument("--step", type=float, default=1.5, help="sweep: rate factor between coarse steps")
    p.add_argument("--refine", type=int, default=2, help="sweep: bisections after bracketing the capacity")
    p.add_argument("--max-steps", type=int, default=4, help="sweep: coarse steps at most each way")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--stem", default="matrix_h200")
    args = p.parse_args(argv)
    args.argv = argv
    return args


def _names(text: str) -> list[str]:
    return list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))


def _systems(text: str) -> list[str]:
    from kvloop.engine.bench.w5_variants import parse_variant

    names = _names(text)
    for must in (report.REFERENCE, report.FIXED):
        if must not in names:
            names.append(must)
    for n in names:
        parse_variant(n)  # refuses a name the simulator would not run, before any run
    return names


def _git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" (uncommitted changes in the tree)" if dirty else "")


def _host_cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_matrix(args: argparse.Namespace, log=print) -> dict:
    systems, traces = _systems(args.systems), _names(args.traces)
    loads = [float(x) for x in _names(args.loads)]
    unknown = [t for t in traces if t not in TRACES]
    if unknown:
        raise SystemExit(f"unknown traces {unknown} ({', '.join(TRACES)})")
    cap_systems = (_systems(args.capacity_systems) if args.capacity_systems else
                   [report.FIXED, *report.coordinator_systems(systems)])
    cap_systems = [report.REFERENCE] + [s for s in cap_systems if s != report.REFERENCE]
    opts = TraceOptions(args.w1_s, args.w5_s, args.w5_phase_s, args.mooncake_s, args.mooncake, args.seed)
    runner = Runner(Traces(opts), log)
    t0 = time.perf_counter()
    capacity: dict[str, dict] = {}
    cells: list[dict] = []
    for t in traces:
        capacity[t] = {}
        for s in cap_systems:  # the reference first: the others start from its capacity
            start = capacity[t][report.REFERENCE]["capacity_req_s"] if s != report.REFERENCE else None
            capacity[t][s] = sweep(runner, s, t, start or SWEEP_START[t], args.step, args.refine,
                                   args.max_steps)
        ref = capacity[t][report.REFERENCE]["capacity_req_s"]
        if ref is None:
            log(f"{t}: {report.REFERENCE} met the SLO at no rate tried: no cells")
            continue
        for x in loads:
            for s in systems:
                cells.append({**runner.run(s, t, ref * x), "load": x})
    result = {
        "meta": {"command": " ".join(["python -m kvloop.engine.sim.matrix", *args.argv]),
                 "git_commit": _git_commit(), "host_cpu": _host_cpu(),
                 "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                 "python": platform.python_version(), "wall_s": time.perf_counter() - t0,
                 "runs": runner.count,
                 "slo": {"ttft_base_s": GPU_SLO.ttft_base_s, "ttft_per_1k_s": GPU_SLO.ttft_per_1k_s,
                         "tpot_s": GPU_SLO.tpot_s},
                 "capacity_good_share": GOOD_SHARE_FOR_CAPACITY,
                 "sweep": {"step": args.step, "refine": args.refine, "max_steps": args.max_steps},
                 "windows_s": {t: opts.window(t) for t in traces},
                 "why_short": "windows of arrivals of minutes, not the hour of W1-gpu, so that the whole "
                              "matrix runs within about 15 minutes on one core"},
        "systems": systems, "capacity_systems": cap_systems, "traces_run": traces, "loads": loads,
        "reference": report.REFERENCE, "fixed": report.FIXED,
        "traces": {t: runner.traces.describe(t) for t in traces},
        "capacity": capacity, "cells": cells,
    }
    result["goals"] = report.goals(result)
    return result


def write(result: dict, out_dir: Path, stem: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md"]
    paths[0].write_text(json.dumps(result, indent=1, default=str) + "\n")
    paths[1].write_text(report.markdown(result))
    png = out_dir / f"{stem}.png"
    if report.heatmap(result, png):
        paths.append(png)
    return paths


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    result = run_matrix(args, log)
    for p in write(result, args.out_dir, args.stem):
        log(f"wrote {p}")
    for g in result["goals"]:
        log(f"{'met   ' if g['met'] else 'MISSED'} {g['name']}: {g['value']} {g['op']} {g['bound']}")
    log(f"{result['meta']['runs']} runs, {result['meta']['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
