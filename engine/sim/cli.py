"""`kvloop simulate`: run workloads through the simulator and write the benchmark's metrics JSON."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from kvloop.engine.bench.w5_workload import W5_SCALES
from kvloop.engine.core.policy import policy_names

WORKLOADS = ("w1", "w1-smoke", "w2", "w4", "w1-gpu", *W5_SCALES, "azure", "mooncake")


def add_simulate_parser(sub) -> None:
    from kvloop.engine.sim.profiles import PROFILES

    p = sub.add_parser("simulate",
                       help="GPU-scale simulator: real scheduler/KV manager/control law, roofline time")
    p.add_argument("--workload", default="w1", choices=WORKLOADS)
    p.add_argument("--trace", default=None, help="CSV (azure) or JSONL (mooncake) trace file")
    p.add_argument("--profile", default="cpu", choices=PROFILES)
    p.add_argument("--calibration", default=None,
                   help="CPU calibration JSON (default bench/results/sim_calibration.json)")
    p.add_argument("--modes", default=",".join(policy_names()),
                   help="comma-separated modes, or W5 variants: codesign@cap64 (fixed cap, coordinator off), "
                        "codesign+coord[@10s][+events] (the coordinator; --feedback's settings or the "
                        "defaults)")
    p.add_argument("--rate", type=float, default=None,
                   help="requests/s (w1-gpu: all requests; else the open stream)")
    p.add_argument("--phase-rates", default=None, help="w5, w5-gpu: 'chat,rag' requests/s of each phase kind")
    p.add_argument("--duration", type=float, default=None,
                   help="w1-gpu: seconds of arrivals (default 3600); w5: of phases (default: its scale's)")
    p.add_argument("--phase", type=float, default=None, help="w5: phase length in s (default: its scale's)")
    p.add_argument("--scale", type=float, default=1.0, help="length scale (w1/w2/w4 lengths, trace lengths)")
    p.add_argument("--time-scale", type=float, default=1.0, help="trace inter-arrival scale")
    p.add_argument("--limit", type=int, default=None, help="trace rows at most")
    p.add_argument("--w4-ratio", type=float, default=1.0, help="w4: documents' KV / device pool")
    p.add_argument("--w4-oneoff", type=float, default=0.0, help="w4: share of one-off documents")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-cache-tokens", type=int, default=None)
    p.add_argument("--host-cache-tokens", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--static-batch", type=int, default=None)
    p.add_argument("--feedback", default=None,
                   help="'default' or a sidecar settings file: run the coordinator")
    p.add_argument("--period", type=float, default=None, help="coordinator period (s)")
    p.add_argument("--until", type=float, default=None, help="stop at this virtual time")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="longest request (prompt + output) in tokens (default: the profile model's context)")
    p.add_argument("--out", default=None, help="write the JSON here (default: stdout)")
    p.set_defaults(func=cmd_simulate)


def build_workload(args):
    from kvloop.engine.bench import traces
    from kvloop.engine.bench import workloads as bw
    from kvloop.engine.sim import scenarios

    kw = {"seed": args.seed}
    if args.workload in W5_SCALES:
        from kvloop.engine.bench.w5_workload import parse_phase_rates, w5

        if args.rate is not None:
            raise SystemExit(f"{args.workload}: give the rate of each phase kind with --phase-rates chat,rag")
        if args.duration:
            kw["duration_s"] = args.duration
        if args.phase:
            kw["phase_s"] = args.phase
        return w5(args.workload, parse_phase_rates(args.phase_rates), **kw)
    if args.rate is not None and args.workload != "w1-gpu":
        kw["rate"] = args.rate
    if args.workload == "w1":
        return bw.w1(args.scale, **kw)
    if args.workload == "w1-smoke":
        return bw.w1_smoke(**kw)
    if args.workload == "w2":
        return bw.w2(args.scale, **kw)
    if args.workload == "w4":
        return bw.w4(args.kv_cache_tokens or 24576, args.w4_ratio, args.w4_oneoff, args.scale, **kw)
    if args.workload == "w1-gpu":
        return scenarios.gpu_w1(args.rate or 20.0, args.duration or 3600.0, args.seed)
    if not args.trace:
        raise SystemExit(f"--trace is required for {args.workload}")
    reader = traces.read_azure_csv if args.workload == "azure" else traces.read_mooncake_jsonl
    return reader(args.trace, args.limit, args.time_scale, args.scale, args.seed)


def build_sizing(args, profile):
    from kvloop.engine.sim import scenarios

    w5 = W5_SCALES.get(args.workload)
    sizing = scenarios.sizing_for(profile, w5.kv_cache_tokens if w5 else None)
    over = {"kv_cache_tokens": args.kv_cache_tokens, "host_cache_tokens": args.host_cache_tokens,
            "max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
            "static_batch": args.static_batch}
    return replace(sizing, **{k: v for k, v in over.items() if v is not None})


def feedback_settings(args):
    if args.feedback is None:
        return None
    from kvloop.sidecar.settings import Settings, load_settings

    s = Settings() if args.feedback == "default" else load_settings(args.feedback)
    return replace(s, period_s=args.period) if args.period else s


def trace_account(args, wl) -> dict | None:
    """Every row of a replayed trace file accounted for: read, or left out past --limit."""
    if not args.trace or args.workload not in ("azure", "mooncake"):
        return None
    from kvloop.engine.sim.trace_rows import row_account

    return row_account(args.trace, len(wl.requests))


def _summary_line(run: dict) -> str:
    c, s = run["client"], run["slo"]
    miss = s["slo_missed"]
    parts = [f"{run['system']:15s} {c['output_throughput_tok_s']:10.1f} tok/s",
             f"goodput {s['slo_goodput_req_s']:.3f} req/s ({s['slo_good']}/{s['slo_sent']} good; missed ttft "
             f"{miss['ttft']}, tpot {miss['tpot']}, failed {miss['failed']})",
             f"TTFT p50 {_s(s['ttft_p50_s'])} p99 {_s(s['ttft_p99_s'])}",
             f"(no hit p99 {_s(s['slo_nohit_ttft_p99_s'])})",
             f"TPOT p50 {_s(s['tpot_p50_s'])} p99 {_s(s['tpot_p99_s'])}",
             "refused: " + (", ".join(f"{k} {v}" for k, v in s["rejections"].items()) or "none")]
    if s["failures"]:
        parts.append("failed: " + ", ".join(f"{k} {v}" for k, v in s["failures"].items()))
    return "  ".join(parts) + f"  ({run['sim']['wall_s']:.1f} s wall)"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f} s"


def cmd_simulate(args: argparse.Namespace) -> int:
    from kvloop.engine.sim.profiles import get_profile
    from kvloop.engine.sim.systems import run_system

    profile = get_profile(args.profile, args.calibration)
    sizing = build_sizing(args, profile)
    fb = feedback_settings(args)
    runs, trace = [], None
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        wl = build_workload(args)  # fresh per mode: chat sessions consume their replies
        run = run_system(mode, profile, wl, sizing, fb, args.until, args.max_model_len)
        trace = trace or trace_account(args, wl)
        runs.append({**run, "rate": args.rate})
        print(_summary_line(run), file=sys.stderr)
    if trace:
        print(f"trace: {trace['rows']} rows, {trace['read']} read, left out: {trace['left_out'] or 'none'}",
              file=sys.stderr)
    context = args.max_model_len or profile.model.context
    out = {"simulated": True, "profile": args.profile, "max_model_len": context,
           **({"trace": trace} if trace else {}), "runs": runs}
    text = json.dumps(out, indent=1, default=str)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    return 0
