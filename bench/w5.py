"""W5 (memory pressure with shifting phases, ../shared/WORKLOADS.md): the co-design against continuous+lru,
the coordinator (its defaults, and a period sweep with the event path on) against a sweep of fixed batch caps
through the same phases. Writes <name>.json (with a top-level `goals` list: issue 16's W5 goals computed from
the numbers in the file), <name>.md and <name>.png (+ <name>_caps.png).

Subcommands:
- sim:      the simulator. --scale gpu (default): Llama-3.1-70B-FP8 on an H200 (profile h200-70b-fp8), one
            simulated hour -> bench/results/w5_h200.*; --scale cpu: the CPU profile -> w5_sim_cpu.*
- cpu:      the real engine (embedded SmolLM2-135M), CPU scale, one system at a time -> bench/results/w5_cpu.*
- capacity: continuous+lru's capacity in each phase kind alone (the highest rate whose run keeps TTFT P99, or
            with --ttft-pct 50 the median TTFT, <= --ttft-bound), by doubling then bisecting the rate; W5's
            rates are 0.9x that. Writes bench/results/w5_capacity_<scale>_<engine>[_p50].json, which
            `--phase-rates auto` (the P99 file) or `--phase-rates FILE` reads. The GPU defaults in
            engine/bench/w5_workload.py come from the P50 (near-saturation) measurement: under the P99 SLO
            the pool never binds and every system ties. --system codesign (or any W5 system) measures another
            system's capacity the same way (file name + _<system>): at W5's rates every system keeps up, so
            output throughput ties by construction; the capacities say how much more load one carries.
- load:     the simulator at multiples of W5's rates (--factors), continuous+lru, codesign and the coordinator
            by default -> bench/results/w5_h200_load.*: at W5's rates throughput ties by
            construction; issue 16's
            1.3x throughput goal is read at the lowest load where both systems are past capacity (w5_load.py)
- seeds:    the simulator over several workload seeds (--seeds 0-9) at one set of rates, continuous+lru and
            codesign by default -> bench/results/<stem>_seeds.*: per-seed ratios and
            their median (w5_seeds.py)
- budget:   the simulator once per step token budget (--budgets; the largest prefill
chunk a step carries), the
            systems at the same budget each time -> bench/results/<stem>_budget.*:
            whether a lead is the budget's
            (each system is also read at its own best budget; w5_budget.py)
- report:   re-renders <name>.md/.png from a <name>.json.

The coordinator steers its step token budget to a TPOT P50 objective (--coord-tpot;
default GPU 50 ms, CPU none:
w5_variants.TPOT_OBJECTIVE_S); the fixed caps and the other systems keep the sizing's budget.

    .venv/bin/python bench/w5.py capacity --scale gpu --ttft-pct 50         # the sim; ~4 CPU minutes
    .venv/bin/python bench/w5.py sim --phase-rates bench/results/w5_capacity_gpu_sim_p50.json --jobs 2
    .venv/bin/python bench/w5.py capacity --scale cpu --engine real --ttft-pct 50   # quiet machine, ~1 h
    .venv/bin/python bench/w5.py cpu --phase-rates bench/results/w5_capacity_cpu_real_p50.json  # ~15
    min/system .venv/bin/python bench/w5.py sim --duration 120 --phase 60 --out /tmp/w5 --systems
    codesign,codesign@cap64 .venv/bin/python bench/w5.py load --jobs 2       # W5 GPU at 1-2x its rates ->
    bench/results/w5_h200_load.* .venv/bin/python bench/w5.py sim --load 1.4 --jobs 2 --name w5_h200_load1.4
    # all 14 systems, ~10 min .venv/bin/python bench/w5.py seeds --load 1.7 --seeds 0-9 --jobs 2 --name
    w5_h200_seeds_load1.7 \
        --systems continuous+lru,codesign,codesign+coord,codesign@cap32,codesign@cap64   # ~33 min
    .venv/bin/python bench/w5.py budget --load 1.4 --budgets 128,256,512,1024,2048 --jobs 2  # ->
    w5_h200_budget.* .venv/bin/python bench/w5.py seeds --scale cpu --phase-rates 0.482,0.231 --seeds 0-9   #
    -> w5_sim_cpu_seeds.* .venv/bin/python bench/w5.py cpu --load 1.2 --phase-rates
    bench/results/w5_capacity_cpu_sim_p50.json \
        --systems continuous+lru,codesign --name w5_cpu_load1.2    # the real engine past
        continuous+lru's capacity
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import shlex
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path

from kvloop.engine.bench import phases as ph
from kvloop.engine.bench import w5_budget, w5_load, w5_report, w5_seeds
from kvloop.engine.bench.metrics import SLO, client_metrics, server_metrics
from kvloop.engine.bench.sizing import Sizing
from kvloop.engine.bench.w5_variants import (
    FIXED_CAPS,
    PERIODS,
    coordinator_base,
    coordinator_settings,
    parse_variant,
    sized,
    tpot_objective,
    w5_systems,
)
from kvloop.engine.bench.w5_workload import CHAT, RAG, W5_SCALES, parse_phase_rates, phases_of, w5

RESULTS = Path(__file__).resolve().parent / "results"
WORKLOAD = {"gpu": "w5-gpu", "cpu": "w5"}
PROFILE = {"gpu": "h200-70b-fp8", "cpu": "cpu"}
STEM = {("sim", "gpu"): "w5_h200", ("sim", "cpu"): "w5_sim_cpu", ("cpu", "cpu"): "w5_cpu"}
HEADROOM = 0.9  # W5's rates: this share of continuous+lru's capacity in each phase alone
BASELINE = "continuous+lru"


def capacity_file(scale: str, engine: str, system: str = BASELINE) -> Path:
    """continuous+lru's capacity sets W5's rates; another system's file carries its name."""
    return RESULTS / f"w5_capacity_{scale}_{engine}{'' if system == BASELINE else '_' + system}.json"


