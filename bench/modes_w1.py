"""Modes benchmark: W1 (WORKLOADS.md) scaled to this machine, for the four scheduler modes in one run.

static, continuous, continuous+lru and codesign are configurations of the same in-process engine (same
model code; engine.bench.systems.engine_target). Runs go through the bench harness (engine.bench.suite):
each run on a fresh engine, the system order rotated every repetition, the machine's other load measured
by the noise guard and recorded per run. Writes bench/results/modes_w1.json, modes_w1.md, modes_w1.png.

    .venv/bin/python bench/modes_w1.py                 # the committed run (minutes)
    .venv/bin/python bench/modes_w1.py --smoke         # W1-smoke: checks the harness, not speed
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

from kvloop.engine.bench.metrics import SLO
from kvloop.engine.bench.suite import RunRow, run_suite
from kvloop.engine.bench.systems import Sizing
from kvloop.engine.bench.workloads import SMOKE, W1Params, build_w1
from kvloop.engine.core.policy import policy_names

RESULTS = Path(__file__).resolve().parent / "results"
KEYS = ("throughput_tok_s", "throughput_req_s", "ttft_p50_s", "ttft_p99_s", "e2e_p99_s", "oom_events",
        "preemptions",
        "kv_use_mean_saturated", "hit_rate")
# issue 4's goals: (name, key, against, ratio, direction)
GOALS = (("codesign >= 4x static throughput", "throughput_tok_s", "static", 4.0, ">="),
         ("codesign P99 TTFT <= 0.45x static", "ttft_p99_s", "static", 0.45, "<="),
         ("codesign >= 1.3x continuous+lru throughput", "throughput_tok_s", "continuous+lru", 1.3, ">="))


def workload_params(a: argparse.Namespace) -> W1Params:
    if a.smoke:
        return dataclasses.replace(SMOKE, rate=a.rate, seed=a.seed)
    p = W1Params(rate=a.rate, seed=a.seed, think_mean_s=a.think,
                 num_doc_questions=max(1, round(60 * a.count_scale)),
                 num_sessions=max(1, round(15 * a.count_scale)))
    return p.scaled(a.scale)


def _num(x) -> float | None:
    return x if isinstance(x, int | float) and not (isinstance(x, float) and math.isnan(x)) else None


def _median(xs) -> float | None:
    xs = [x for x in map(_num, xs) if x is not None]
    return statistics.median(xs) if xs else None


def hit_rate(rows: list[RunRow]) -> float | None:
    """Prefix-cache hit rate (tokens). A mode that never looks up (static) has no server-side rate; it is
    0.0 when the client saw no cached prompt tokens either."""
    rate = _median(r.server.get("hit_rate_total") for r in rows)
    if rate is None and rows and all(r.client.get("cached_prompt_share") == 0 for r in rows):
        return 0.0
    return rate


def mode_summary(rows: list[RunRow]) -> dict:
    """The issue's keys (medians over repetitions), plus what explains them."""
    c = lambda k: _median(r.client.get(k) for r in rows)  # noqa: E731
    s = lambda k: _median(r.server.get(k) for r in rows)  # noqa: E731
    return {
        "throughput_tok_s": c("output_throughput_tok_s"), "throughput_req_s": c("request_throughput_req_s"),
        "ttft_p50_s": c("ttft_p50_s"), "ttft_p99_s": c("ttft_p99_s"), "e2e_p99_s": c("e2e_p99_s"),
        "oom_events": s("oom_events"), "preemptions": s("preemptions"),
        "kv_use_mean_saturated": s("kv_use_mean_while_waiting"), "hit_rate": hit_rate(rows),
        "tpot_p50_s": c("tpot_p50_s"), "completed": c("completed"), "failed": c("failed"),
        "rejections": c("rejections"), "cached_prompt_share": c("cached_prompt_share"),
        "duration_s": c("duration_s"), "kv_use_mean": s("kv_use_mean"),
        "hit_rate_device": s("hit_rate_device"), "hit_rate_host": s("hit_rate_host"),
        "noise_other_cores_mean": _median(r.noise.get("other_cores_mean") for r in rows),
        "noisy_runs": sum(1 for r in rows if r.noise.get("noisy")),
        "info": rows[0].info if rows else {},
        "runs": [{"rep": r.rep, "throughput_tok_s": r.client.get("output_throughput_tok_s"),
                  "ttft_p99_s": r.client.get("ttft_p99_s"), "completed": r.client.get("completed"),
                  "failed": r.client.get("failed"), "oom_events": r.server.get("oom_events"),
                  "preemptions": r.server.get("preemptions"),
                  "other_cores_mean": r.noise.get("other_cores_mean"),
                  "other_cores_max": r.noise.get("other_cores_max"),
                  "ours_cores_mean": r.noise.get("ours_cores_mean"), "noisy": r.noise.get("noisy"),
                  "kv_use_series": r.server.get("kv_use_series", [])} for r in rows],
    }


