"""sim_fidelity.md and sim_fidelity.png from the report sim_fidelity.py builds: the table, and per mode the
pooled TTFT distributions of the real engine and of the simulator (CDFs), which show more than two
percentiles of 160 requests can."""

from __future__ import annotations

from pathlib import Path

LABELS = (("throughput_tok_s", "throughput tok/s", "{:.1f}"), ("ttft_p50_s", "TTFT P50 s", "{:.2f}"),
          ("ttft_p99_s", "TTFT P99 s", "{:.2f}"))


def write_report(results: Path, report: dict) -> None:
    modes = report["modes"]
    lines = ["# Simulator fidelity on this CPU", "",
             f"Workload: {report['workload']['name']}, seeds {', '.join(map(str, report['workload']['seeds']))}. "
             f"Statistic: {report['statistic']}. Calibration: {report['calibration']}. Goal: within "
             f"{report['goal_rel_error']:.0%}.", "",
             "| mode | " + " | ".join(f"{label}, real / sim" for _, label, _ in LABELS)
             + " | within goal | other cores (max over runs) |",
             "|---|" + "---|" * len(LABELS) + "---|---|"]
    for mode, row in modes.items():
        cells = [f"{fmt.format(row['real'][k])} / {fmt.format(row['sim'][k])} ({row['rel_error'][k]:+.0%})"
                 for k, _, fmt in LABELS]
        lines.append(f"| {mode} | " + " | ".join(cells) + f" | {'yes' if row['within_goal'] else 'no'} | "
                     f"{row['real_noise_other_cores']:.2f} |")
    lines += ["", "Per-seed medians (the statistic before TTFTs were pooled):", "",
              "| mode | " + " | ".join(f"{label}, real / sim" for _, label, _ in LABELS) + " |",
              "|---|" + "---|" * len(LABELS)]
    for mode, row in modes.items():
        med = row["median_over_seeds"]
        cells = [f"{fmt.format(med['real'][k])} / {fmt.format(med['sim'][k])} "
                 f"({(med['sim'][k] - med['real'][k]) / med['real'][k]:+.0%})" for k, _, fmt in LABELS]
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    lines += ["", "Engine busy seconds (summed step time) real / sim, median over seeds: " + "; ".join(
        f"{m} {r['busy_s']['real']:.1f} / {r['busy_s']['sim']:.1f}" for m, r in modes.items()) + ".",
        "", "![TTFT CDFs](sim_fidelity.png)", ""]
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
