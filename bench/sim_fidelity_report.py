"""sim_fidelity.md and sim_fidelity.png from the report sim_fidelity.py builds: the table, and per mode the
pooled TTFT distributions of the real engine and of the simulator (CDFs), which show more than two
percentiles of 160 requests can."""

from __future__ import annotations

import json
from pathlib import Path

from sim_fidelity import rel_error  # bench/ is on sys.path when run as a script

from kvloop.engine.bench.numbers import fmt
from kvloop.engine.bench.report import machine_lines

LABELS = (("throughput_tok_s", "throughput tok/s", "{:.1f}"), ("ttft_p50_s", "TTFT P50 s", "{:.2f}"),
          ("ttft_p99_s", "TTFT P99 s", "{:.2f}"))


def pair(real: float | None, sim: float | None, fmt: str) -> str:
    """A table cell 'real / sim (+x%)'; a dash for a missing number, no percentage without both."""
    err = rel_error(sim, real)
    cells = [fmt.format(x) if isinstance(x, int | float) else "—" for x in (real, sim)]
    return " / ".join(cells) + (f" ({err:+.0%})" if err is not None else "")


def write_report(results: Path, report: dict) -> None:
    modes = report["modes"]
    lines = ["# Simulator fidelity on this CPU", "",
             f"Workload: {report['workload']['name']}, seeds "
             f"{', '.join(map(str, report['workload']['seeds']))}. Statistic: {report['statistic']}. "
             f"Calibration: {report['calibration']}. Goal: within {report['goal_rel_error']:.0%}.", "",
             "| mode | " + " | ".join(f"{label}, real / sim" for _, label, _ in LABELS)
             + " | within goal | other cores (max over runs) |",
             "|---|" + "---|" * len(LABELS) + "---|---|"]
    for mode, row in modes.items():
        cells = [pair(row["real"][k], row["sim"][k], fmt) for k, _, fmt in LABELS]
        lines.append(f"| {mode} | " + " | ".join(cells) + f" | {'yes' if row['within_goal'] else 'no'} | "
                     f"{row['real_noise_other_cores']:.2f} |")
    lines += ["", "Per-seed medians (the statistic before TTFTs were pooled):", "",
              "| mode | " + " | ".join(f"{label}, real / sim" for _, label, _ in LABELS) + " |",
              "|---|" + "---|" * len(LABELS)]
    for mode, row in modes.items():
        med = row["median_over_seeds"]
        cells = [pair(med["real"][k], med["sim"][k], fmt) for k, _, fmt in LABELS]
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    lines += ["", "Engine busy seconds (summed step time) real / sim, median over seeds: " + "; ".join(
        f"{m} {r['busy_s']['real']:.1f} / {r['busy_s']['sim']:.1f}" for m, r in modes.items()) + ".",
        "", "![TTFT CDFs](sim_fidelity.png)", ""]
    if report.get("machine"):
        lines[1:1] = ["", *machine_lines(report["machine"])]
    if report.get("goals"):
        lines += ["## Goals", "", *("- " + json.dumps(g, default=str) for g in report["goals"]), ""]
    (results / "sim_fidelity.md").write_text("\n".join(lines))
    _plot(results, modes)


def _plot(results: Path, modes: dict) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return
    fig, axes = plt.subplots(1, len(modes), figsize=(4 * len(modes), 3.5), squeeze=False)
    for ax, (mode, row) in zip(axes[0], modes.items(), strict=True):
        for side, style in (("real", "-"), ("sim", "--")):
            xs = row["ttfts"][side]
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], style, where="post", label=side)
        ax.set(xscale="log", xlabel="TTFT (s)", title=mode)
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # labels on decades only
    axes[0][0].set(ylabel="share of requests")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(results / "sim_fidelity.png", dpi=80)
    plt.close(fig)


# ---- W5 (sim_fidelity_w5.py) ----------------------------------------------------------------------------
W5_WHOLE = (("output_throughput_tok_s", "out tok/s", "{:.1f}"), ("ttft_p50_s", "TTFT P50 s", "{:.2f}"),
            ("ttft_p99_s", "TTFT P99 s", "{:.2f}"), ("preemptions", "preemptions", "{:.0f}"),
            ("hit_rate_total", "hit rate", "{:.2f}"))
W5_KIND = (("throughput_tok_s", "out tok/s", "{:.1f}"), ("ttft_p50_s", "TTFT P50 s", "{:.2f}"),
           ("ttft_p99_s", "TTFT P99 s", "{:.2f}"), ("preemptions", "preemptions", "{:.0f}"))


def _machine_name(machine: dict | str | None) -> str:
    """A calibration's machine: machine_info's model (newer files), or the profile name older files wrote."""
    return machine.get("model", "?") if isinstance(machine, dict) else str(machine)


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |",
            "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]


