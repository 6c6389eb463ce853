"""W5 across step token budgets (pure Python; matplotlib only for the plot): how much the prefill chunk size
moves each system, and whether codesign's lead over continuous+lru is its own or the budget's.

Every system runs the same W5 phases and rates once per budget (the scheduler's max_num_batched_tokens: the
most tokens one step computes, so the largest prefill chunk that rides with the decode rows). Ratios are read
two ways: both systems at the same budget (one row per budget), and each system at its own best budget (the
highest output throughput of its runs), so that a gain a baseline would get from the same tuning is not
credited to codesign. Issue 16's codesign / continuous+lru goals (w5_report.GOALS) are read on both."""

from __future__ import annotations

import json
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


def _ratio(a: dict | None, b: dict | None, key: str) -> float | None:
    x, y = (a or {}).get(key), (b or {}).get(key)
    return x / y if is_number(x) and is_number(y) and y > 0 else None


def goals(entries: list[dict], scale: str, default_budget: int) -> list[dict]:
    """The scale's codesign / continuous+lru goals, both at the default budget and each at its best budget."""
    same = next((e for e in entries if e["budget"] == default_budget), None)
    best = {s: best_budget(entries, s) for s in (CODESIGN, BASELINE)}
    out = []
    for name, metric, system, against, op, bound in w5_report.GOALS[scale]:
        if (system, against) != (CODESIGN, BASELINE):
            continue  # the coordinator's goals need the fixed-cap sweep: bench/w5.py sim
        key = METRICS[metric]
        if same is None:
            out.append(goal(f"{name}, both at budget {default_budget}", None, op, bound, status="not run"))
        else:
            out.append(goal(f"{name}, both at budget {default_budget}",
                            _ratio(same["systems"].get(system), same["systems"].get(against), key), op, bound))
        b_sys, b_against = best[system], best[against]
        value = None if b_sys is None or b_against is None else _ratio(
            b_sys["systems"][system], b_against["systems"][against], key)
        out.append(goal(f"{name}, each at its best budget", value, op, bound,
                        budgets={system: b_sys and b_sys["budget"], against: b_against and b_against["budget"]}))
    return out


def build(entries: list[dict], meta: dict, scale: str) -> dict:
    entries = sorted(entries, key=lambda e: e["budget"])
    w5_load.annotate(entries, METRICS)
    best = {s: (b["budget"] if (b := best_budget(entries, s)) else None) for s in meta["systems"]}
    return {"meta": meta, "scale": scale, "budgets": entries, "best_budget": best,
            "goals": goals(entries, scale, meta["default_budget"])}


def markdown(report: dict, plots: list[str]) -> str:
    meta = report["meta"]
    systems = meta["systems"]
    lines = [f"# {meta['title']}", "",
             f"Rates: chat {meta['rates']['chat']:.3f}, RAG {meta['rates']['rag']:.3f} req/s ({meta['rates_how']}); "
             f"{meta['phase_s']:g} s phases, {meta['duration_s']:g} s in all; seed {meta['seed']}. The scale's "
             f"default budget is {meta['default_budget']}. Started {meta['started']}, {meta['wall_s']:g} s.", "",
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
              f"({w5_report.KEEPS_UP_TTFT_P50_S:g} s): the run fell behind its arrivals.", "", "## Goals", ""]
    for g in report["goals"]:
        lines.append(f"- [{'x' if g['met'] else ' '}] {g['name']}: {fmt(g['value'], 3)} ({g['op']} {g['bound']:g})"
                     + (f"; budgets {g['budgets']}" if g.get("budgets") else ""))
    lines += ["", "## Notes", ""] + [f"- {n}" for n in meta.get("notes", [])]
    lines += ["", "Commands:", ""] + [f"    {c}" for c in meta.get("commands", [])]
    lines += [""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def plot(report: dict, out_dir: Path, stem: str) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    budgets = [e["budget"] for e in report["budgets"]]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for s in report["meta"]["systems"]:
        for ax, key in zip(axes, ("output_throughput_tok_s", "ttft_p99_s"), strict=True):
            ax.plot(budgets, [(e["systems"].get(s) or {}).get(key) for e in report["budgets"]], marker="o", label=s)
    for ax, title in zip(axes, ("output throughput, tok/s", "TTFT P99, s"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("step token budget")
        ax.set_title(title)
        ax.legend()
    axes[1].set_yscale("log")
    fig.tight_layout()
    name = f"{stem}.png"
    fig.savefig(out_dir / name, dpi=100)
    plt.close(fig)
    return [name]


def write(report: dict, out_dir: Path, stem: str) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out_dir / f"{stem}.md").write_text(markdown(report, plot(report, out_dir, stem)))
    return report