def resolve_rates(text: str | None, scale: str, engine: str) -> tuple[tuple[float, float], str]:
    """(chat, rag) requests/s and how they were chosen."""
    if text == "auto" or (text or "").endswith(".json"):
        f = capacity_file(scale, engine) if text == "auto" else Path(text)
        if not f.exists():
            raise SystemExit(f"--phase-rates auto: {f} is missing (run `bench/w5.py capacity --scale {scale} "
                             f"--engine {engine}` first)")
        d = json.loads(f.read_text())
        r = d["chosen_rates"]
        return (r[CHAT],
                r[RAG]), (f"{HEADROOM:g} x continuous+lru's capacity in each phase alone, from {f.name}: "
                                   f"{d['how']}")
    rates = parse_phase_rates(text)
    if rates:
        return rates, "given on the command line (--phase-rates)"
    p = W5_SCALES[WORKLOAD[scale]]
    return (p.chat_rate, p.rag_rate), "the scale's defaults in engine/bench/w5_workload.py"


def positive_factors(text: str, flag: str) -> list[float]:
    """A comma list of positive multiples of W5's rates (--factors, --load), sorted; stops with a message."""
    try:
        factors = sorted(float(f) for f in text.split(","))
    except ValueError:
        raise SystemExit(f"{flag} wants a comma list of numbers, got {text!r}") from None
    if not factors or factors[0] <= 0 or not all(math.isfinite(f) for f in factors):
        raise SystemExit(f"{flag} wants positive multiples of the rates, got {text!r}")
    return factors


def seed_list(text: str) -> list[int]:
    """--seeds: a comma list of seeds and inclusive ranges ("0-9", "0,3,5-7"), sorted;
    stops with a message."""
    seeds: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            seeds.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise SystemExit(f"--seeds wants seeds and ranges such as 0-9 or 0,3,5-7, got {text!r}") from None
    if not seeds:
        raise SystemExit(f"--seeds names no seed: {text!r}")
    return sorted(seeds)


def loaded_rates(rates: tuple[float, float], how: str, load: str | None) -> tuple[tuple[float, float], str,
                                                                                  float]:
    """W5's rates times --load (one factor): past continuous+lru's capacity, where the
    systems' throughputs can part
    (at W5's own rates every system that keeps up delivers the offered load)."""
    if load is None:
        return rates, how, 1.0
    f = positive_factors(load, "--load")
    if len(f) != 1:
        raise SystemExit(f"--load wants one factor, got {load!r}")
    return (rates[0] * f[0],
            rates[1] * f[0]), f"{f[0]:g} x W5's rates ({rates[0]:g}/{rates[1]:g} req/s: {how})", f[0]


def checked_systems(names: list[str]) -> list[str]:
    """The W5 system names, each parsed first: a bad one fails before hours of running."""
    for name in names:
        parse_variant(name)
    return names


def workload_kw(args) -> dict:
    kw = {"seed": args.seed}
    if args.duration:
        kw["duration_s"] = args.duration
    if args.phase:
        kw["phase_s"] = args.phase
    return kw


