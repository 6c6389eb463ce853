"""The fleet, live on the CPU (issue 55; bench/results/fleet_cpu.json + .md + .png): pods of `kvloop serve`
behind vllm-router, started by scripts/serve_fleet.sh.

1. hits: W1 and the Mooncake replay (lengths x --length-scale) through the router at a rate three pods
   sustain: the fleet's prefix-cache hit rate (hit / looked-up prompt tokens, summed over the pods' /metrics),
   goodput at the CPU SLO, TTFT and TPOT percentiles, for cache_aware (prefix-aware), round_robin,
   round_robin + the shared store, kv_aware (our KV events), and one pod alone on the same traffic.
2. store: a document prefilled on pod A then asked on pod B (sent to the pods directly) through the store,
   against a fresh document on pod B; then the store SIGKILLed while requests flow to pod B.
3. kill: one of three pods SIGKILLed while W1 flows through the router: who fails, with what status, how
   soon the router stops sending to it (the router's per-worker counters, scraped every 0.2 s; and the
   client's last failed request).

    .venv/bin/python bench/fleet_cpu.py [--steps hits,store,kill] [--estimate] [--smoke] [--out DIR]

--smoke: W1-smoke sizes, a 256-token document, short windows, one system pair; writes to a temporary
folder unless --out is given (bench/results holds full runs only).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from kvloop.engine.bench import fleet_cpu_report as R
from kvloop.engine.bench.fleet_cpu_fleet import ROUTER_ARGS, missing_tools
from kvloop.engine.bench.fleet_cpu_steps import (
    SYSTEMS,
    Plan,
    estimate_s,
    step_hit_rates,
    step_pod_kill,
    step_store,
)
from kvloop.engine.bench.machine import machine_info

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("hits", "store", "kill")
SMOKE = Plan(
    traffic_s=8.0,
    drain_s=20.0,
    rates=(("w1", 0.5),),
    doc_tokens=256,
    docs=2,
    kill_traffic_s=10.0,
    kill_at_s=4.0,
    kill_rate=1.0,
    smoke=True,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench/fleet_cpu.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", default=",".join(STEPS))
    p.add_argument("--traffic-s", type=float, default=Plan.traffic_s, help="seconds of arrivals per hit cell")
    p.add_argument("--drain-s", type=float, default=Plan.drain_s)
    p.add_argument(
        "--length-scale",
        type=float,
        default=Plan.length_scale,
        help="W1 (w1_scale) and Mooncake (mooncake_scale) token lengths",
    )
    p.add_argument(
        "--rates",
        default=",".join(f"{t}={r:g}" for t, r in Plan.rates),
        help="req/s per trace through the router (a load three pods sustain)",
    )
    p.add_argument("--doc-tokens", type=int, default=Plan.doc_tokens)
    p.add_argument("--docs", type=int, default=Plan.docs)
    p.add_argument(
        "--systems",
        default="",
        help="step 1's systems (default: all; --smoke: the first three) of "
        + ", ".join(s[0] for s in SYSTEMS),
    )
    p.add_argument("--estimate", action="store_true", help="print the run's estimated wall time and exit")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: checks that it runs, measures nothing")
    p.add_argument("--out", default="", help="results folder (default bench/results; --smoke: a temp dir)")
    p.add_argument("--name", default="fleet_cpu")
    return p.parse_args(argv)


def plan_of(args: argparse.Namespace) -> Plan:
    if args.smoke:
        return SMOKE
    rates = tuple(
        (t.strip(), float(r)) for t, r in (x.split("=") for x in args.rates.split(",") if x.strip())
    )
    return replace(
        Plan(),
        traffic_s=args.traffic_s,
        drain_s=args.drain_s,
        length_scale=args.length_scale,
        rates=rates,
        doc_tokens=args.doc_tokens,
        docs=args.docs,
    )


def main(argv: list[str] | None = None) -> dict | None:
    args = parse_args(argv)
    plan = plan_of(args)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    if bad := [s for s in steps if s not in STEPS]:
        raise SystemExit(f"unknown steps {bad} (of {', '.join(STEPS)})")
    systems = SYSTEMS[:3] if args.smoke else SYSTEMS
    if args.systems:
        wanted = [x.strip() for x in args.systems.split(",") if x.strip()]
        if bad := sorted(set(wanted) - {s[0] for s in SYSTEMS}):
            raise SystemExit(f"unknown systems {bad} (of {', '.join(s[0] for s in SYSTEMS)})")
        systems = tuple(s for s in SYSTEMS if s[0] in wanted)
    est = estimate_s(plan, steps, len(systems))
    if args.estimate:
        print(f"estimated wall time: {est / 60:.1f} min ({', '.join(steps)}; 45 s per fleet start-up)")
        return None
    if why := missing_tools():
        raise SystemExit(f"bench/fleet_cpu.py: {why}")
    out = (
        Path(args.out)
        if args.out
        else (Path(tempfile.mkdtemp(prefix="fleet_cpu_smoke_")) if args.smoke else ROOT / "bench" / "results")
    )
    t0 = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {msg}", flush=True)

    log(f"estimated {est / 60:.1f} min; writing {out}/{args.name}.*")
    cmd = " ".join(["bench/fleet_cpu.py", *(sys.argv[1:] if argv is None else argv)])
    raw: dict = {
        "meta": {
            "command": cmd,
            "commit": _git_commit(),
            "machine": machine_info(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "plan": plan.__dict__,
            "router_args": ROUTER_ARGS,
            "steps": steps,
        }
    }
    if "hits" in steps:
        raw["hit_rates"] = step_hit_rates(plan, log, systems)
        _write(raw, out, args.name, t0)
    if "store" in steps:
        raw["store"] = step_store(plan, log)
        _write(raw, out, args.name, t0)
    if "kill" in steps:
        raw["pod_kill"] = step_pod_kill(plan, log)
    _write(raw, out, args.name, t0)
    for g in raw["goals"]:
        log(f"{'MET ' if g['met'] else 'MISS'} {g['name']}: {g['value']} {g['op']} {g['bound']}")
    return raw


def _write(raw: dict, out: Path, name: str, t0: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    raw["meta"]["elapsed_s"] = round(time.monotonic() - t0, 1)
    raw["goals"] = R.goals(raw)
    if R.plot(raw, out / f"{name}.png"):
        raw["meta"]["png"] = f"{name}.png"
    (out / f"{name}.json").write_text(json.dumps(raw, indent=1, default=str) + "\n")
    (out / f"{name}.md").write_text(R.markdown(raw))


def _git_commit() -> str:
    import subprocess

    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "unknown"


if __name__ == "__main__":
    main()