def goals(modes: dict) -> list[dict]:
    out = []
    cd = modes.get("codesign", {})
    for name, key, other, ratio, op in GOALS:
        a, b = cd.get(key), modes.get(other, {}).get(key)
        value = a / b if a is not None and b else None
        met = value is not None and (value >= ratio if op == ">=" else value <= ratio)
        out.append({"goal": name, "value": value, "met": met})
    st = modes.get("static", {})
    out.append({"goal": "0 OOM events in codesign while static has some", "value": [cd.get("oom_events"),
                st.get("oom_events")], "met": cd.get("oom_events") == 0 and (st.get("oom_events") or 0) > 0})
    use = cd.get("kv_use_mean_saturated")
    out.append({"goal": "codesign mean device-pool use >= 0.85 while saturated", "value": use,
                "met": use is not None and use >= 0.85})
    return out


def fmt(x, spec: str = ".2f") -> str:
    return "n/a" if x is None else format(x, spec)


def markdown(res: dict) -> str:
    w = res["workload"]
    lines = [f"# Modes on W1 (scaled): {', '.join(res['modes'])}", "",
             f"{w['description']}", "",
             f"Command: `{w['command']}`. Started {w['started']}, {w['wall_s']} s in all.",
             "", "| mode | tok/s | req/s | TTFT P50 (s) | TTFT P99 (s) | E2E P99 (s) | OOM | preemptions | "
             "KV use saturated | hit rate | completed / failed | other load (cores) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in res["modes"].items():
        lines.append(f"| {name} | {fmt(m['throughput_tok_s'], '.1f')} | {fmt(m['throughput_req_s'], '.3f')} "
                     f"| {fmt(m['ttft_p50_s'])} | {fmt(m['ttft_p99_s'])} | {fmt(m['e2e_p99_s'])} | "
                     f"{fmt(m['oom_events'], '.0f')} | {fmt(m['preemptions'], '.0f')} | "
                     f"{fmt(m['kv_use_mean_saturated'])} | {fmt(m['hit_rate'])} | "
                     f"{fmt(m['completed'], '.0f')} / {fmt(m['failed'], '.0f')} | "
                     f"{fmt(m['noise_other_cores_mean'])} |")
    lines += ["", "## Goals (issue 4)", "", "| goal | measured | met |", "|---|---|---|"]
    for g in res["goals"]:
        v = g["value"]
        lines.append(f"| {g['goal']} | {v if not isinstance(v, float) else f'{v:.2f}'} | "
                     f"{'yes' if g['met'] else 'no'} |")
    lines += ["", "## Notes", ""] + [f"- {n}" for n in w["notes"]] + ["", "![modes](modes_w1.png)", ""]
    return "\n".join(lines)


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(res["modes"])
    ms = [res["modes"][n] for n in names]
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    ax[0].bar(names, [m["throughput_tok_s"] or 0 for m in ms], color="tab:blue")
    ax[0].set_title("output throughput (tok/s)")
    x = range(len(names))
    ax[1].bar([i - 0.2 for i in x], [m["ttft_p50_s"] or 0 for m in ms], 0.4, label="P50")
    ax[1].bar([i + 0.2 for i in x], [m["ttft_p99_s"] or 0 for m in ms], 0.4, label="P99")
    ax[1].set_xticks(list(x), names)
    ax[1].set_title("TTFT (s)")
    ax[1].legend()
    for n, m in zip(names, ms, strict=True):
        series = m["runs"][0]["kv_use_series"] if m["runs"] else []
        if series:
            ax[2].plot([p[0] for p in series], [p[1] for p in series], label=n)
    ax[2].set_title("device-pool use (referenced share) over time, rep 0")
    ax[2].set_xlabel("s")
    ax[2].legend()
    for a in ax[:2]:
        a.tick_params(axis="x", labelrotation=15)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="W1-smoke (pools / 8)")
    ap.add_argument("--scale", type=float, default=0.25, help="W1 lengths and pools times this")
    ap.add_argument("--count-scale", type=float, default=0.25, help="questions and sessions times this")
    ap.add_argument("--rate", type=float, default=2.0)
    ap.add_argument("--think", type=float, default=2.0)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=600.0, help="per run (s); unfinished requests fail")
    ap.add_argument("--max-other-cores", type=float, default=0.3)
    ap.add_argument("--redo-noisy", type=int, default=0)
    ap.add_argument("--modes", default=",".join(policy_names()))
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--name", default="modes_w1")
    ap.add_argument("--note", action="append", default=[])
    ap.add_argument("--render", default=None, help="re-render markdown and plot from this JSON (no run)")
    a = ap.parse_args(argv)
    if a.render:
        res = json.loads(Path(a.render).read_text())
        res["workload"]["notes"] += [n for n in a.note if n not in res["workload"]["notes"]]
        for m in res["modes"].values():  # the rule of hit_rate() for files written before it existed
            if m.get("hit_rate") is None and m.get("cached_prompt_share") == 0:
                m["hit_rate"] = 0.0
        res["goals"] = goals(res["modes"])
        stem = Path(a.render).with_suffix("")
        Path(a.render).write_text(json.dumps(res, indent=1, default=str))
        stem.with_suffix(".md").write_text(markdown(res).replace("modes_w1.png", f"{stem.name}.png"))
        plot(res, stem.with_suffix(".png"))
        return 0
    p = workload_params(a)
    name = "W1-smoke" if a.smoke else "W1"
    probe = build_w1(p, name)
    sizing = Sizing().scaled(1 / 8 if a.smoke else a.scale)
    longest = max([len(r.prompt) + r.max_tokens for r in probe.requests] + [
        len(s.system) + s.num_turns * (len(s.user_turns[0]) + s.reply_tokens) for s in probe.sessions])
    sizing = dataclasses.replace(sizing, max_context=(longest // 256 + 1) * 256)
    modes = [m for m in a.modes.split(",") if m]
    load0 = os.getloadavg()
    t0 = time.time()
    suite = run_suite(modes, lambda rate: build_w1(dataclasses.replace(p, rate=rate), name), [a.rate], a.rate,
                      sizing,
                      a.reps, SLO(), a.threads, a.redo_noisy, a.max_other_cores, a.timeout, progress=False,
                      log=lambda s: print(s, file=sys.stderr, flush=True))
    load1 = os.getloadavg()
    per_mode = {m: mode_summary([r for r in suite.rows if r.system == m]) for m in modes}
    static_oom = "fail"  # SchedulerConfig.static_oom default: the request finishes with 'error'
    desc = (f"{name} with lengths x{a.scale:g} and counts x{a.count_scale:g} ({probe.num_requests} requests: "
            f"{len(probe.requests)} document questions over {p.num_docs} documents of {p.doc_tokens} tokens, "
            f"{len(probe.sessions)} chat sessions x {p.turns} turns), Poisson rate {a.rate:g} req/s, think "
            f"{p.think_mean_s:g} s; device pool {sizing.kv_cache_tokens} tokens, host tier "
            f"{sizing.host_cache_tokens} tokens (codesign only), static batch {sizing.static_batch} with "
            f"{sizing.fill_timeout_s} s fill timeout, {a.reps} interleaved repetition(s)")
    notes = [
        f"Machine: {os.cpu_count()} CPUs shared with other developers' jobs; load average {load0[0]:.1f} "
        f"before, {load1[0]:.1f} after. 'other load' is the noise guard's mean CPU (cores) used by other "
        f"processes during each run (threshold {a.max_other_cores} cores): every number here is under that "
        "contention.",
        "Engine dtype 'auto' (fp32 on this CPU), embedded SmolLM2-135M, synthetic token text, ignore_eos, "
        "greedy.",
        "static: the scheduler's own static mode; a reservation (prompt + max_tokens) that does not fit the "
        f"pool is an OOM event and the request fails ('{static_oom}': finish_reason 'error'); a failed chat "
        f"turn ends its session (the driver does not send later turns), so static completes fewer requests.",
        "Throughput = output tokens of completed requests / makespan (first send to last finish).",
        "kv_use_mean_saturated = mean referenced share of the device pool over samples taken while requests "
        "waited.",
        *a.note,
    ]
    cmd = "bench/modes_w1.py " + " ".join(argv if argv is not None else sys.argv[1:])
    res = {"workload": {"name": name, "description": desc, "params": probe.params,
                        "num_requests": probe.num_requests,
                        "scale": a.scale, "count_scale": a.count_scale, "rate": a.rate, "reps": a.reps,
                        "sizing": dataclasses.asdict(sizing), "started": time.strftime("%Y-%m-%d %H:%M:%S",
                                                                                       time.localtime(t0)),
                        "wall_s": round(time.time() - t0, 1), "loadavg_before": load0, "loadavg_after": load1,
                        "cpu_count": os.cpu_count(), "command": cmd.strip(), "notes": notes},
           "modes": per_mode}
    res["goals"] = goals(per_mode)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{a.name}.json").write_text(json.dumps(res, indent=1, default=str))
    md = markdown(res).replace("modes_w1.png", f"{a.name}.png")
    (out / f"{a.name}.md").write_text(md)
    plot(res, out / f"{a.name}.png")
    print(md.split("## Notes")[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