# ---- the simulator -------------------------------------------------------------------------------------
def sim_one(name: str, scale: str, rates: tuple[float, float], kw: dict, profile_name: str,
            calibration: str | None = None, sample_every_s: float = 1.0, base_sizing: Sizing | None = None,
            coord_tpot_s: float | None = None) -> dict:
    """One system through W5 in the simulator -> its summary (runs in a worker process). base_sizing: the
    sizing before the variant's cap (default: the profile's, with the pool the workload prescribes); the
    fidelity check (sim_fidelity.py --w5) passes the real engine's. coord_tpot_s: the coordinator's TPOT
    objective (None: the scale's, w5_variants.TPOT_OBJECTIVE_S; 0: none)."""
    from kvloop.engine.sim.profiles import get_profile
    from kvloop.engine.sim.scenarios import sizing_for
    from kvloop.engine.sim.simulator import SimConfig, Simulator
    from kvloop.engine.sim.workload import BenchWorkload

    t, cpu = time.perf_counter(), time.process_time()
    wl = w5(WORKLOAD[scale], rates, **kw)
    gc.collect()  # what earlier runs left in cycles, before the freeze keeps it
    gc.freeze()  # the prompts live all run: keep the cyclic GC from walking them again and again
    prof = get_profile(profile_name, calibration)
    v = parse_variant(name)
    sizing = sized(v, base_sizing or sizing_for(prof, wl.params.get("kv_cache_tokens")))
    fb, events = coordinator_settings(v, coordinator_base(scale, coord_tpot_s), max(FIXED_CAPS[scale]))
    sim = Simulator(prof, BenchWorkload(wl), SimConfig(mode=v.mode, sizing=sizing, feedback=fb,
                                                       sample_every_s=sample_every_s))
    res = sim.run()
    facts = {k: x for k, x in res["sim"].items() if k not in ("sizing", "cost")}
    out = w5_report.run_summary(name, res["client"], res["server"], sim.rec.phase_report(phases_of(wl)),
                                feedback=res.get("feedback"), event_path=events if fb is not None else None,
                                sizing=asdict(sizing), sim=facts)
    out["sim"].update(wall_s=time.perf_counter() - t, cpu_s=time.process_time() - cpu)
    return out


def run_sim(systems: list[str], scale: str, rates, kw: dict, profile: str, calibration: str | None = None,
            jobs: int = 1, sizings: dict[str, Sizing] | None = None, coord_tpot_s: float | None = None
            ) -> dict[str, dict]:
    """Each system through W5 in the simulator, `jobs` at a time; sizings: base sizing per system (default:
    the profile's); coord_tpot_s: as sim_one's."""
    jobs_args = [(n, scale, rates, kw, profile, calibration, 1.0, (sizings or {}).get(n), coord_tpot_s)
                 for n in systems]
    runs: dict[str, dict] = {}
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            for n, res in zip(systems, pool.map(sim_one, *zip(*jobs_args, strict=True)), strict=True):
                runs[n] = res
                log_run(res)
    else:
        for job in jobs_args:
            runs[job[0]] = sim_one(*job)
            log_run(runs[job[0]])
    return runs


def log_run(r: dict) -> None:
    w = r["whole"]
    kinds = " ".join(f"{k} {d['throughput_tok_s']:.0f} tok/s" for k, d in (r.get("by_kind") or {}).items())
    extra = r.get("sim") or {}
    print(f"{r['system']:28s} {w['output_throughput_tok_s']:9.1f} tok/s  TTFT p99 {w['ttft_p99_s']:7.2f} s  "
          f"preempt {w['preemptions']:.0f}  [{kinds}]  "
          f"({extra.get('cpu_s', r.get('wall_s', 0)):.0f} s)", file=sys.stderr, flush=True)


# ---- the real engine -----------------------------------------------------------------------------------
def engine_one(name: str, wl, sizing, args, slo: SLO) -> dict:
    from kvloop.engine.bench.driver import run_workload
    from kvloop.engine.bench.guard import NoiseGuard
    from kvloop.engine.bench.w5_engine import variant_target

    target, events = variant_target(name, sizing, args.threads, coordinator_base("cpu", args.coord_tpot),
                                    max(FIXED_CAPS["cpu"]))
    try:
        res = run_workload(wl, target, progress=not args.no_progress, timeout_s=args.timeout,
                           guard=NoiseGuard(max_other_cores=args.max_other_cores))
    finally:
        target.close()
    info = dict(res.info)
    feedback = info.pop("feedback", None)
    return w5_report.run_summary(name, client_metrics(res.records, slo), server_metrics(res.samples),
                                 ph.report(res.records, res.samples, phases_of(wl), slo,
                                           timeline_every_s=1.0),
                                 feedback=feedback,
                                 event_path=events if feedback is not None else None, info=info,
                                 noise={k: v for k, v in (res.noise.as_dict() if res.noise else {}).items()
                                        if k != "series"}, wall_s=res.wall_s,
                                 sizing=asdict(sized(parse_variant(name), sizing)),
                                 requests=[r.compact() for r in res.records])


