"""W5 under rising load (pure Python; matplotlib only for the plot): the same phases at multiples of W5's
rates, each system's whole-run numbers per load, and issue 16's throughput goal read
where it can mean something.

W5's rates sit at ~90% of continuous+lru's capacity, so there every system that keeps up delivers the offered
load and output throughput ties by construction. A system's throughput can only exceed another's at the same
offered load once the other falls behind; past both capacities each delivers what it sustains. So the goal
"codesign >= 1.3x continuous+lru output throughput at the same offered load (and <= 0.5x its P99 TTFT)" is
read at the lowest load of the sweep where both systems are past their capacity (their median request waited
more than 2 s, the W5 report's keeps-up bound): the ratio of sustained throughputs. Higher loads only fill
both queues to their bound (max_waiting): requests are refused and the P99 TTFT of the rest tends to the time
a full queue takes to drain, the same for both, which measures the bound, not the system. Every load's ratios
are in the file and the table, so the reader sees how they grow from the tie and what the heavier loads do."""

from __future__ import annotations

import json
from pathlib import Path

from kvloop.engine.bench import w5_report
from kvloop.engine.bench.goals import goal
from kvloop.engine.bench.numbers import fmt, is_number
from kvloop.engine.bench.w5_report import BASELINE, CODESIGN, KEEPS_UP_TTFT_P50_S

WHOLE = ("output_throughput_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "completed", "rejections",
         "duration_s", "preemptions", "hit_rate_total", "kv_use_mean")


def system_rows(runs: dict[str, dict]) -> dict[str, dict]:
    """Each system's whole-run numbers (with per-kind throughput), as a sweep keeps them."""
    systems = {}
    for name, r in runs.items():
        row = {k: r["whole"].get(k) for k in WHOLE}
        row["by_kind_throughput_tok_s"] = {k: d.get("throughput_tok_s")
                                           for k, d in (r.get("by_kind") or {}).items()}
        systems[name] = row
    return systems


def load_entry(factor: float, rates: dict[str, float], runs: dict[str, dict]) -> dict:
    """One load of the sweep: its factor, rates and each system's whole-run numbers."""
    return {"factor": factor, "rates": rates, "systems": system_rows(runs)}


def past_capacity(row: dict | None) -> bool:
    """The system fell behind at this load: its median request waited longer than W5's keeps-up bound."""
    return row is not None and is_number(row.get("ttft_p50_s")) and row["ttft_p50_s"] > KEEPS_UP_TTFT_P50_S


def ratio(entry: dict, metric: str, system: str = CODESIGN, against: str = BASELINE) -> float | None:
    """system's metric over against's in one entry of a sweep (a load, a seed; None
    where either is missing)."""
    s = entry["systems"]
    a, b = (s.get(system) or {}).get(metric), (s.get(against) or {}).get(metric)
    return a / b if is_number(a) and is_number(b) and b else None


def annotate(entries: list[dict], metrics: dict[str, str]) -> None:
    """Each entry of a sweep (a seed, a budget) gets codesign / continuous+lru `ratios` per metric (name ->
    key of the systems' rows) and the systems `past_capacity` in it."""
    for e in entries:
        e["ratios"] = {m: ratio(e, key) for m, key in metrics.items()}
        e["past_capacity"] = [n for n, row in e["systems"].items() if past_capacity(row)]


def goals(loads: list[dict]) -> list[dict]:
    """Issue 16's W5 throughput and TTFT goals at the sweep's lowest load where both
    systems are past capacity."""
    names = ("codesign / continuous+lru output throughput, both past capacity (the sweep's lowest such load)",
             "codesign / continuous+lru TTFT P99 at that load")
    both = [e for e in sorted(loads, key=lambda x: x["factor"])
            if all(past_capacity(e["systems"].get(n)) for n in (CODESIGN, BASELINE))]
    if not both:
        top = max(loads, key=lambda x: x["factor"], default=None)
        why = ("no load ran" if top is None
               else f"up to x{top['factor']:g} codesign or continuous+lru kept up: "
               "throughputs still follow the offered load")
        return [goal(names[0], None, ">=", 1.3, status="not saturated", why=why),
                goal(names[1], None, "<=", 0.5, status="not saturated", why=why)]
    at = both[0]
    extra = {"factor": at["factor"], "rates": at["rates"]}
    return [goal(names[0], ratio(at, "output_throughput_tok_s"), ">=", 1.3, **extra),
            goal(names[1], ratio(at, "ttft_p99_s"), "<=", 0.5, **extra)]


