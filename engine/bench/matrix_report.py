"""The CPU robustness matrix's numbers (pure Python; matplotlib only for the heat maps): capacity per system
and trace, the issue's goals computed from the cells, the markdown, the heat maps.

Capacity of the reference (continuous+lru) comes from its sweep (the highest rate tried with >= 95% of the
requests good). For the comparisons every system's capacity is estimated the same way from the matrix's
three loads (`capacity_from_loads`): between the highest load that meets 95% good and the next one that does
not, the good share is taken as linear in the load and the crossing of 95% is the estimate; with no failing
load above, the highest load is a lower bound (flagged); with the lowest load failing already, the crossing
between (0, all good) and it."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from kvloop.engine.bench.goals import goal
from kvloop.engine.bench.heatmap import write_heatmap
from kvloop.engine.bench.metrics import GOOD_SHARE_FOR_CAPACITY
from kvloop.engine.bench.numbers import fmt, is_number

SUBJECT, REFERENCE, VLLM_PREFIX = "codesign", "continuous+lru", "vllm-cpu"
CAPACITY_TRACES = ("w1", "w5-cpu", "mooncake")  # the median trace is of these; W2 is the control
CONTROL_TRACE = "w2"


def capacity_from_loads(points: list[tuple[float, float | None]]) -> tuple[float | None, bool]:
    """(estimated capacity in load units, whether it is only a lower bound) from (load, good share)."""
    pts = sorted((x, s) for x, s in points if s is not None)
    if not pts:
        return None, False
    prev = (0.0, 1.0)
    for x, s in pts:
        if s < GOOD_SHARE_FOR_CAPACITY:
            (x0, s0) = prev
            return x0 + (x - x0) * (s0 - GOOD_SHARE_FOR_CAPACITY) / (s0 - s), False
        prev = (x, s)
    return pts[-1][0], True


def cells_of(result: dict, system: str, trace: str) -> list[dict]:
    return [c for c in result.get("cells", []) if c["system"] == system and c["trace"] == trace]


def cell(result: dict, system: str, trace: str, load: float) -> dict | None:
    return next((c for c in cells_of(result, system, trace) if c["load"] == load), None)


def capacities(result: dict) -> dict:
    """system -> trace -> {"loads": estimate in x of the reference's capacity, "lower_bound"}."""
    out: dict = {}
    for c in result.get("cells", []):
        out.setdefault(c["system"], {}).setdefault(c["trace"], None)
    for system, traces in out.items():
        for trace in traces:
            est, lower = capacity_from_loads([(c["load"], c["m"].get("slo_good_share"))
                                              for c in cells_of(result, system, trace)])
            traces[trace] = {"x_ref_capacity": est, "lower_bound": lower}
    return out


def _ratio(a, b) -> float | None:
    return a / b if is_number(a) and is_number(b) and b else None


def vllm_name(result: dict) -> str | None:
    return next((s for s in result.get("systems", []) if s.startswith(VLLM_PREFIX)), None)


def goals(result: dict, subject: str = SUBJECT, reference: str = REFERENCE) -> list[dict]:
    """The issue's CPU goals from the cells' raw numbers (None where a cell is missing: not met)."""
    caps = capacities(result)
    vllm = vllm_name(result)

    def cap_ratio(system: str | None, trace: str) -> tuple[float | None, bool]:
        a = (caps.get(subject) or {}).get(trace) or {}
        b = (caps.get(system) or {}).get(trace) or {} if system else {}
        return _ratio(a.get("x_ref_capacity"), b.get("x_ref_capacity")), bool(
            a.get("lower_bound") or b.get("lower_bound"))

    out = []
    how = "capacities estimated from the 0.5x/1x/1.5x cells (matrix_report.capacity_from_loads)"
    for other, bound_median, bound_each in ((reference, 1.3, 0.97), (vllm, 1.2, None)):
        ratios = {t: cap_ratio(other, t) for t in CAPACITY_TRACES}
        known = [r for r, _ in ratios.values() if r is not None]
        median = statistics.median(known) if len(known) == len(CAPACITY_TRACES) else None
        out.append(goal(f"capacity {subject} / {other or VLLM_PREFIX}, median of {'/'.join(CAPACITY_TRACES)}",
                        median, ">=", bound_median, how=how,
                        lower_bounds=[t for t, (_, lb) in ratios.items() if lb]))
        if bound_each is not None:
            for t, (r, lb) in ratios.items():
                out.append(goal(f"capacity {subject} / {other} on {t}", r, ">=", bound_each, how=how,
                                lower_bound=lb))
    r, lb = cap_ratio(reference, CONTROL_TRACE)
    out.append(goal(f"capacity {subject} / {reference} on {CONTROL_TRACE} (no reuse)", r, ">=", 0.98,
                    how=how, lower_bound=lb))
    for trace in result.get("traces", []):
        for load in result.get("loads", []):
            a, b = cell(result, subject, trace, load), cell(result, reference, trace, load)
            am, bm = (a or {}).get("m", {}), (b or {}).get("m", {})
            out.append(goal(f"goodput {subject} / {reference} at {trace} {load:g}x",
                            _ratio(am.get("slo_goodput_req_s"), bm.get("slo_goodput_req_s")), ">=", 0.97))
            out.append(goal(f"TTFT P99 {subject} / {reference} at {trace} {load:g}x",
                            _ratio(am.get("ttft_p99_s"), bm.get("ttft_p99_s")), "<=", 1.1))
        a, v = cell(result, subject, trace, 1.0), cell(result, vllm, trace, 1.0) if vllm else None
        p50 = [(x or {}).get("m", {}).get("ttft_p50_s") for x in (a, v)]
        out.append(goal(f"TTFT P50 {subject} / {vllm or VLLM_PREFIX} at {trace} 1x", _ratio(*p50), "<=", 1.0))
    return out


def goodput_ratio_grid(result: dict, subject: str, other: str) -> list[list[float | None]]:
    grid = []
    for trace in result["traces"]:
        row = []
        for load in result["loads"]:
            a, b = cell(result, subject, trace, load), cell(result, other, trace, load)
            row.append(_ratio((a or {}).get("m", {}).get("slo_goodput_req_s"),
                              (b or {}).get("m", {}).get("slo_goodput_req_s")))
        grid.append(row)
    return grid


def heatmaps(result: dict, out_dir: Path, stem: str, subject: str = SUBJECT) -> list[str]:
    """One PNG per comparison: the subject's goodput over the reference's, over vLLM-CPU's."""
    files = []
    for tag, other in (("vs_lru", REFERENCE), ("vs_vllm", vllm_name(result))):
        if other is None or other not in result.get("systems", []):
            continue
        path = out_dir / f"{stem}_{tag}.png"
        if write_heatmap(path, result["traces"], [f"{x:g}x" for x in result["loads"]],
                         goodput_ratio_grid(result, subject, other),
                         f"goodput {subject} / {other} (load: x {REFERENCE} capacity)", center=1.0):
            files.append(path.name)
    return files


COLUMNS = (("goodput req/s", "slo_goodput_req_s", 3, 1), ("good share", "slo_good_share", 2, 1),
           ("req/s", "request_throughput_req_s", 3, 1), ("out tok/s", "output_throughput_tok_s", 1, 1),
           ("TTFT p50 s", "ttft_p50_s", 2, 1), ("TTFT p99 s", "ttft_p99_s", 2, 1),
           ("TPOT p50 ms", "tpot_p50_s", 0, 1000), ("TPOT p99 ms", "tpot_p99_s", 0, 1000),
           ("no-hit TTFT p99 s", "slo_nohit_ttft_p99_s", 2, 1), ("refused", "rejections", 0, 1))


def markdown(result: dict) -> str:
    m = result["meta"]
    lines = ["# Robustness matrix, CPU (live servers)", "", m.get("summary", ""), "",
             f"Machine: {m.get('machine', {}).get('model')} ({m.get('machine_class')}), "
             f"{m.get('machine', {}).get('cores')} cores; commit {m.get('commit')}; {m.get('date')}; quiet: "
             f"{m.get('quiet')} (worst other load {fmt(m.get('worst_other_cores'))} cores).", "",
             "## Capacity sweep of the reference", "",
             "| trace | unit | rates tried | good share | capacity |",
             "|---|---|---|---|---|"]
    for trace, s in result.get("sweep", {}).items():
        lines.append(f"| {trace} | {s.get('unit', '')} | {', '.join(f'{r:g}' for r in s['rates'])} | "
                     f"{', '.join(fmt(x) for x in s['good_shares'])} | {fmt(s.get('capacity'), 3)} |")
    lines += ["", "## Cells (load: x the reference's capacity on that trace)", "",
              "| trace | load | system | offered req/s | " + " | ".join(c[0] for c in COLUMNS) + " | missed "
              "(ttft/tpot/failed) | other CPU |", "|---" * (len(COLUMNS) + 6) + "|"]
    for c in sorted(result.get("cells", []), key=lambda c: (c["trace"], c["load"], c["system"])):
        mm = c["m"]
        miss = mm.get("slo_missed") or {}
        lines.append(f"| {c['trace']} | {c['load']:g}x | {c['system']} | {fmt(c.get('offered_req_s'), 2)} | "
                     + " | ".join(fmt(mm.get(k), d, s) for _, k, d, s in COLUMNS)
                     + f" | {'/'.join(str(miss.get(r, 0)) for r in ('ttft', 'tpot', 'failed'))} | "
                       f"{fmt(c.get('noise', {}).get('other_cores_mean'))} |")
    caps = capacities(result)
    lines += ["", "## Capacity estimates from the three loads (x the reference's capacity)", ""]
    for system, traces in caps.items():
        lines.append(f"- {system}: " + ", ".join(
            f"{t} {fmt(v['x_ref_capacity'])}{' (lower bound)' if v['lower_bound'] else ''}"
            for t, v in traces.items()))
    met = sum(1 for g in result.get("goals", []) if g["met"])
    lines += ["", f"## Goals ({met} of {len(result.get('goals', []))} met)", ""]
    lines += ["- " + json.dumps(g, default=str) for g in result.get("goals", [])]
    if result.get("missing"):
        lines += ["", "Not run: " + "; ".join(f"**{k}**: {v}" for k, v in result["missing"].items())]
    lines += ["", "## Heat maps", ""] + [f"![{Path(p).stem}]({p})" for p in result.get("plots", [])]
    lines += ["", "## Notes", ""] + [f"- {n}" for n in m.get("notes", [])]
    lines += ["", "## Command", "", f"    {m.get('command', '')}"]
    return "\n".join(lines) + "\n"