def engine_sizing(wl) -> Sizing:
    """The real engine's sizing at CPU scale: the defaults with W5's device pool (the simulator's CPU sizing,
    but for max_context, which only peers with per-slot contexts read)."""
    longest = max([len(r.prompt) + r.max_tokens for r in wl.requests] + [
        len(s.system) + s.num_turns * (len(s.user_turns[0]) + s.reply_tokens) for s in wl.sessions] + [1])
    return Sizing(kv_cache_tokens=wl.params["kv_cache_tokens"], max_context=(longest // 256 + 1) * 256)


def run_engine(args, systems: list[str], rates, kw) -> dict[str, dict]:
    import torch

    torch.set_num_threads(args.threads)
    slo = SLO(args.slo_ttft, args.slo_tpot)
    runs = {}
    for name in systems:
        wl = w5(WORKLOAD["cpu"], rates, **kw)
        runs[name] = engine_one(name, wl, engine_sizing(wl), args, slo)
        log_run(runs[name])
    return runs


# ---- capacity ------------------------------------------------------------------------------------------
def probe(kind: str, rate: float, args) -> dict:
    """args.system (continuous+lru by default) on W5 with every phase of `kind`, at `rate` requests/s."""
    kw = {**workload_kw(args), "kinds": (kind,)}
    kw["duration_s"] = args.probe_duration or 2 * (args.phase or W5_SCALES[WORKLOAD[args.scale]].phase_s)
    rates = (rate, rate)
    if args.engine == "sim":
        profile = args.profile or PROFILE[args.scale]
        r = sim_one(args.system, args.scale, rates, kw, profile, args.calibration,
                    base_sizing=budget_sizing(args.budget, args.scale, profile, args.calibration),
                    coord_tpot_s=args.coord_tpot)
    else:
        import torch

        torch.set_num_threads(args.threads)
        wl = w5(WORKLOAD["cpu"], rates, **kw)
        r = engine_one(args.system, wl, engine_sizing(wl), args, SLO(args.ttft_bound, args.tpot_bound or 1e9))
    w = r["whole"]
    meets = (not w["failed"] and _le(w[f"ttft_p{args.ttft_pct}_s"], args.ttft_bound)
             and (args.tpot_bound is None or _le(w["tpot_p99_s"], args.tpot_bound)))
    out = {"rate": rate, "meets": meets,
           **{k: w[k] for k in ("output_throughput_tok_s", "request_throughput_req_s",
                                                              "ttft_p50_s", "ttft_p99_s", "tpot_p99_s",
                                                              "failed",
                                                              "preemptions", "kv_use_mean")}}
    print(f"capacity probe {kind} {rate:.3f} req/s: TTFT p50 {w['ttft_p50_s']:.2f} s, p99 "
          f"{w['ttft_p99_s']:.2f} s, {'meets' if meets else 'misses'}", file=sys.stderr, flush=True)
    return out


def w5_sizing(scale: str, profile: str, calibration: str | None) -> Sizing:
    """The profile's sizing for W5 at this scale, with the device pool W5 prescribes (as
    sim_one sizes a run)."""
    from kvloop.engine.sim.profiles import get_profile
    from kvloop.engine.sim.scenarios import sizing_for

    return sizing_for(get_profile(profile, calibration), W5_SCALES[WORKLOAD[scale]].kv_cache_tokens)


def budget_sizing(budget: int | None, scale: str, profile: str, calibration: str | None) -> Sizing | None:
    """w5_sizing at step token budget `budget` in every step, decoding or not (None: no budget given,
    sim_one's own sizing)."""
    if budget is None:
        return None
    from dataclasses import replace

    return replace(w5_sizing(scale, profile, calibration), max_num_batched_tokens=budget, idle_step_tokens=0)


def sweep_meta(args, title: str, phase_rates: tuple[float, float], systems: list[str], t0: float, note: str,
               **fields) -> dict:
    """A simulator sweep's meta (load, seeds, budget): its title and own fields, W5's phases at these rates,
    the systems, when and how long it ran, the command line and the notes (--note first). phase_rates: the
    rates its W5 is built with (only its phase lengths are read)."""
    p = w5(WORKLOAD[args.scale], phase_rates, **workload_kw(args)).params
    return {"title": title, **fields, "coordinator_tpot_p50_s": tpot_objective(args.scale, args.coord_tpot),
            "phase_s": p["phase_s"], "duration_s": p["duration_s"], "systems": systems,
            "wall_s": round(time.time() - t0, 1),
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t0)),
            "commands": [".venv/bin/python bench/w5.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])],
            "notes": args.note + [note]}


def _le(x, bound: float) -> bool:
    return isinstance(x, int | float) and not math.isnan(x) and x <= bound


def capacity_search(kind: str, start: float, iters: int, args) -> dict:
    """The highest rate that meets the bound: double (or halve) from `start` until it is bracketed, then
    bisect geometrically `iters` times. Halving stops where the bound is out of reach at any rate: a miss
    whose TTFT did not fall with the load (a request alone misses it, e.g. a cold RAG prefill on a slow CPU)
    or a probe with no request done; the capacity is then None and `unattainable` says why."""
    probes: dict[float, dict] = {}
    pct = f"ttft_p{args.ttft_pct}_s"

    def ok(rate: float) -> bool:
        rate = round(rate, 4)
        if rate not in probes:
            probes[rate] = probe(kind, rate, args)
        return probes[rate]["meets"]

    lo = hi = None
    unattainable = None
    rate = start
    for _ in range(12):
        if ok(rate):
            lo = rate
            if hi is not None:
                break
            rate *= 2
        else:
            ttft, before = probes[round(rate, 4)][pct], probes.get(round(2 * rate, 4), {}).get(pct)
            if lo is None and (not _le(ttft, math.inf) or (before is not None and ttft >= 0.95 * before)):
                unattainable = (f"TTFT P{args.ttft_pct} {ttft:.2f} s at {rate:.4g} req/s, not below "
                                f"{before if before is not None else float('nan'):.2f} s at twice the rate: "
                                f"not load-bound, the {args.ttft_bound:g} s bound is out of reach "
                                "at any rate")
                break
            hi = rate
            if lo is not None:
                break
            rate /= 2
    for _ in range(iters if lo and hi else 0):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return {"capacity_req_s": lo, "first_miss_req_s": hi, "unattainable": unattainable,
            "probes": [probes[r] for r in sorted(probes)]}


def cmd_capacity(args) -> int:
    if args.budget is not None and args.engine != "sim":
        raise SystemExit("--budget is the simulator's (the real engine takes its budget from its own sizing)")
    starts = W5_SCALES[WORKLOAD[args.scale]]
    found = {kind: capacity_search(kind, args.start or starts.rate(kind), args.iters, args) for kind in (CHAT,
                                                                                                         RAG)}
    chosen = {k: round(HEADROOM * d["capacity_req_s"],
                       3) if d["capacity_req_s"] else None for k, d in found.items()}
    dur = args.probe_duration or 2 * (args.phase or starts.phase_s)
    how = (f"{args.system} on each phase kind alone ({dur:g} s of arrivals, then the drain; "
           f"{args.engine}), capacity = the highest rate with TTFT P{args.ttft_pct} <= {args.ttft_bound:g} s"
           + (f" and TPOT P99 <= {args.tpot_bound:g} s" if args.tpot_bound else "")
           + f" and no failures ({args.iters} bisections after bracketing); rates = {HEADROOM:g} x capacity"
           + (f"; step token budget {args.budget}" if args.budget is not None else ""))
    out = {"scale": args.scale, "engine": args.engine, "system": args.system, "how": how, "capacity": found,
           "chosen_rates": chosen,
           "command": "bench/w5.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])}
    path = Path(args.out) / capacity_file(args.scale, args.engine, args.system).name
    if args.ttft_pct != 99:
        path = path.with_name(f"{path.stem}_p{args.ttft_pct}.json")
    # beside the default budget's file, compared with the baseline's at the same budget
    if args.budget is not None:
        path = path.with_name(f"{path.stem}_budget{args.budget}.json")
    base_file = path.with_name(path.name.replace(f"_{args.system}", "")) if args.system != BASELINE else None
    baseline = ({k: d["capacity_req_s"] for k, d in json.loads(base_file.read_text())["capacity"].items()}
                if base_file is not None and base_file.exists() else None)
    out["goals"] = w5_report.capacity_goals(args.system, {k: d["capacity_req_s"] for k, d in found.items()},
                                            {k: starts.rate(k) for k in found}, baseline)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({"chosen_rates": chosen,
                      "capacity": {k: d["capacity_req_s"] for k, d in found.items()}}))
    for k, d in found.items():
        if d["unattainable"]:
            print(f"{k}: no capacity: {d['unattainable']}")
    if all(chosen.values()):
        print(f"use: --phase-rates {chosen[CHAT]},{chosen[RAG]}   ({path})")
    return 0


# ---- the comparison ------------------------------------------------------------------------------------
def cmd_run(args) -> int:
    engine = "sim" if args.cmd == "sim" else "real"
    scale = args.scale if args.cmd == "sim" else "cpu"
    args.scale = scale
    rates, how, load = loaded_rates(*resolve_rates(args.phase_rates, scale, engine), args.load)
    kw = workload_kw(args)
    # the real engine's default leaves the period sweep out (issue 16 asks it of the simulator; 15 min each)
    default = PERIODS if engine == "sim" else ()
    periods = tuple(float(p) for p in args.periods.split(",") if p) if args.periods is not None else default
    caps = tuple(int(c) for c in args.caps.split(",")) if args.caps else None
    systems = checked_systems(args.systems.split(",") if args.systems else w5_systems(scale, periods, caps))
    probe_wl = w5(WORKLOAD[scale], rates, **kw)
    t0 = time.time()
    runs = (run_sim(systems, scale, rates, kw, args.profile or PROFILE[scale], args.calibration, args.jobs,
                    coord_tpot_s=args.coord_tpot) if engine == "sim" else run_engine(args, systems, rates,
                                                                                     kw))
    p = probe_wl.params
    what_ran = (f"simulator, {args.profile or PROFILE[scale]}" if engine == "sim"
                else "real engine, embedded SmolLM2-135M")
    meta = {"title": f"W5 {'GPU' if scale == 'gpu' else 'CPU'} scale ({what_ran})",
            "workload": probe_wl.name, "engine": engine,
            "profile": (args.profile or PROFILE[scale]) if engine == "sim"
            else "embedded SmolLM2-135M", "phase_rates": {CHAT: rates[0], RAG: rates[1]}, "rates_how": how,
            "load": load,
            "coordinator_tpot_p50_s": tpot_objective(scale, args.coord_tpot),
            "phase_s": p["phase_s"], "duration_s": p["duration_s"], "requests": len(probe_wl.requests),
            "sessions": len(probe_wl.sessions), "num_requests": probe_wl.num_requests,
            "phases": p["phases"], "workload_params": {k: v for k, v in p.items() if k != "phases"},
            "wall_s": round(time.time() - t0, 1),
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t0)),
            "commands": [".venv/bin/python bench/w5.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])],
            "notes": args.note + [
                "throughput: output tokens / makespan (first send to last finish); per phase, served (the "
                "goals'): output tokens of the requests sent in the phase / the time from its start until "
                "the last of them finished (at least the phase); per phase, window: output tokens of the "
                "requests that finished in the phase's window / the window (the last runs to the last "
                "finish)",
                "latencies per phase: of the requests sent in it; server counters: deltas over the window",
                ("best fixed cap: the highest output throughput (ties: lower TTFT P99) among the "
                 f"codesign@capN runs that kept up there (TTFT P50 <= {w5_report.KEEPS_UP_TTFT_P50_S:g} s; "
                 "all where none did)")]}
    if engine == "real":
        from kvloop.engine.bench.machine import machine_info

        meta.update(machine=machine_info(), threads=args.threads)
    report = w5_report.build(runs, meta, scale)
    w5_report.write(report, Path(args.out), args.name or STEM[(args.cmd, scale)])
    for g in report["goals"]:
        print(json.dumps(g, default=str))
    return 0


