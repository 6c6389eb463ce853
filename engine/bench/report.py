"""Report: JSON (per system: headline numbers at the main rate, medians over repetitions, capacity from the
rate sweep, every run), ratios of the subject (codesign unless `--subject` names others of the systems, such
as codesign@tpot80: then each one's) against each system, goals checked, markdown with tables, PNG plots."""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from kvloop.engine.bench.goals import goal
from kvloop.engine.bench.metrics import SLO, capacity, slo_capacity
from kvloop.engine.bench.numbers import fmt
from kvloop.engine.bench.suite import SuiteResult

HEADLINE = ("output_throughput_tok_s", "request_throughput_req_s", "total_token_throughput_tok_s",
            "goodput_req_s", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_mean_s",
            "tpot_p50_s",
            "tpot_p90_s", "tpot_p99_s", "itl_mean_s", "itl_p50_s", "itl_p90_s", "itl_p99_s", "e2e_mean_s",
            "e2e_p50_s",
            "e2e_p90_s", "e2e_p99_s", "failed", "rejections", "cached_prompt_share",
            "slo_good", "slo_good_share", "slo_goodput_req_s", "slo_nohit_ttft_p99_s")
SERVER = ("hit_rate_device", "hit_rate_host", "hit_rate_disk", "hit_rate_total", "preemptions", "oom_events",
          "kv_use_mean", "kv_use_mean_while_waiting", "kv_use_max")
# Issue 19's W1 goals, and issue 16's TPOT one (the last): (system, metric, op, bound) on subject / system.
# Ratios of throughput (higher is better), P99 TTFT and P50 TPOT (lower is better); each becomes
# {"name", "value", "op", "bound", "met"}.
# "vllm-cpu" stands for the strongest vLLM variant in the run (bf16 or fp32: on CPUs without native bf16
# either may be faster), so the goal is always against the best vLLM here.
GOALS = (("vllm-cpu", "throughput", ">=", 1.2), ("vllm-cpu", "tpot_p50", "<=", 1.0),
         ("llama.cpp-bf16-np8", "throughput", ">=", 1.5), ("llama.cpp-bf16-np8", "tpot_p50", "<=", 1.0),
         ("continuous+lru", "throughput", ">=", 1.3), ("static", "ttft_p99", "<=", 0.45),
         ("static", "tpot_p50", "<=", 1.2))
SUBJECT = "codesign"  # the system the ratios and goals are of, unless the run names another


def _median(xs: list) -> float | None:
    xs = [x for x in xs if isinstance(x, int | float) and not (isinstance(x, float) and math.isnan(x))]
    return statistics.median(xs) if xs else None


def summarize(suite: SuiteResult, slo: SLO) -> dict:
    systems: dict[str, dict] = {}
    names = list(dict.fromkeys(r.system for r in suite.rows))
    for name in names:
        rows = [r for r in suite.rows if r.system == name]
        main = [r for r in rows if r.rate == suite.main_rate] or rows
        d: dict = {k: _median([r.client.get(k) for r in main]) for k in HEADLINE}
        d.update({k: _median([r.server.get(k) for r in main]) for k in SERVER})
        d["throughput_tok_s"] = d["output_throughput_tok_s"]
        # out-of-memory events: the server's counter where it has one, else client-seen OOM errors
        d["oom_events"] = d["oom_events"] if d["oom_events"] is not None else _median(
            [r.client.get("client_oom_errors") for r in main])
        sweep = sorted({r.rate for r in rows})
        per_rate = [(rate,
                     {"meets_slo": all(r.client["meets_slo"] for r in rows if r.rate == rate)})
                     for rate in sweep]
        d["capacity_req_s"] = capacity(per_rate)
        d["capacity_note"] = (f"largest of swept rates {sweep} meeting TTFT P99 <= {slo.ttft_s} s and TPOT "
                              f"P99 <= {slo.tpot_s * 1000:.0f} ms"
                              + ("" if d["capacity_req_s"] else "; none did"))
        d["capacity_slo_req_s"] = slo_capacity(
            [(rate, _median([r.client.get("slo_good_share") for r in rows if r.rate == rate]))
             for rate in sweep])
        d["sweep"] = [{"rate": rate, **{k: _median([r.client[k] for r in rows if r.rate == rate])
                                        for k in ("output_throughput_tok_s", "ttft_p99_s", "tpot_p99_s")},
                       "meets_slo": m["meets_slo"]} for rate, m in per_rate]
        d["noise_other_cores_mean"] = _median([r.noise.get("other_cores_mean") for r in rows])
        d["noisy_runs"] = sum(1 for r in rows if r.noise.get("noisy"))
        d["info"] = rows[0].info
        d["runs"] = [{"rate": r.rate, "rep": r.rep, "attempts": r.attempts, "client": r.client,
                      "server": {k: v for k, v in r.server.items() if k != "kv_use_series"},
                      "noise": {k: v for k, v in r.noise.items() if k != "series"},
                      **({"last_chain": r.last_chain} if r.last_chain else {})} for r in rows]
        systems[name] = d
    return systems


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def ratios(systems: dict, subject: str = SUBJECT) -> dict:
    """subject / each other system: throughput (higher is better), P99 TTFT and P50 TPOT (lower is better)."""
    cd = systems.get(subject)
    if not cd:
        return {}
    return {name: {"throughput_x": _ratio(cd["throughput_tok_s"], d.get("throughput_tok_s")),
                   "ttft_p99_x": _ratio(cd["ttft_p99_s"], d.get("ttft_p99_s")),
                   "tpot_p50_x": _ratio(cd["tpot_p50_s"], d.get("tpot_p50_s"))}
            for name, d in systems.items() if name != subject}


