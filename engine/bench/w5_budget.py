"""W5 across step token budgets (pure Python; matplotlib only for the plot): how much the prefill chunk size
moves each system, and whether codesign's lead over continuous+lru is its own or the budget's.

Every system runs the same W5 phases and rates once per budget (the scheduler's max_num_batched_tokens: the
most tokens one step computes, so the largest prefill chunk that rides with the decode rows). Ratios are read
two ways: both systems at the same budget (one row per budget), and each system at its own best budget (the
highest output throughput of its runs), so that a gain a baseline would get from the same tuning is not
credited to codesign. Issue 16's codesign / continuous+lru goals (w5_report.GOALS) are read on both."""

from __future__ import annotations

from pathlib import Path

from kvloop.engine.bench import w5_load, w5_report
from kvloop.engine.bench.goals import goal
from kvloop.engine.bench.numbers import fmt, is_number
from kvloop.engine.bench.w5_report import BASELINE, CODESIGN

METRICS = {"throughput": "output_throughput_tok_s", "ttft_p99": "ttft_p99_s"}


def budget_entry(budget: int, runs: dict[str, dict]) -> dict:
    """One budget: each system's whole-run numbers."""
    return {"budget": budget, "systems": w5_load.system_rows(runs)}


def best_budget(entries: list[dict], system: str) -> dict | None:
    """The entry where `system` delivered the most output tokens per second (None: it ran in none)."""
    key = METRICS["throughput"]
    ran = [e for e in entries if is_number((e["systems"].get(system) or {}).get(key))]
    return max(ran, key=lambda e: e["systems"][system][key]) if ran else None


def goals(entries: list[dict], best: dict[str, dict | None], scale: str, default_budget: int) -> list[dict]:
    """The scale's codesign / continuous+lru goals, both at the default budget and each at its best budget
    (`best`: system -> its best entry)."""
    same = next((e for e in entries if e["budget"] == default_budget), None)
    out = []
    for name, metric, system, against, op, bound in w5_report.GOALS[scale]:
        if (system, against) != (CODESIGN, BASELINE):
            continue  # the coordinator's goals need the fixed-cap sweep: bench/w5.py sim
        key = METRICS[metric]
        if same is None:
            out.append(goal(f"{name}, both at budget {default_budget}", None, op, bound, status="not run"))
        else:
            out.append(goal(f"{name}, both at budget {default_budget}",
                            w5_load.ratio(same, key, system, against),
                            op, bound))
        b_sys, b_against = best.get(system), best.get(against)
        value = None
        if b_sys is not None and b_against is not None:
            value = w5_load.ratio({"systems": {system: b_sys["systems"][system],
                                               against: b_against["systems"][against]}}, key, system, against)
        out.append(goal(f"{name}, each at its best budget", value, op, bound,
                        budgets={system: b_sys and b_sys["budget"],
                                 against: b_against and b_against["budget"]}))
    return out


def build(entries: list[dict], meta: dict, scale: str) -> dict:
    entries = sorted(entries, key=lambda e: e["budget"])
    w5_load.annotate(entries, METRICS)
    best = {s: best_budget(entries, s) for s in dict.fromkeys([*meta["systems"], CODESIGN, BASELINE])}
    return {"meta": meta, "scale": scale, "budgets": entries,
            "best_budget": {s: e["budget"] if e else None for s, e in best.items() if s in meta["systems"]},
            "goals": goals(entries, best, scale, meta["default_budget"])}


def markdown(report: dict, plots: list[str]) -> str:
    meta = report["meta"]
    systems = meta["systems"]
    lines = [f"# {meta['title']}", "", __doc__.split("\n\n", 1)[1].replace("\n", " "), "",
             f"Rates: chat {meta['rates']['chat']:.3f}, RAG {meta['rates']['rag']:.3f} req/s "
             f"({meta['rates_how']}); {meta['phase_s']:g} s phases, {meta['duration_s']:g} s in all; seed "
             f"{meta['seed']}. The scale's default budget is {meta['default_budget']}. Started "
             f"{meta['started']}, {meta['wall_s']:g} s.", "",
             "| budget | " + " | ".join(f"{s} out tok/s | {s} TTFT P50 / P99 s" for s in systems)
             + " | codesign / LRU throughput | codesign / LRU TTFT P99 |",
             "|---|" + "---|---|" * len(systems) + "---|---|"]
    for e in report["budgets"]:
        cells = []
        for s in systems:
            row = e["systems"].get(s) or {}
            mark = " (behind)" if s in e["past_capacity"] else ""
            cells += [f"{fmt(row.get('output_throughput_tok_s'), 1)}{mark}",
                      f"{fmt(row.get('ttft_p50_s'), 2)} / {fmt(row.get('ttft_p99_s'), 2)}"]
        lines.append(f"| {e['budget']} | " + " | ".join(cells)
                     + f" | {fmt(e['ratios']['throughput'], 2)} | {fmt(e['ratios']['ttft_p99'], 2)} |")
    lines += ["", "Best budget (highest output throughput): "
              + ", ".join(f"{s} {b}" for s, b in report["best_budget"].items()) + ".", "",
              "(behind): TTFT P50 above W5's keeps-up bound "
              f"({w5_report.KEEPS_UP_TTFT_P50_S:g} s): the run fell behind its arrivals."]
    return "\n".join(lines + w5_load.sweep_tail(report, plots)) + "\n"


def plot(report: dict, out_dir: Path, stem: str) -> list[str]:
    plt = w5_report.pyplot()
    if plt is None:
        return []
    budgets = [e["budget"] for e in report["budgets"]]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for s in report["meta"]["systems"]:
        for ax, key in zip(axes, ("output_throughput_tok_s", "ttft_p99_s"), strict=True):
            ax.plot(budgets, [(e["systems"].get(s) or {}).get(key) for e in report["budgets"]], marker="o",
                    label=s)
    for ax, title in zip(axes, ("output throughput, tok/s", "TTFT P99, s"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set(xlabel="step token budget", title=title)
        ax.legend()
    axes[1].set_yscale("log")
    return [w5_report.save_figure(plt, fig, out_dir / f"{stem}.png", dpi=100)]


def write(report: dict, out_dir: Path, stem: str) -> dict:
    return w5_report.write(report, out_dir, stem, plot, markdown)