def cmd_load(args) -> int:
    """The simulator at multiples of W5's rates (`--factors`): where the systems'
    throughputs part (w5_load.py)."""
    rates, how = resolve_rates(args.phase_rates, args.scale, "sim")
    kw = workload_kw(args)
    systems = checked_systems(args.systems.split(","))
    factors = positive_factors(args.factors, "--factors")
    t0 = time.time()
    loads = []
    for f in factors:
        scaled = (rates[0] * f, rates[1] * f)
        print(f"load x{f:g}: chat {scaled[0]:.3f}, rag {scaled[1]:.3f} req/s", file=sys.stderr, flush=True)
        runs = run_sim(systems, args.scale, scaled, kw, args.profile or PROFILE[args.scale], args.calibration,
                       args.jobs, coord_tpot_s=args.coord_tpot)
        loads.append(w5_load.load_entry(f, {CHAT: scaled[0], RAG: scaled[1]}, runs))
    meta = sweep_meta(args,
                      f"W5 {args.scale.upper()} scale under rising load (simulator, "
                      f"{args.profile or PROFILE[args.scale]})",
                      rates, systems, t0,
                      "throughput: output tokens / makespan (first send to last finish); rejected: "
                      "requests refused at a full queue (they count in no throughput)",
                      base_rates={CHAT: rates[0], RAG: rates[1]}, rates_how=how, factors=factors)
    report = w5_load.build(loads, meta)
    w5_load.write(report, Path(args.out), args.name or f"{STEM[('sim', args.scale)]}_load")
    for g in report["goals"]:
        print(json.dumps(g, default=str))
    return 0