def ratio_of(r: dict, metric: str) -> float | None:
    """A ratios entry's value (metric: throughput, ttft_p99, tpot_p50), also from reports written before the
    subject could be chosen (their keys were codesign_<metric>_x)."""
    return r.get(f"{metric}_x", r.get(f"codesign_{metric}_x"))


def strongest_variant(family: str, systems: dict) -> str | None:
    """The system of `family` (itself, or `family-<variant>`) with the highest output
    throughput in this run."""
    names = [n for n in systems if n == family or n.startswith(family + "-")]
    scored = [(systems[n].get("throughput_tok_s") or 0.0, n) for n in names]
    return max(scored)[1] if scored else None


def goals(systems: dict, rat: dict, missing: dict[str, str], subject: str = SUBJECT) -> list[dict]:
    out = []
    for family, metric, op, bound in GOALS:
        system = strongest_variant(family, systems) or next(
            (n for n in missing if n == family or n.startswith(family + "-")), family)
        if system == subject:  # a subject is not judged against itself
            continue
        name = f"{subject} {metric} / {system}"
        if system in missing or system not in rat:
            out.append(goal(name, None, op, bound, status="not run",
                            why=missing.get(system, "system not in this run")))
            continue
        out.append(goal(name, rat[system][f"{metric}_x"], op, bound))
    cd = systems.get(subject)
    if cd:
        out.append(goal(f"{subject} oom_events", cd.get("oom_events") or 0, "<=", 0))
    return out


def build(suite: SuiteResult, meta: dict, slo: SLO, subjects: Sequence[str] = (SUBJECT,)) -> dict:
    report = {"meta": meta, "slo": {"ttft_p99_s": slo.ttft_s, "tpot_p99_s": slo.tpot_s},
              "systems": summarize(suite, slo), "missing": suite.missing}
    return judge(report, subjects)


def judge(report: dict, subjects: Sequence[str]) -> dict:
    """The report's ratios and goals from its systems, for each subject: the goals of all of them, the first
    one's ratios as the report's (`subject`, `ratios`), and with several, every one's under
    `ratios_by_subject`."""
    systems, missing = report["systems"], report["missing"]
    by_subject = {s: ratios(systems, s) for s in subjects}
    report.update(subject=subjects[0], ratios=by_subject[subjects[0]],
                  goals=[g for s in subjects for g in goals(systems, by_subject[s], missing, s)])
    report.pop("ratios_by_subject", None)
    if len(subjects) > 1:
        report["ratios_by_subject"] = by_subject
    return report


def rejudge(path: Path, subjects: Sequence[str], command: str) -> dict:
    """A written report (its JSON and markdown, plots kept) with its ratios and goals computed for these
    subjects from the numbers it holds (`kvloop bench --rejudge`, its command line appended to the report's):
    a subject added after a run, without running it again. A subject that is not among its
    systems is a ValueError."""
    report = json.loads(path.read_text())
    absent = [s for s in subjects if s not in report["systems"]]
    if absent:
        raise ValueError(f"--subject {absent[0]!r} is not one of {path}'s systems")
    report = judge(report, subjects)
    report["meta"]["commands"] = [*report["meta"].get("commands", []), command]
    path.write_text(json.dumps(report, indent=1, default=str) + "\n")
    path.with_suffix(".md").write_text(markdown(report,
                                                [str(path.parent / p) for p in report.get("plots", [])]))
    return report


