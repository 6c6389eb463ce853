"""The H200 matrix's goals, heat map and markdown, each computed from the raw numbers of a results file
(sim/matrix.py writes it), so that a file can be judged again without rerunning it.

Goals (issue 57, simulator): every coordinator system (a name with "+coord") keeps at least 0.98x the fixed
defaults' (codesign's) goodput in every cell, and reaches 1.15x codesign's capacity on the median trace; no
trace row that fits the model's context is refused for length (rows past it cannot be served by any
setting: they are counted apart)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from kvloop.engine.bench.goals import goal

REFERENCE = "continuous+lru"  # the loads are relative to its capacity; the heat map's ratios are against it
FIXED = "codesign"  # the fixed defaults the coordinator must not harm
CELL_GOODPUT_RATIO = 0.98
MEDIAN_CAPACITY_RATIO = 1.15


def coordinator_systems(systems: list[str]) -> list[str]:
    return [s for s in systems if "+coord" in s]


def _ratio(a: float | None, b: float | None) -> float | None:
    """a / b; 1.0 where both are 0 (neither served a good request); None where either is unknown or only b
    is 0."""
    if a is None or b is None:
        return None
    if b == 0:
        return 1.0 if a == 0 else None
    return a / b


def cell(result: dict, system: str, trace: str, load: float) -> dict | None:
    return next((c for c in result["cells"] if c["system"] == system and c["trace"] == trace
                 and c["load"] == load), None)


def _goodput(c: dict | None) -> float | None:
    return None if c is None else c["goodput_req_s"]


def capacity(result: dict, trace: str, system: str) -> float | None:
    return result["capacity"].get(trace, {}).get(system, {}).get("capacity_req_s")


def goals(result: dict) -> list[dict]:
    out = []
    traces, loads = result["traces_run"], result["loads"]
    for s in coordinator_systems(result["systems"]):
        for t in traces:
            for x in loads:
                value = _ratio(_goodput(cell(result, s, t, x)), _goodput(cell(result, FIXED, t, x)))
                out.append(goal(f"{s} goodput / {FIXED}'s, {t} at {x:g}x", value, ">=", CELL_GOODPUT_RATIO))
        per_trace = {t: _ratio(capacity(result, t, s), capacity(result, t, FIXED)) for t in traces}
        ratios = [r for r in per_trace.values() if r is not None]
        out.append(goal(f"{s} capacity / {FIXED}'s on the median trace",
                        statistics.median(ratios) if ratios else None, ">=", MEDIAN_CAPACITY_RATIO,
                        per_trace=per_trace))
    swept = [r for t in result["capacity"].values() for c in t.values() for r in c["rates_tried"]]
    runs = list({(r["system"], r["trace"], r["rate"]): r for r in result["cells"] + swept}.values())
    refused = sum(max(0, r["rejections"].get("too_long", 0) - r["rows_beyond_context"]) for r in runs)
    out.append(goal("trace rows within the model's context refused for length (every run)", refused, "<=", 0,
                    rows_beyond_context_refused=sum(min(r["rejections"].get("too_long", 0),
                                                        r["rows_beyond_context"]) for r in runs)))
    return out


def columns(result: dict) -> list[tuple[str, float]]:
    return [(t, x) for t in result["traces_run"] for x in result["loads"]]


def goodput_ratio_grid(result: dict) -> tuple[list[str], list[str], list[list[float | None]]]:
    """(rows: systems other than the reference, columns: 'trace\nload', goodput ratio to the reference's)."""
    rows = [s for s in result["systems"] if s != REFERENCE]
    cols = columns(result)
    grid = [[_ratio(_goodput(cell(result, s, t, x)), _goodput(cell(result, REFERENCE, t, x)))
             for t, x in cols] for s in rows]
    return rows, [f"{t}\n{x:g}x" for t, x in cols], grid  # two lines: the labels fit their cells


def heatmap(result: dict, path: Path) -> bool:
    from kvloop.engine.bench.heatmap import write_heatmap

    rows, cols, grid = goodput_ratio_grid(result)
    return write_heatmap(path, rows, cols, grid, f"H200 simulator: goodput / {REFERENCE}'s at the GPU SLO",
                         xlabel="trace, load (x continuous+lru's capacity)", ylabel="system")


def _f(x, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def _ms(x: float | None) -> str:
    return "–" if x is None else f"{x * 1e3:.0f}"


def _reasons(d: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items()) or "0"


def markdown(result: dict) -> str:
    m = result["meta"]
    lines = [f"# Robustness matrix, H200 simulator ({m['date']})", "",
             f"`{m['command']}` at {m['git_commit']} on {m['host_cpu']}: {m['wall_s']:.0f} s of wall time. "
             f"SLO (GPU scale): TTFT <= {m['slo']['ttft_base_s']:g} s + {m['slo']['ttft_per_1k_s']:g} s per "
             f"1,000 prompt tokens, mean TPOT <= {m['slo']['tpot_s'] * 1e3:g} ms. Capacity: the highest rate "
             f"tried whose good share (good / sent) is >= {m['capacity_good_share']:.0%}; loads are "
             f"{', '.join(f'{x:g}x' for x in result['loads'])} of {REFERENCE}'s capacity on each trace.", ""]
    lines += ["| trace | profile | window of arrivals s | notes |", "|---|---|---|---|"]
    for t in result["traces_run"]:
        d = result["traces"][t]
        note = (f"{d['rows']} rows in the file, {d['read']} read, {d['trace_rate_req_s']:.2f} req/s as "
                f"recorded; a run replays the rows that arrive within its window" if t == "mooncake" else
                d.get("rate_is", ""))
        lines.append(f"| {t} | {d['profile']} | {d['window_s']:g} | {note} |")
    lines += ["", "## Goals", "", "| goal | value | bound | met |", "|---|---|---|---|"]
    lines += [f"| {g['name']} | {_f(g['value'])} | {g['op']} {g['bound']:g} | {'yes' if g['met'] else 'no'} |"
              for g in result["goals"]]
    lines += ["", "## Capacity at the SLO (req/s; rates tried: good share)", "",
              "| trace | system | capacity | rates tried |", "|---|---|---|---|"]
    for t, systems in result["capacity"].items():
        for s, c in systems.items():
            tried = ", ".join(f"{r['rate']:.3g}: {_f(r['good_share'], 2)}" for r in c["rates_tried"])
            lines.append(f"| {t} | {s} | {_f(c['capacity_req_s'])} | {tried} |")
    lines += ["", "## Cells", "",
              "| trace | load | rate | system | goodput | / c+lru | req/s | out tok/s | TTFT P50 / P99 ms | "
              "TPOT P50 / P99 ms | no-hit TTFT P99 ms | refused | failed |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in result["cells"]:
        ref = cell(result, REFERENCE, c["trace"], c["load"])
        lines.append(
            f"| {c['trace']} | {c['load']:g}x | {c['rate']:.3g} | {c['system']} | {_f(c['goodput_req_s'])} | "
            f"{_f(_ratio(c['goodput_req_s'], _goodput(ref)), 2)} | {_f(c['throughput_req_s'])} | "
            f"{_f(c['output_tok_s'], 0)} | {_ms(c['ttft_p50_s'])} / {_ms(c['ttft_p99_s'])} | "
            f"{_ms(c['tpot_p50_s'])} / {_ms(c['tpot_p99_s'])} | {_ms(c['no_hit_ttft_p99_s'])} | "
            f"{_reasons(c['rejections'])} | {_reasons(c['failures'])} |")
    return "\n".join(lines) + "\n"