def cmd_seeds(args) -> int:
    """The simulator over several workload seeds at one set of rates (w5_seeds.py): the ratios' spread."""
    rates, how, load = loaded_rates(*resolve_rates(args.phase_rates, args.scale, "sim"), args.load)
    systems = checked_systems(args.systems.split(","))
    seeds = seed_list(args.seeds)
    profile = args.profile or PROFILE[args.scale]
    t0 = time.time()
    entries = []
    for seed in seeds:
        print(f"seed {seed}", file=sys.stderr, flush=True)
        runs = run_sim(systems, args.scale, rates, {**workload_kw(args), "seed": seed}, profile,
                       args.calibration,
                       args.jobs, coord_tpot_s=args.coord_tpot)
        entries.append(w5_seeds.seed_entry(seed, runs))
    meta = sweep_meta(args, f"W5 {args.scale.upper()} scale over {len(seeds)} seeds (simulator, {profile})",
                      rates,
                      systems, t0,
                      "throughput: output tokens / makespan (first send to last finish); kept up: TTFT "
                      f"P50 <= {w5_report.KEEPS_UP_TTFT_P50_S:g} s", rates={CHAT: rates[0], RAG: rates[1]},
                      rates_how=how, load=load, seeds=seeds,
                      calibration=args.calibration if args.scale == "cpu" else None)
    report = w5_seeds.build(entries, meta, args.scale)
    w5_seeds.write(report, Path(args.out), args.name or f"{STEM[('sim', args.scale)]}_seeds")
    for g in report["goals"]:
        print(json.dumps(g, default=str))
    return 0


