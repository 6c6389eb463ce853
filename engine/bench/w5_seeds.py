"""W5 over several workload seeds (pure Python; matplotlib only for the plot): how much of a codesign /
continuous+lru ratio is the workload's draw.

One W5 run is one draw of arrivals, sessions and documents. Near continuous+lru's capacity whether it falls
behind (and how far) depends on that draw, and so does the throughput ratio: the same rates gave 1.02x and
1.27x on two seeds in the simulator. Here each seed runs every system on the same phases and rates; the ratios
are per seed, and issue 16's codesign / continuous+lru goals (the scale's bounds,
engine/bench/w5_report.GOALS) are read on their median over the seeds, with the spread beside it. A seed's row
says whether each system kept up
(median TTFT within W5's keeps-up bound), which is what moves its ratio. Where the coordinator ran beside
fixed caps, each seed also reads it against that seed's best fixed cap over the whole run
(w5_report.best_fixed), and the coordinator's whole-run goal is read on the median of those ratios."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from kvloop.engine.bench import w5_load, w5_report
from kvloop.engine.bench.goals import goal
from kvloop.engine.bench.numbers import fmt, is_number
from kvloop.engine.bench.w5_report import BASELINE, CODESIGN, COORD

METRICS = {"throughput": "output_throughput_tok_s", "ttft_p99": "ttft_p99_s"}
COORD_RATIO = "coordinator_throughput"  # the coordinator / the seed's best fixed cap, output throughput


def seed_entry(seed: int, runs: dict[str, dict]) -> dict:
    """One seed: each system's whole-run numbers, and where the coordinator ran beside fixed caps, which run
    stands for it and which fixed cap was best over the whole run."""
    out = {"seed": seed, "systems": w5_load.system_rows(runs)}
    best, coord = w5_report.best_fixed(runs).get("whole"), w5_report.coordinator_run(runs)
    if best and coord in runs:
        out["coordinator"] = {"system": coord, "best_fixed_cap": best["system"], "cap": best["cap"]}
    return out


def _coordinator_ratio(entry: dict) -> float | None:
    c = entry.get("coordinator")
    return w5_load.ratio(entry, "output_throughput_tok_s", c["system"], c["best_fixed_cap"]) if c else None


def spread(values: list[float]) -> dict:
    """Median, lowest and highest of the per-seed ratios (None where no seed has one)."""
    if not values:
        return {"median": None, "min": None, "max": None, "seeds": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "seeds": len(values)}


def goals(entries: list[dict], scale: str) -> list[dict]:
    """The scale's codesign / continuous+lru goals, and the coordinator's whole-run one where a seed has it,
    on the median over seeds of the per-seed ratios."""
    out = []
    for name, metric, system, against, op, bound in w5_report.GOALS[scale]:
        if (system, against) == (COORD,
                                 "best") and any(is_number(e["ratios"].get(COORD_RATIO)) for e in entries):
            metric = COORD_RATIO
        elif (system, against) != (CODESIGN, BASELINE):
            continue  # the per-phase coordinator goals need the phases: bench/w5.py sim
        ratios = [r for e in entries if is_number(r := e["ratios"][metric])]
        s = spread(ratios)
        if not ratios:
            out.append(goal(f"{name}, median over seeds", None, op, bound, status="not run"))
            continue
        met_in = sum(1 for r in ratios if (r >= bound if op == ">=" else r <= bound))
        out.append(goal(f"{name}, median over seeds", s["median"], op, bound, min=s["min"], max=s["max"],
                        seeds=s["seeds"], seeds_meeting=met_in))
    return out


def build(entries: list[dict], meta: dict, scale: str) -> dict:
    entries = sorted(entries, key=lambda e: e["seed"])
    w5_load.annotate(entries, METRICS)
    for e in entries:
        e["ratios"][COORD_RATIO] = _coordinator_ratio(e)
    metrics = [*METRICS, *([COORD_RATIO] if any(e.get("coordinator") for e in entries) else [])]
    summary = {m: spread([r for e in entries if is_number(r := e["ratios"][m])]) for m in metrics}
    return {"meta": meta, "scale": scale, "seeds": entries, "summary": summary,
            "goals": goals(entries, scale)}


def markdown(report: dict, plots: list[str]) -> str:
    m, entries = report["meta"], report["seeds"]
    systems = list(dict.fromkeys(n for e in entries for n in e["systems"]))
    lines = [f"# {m.get('title', 'W5 over seeds')}", "", __doc__.split("\n\n", 1)[1].replace("\n", " "), "",
             f"Rates: {json.dumps(m.get('rates'))} ({m.get('rates_how', '')}); phases of {m.get('phase_s')} "
             f"s for {m.get('duration_s')} s of arrivals, then the drain.", "",
             "| seed | system | out tok/s | TTFT p50 s | TTFT p99 s | preempt | makespan s | kept up |",
             "|---|---|---|---|---|---|---|---|"]
    for e in entries:
        for n in systems:
            row = e["systems"].get(n)
            if row is not None:
                lines.append(f"| {e['seed']} | {n} | {fmt(row['output_throughput_tok_s'], 1)} | "
                             f"{fmt(row['ttft_p50_s'])} | {fmt(row['ttft_p99_s'])} | "
                             f"{fmt(row['preemptions'], 0)} | {fmt(row['duration_s'], 0)} | "
                             f"{'no' if w5_load.past_capacity(row) else 'yes'} |")
    lines += ["", "## codesign / continuous+lru per seed", "", "| seed | throughput x | TTFT P99 x |",
              "|---|---|---|"]
    lines += [f"| {e['seed']} | {fmt(e['ratios']['throughput'])} | {fmt(e['ratios']['ttft_p99'])} |"
              for e in entries]
    if COORD_RATIO in report["summary"]:
        lines += ["", "## The coordinator / the seed's best fixed cap (whole run, output throughput)", "",
                  "| seed | coordinator | best fixed cap | throughput x |", "|---|---|---|---|"]
        lines += [f"| {e['seed']} | {c['system']} | {c['best_fixed_cap']} | {fmt(e['ratios'][COORD_RATIO])} |"
                  for e in entries if (c := e.get("coordinator"))]
    lines += ["", "| ratio | median | min | max | seeds |", "|---|---|---|---|---|"]
    lines += [f"| {k} | {fmt(s['median'])} | {fmt(s['min'])} | {fmt(s['max'])} | {s['seeds']} |"
              for k, s in report["summary"].items()]
    return "\n".join(lines + w5_load.sweep_tail(report, plots)) + "\n"


def plot(report: dict, out_dir: Path, stem: str) -> list[str]:
    plt = w5_report.pyplot()
    if plt is None:
        return []
    entries = report["seeds"]
    seeds = [e["seed"] for e in entries]
    panels = [("throughput", "Output throughput", "codesign output", "codesign / continuous+lru"),
              ("ttft_p99", "TTFT P99", "codesign TTFT", "codesign / continuous+lru")]
    if COORD_RATIO in report["summary"]:
        panels.append((COORD_RATIO, "Coordinator output throughput", "codesign+coord output",
                       "coordinator / best fixed cap"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2))
    for ax, (metric, title, goal_name, ylabel) in zip(axes, panels, strict=True):
        vals = [e["ratios"].get(metric) for e in entries]
        ax.bar([str(s) for s in seeds], [v if is_number(v) else 0 for v in vals])
        med = report["summary"][metric]["median"]
        if is_number(med):
            ax.axhline(med, color="k", linestyle="--", label=f"median {med:.3g}")
        bound = next((g["bound"] for g in report["goals"] if g["name"].startswith(goal_name)), None)
        if bound is not None:
            ax.axhline(bound, color="r", linestyle=":", label=f"goal {bound:g}")
        ax.set(xlabel="seed", ylabel=ylabel, title=title)
        ax.legend(fontsize=8)
    fig.suptitle(report["meta"].get("title", "W5 over seeds"))
    return [w5_report.save_figure(plt, fig, out_dir / f"{stem}.png")]


def write(report: dict, out_dir: Path, stem: str) -> dict:
    return w5_report.write(report, out_dir, stem, plot, markdown)