def machine_lines(machine: dict | None) -> list[str]:
    """The machine a report ran on (machine.machine_info), as a paragraph; nothing
    where it was not recorded."""
    if not machine:
        return []
    return [f"Machine: {machine['model']}, {machine['cores']} cores, native bf16: "
            f"{'yes' if machine['native_bf16'] else 'no'} (flags: {' '.join(machine['flags'])}); torch "
            f"{machine['torch']}.", ""]


def markdown(report: dict, plots: list[str]) -> str:
    m = report["meta"]
    lines = [f"# {m.get('title', 'Benchmark report')}", "", m.get("summary", ""), "",
             *machine_lines(m.get("machine")),
             "## Systems at the main rate (medians over repetitions)", "",
             "| system | out tok/s | req/s | TTFT p50 s | TTFT p99 s | TPOT p50 ms | TPOT p99 ms | ITL p99 "
             "ms | E2E p99 s | hit rate (dev/host/disk) | preempt | OOM | failed | capacity req/s | other "
             "CPU | goodput (per-request SLO) req/s | good share | no-hit TTFT p99 s | "
             "capacity at SLO req/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, d in report["systems"].items():
        hit = "/".join(fmt(d.get(f"hit_rate_{t}")) for t in ("device", "host", "disk"))
        lines.append(f"| {name} | {fmt(d['throughput_tok_s'], 1)} | {fmt(d['request_throughput_req_s'], 3)} "
                     f"| {fmt(d['ttft_p50_s'])} | {fmt(d['ttft_p99_s'])} | {fmt(d['tpot_p50_s'], 0, 1000)} | "
                     f"{fmt(d['tpot_p99_s'], 0, 1000)} | {fmt(d['itl_p99_s'], 0, 1000)} | "
                     f"{fmt(d['e2e_p99_s'], 1)} | {hit} | {fmt(d['preemptions'], 0)} | "
                     f"{fmt(d['oom_events'], 0)} | {fmt(d['failed'], 0)} | {fmt(d['capacity_req_s'], 2)} | "
                     f"{fmt(d['noise_other_cores_mean'])} | {fmt(d.get('slo_goodput_req_s'), 3)} | "
                     f"{fmt(d.get('slo_good_share'))} | {fmt(d.get('slo_nohit_ttft_p99_s'))} | "
                     f"{fmt(d.get('capacity_slo_req_s'), 2)} |")
    if report["missing"]:
        lines += ["", "Not run: " + "; ".join(f"**{k}**: {v}" for k, v in report["missing"].items())]
    for subject, rat in report.get("ratios_by_subject",
                                   {report.get("subject", SUBJECT): report["ratios"]}).items():
        lines += ["", f"## Ratios ({subject} / system)", "",
                  "| vs | throughput × | TTFT P99 × | TPOT P50 × |",
                  "|---|---|---|---|"]
        for name, r in rat.items():
            lines.append(f"| {name} | {fmt(ratio_of(r, 'throughput'))} | {fmt(ratio_of(r, 'ttft_p99'))} | "
                         f"{fmt(ratio_of(r, 'tpot_p50'))} |")
    lines += ["", "## Goals", ""]
    for g in report["goals"]:
        lines.append("- " + json.dumps(g, default=str))
    lines += chain_lines(report)
    lines += ["", "## Rate sweep", "",
              "| system | rate req/s | out tok/s | TTFT p99 s | TPOT p99 ms | meets SLO |",
              "|---|---|---|---|---|---|"]
    for name, d in report["systems"].items():
        for s in d["sweep"]:
            lines.append(f"| {name} | {s['rate']:g} | {fmt(s['output_throughput_tok_s'], 1)} | "
                         f"{fmt(s['ttft_p99_s'])} | {fmt(s['tpot_p99_s'], 0, 1000)} | {s['meets_slo']} |")
    lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    for section in ("notes", "commands"):
        if m.get(section):
            lines += ["", f"## {section.capitalize()}", ""]
            lines += ([f"    {c}" for c in m[section]] if section == "commands"
                      else [f"- {n}" for n in m[section]])
    return "\n".join(lines) + "\n"


def chain_lines(report: dict) -> list[str]:
    """Per run at the main rate, the chat session that finished last (chains.py): the closed loop that bounds
    the makespan. Nothing where no run has one (no chat sessions, or a file written before runs kept it)."""
    main = report["meta"].get("main_rate")
    rows = [(name, run) for name, d in report["systems"].items() for run in d.get("runs", [])
            if run.get("last_chain") and (main is None or run["rate"] == main)]
    if not rows:
        return []
    lines = ["",
             "## The last chat session of each run (its turns run one after another: the makespan cannot be "
             "shorter)", "", "| system | rep | makespan s | session | first send s | think s (all gaps) | "
             "TTFT s per turn | decode s per turn | ms per token per turn |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, run in rows:
        c = run["last_chain"]
        lines.append(f"| {name} | {run['rep']} | {fmt(c['makespan_s'], 1)} | {c['session']} | "
                     f"{fmt(c['first_send_s'], 1)} | {fmt(c['think_s'], 1)} | "
                     f"{' / '.join(fmt(x) for x in c['ttft_s'])} | "
                     f"{' / '.join(fmt(x, 1) for x in c['decode_s'])} | "
                     f"{' / '.join(fmt(x, 0) for x in c['ms_per_token'])} |")
    return lines


def plots(suite: SuiteResult, out_dir: Path, stem: str) -> list[str]:
    try:
        import matplotlib
    except ImportError:  # plots are optional: `pip install kvloop[bench]` brings matplotlib
        print("matplotlib is not installed: writing the report without plots", file=sys.stderr)
        return []

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r.system for r in suite.rows))
    files = []

    def save(fig, tag: str) -> None:
        p = out_dir / f"{stem}_{tag}.png"
        fig.tight_layout()
        fig.savefig(p, dpi=90)
        plt.close(fig)
        files.append(str(p))

    fig, ax = plt.subplots(figsize=(6, 4))
    for n in names:
        pts = sorted((r.rate, r.client["output_throughput_tok_s"]) for r in suite.rows if r.system == n)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=n)
    ax.set(xlabel="request rate (req/s)", ylabel="output tokens/s", title="Throughput vs request rate")
    ax.legend(fontsize=7)
    save(fig, "throughput")
    fig, ax = plt.subplots(figsize=(6, 4))
    for n in names:
        ttfts = sorted(t for r in suite.rows if r.system == n and r.rate == suite.main_rate for t in r.ttfts)
        if ttfts:
            ax.plot(ttfts, [(i + 1) / len(ttfts) for i in range(len(ttfts))], label=n)
    ax.set(xlabel="TTFT (s)", ylabel="fraction of requests", title=f"TTFT CDF at {suite.main_rate:g} req/s")
    ax.set_xscale("log")
    ax.legend(fontsize=7)
    save(fig, "ttft_cdf")
    fig, ax = plt.subplots(figsize=(6, 4))
    for n in names:
        row = next((r for r in suite.rows if r.system == n and r.rate == suite.main_rate), None)
        series = (row.server.get("kv_use_series") or []) if row else []
        if series:
            ax.plot([s[0] for s in series], [s[1] for s in series], label=n)
    ax.set(xlabel="time (s)", ylabel="device KV pool use", title="KV use over time (in-process engine modes)")
    ax.legend(fontsize=7)
    save(fig, "kv_use")
    fig, ax = plt.subplots(figsize=(6, 4))
    bottoms = [0.0] * len(names)
    for tier in ("device", "host", "disk"):
        vals = []
        for n in names:
            rows = [r for r in suite.rows if r.system == n and r.rate == suite.main_rate]
            v = _median([r.server.get(f"hit_rate_{tier}") for r in rows])
            if v is None:  # peers without tiers: the share of prompt tokens they reported as cached
                v = _median([r.client.get("cached_prompt_share") for r in rows]) if tier == "device" else 0.0
            vals.append(v or 0.0)
        ax.bar(names, vals, bottom=bottoms, label=tier)
        bottoms = [b + v for b, v in zip(bottoms, vals, strict=True)]
    ax.set(ylabel="prompt tokens from cache", title="Prefix-cache hit rate per tier")
    ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    ax.legend(fontsize=7)
    save(fig, "hit_rate")
    return files


def write(suite: SuiteResult, meta: dict, out_dir: Path, stem: str, slo: SLO | None = None,
          subjects: Sequence[str] = (SUBJECT,)) -> dict:
    slo = slo or SLO()
    out_dir.mkdir(parents=True, exist_ok=True)
    report = build(suite, meta, slo, subjects)
    pngs = plots(suite, out_dir, stem)
    report["plots"] = [Path(p).name for p in pngs]
    (out_dir / f"{stem}.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out_dir / f"{stem}.md").write_text(markdown(report, pngs))
    return report