def cmd_budget(args) -> int:
    """The simulator once per step token budget, every system at the same budget (w5_budget.py)."""
    rates, how, load = loaded_rates(*resolve_rates(args.phase_rates, args.scale, "sim"), args.load)
    systems = checked_systems(args.systems.split(","))
    budgets = sorted({int(b) for b in positive_factors(args.budgets, "--budgets")})
    profile = args.profile or PROFILE[args.scale]
    kw = workload_kw(args)
    t0 = time.time()
    entries = []
    for budget in budgets:
        print(f"step token budget {budget}", file=sys.stderr, flush=True)
        sizing = budget_sizing(budget, args.scale, profile, args.calibration)
        runs = run_sim(systems, args.scale, rates, kw, profile, args.calibration, args.jobs,
                       {s: sizing for s in systems}, args.coord_tpot)
        entries.append(w5_budget.budget_entry(budget, runs))
    meta = sweep_meta(args, f"W5 {args.scale.upper()} scale across step token budgets (simulator, {profile})",
                      rates, systems, t0,
                      "throughput: output tokens / makespan (first send to last finish); budget: "
                      "the scheduler's max_num_batched_tokens for every system of the run",
                      rates={CHAT: rates[0], RAG: rates[1]}, rates_how=how, load=load, seed=args.seed,
                      default_budget=w5_sizing(args.scale, profile, args.calibration).max_num_batched_tokens,
                      budgets=budgets)
    report = w5_budget.build(entries, meta, args.scale)
    w5_budget.write(report, Path(args.out), args.name or f"{STEM[('sim', args.scale)]}_budget")
    for g in report["goals"]:
        print(json.dumps(g, default=str))
    return 0