def build(loads: list[dict], meta: dict) -> dict:
    loads = sorted(loads, key=lambda x: x["factor"])
    for e in loads:
        e["ratios"] = {"throughput": ratio(e, "output_throughput_tok_s"), "ttft_p99": ratio(e, "ttft_p99_s")}
        e["past_capacity"] = [n for n, row in e["systems"].items() if past_capacity(row)]
    return {"meta": meta, "loads": loads, "goals": goals(loads)}


def markdown(report: dict, plots: list[str]) -> str:
    m, loads = report["meta"], report["loads"]
    systems = list(dict.fromkeys(n for e in loads for n in e["systems"]))
    lines = [f"# {m.get('title', 'W5 under rising load')}", "",
             __doc__.split("\n\n", 1)[1].replace("\n", " "), "",
             f"Base rates (x1): {json.dumps(m.get('base_rates'))} ({m.get('rates_how', '')}); "
             f"phases of {m.get('phase_s')} s for {m.get('duration_s')} s of arrivals, then the drain."
             + (f" The coordinator's TPOT P50 objective (it steers the step token budget): "
                f"{m['coordinator_tpot_p50_s']:g} s." if m.get("coordinator_tpot_p50_s") else ""), "",
             "| load | rates chat/rag req/s | system | out tok/s | TTFT p50 s | TTFT p99 s | TPOT p50 ms | "
             "preempt | rejected | makespan s | past capacity |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in loads:
        r = e["rates"]
        for n in systems:
            row = e["systems"].get(n)
            if row is None:
                continue
            lines.append(f"| x{e['factor']:g} | {r.get('chat', 0):.3g}/{r.get('rag', 0):.3g} | {n} | "
                         f"{fmt(row['output_throughput_tok_s'], 1)} | {fmt(row['ttft_p50_s'])} | "
                         f"{fmt(row['ttft_p99_s'])} | {fmt(row['tpot_p50_s'], 0, 1e3)} | "
                         f"{fmt(row['preemptions'], 0)} | {fmt(row['rejections'], 0)} | "
                         f"{fmt(row['duration_s'], 0)} | {'yes' if past_capacity(row) else 'no'} |")
    lines += ["", "## codesign / continuous+lru at each load", "", "| load | throughput x | TTFT P99 x |",
              "|---|---|---|"]
    lines += [f"| x{e['factor']:g} | {fmt(e['ratios']['throughput'])} | {fmt(e['ratios']['ttft_p99'])} |"
              for e in loads]
    return "\n".join(lines + sweep_tail(report, plots)) + "\n"


def sweep_tail(report: dict, plots: list[str]) -> list[str]:
    """The closing lines of a sweep's markdown (loads, seeds, budgets): its goals,
    plots, commands and notes."""
    m = report["meta"]
    lines = ["", "## Goals", ""] + [f"- {json.dumps(g, default=str)}" for g in report["goals"]]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    lines += ["", "## Commands", ""] + [f"    {c}" for c in m.get("commands", [])]
    return lines + [f"- {n}" for n in m.get("notes", [])]


def plot(report: dict, out_dir: Path, stem: str) -> list[str]:
    plt = w5_report.pyplot()
    if plt is None:
        return []
    loads = report["loads"]
    systems = list(dict.fromkeys(n for e in loads for n in e["systems"]))
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for n in systems:
        pts = [(e["factor"], e["systems"][n]) for e in loads if n in e["systems"]]
        a.plot([x for x, _ in pts], [r["output_throughput_tok_s"] for _, r in pts], marker="o", label=n)
        b.plot([x for x, _ in pts], [r["ttft_p99_s"] for _, r in pts], marker="o", label=n)
    a.set(xlabel="load (x W5's rates)", ylabel="output tokens/s", title="Output throughput")
    b.set(xlabel="load (x W5's rates)", ylabel="s", title="TTFT P99", yscale="log")
    a.legend(fontsize=8)
    fig.suptitle(report["meta"].get("title", "W5 under rising load"))
    return [w5_report.save_figure(plt, fig, out_dir / f"{stem}.png")]


def write(report: dict, out_dir: Path, stem: str) -> dict:
    return w5_report.write(report, out_dir, stem, plot, markdown)
