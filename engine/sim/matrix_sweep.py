"""The H200 matrix's runs: one system on one trace at one rate, kept in the compact shape the results file
holds (and memoised: a sweep's run at a cell's rate is that cell), and the capacity sweep over them.

Capacity (../shared/WORKLOADS.md) is the highest rate tried whose goodput is >= 95% of the offered rate,
measured as the benchmark harness does (bench.metrics.slo_capacity: good / sent, the same span on both sides,
so a closed-loop tail after the window does not count as loss). The sweep steps the rate by a factor from a
start until it brackets the capacity (at most `max_steps` each way), then bisects the bracket
geometrically `refine` times."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from kvloop.engine.bench.metrics import slo_capacity
from kvloop.engine.sim.matrix_traces import PROFILES, Traces, rows_beyond, rows_left_out


class Runner:
    def __init__(self, traces: Traces, log: Callable[[str], None] = print):
        self.traces, self.log = traces, log
        self._memo: dict[tuple[str, str, float], dict] = {}
        self._profiles: dict[str, object] = {}
        self.count = 0

    def profile(self, trace: str):
        name = PROFILES[trace]
        if name not in self._profiles:
            from kvloop.engine.sim.profiles import get_profile

            self._profiles[name] = get_profile(name)
        return self._profiles[name]

    def run(self, system: str, trace: str, rate: float) -> dict:
        key = (system, trace, round(rate, 9))
        if key not in self._memo:
            self._memo[key] = self._run(system, trace, rate)
        return dict(self._memo[key])

    def _run(self, system: str, trace: str, rate: float) -> dict:
        from kvloop.engine.sim.scenarios import sizing_for
        from kvloop.engine.sim.systems import run_system

        profile = self.profile(trace)
        t = time.perf_counter()
        wl = self.traces.build(trace, rate)
        beyond = rows_beyond(wl, profile.model.context)
        run = run_system(system, profile, wl, sizing_for(profile))
        self.count += 1
        out = summarize(run, system, trace, rate, beyond)
        if (left := rows_left_out(wl)) is not None:
            out["rows_left_out_by_window"] = left
        self.log(f"{trace:9s} {rate:8.3f} req/s {system:22s} good {out['good']}/{out['sent']} "
                 f"goodput {out['goodput_req_s']:.3f}  refused {out['rejections'] or 0}  "
                 f"({time.perf_counter() - t:.1f} s)")
        return out


def summarize(run: dict, system: str, trace: str, rate: float, beyond: int) -> dict:
    """What the results file keeps of a run."""
    s, c = run["slo"], run["client"]
    return {"system": system, "trace": trace, "rate": rate, "sent": s["slo_sent"], "good": s["slo_good"],
            "good_share": s["slo_good_share"], "goodput_req_s": s["slo_goodput_req_s"],
            "span_s": s["slo_span_s"], "offered_req_s": s["offered_req_s"], "missed": s["slo_missed"],
            "throughput_req_s": c["request_throughput_req_s"], "output_tok_s": c["output_throughput_tok_s"],
            "ttft_p50_s": s["ttft_p50_s"], "ttft_p99_s": s["ttft_p99_s"], "tpot_p50_s": s["tpot_p50_s"],
            "tpot_p99_s": s["tpot_p99_s"], "no_hit_ttft_p99_s": s["slo_nohit_ttft_p99_s"],
            "no_hit_requests": s["slo_nohit_count"], "rejections": s["rejections"], "failures": s["failures"],
            "rows_beyond_context": beyond, "hit_rate": run["server"].get("hit_rate_total"),
            "virtual_s": run["sim"]["virtual_s"], "wall_s": run["sim"]["wall_s"]}


def passes(run: dict) -> bool:
    return slo_capacity([(run["rate"], run["good_share"])]) is not None


def sweep(runner: Runner, system: str, trace: str, start: float, step: float = 1.5, refine: int = 2,
          max_steps: int = 4) -> dict:
    """{capacity_req_s (None: no rate tried met the SLO), bracketed (a rate tried above it failed),
    rates_tried (each run, in the order tried)}."""
    if step <= 1 or start <= 0:
        raise ValueError("the sweep needs step > 1 and start > 0")
    tried: list[dict] = []

    def at(rate: float) -> bool:
        r = runner.run(system, trace, rate)
        tried.append(r)
        return passes(r)

    lo = hi = None
    rate = start
    if at(rate):
        lo = rate
        for _ in range(max_steps):
            rate *= step
            if not at(rate):
                hi = rate
                break
            lo = rate
    else:
        hi = rate
        for _ in range(max_steps):
            rate /= step
            if at(rate):
                lo = rate
                break
            hi = rate
    for _ in range(refine if lo is not None and hi is not None else 0):
        mid = math.sqrt(lo * hi)
        if at(mid):
            lo = mid
        else:
            hi = mid
    cap = slo_capacity([(r["rate"], r["good_share"]) for r in tried])
    return {"capacity_req_s": cap, "bracketed": hi is not None and cap is not None and hi > cap,
            "rates_tried": tried}