def cmd_report(args) -> int:
    path = Path(args.json)
    report = json.loads(path.read_text())
    if "loads" in report:  # a `load` sweep's file
        w5_load.write(w5_load.build(report["loads"], report["meta"]), path.parent, path.stem)
        return 0
    if "budgets" in report:  # a `budget` sweep's file
        w5_budget.write(w5_budget.build(report["budgets"], report["meta"], report["scale"]), path.parent,
                        path.stem)
        return 0
    if "seeds" in report:  # a `seeds` sweep's file
        w5_seeds.write(w5_seeds.build(report["seeds"], report["meta"], report["scale"]), path.parent,
                       path.stem)
        return 0
    report.update(w5_report.build(report["systems"], report["meta"], report["scale"]))
    w5_report.write(report, path.parent, path.stem)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--phase-rates", default=None,
                        help="'chat,rag' requests/s, 'auto' "
                             "(bench/results/w5_capacity_<scale>_<engine>.json) or a capacity JSON written "
                             "by `capacity`")
    common.add_argument("--duration", type=float, default=None,
                        help="seconds of phases (default: the scale's)")
    common.add_argument("--phase", type=float, default=None,
                        help="phase length s (default: 300 GPU, 120 CPU)")
    common.add_argument("--seed", type=int, default=0)
    common.add_argument("--profile", default=None, help="simulator profile (default h200-70b-fp8 / cpu)")
    common.add_argument("--calibration", default=None, help="CPU profile calibration JSON")
    common.add_argument("--threads", type=int, default=2, help="real engine: torch threads")
    common.add_argument("--timeout", type=float, default=None, help="real engine: per-run limit (s)")
    common.add_argument("--max-other-cores", type=float, default=0.3)
    common.add_argument("--no-progress", action="store_true")
    common.add_argument("--slo-ttft", type=float, default=2.0)
    common.add_argument("--slo-tpot", type=float, default=0.25)
    common.add_argument("--coord-tpot", type=float, default=None,
                        help="the coordinator's TPOT P50 objective s, which steers its step token budget "
                             "(default: GPU 0.05, CPU none; 0: none)")
    common.add_argument("--out", default=str(RESULTS))
    for name, helptext in (("sim", "the simulator"), ("cpu", "the real engine at CPU scale")):
        p = sub.add_parser(name, parents=[common], help=helptext)
        if name == "sim":
            p.add_argument("--scale", choices=("gpu", "cpu"), default="gpu")
            p.add_argument("--jobs", type=int, default=1, help="systems simulated in parallel processes")
        p.add_argument("--systems", default=None,
                       help="comma list of W5 system names (default: the whole set)")
        p.add_argument("--periods", default=None,
                       help="coordinator periods of the sweep with the event path on "
                       "(default: sim 1,5,10,30,60; cpu none, '' none)")
        p.add_argument("--caps", default=None, help="fixed caps (default GPU 16..512, CPU 4..64)")
        p.add_argument("--load", default=None,
                       help="run at this multiple of the rates (--phase-rates); the file "
                       "records it (default 1: W5's own rates)")
        p.add_argument("--name", default=None, help="file stem (default w5_h200 / w5_sim_cpu / w5_cpu)")
        p.add_argument("--note", action="append", default=[])
        p.set_defaults(func=cmd_run)
    p = sub.add_parser("load", parents=[common], help="the simulator at multiples of W5's rates")
    p.add_argument("--scale", choices=("gpu", "cpu"), default="gpu")
    p.add_argument("--jobs", type=int, default=1, help="systems simulated in parallel processes")
    p.add_argument("--factors", default="1,1.2,1.4,1.7,2", help="multiples of the base rates (--phase-rates)")
    p.add_argument("--systems", default=f"{BASELINE},codesign,codesign+coord")
    p.add_argument("--name", default=None, help="file stem (default w5_h200_load / w5_sim_cpu_load)")
    p.add_argument("--note", action="append", default=[])
    p.set_defaults(func=cmd_load)
    p = sub.add_parser("seeds", parents=[common], help="the simulator over several workload seeds")
    p.add_argument("--scale", choices=("gpu", "cpu"), default="gpu")
    p.add_argument("--jobs", type=int, default=1, help="systems simulated in parallel processes")
    p.add_argument("--seeds", default="0-9", help="workload seeds: a comma list and ranges (default 0-9)")
    p.add_argument("--systems", default=f"{BASELINE},codesign")
    p.add_argument("--load", default=None, help="run at this multiple of the rates (--phase-rates)")
    p.add_argument("--name", default=None, help="file stem (default w5_h200_seeds / w5_sim_cpu_seeds)")
    p.add_argument("--note", action="append", default=[])
    p.set_defaults(func=cmd_seeds)
    p = sub.add_parser("budget", parents=[common], help="the simulator once per step token budget")
    p.add_argument("--scale", choices=("gpu", "cpu"), default="gpu")
    p.add_argument("--jobs", type=int, default=1, help="systems simulated in parallel processes")
    p.add_argument("--budgets", default="128,256,512,1024,2048", help="step token budgets (comma list)")
    p.add_argument("--systems", default=f"{BASELINE},codesign")
    p.add_argument("--load", default=None, help="run at this multiple of the rates (--phase-rates)")
    p.add_argument("--name", default=None, help="file stem (default w5_h200_budget / w5_sim_cpu_budget)")
    p.add_argument("--note", action="append", default=[])
    p.set_defaults(func=cmd_budget)
    p = sub.add_parser("capacity", parents=[common], help="a system's capacity per phase kind")
    p.add_argument("--system", default=BASELINE, help="the W5 system probed (continuous+lru sets W5's rates)")
    p.add_argument("--scale", choices=("gpu", "cpu"), default="gpu")
    p.add_argument("--engine", choices=("sim", "real"), default="sim")
    p.add_argument("--start", type=float, default=None, help="first rate tried (default: the scale's rate)")
    p.add_argument("--iters", type=int, default=4, help="bisections after bracketing")
    p.add_argument("--probe-duration", type=float, default=None,
                   help="s of arrivals per probe (default 2 phases)")
    p.add_argument("--ttft-bound", type=float, default=2.0)
    p.add_argument("--ttft-pct", type=int, choices=(50, 99), default=99,
                   help="99: WORKLOADS.md's capacity SLO; 50: near saturation (the median request barely "
                   "queues)")
    p.add_argument("--tpot-bound", type=float, default=None)
    p.add_argument("--budget", type=int, default=None,
                   help="simulator: step token budget (default: the profile's)")
    p.set_defaults(func=cmd_capacity)
    p = sub.add_parser("report",
                       help="re-render the markdown and plots of a W5 (or W5 load or seeds sweep) JSON")
    p.add_argument("json")
    p.set_defaults(func=cmd_report)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
