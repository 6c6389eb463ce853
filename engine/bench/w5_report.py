"""W5's report (pure Python; matplotlib only for the plots): one summary per system (the simulator's and
the real engine's runs alike), the best fixed cap over the whole run and per phase kind, issue 16's W5
goals computed from the numbers in the file, a markdown page and PNG plots with the phases shaded."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from kvloop.engine.bench.goals import goal
from kvloop.engine.bench.numbers import fmt, is_number
from kvloop.engine.bench.w5_variants import PERIODS, parse_variant

CLIENT = ("output_throughput_tok_s", "request_throughput_req_s", "goodput_req_s", "ttft_p50_s", "ttft_p99_s",
          "tpot_p50_s", "tpot_p99_s", "e2e_p99_s", "completed", "failed", "rejections", "duration_s",
          "total_output_tokens", "cached_prompt_share")
SERVER = ("preemptions", "oom_events", "server_rejections", "hit_rate_device", "hit_rate_host",
          "hit_rate_disk",
          "hit_rate_total", "kv_use_mean", "kv_use_max", "kv_use_mean_while_waiting")
BASELINE, CODESIGN, COORD = "continuous+lru", "codesign", "codesign+coord"
# Issue 16's W5 goals per scale: (name, metric, system, against, op, bound). `against` is a system, or
# "best fixed cap" (whole run) / "best fixed cap in <kind> phases"; metrics as in `_value`. A phase kind's
# throughput is its served throughput (engine.bench.phases): the tokens of the requests sent in its phases
# over the time until the last of them finished, so a backlog is charged to the phase whose requests waited.
# the coordinator against the best fixed cap, phase kind by phase kind: the same at either scale
PHASE_GOALS = (
    ("codesign+coord chat-phase served throughput / best fixed cap in chat phases", "chat_throughput", COORD,
     "best:chat", ">=", 0.9),
    ("codesign+coord RAG-phase served throughput / best fixed cap in RAG phases", "rag_throughput", COORD,
     "best:rag", ">=", 0.9),
)
GOALS = {
    "gpu": (("codesign output throughput / continuous+lru", "throughput", CODESIGN, BASELINE, ">=", 1.3),
            ("codesign TTFT P99 / continuous+lru", "ttft_p99", CODESIGN, BASELINE, "<=", 0.5),
            ("codesign+coord output throughput / best fixed cap (whole run)", "throughput", COORD, "best",
             ">=", 1.15),
            *PHASE_GOALS),
    "cpu": (("codesign output throughput / continuous+lru", "throughput", CODESIGN, BASELINE, ">=", 1.2),
            ("codesign TTFT P99 / continuous+lru", "ttft_p99", CODESIGN, BASELINE, "<=", 0.6),
            *PHASE_GOALS),
}


def run_summary(system: str, client: dict, server: dict, phase_report: dict, **extra) -> dict:
    """One system's run in the file's shape: whole-run numbers, phases, phases by kind, timeline, extras."""
    whole = {k: client.get(k) for k in CLIENT}
    whole.update({k: server.get(k) for k in SERVER})
    return {"system": system, "whole": whole, **phase_report, **extra}


def _value(run: dict | None, metric: str) -> float | None:
    if run is None:
        return None
    w = run["whole"]
    if metric == "throughput":
        return w["output_throughput_tok_s"]
    if metric == "ttft_p99":
        return w["ttft_p99_s"]
    kind = metric.removesuffix("_throughput")
    return (run.get("by_kind") or {}).get(kind, {}).get("served_tok_s")


def fixed_caps(runs: dict[str, dict]) -> dict[str, int]:
    """Each fixed-cap run's cap, in ascending order: the mode@capN runs, and a plain run of a swept mode
    (coordinator off) at its default cap (its recorded sizing's max_num_seqs) where the sweep has no run at
    that cap: it is the same engine (at CPU scale `codesign` is `codesign@cap64`), so
    it need not run twice."""
    caps = {n: v.cap for n in runs if (v := parse_variant(n)).cap}
    swept = {parse_variant(n).mode for n in caps}
    for n, r in runs.items():
        v, default = parse_variant(n), (r.get("sizing") or {}).get("max_num_seqs")
        if (v.mode in swept and not v.cap and not v.coordinator and default
                and default not in {c for m, c in caps.items() if parse_variant(m).mode == v.mode}):
            caps[n] = default
    return dict(sorted(caps.items(), key=lambda x: x[1]))


def fixed_cap_runs(runs: dict[str, dict]) -> dict[str, dict]:
    return {n: runs[n] for n in fixed_caps(runs)}


TIE = 0.005  # throughputs this close (relative) tie; the lower TTFT P99 then wins
# A fixed cap competes for a phase's (or the run's) best only where it kept up: the median request sent in
# that window waited at most this long (W5's TTFT SLO). A cap that falls behind carries its backlog into the
# next phase, and its window throughput there (finished tokens / window) measures that backlog, not the phase:
# cap 16 "won" the GPU run's RAG phases at 477 tok/s with a median TTFT of 115 s, where every cap that kept
# up delivered the ~355 tok/s the RAG phases offer. Where no cap kept up, all compete.
KEEPS_UP_TTFT_P50_S = 2.0


def _pick(scored: list[tuple[float, float | None, str, float | None]]) -> tuple[float, str]:
    """(throughput, system) of the best of (throughput, TTFT P99, system, TTFT P50): among those that kept up
    (KEEPS_UP_TTFT_P50_S; all where none did), the highest throughput, within TIE the lowest TTFT P99."""
    kept_up = [x for x in scored if is_number(x[3]) and x[3] <= KEEPS_UP_TTFT_P50_S]
    scored = kept_up or scored
    top = max(x[0] for x in scored)
    tied = [x for x in scored if x[0] >= top * (1 - TIE)]
    v, _, name, _ = min(tied, key=lambda x: (x[1] if is_number(x[1]) else math.inf, -x[0]))
    return v, name


def best_fixed(runs: dict[str, dict]) -> dict:
    """The fixed cap with the highest output throughput over the whole run and in each phase kind (by the
    phases' served throughput) among those that kept up there; near-ties (TIE) go to the lower P99 TTFT."""
    caps = fixed_caps(runs)  # once: it parses every run's name
    fixed = {n: runs[n] for n in caps}
    kinds = list(dict.fromkeys(k for r in fixed.values() for k in (r.get("by_kind") or {})))
    out: dict = {}
    for key in ["whole", *kinds]:
        metric = "throughput" if key == "whole" else f"{key}_throughput"
        scored = []
        for name, r in fixed.items():
            v = _value(r, metric)
            where = r["whole"] if key == "whole" else r["by_kind"][key]
            if is_number(v):
                scored.append((v, where.get("ttft_p99_s"), name, where.get("ttft_p50_s")))
        if scored:
            v, name = _pick(scored)
            out[key] = {"system": name, "cap": caps[name], "throughput_tok_s": v}
    return out


def best_fixed_per_phase(runs: dict[str, dict]) -> list[dict]:
    """Phase by phase: the fixed cap with the highest served throughput among those that kept up (ties: lower
    TTFT P99)."""
    caps = fixed_caps(runs)
    fixed = {n: runs[n] for n in caps if runs[n].get("phases")}
    if not fixed:
        return []
    out = []
    for i, ph in enumerate(next(iter(fixed.values()))["phases"]):
        scored = [(p["served_tok_s"], p["ttft_p99_s"], n, p.get("ttft_p50_s"))
                  for n, r in fixed.items() if i < len(r["phases"])
                  and is_number((p := r["phases"][i]).get("served_tok_s"))]
        if scored:
            v, name = _pick(scored)
            out.append({"index": ph["index"], "kind": ph["kind"], "system": name, "cap": caps[name],
                        "throughput_tok_s": v})
    return out


def coordinator_run(runs: dict[str, dict]) -> str:
    """The run that stands for the coordinator in the goals: codesign+coord (its default settings) where it
    ran, else the first coordinator variant of codesign (a shortened real-engine run may
    take one period only)."""
    if COORD in runs:
        return COORD
    return next((n for n in runs if (v := parse_variant(n)).coordinator and v.mode == CODESIGN), COORD)


def goals(runs: dict[str, dict], scale: str) -> list[dict]:
    best = best_fixed(runs)
    out = []
    coord = coordinator_run(runs)
    for name, metric, system, against, op, bound in GOALS[scale]:
        system = coord if system == COORD else system
        if against.startswith("best"):
            key = against.partition(":")[2] or "whole"
            ref = runs.get(best[key]["system"]) if key in best else None
            ref_name = best[key]["system"] if key in best else "no fixed-cap run"
        else:
            ref, ref_name = runs.get(against), against
        a, b = _value(runs.get(system), metric), _value(ref, metric)
        if not (is_number(a) and is_number(b) and b):
            out.append(goal(name, None, op, bound, status="not run", systems=[system, ref_name]))
            continue
        out.append(goal(name, a / b, op, bound, systems=[system, ref_name], values=[a, b]))
    if scale == "gpu":
        oom = [x for r in runs.values() if is_number(x := r["whole"].get("oom_events"))]
        out.append(goal("OOM events, every run", sum(oom) if oom else None, "<=", 0))
        swept = sorted({v.period_s for n in runs if (v := parse_variant(n)).coordinator and v.period_s
                        and runs[n].get("event_path")})
        out.append(goal("coordinator periods swept with the event path on (1, 5, 10, 30, 60 s)",
                        len([p for p in swept if p in PERIODS]), ">=", len(PERIODS), periods=swept))
    return out


def capacity_goals(system: str, capacity: dict[str, float | None], rates: dict[str, float],
                   baseline: dict[str, float | None] | None) -> list[dict]:
    """A capacity file's goals, per phase kind. continuous+lru's: W5's rate stays below its capacity
    (WORKLOADS.md sets it at ~90%). Another system's, with continuous+lru's capacity at hand: issue 16's 1.3x
    throughput goal read as the load carried under the same SLO (at W5's rates every
    system that keeps up ties)."""
    out = []
    for kind, cap in capacity.items():
        if system == BASELINE:
            value = rates[kind] / cap if cap else None
            out.append(goal(f"W5's {kind} rate / continuous+lru's {kind} capacity", value, "<=", 1.0))
        else:
            ref = (baseline or {}).get(kind)
            value = cap / ref if cap and ref else None
            out.append(goal(f"{system} / continuous+lru {kind} capacity", value, ">=", 1.3))
    return out


def build(runs: dict[str, dict], meta: dict, scale: str) -> dict:
    return {"meta": meta, "scale": scale, "systems": runs, "best_fixed_cap": best_fixed(runs),
            "best_fixed_cap_per_phase": best_fixed_per_phase(runs), "goals": goals(runs, scale)}


# ---- markdown -----------------------------------------------------------------------------------------
def _hits(d: dict) -> str:
    return "/".join(fmt(d.get(f"hit_rate_{t}")) for t in ("device", "host", "disk"))


def _budget_range(run: dict) -> str:
    """The step token budget over the run's timeline (one sample a second): lowest, median and highest."""
    xs = sorted(b for b in (run.get("timeline") or {}).get("step_token_budget") or [] if is_number(b))
    return f"{xs[0]:g} / {xs[len(xs) // 2]:g} / {xs[-1]:g}" if xs else "—"


def markdown(report: dict, plots: list[str]) -> str:
    m, runs = report["meta"], report["systems"]
    lines = [f"# {m.get('title', 'W5')}", ""] + ([m["summary"], ""] if m.get("summary") else []) + [
        "| | |", "|---|---|"]
    for k in ("workload", "profile", "phase_rates", "phase_s", "duration_s", "requests", "sessions", "sizing",
              "rates_how", "coordinator_tpot_p50_s"):
        if k in m:
            lines.append(f"| {k} | "
                         f"{json.dumps(m[k], default=str) if isinstance(m[k], dict | list) else m[k]} |")
    lines += ["", "## Whole run", "",
              "| system | out tok/s | req/s | TTFT p50 s | TTFT p99 s | TPOT p50 ms | TPOT p99 ms | preempt "
              "| OOM | hit dev/host/disk | KV use mean | failed |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in runs.items():
        w = r["whole"]
        lines.append(f"| {name} | {fmt(w['output_throughput_tok_s'], 1)} | "
                     f"{fmt(w['request_throughput_req_s'], 3)} | {fmt(w['ttft_p50_s'])} | "
                     f"{fmt(w['ttft_p99_s'])} | {fmt(w['tpot_p50_s'], 0, 1000)} | "
                     f"{fmt(w['tpot_p99_s'], 0, 1000)} | {fmt(w['preemptions'], 0)} | "
                     f"{fmt(w['oom_events'], 0)} | {_hits(w)} | {fmt(w['kv_use_mean'])} | "
                     f"{fmt(w['failed'], 0)} |")
    lines += ["", "## Per phase kind (all phases of a kind pooled)", "",
              "| system | phase | served tok/s | window tok/s | TTFT p50 s | TTFT p99 s | TPOT p50 ms | TPOT "
              "p99 ms | preempt | hit dev/host/disk | KV use mean |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in runs.items():
        for kind, d in (r.get("by_kind") or {}).items():
            lines.append(f"| {name} | {kind} | {fmt(d.get('served_tok_s'), 1)} | "
                         f"{fmt(d['throughput_tok_s'], 1)} | {fmt(d['ttft_p50_s'])} | "
                         f"{fmt(d['ttft_p99_s'])} | {fmt(d['tpot_p50_s'], 0, 1000)} | "
                         f"{fmt(d['tpot_p99_s'], 0, 1000)} | {fmt(d['preemptions'], 0)} | {_hits(d)} | "
                         f"{fmt(d['kv_use_mean'])} |")
    best = report["best_fixed_cap"]
    fixed, caps = fixed_cap_runs(runs), fixed_caps(runs)
    if fixed:
        kinds = [k for k in best if k != "whole"]
        lines += ["", "## Fixed caps through the same phases (coordinator off)", "",
                  "| system | whole out tok/s | " + " | ".join(f"{k} tok/s" for k in kinds)
                  + " | TTFT p99 s | preempt |",
                  "|---|---|" + "---|" * len(kinds) + "---|---|"]
        for name, r in [*fixed.items(), *((n, runs[n]) for n in runs if parse_variant(n).coordinator)]:
            cells = [fmt(_value(r, "throughput"),
                         1) + (" **best**" if best.get("whole", {}).get("system") == name
                                                       else "")]
            cells += [fmt(_value(r, f"{k}_throughput"),
                          1) + (" **best**" if best[k]["system"] == name else "")
                      for k in kinds]
            label = (name if parse_variant(name).cap or name not in fixed
                     else f"{name} (its cap: {caps[name]})")
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {fmt(r['whole']['ttft_p99_s'])} | "
                         f"{fmt(r['whole']['preemptions'], 0)} |")
        lines += ["",
                  f"Best fixed cap (among the caps that kept up there: TTFT P50 <= {KEEPS_UP_TTFT_P50_S:g} "
                  "s): " + ", ".join(f"{k}: cap {v['cap']} ({fmt(v['throughput_tok_s'], 1)} tok/s)"
                                                    for k, v in best.items())]
        per = report.get("best_fixed_cap_per_phase") or []
        if per:
            lines += ["",
                      "Best fixed cap phase by phase: " + ", ".join(f"{p['index']} {p['kind']}: {p['cap']}"
                                                                      for p in per)]
    coord = {n: r for n, r in runs.items() if parse_variant(n).coordinator}
    if coord:
        lines += ["", "## Coordinator runs", "",
                  "| system | period s | event path | decisions changed | final cap | final watermark | "
                  "step budget min / median / max |", "|---|---|---|---|---|---|---|"]
        for name, r in coord.items():
            fb = r.get("feedback") or {}
            lines.append(f"| {name} | {fb.get('period_s', '—')} | {r.get('event_path')} | "
                         f"{len(fb.get('changes') or [])} | {fb.get('final_batch_cap', '—')} | "
                         f"{fb.get('final_watermark', '—')} | {_budget_range(r)} |")
    main = [n for n in (BASELINE, CODESIGN, coordinator_run(runs)) if n in runs]
    if main and runs[main[0]].get("phases"):
        lines += ["",
                  "## Phase by phase (served tok/s / window tok/s / TTFT p99 s of the requests sent in it)",
                  "",
                  "| phase | " + " | ".join(main) + " |", "|---|" + "---|" * len(main)]
        for i, ph in enumerate(runs[main[0]]["phases"]):
            cells = []
            for n in main:
                p = runs[n]["phases"][i] if i < len(runs[n].get("phases") or []) else {}
                cells.append(f"{fmt(p.get('served_tok_s'), 1)} / {fmt(p.get('throughput_tok_s'), 1)} / "
                             f"{fmt(p.get('ttft_p99_s'))}")
            lines.append(f"| {ph['index']} {ph['kind']} ({ph['start_s']:.0f}-{ph['end_s']:.0f} s) | "
                         + " | ".join(cells) + " |")
    lines += _machine_rows(runs)
    lines += ["", "## Goals", ""] + ["- " + json.dumps(g, default=str) for g in report["goals"]]
    lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    for section in ("notes", "commands"):
        if m.get(section):
            lines += ["", f"## {section.capitalize()}", ""]
            lines += [f"    {c}" for c in m[section]] if section == "commands" else [f"- {n}"
                                                                                     for n in m[section]]
    return "\n".join(lines) + "\n"


def _machine_rows(runs: dict[str, dict]) -> list[str]:
    """The machine during each real run: other processes' load and the speed probe
    (engine/bench/speed_probe.py), so that systems run one after the other can be seen to have had the same
    machine; [] for simulator files."""
    measured = {n: r["noise"] for n, r in runs.items() if r.get("noise")}
    if not measured:
        return []

    def probe(speed: dict, kind: str) -> str:
        d = speed.get(kind)
        return f"{fmt(d['median_ms'])} ({fmt(d['spread'])})" if d else "—"

    lines = ["", "## The machine during each run", "",
             "| system | other cores mean | probe: hash 1 MiB ms, median (spread) | probe: copy 16 MiB ms, "
             "median (spread) |",
             "|---|---|---|---|"]
    for name, noise in measured.items():
        speed = noise.get("speed") or {}
        lines.append(f"| {name} | {fmt(noise.get('other_cores_mean'))} | {probe(speed, 'compute')} | "
                     f"{probe(speed, 'memory')} |")
    return lines


# ---- plots --------------------------------------------------------------------------------------------
def _shade(ax, phases: list[dict]) -> None:
    for p in phases:
        if p["kind"] != "chat":
            ax.axvspan(p["start_s"], p["end_s"], color="0.9", lw=0)


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None (said once on stderr) where
    matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: writing the report without plots", file=sys.stderr)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(plt, fig, path: Path, dpi: int = 90) -> str:
    """Lays out, writes and closes a figure; returns the file's path."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return str(path)


def plots(report: dict, out_dir: Path, stem: str) -> list[str]:
    plt = pyplot()
    if plt is None:
        return []
    runs, plan = report["systems"], report["meta"].get("phases") or []
    files = []
    shown = [n for n in runs if not parse_variant(n).cap]  # fixed caps are flat lines: in the second plot
    fig, axes = plt.subplots(4, 1, figsize=(11, 10), sharex=True)
    panels = (("batch_cap", "batch cap"), ("watermark", "retention watermark"),
              ("step_token_budget", "step token budget"), ("kv_use", "device KV use"))
    for ax, (key, label) in zip(axes, panels, strict=True):
        _shade(ax, plan)
        for n in shown:
            tl = runs[n].get("timeline") or {}
            ys = tl.get(key) or []
            pts = [(t, y) for t, y in zip(tl.get("t") or [], ys, strict=False) if y is not None]
            if pts:
                thin = parse_variant(n).period_s is not None
                ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=0.7 if thin else 1.4, label=n,
                        alpha=0.6 if thin else 1.0)
        ax.set_ylabel(label)
        if key == "step_token_budget" and not ax.lines:
            ax.text(0.5, 0.5, "not in the engine snapshot in this run", transform=ax.transAxes, ha="center")
    axes[0].legend(fontsize=7, ncol=3, loc="upper right")
    axes[-1].set_xlabel("seconds (shaded: RAG phases)")
    fig.suptitle(report["meta"].get("title", "W5"))
    files.append(save_figure(plt, fig, out_dir / f"{stem}.png"))
    fixed = fixed_cap_runs(runs)
    if fixed:
        kinds = [k for k in report["best_fixed_cap"] if k != "whole"]
        caps = list(fixed_caps(runs).values())
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for key in ["whole", *kinds]:
            metric = "throughput" if key == "whole" else f"{key}_throughput"
            line = ax.plot(caps, [_value(r, metric) for r in fixed.values()], marker="o",
                           label=f"fixed cap: {key}")
            coord = coordinator_run(runs)
            if coord in runs:
                ax.axhline(_value(runs[coord], metric), color=line[0].get_color(), ls="--", lw=1,
                           label=f"{coord}: {key}")
        ax.set_xscale("log", base=2)
        ax.set(xlabel="fixed batch cap", ylabel="output tokens/s", title="Fixed caps through W5's phases")
        ax.legend(fontsize=7)
        files.append(save_figure(plt, fig, out_dir / f"{stem}_caps.png"))
    return files


def write(report: dict, out_dir: Path, stem: str, plots=plots, markdown=markdown) -> dict:
    """<stem>.json, .md and .png(s) of a report, drawn and rendered by `plots` and
    `markdown` (W5's by default)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pngs = plots(report, out_dir, stem)
    report["plots"] = [Path(p).name for p in pngs]
    (out_dir / f"{stem}.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out_dir / f"{stem}.md").write_text(markdown(report, pngs))
    return report