def w5_markdown(report: dict, plots: list[str]) -> str:
    m, systems = report["meta"], report["systems"]
    w, cal = m["workload"], m["calibration"]
    goals = {g["system"]: g for g in report["goals"]}
    lines = [f"# {m['title']}", "",
             f"Real runs: `{m['real_file']}` (engine: {m['real_engine']}, started {m.get('real_started')}, "
             f"torch threads {m.get('real_threads') or 'not recorded'}), read, not rerun. Simulated on the "
             f"same workload ({w['name']}, phase rates {json.dumps(w['phase_rates'])} req/s, phases of "
             f"{w['phase_s']:g} s over {w['duration_s']:g} s, seed {w['seed']}, {w['num_requests']} "
             f"requests) with the real engine's sizing, profile `{report['profile']}`, calibration "
             f"`{cal['path']}`"
             + (f" (fitted with {cal.get('threads')} threads on {_machine_name(cal.get('machine'))}, "
                f"{cal.get('dtype')})."
                if cal.get("exists") else " (missing: placeholder efficiencies).")
             + f" Goal (issue 16): simulated output throughput within {report['goal_rel_error']:.0%} of the "
             "real engine's, per system.", "", *machine_lines(m.get("real_machine")),
             "## Whole run (real / sim)", ""]
    lines += _table(["system", *(label for _, label, _ in W5_WHOLE), "within goal", "other cores (real)"],
                    [[n, *(pair(r["real"][k], r["sim"][k], fmt) for k, _, fmt in W5_WHOLE),
                      "yes" if goals[n]["met"] else "no", fmt(r.get("real_noise_other_cores"))]
                     for n, r in systems.items()])
    lines += ["", "## Per phase kind (real / sim)", ""]
    lines += _table(["system", "phases", *(label for _, label, _ in W5_KIND)],
                    [[n, kind, *(pair(d["real"].get(k), d["sim"].get(k), fmt) for k, _, fmt in W5_KIND)]
                     for n, r in systems.items() for kind, d in r["by_kind"].items()])
    sizings: dict[str, list[str]] = {}  # systems with one sizing share a line
    for n, r in systems.items():
        sizings.setdefault(f"{r['sizing_from']}: {json.dumps(r['sizing'])}", []).append(n)
    lines += ["", "## Sizing (before a fixed cap)",
              ""] + [f"- {', '.join(ns)}: {s}" for s, ns in sizings.items()]
    lines += ["", "## Goals", ""] + ["- " + json.dumps(g, default=str) for g in report["goals"]]
    lines += ["", *(f"![{Path(p).stem}]({Path(p).name})" for p in plots)]
    lines += ["", "## Notes", ""] + [f"- {n}" for n in m["notes"]]
    lines += ["", "## Commands", ""] + [f"    {c}" for c in m["commands"]]
    lines += ["", "The real runs':", ""] + [f"    {c}" for c in m["real_commands"]]
    return "\n".join(lines) + "\n"


def write_w5_report(out: Path, report: dict, stem: str) -> list[str]:
    """<stem>.md and <stem>.png; returns the plots' file names."""
    plots = _plot_w5(out, report, stem)
    (out / f"{stem}.md").write_text(w5_markdown(report, plots))
    return plots


def _plot_w5(out: Path, report: dict, stem: str) -> list[str]:
    """Output throughput real against simulated per system: the whole run, then each phase kind."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    systems = report["systems"]
    kinds = list(dict.fromkeys(k for r in systems.values() for k in r["by_kind"]))
    panels = [("whole run", lambda r, side: r[side]["output_throughput_tok_s"])] + [
        (f"{k} phases", lambda r, side, k=k: r["by_kind"].get(k, {}).get(side, {}).get("throughput_tok_s"))
        for k in kinds]
    fig, axes = plt.subplots(1, len(panels), figsize=(1.2 + (1 + 0.9 * len(systems)) * len(panels), 4),
                             squeeze=False, sharey=True)
    xs, width = range(len(systems)), 0.4
    for ax, (title, value) in zip(axes[0], panels, strict=True):
        for i, side in enumerate(("real", "sim")):
            ax.bar([x + (i - 0.5) * width for x in xs], [value(r, side) or 0 for r in systems.values()],
                   width,
                   label=side)
        ax.set_xticks(list(xs), list(systems), rotation=25, ha="right", fontsize=7)
        ax.set_title(title)
    axes[0][0].set_ylabel("output tokens/s")
    axes[0][0].legend()
    fig.suptitle(report["meta"]["title"])
    fig.tight_layout()
    fig.savefig(out / f"{stem}.png", dpi=80)
    plt.close(fig)
    return [f"{stem}.png"]
