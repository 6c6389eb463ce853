"""`bench/fleet_cpu.py`'s goals (from the raw numbers only), markdown and plot."""

from __future__ import annotations

from pathlib import Path

PREFIX_VS_ONE, PREFIX_VS_RR, STORE_VS_ONE = 0.9, 1.5, 0.8
STORE_TTFT_RATIO = 0.35
ROUTER_DROP_S = 5.0


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _goal(name: str, value, op: str, bound: float) -> dict:
    met = value is not None and (value >= bound if op == ">=" else value <= bound)
    return {"name": name, "value": value, "op": op, "bound": bound, "met": met}


def _ratio_goal(name: str, num: float | None, den: float | None, bound: float) -> dict:
    """num / den >= bound; where den hit nothing and num did, the ratio is unbounded: met, value None."""
    g = _goal(name, _ratio(num, den), ">=", bound)
    if den == 0 and num:
        g.update(met=True, note="the denominator is 0 and the numerator is not: unbounded")
    return g


def hit_rate(raw: dict, system: str, trace: str) -> float | None:
    for c in raw.get("hit_rates", []):
        if c["system"] == system and c["trace"] == trace:
            return c["hit_rate"]
    return None


def goals(raw: dict) -> list[dict]:
    out = []
    for trace in sorted({c["trace"] for c in raw.get("hit_rates", [])}):
        one, rr = hit_rate(raw, "one_pod", trace), hit_rate(raw, "round_robin", trace)
        pa, st = hit_rate(raw, "cache_aware", trace), hit_rate(raw, "round_robin+store", trace)
        out += [
            _ratio_goal(
                f"{trace}: prefix-aware (cache_aware) fleet hit rate / one pod's", pa, one, PREFIX_VS_ONE
            ),
            _ratio_goal(f"{trace}: prefix-aware fleet hit rate / round robin's", pa, rr, PREFIX_VS_RR),
            _ratio_goal(
                f"{trace}: round robin + shared store fleet hit rate / one pod's", st, one, STORE_VS_ONE
            ),
        ]
    s = raw.get("store")
    if s:
        out.append(
            _goal(
                f"{s['doc_tokens']}-token document prefilled on pod A, asked on pod B through the store:"
                " median TTFT / cold",
                _ratio(s["warm_ttft_p50_s"], s["cold_ttft_p50_s"]),
                "<=",
                STORE_TTFT_RATIO,
            )
        )
        out.append(_goal("store killed mid-run: failed requests", s["store_killed"]["failed"], "<=", 0))
    k = raw.get("pod_kill")
    if k:
        out.append(
            _goal(
                "pod SIGKILLed: failed requests beyond those in flight on it",
                max(0.0, k["failed"] - k["in_flight_at_kill"]),
                "<=",
                0,
            )
        )
        out.append(
            _goal(
                "pod SIGKILLed: failed requests sent after the kill",
                k["failed"] - k["failed_sent_before_kill"],
                "<=",
                0,
            )
        )
        out.append(
            _goal(
                "pod SIGKILLed: seconds from the kill to the last request routed to it",
                k["last_routed_after_kill_s"],
                "<=",
                ROUTER_DROP_S,
            )
        )
    return out


def _f(x, nd: int = 3) -> str:
    return "n/a" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))


def markdown(r: dict) -> str:
    m = r["meta"]
    lines = [
        f"# Fleet on the CPU ({m['date']})",
        "",
        f"`{m['command']}` at {m['commit']}, {m['elapsed_s']:.0f} s"
        f" on {m['machine'].get('model')} ({m['machine'].get('cores')} cores). "
        "Fleets from scripts/serve_fleet.sh (vllm-router "
        f"0.1.17; router args `{m['router_args']}`). Hit rate: the pods' prefix-cache hit tokens / prompt "
        "tokens looked up, summed over the pods (any tier). SLO: engine/core/slo.py CPU_SLO.",
        "",
        "## Goals",
        "",
        "| goal | value | bound | met |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {g['name']} | {_f(g['value'])} | {g['op']} {g['bound']} | {'yes' if g['met'] else 'no'} |"
        for g in r["goals"]
    ]
    if r.get("hit_rates"):
        lines += [
            "",
            "## Hit rate, goodput, latency per system",
            "",
            "| trace | system | hit rate | good / sent | goodput req/s | TTFT p50/p90/p99 s | "
            "TPOT p50/p90/p99 ms |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in r["hit_rates"]:
            x = c["m"]
            tp = "/".join(
                _f(None if x[k] is None else x[k] * 1e3, 0)
                for k in ("tpot_p50_s", "tpot_p90_s", "tpot_p99_s")
            )
            lines.append(
                f"| {c['trace']} | {c['system']} | {_f(c['hit_rate'])} | {x['slo_good']}/{x['slo_sent']}"
                f" | {_f(x['slo_goodput_req_s'])} | "
                + "/".join(_f(x[k], 2) for k in ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s"))
                + f" | {tp} |"
            )
    s = r.get("store")
    if s:
        k = s["store_killed"]
        lines += [
            "",
            "## Shared store",
            "",
            f"Pod B's median TTFT: {_f(s['warm_ttft_p50_s'])} s after pod A "
            f"prefilled the document, {_f(s['cold_ttft_p50_s'])} s on a fresh one ({s['docs']} documents). "
            f"Store killed after pod B's answer {k.get('killed_after_requests')}: "
            f"{k['failed']} of {k['sent']} "
            f"failed; cached tokens of the requests after the kill {k.get('cached_after_kill')} (pod B had "
            f"only the store for these documents); remote hit tokens over the whole run (before the kill "
            f"included) {_f(k['remote_hit_tokens_during'], 0)}, remote errors {_f(k['remote_errors'], 0)}.",
        ]
    k = r.get("pod_kill")
    if k:
        errs = sorted({f["error"][:60] for f in k["failures"]})
        lines += [
            "",
            "## A pod killed",
            "",
            f"SIGKILL at {k['kill_at_s']:.1f} s with {_f(k['in_flight_at_kill'], 0)}"
            f" requests in flight on it: {k['failed']} of {k['sent']} failed ({k['failed_sent_before_kill']}"
            f" sent before the kill); last routed there {_f(k['last_routed_after_kill_s'], 2)} s after it "
            f"(router counters {_f(k['router_last_routed_after_kill_s'], 2)} s, client failures "
            f"{_f(k['client_last_failure_sent_after_kill_s'], 2)} s). Errors: {errs}.",
        ]
    if m.get("png"):
        lines += ["", f"![hit rates]({m['png']})"]
    return "\n".join(lines) + "\n"


def plot(r: dict, path: Path) -> bool:
    cells = r.get("hit_rates") or []
    if not cells:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = sorted({c["trace"] for c in cells})
    systems = list(dict.fromkeys(c["system"] for c in cells))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    w = 0.8 / max(1, len(systems))
    for j, s in enumerate(systems):
        xs = [i + j * w for i in range(len(traces))]
        axes[0].bar(xs, [hit_rate(r, s, t) or 0 for t in traces], w, label=s)
        good = [
            next((c["m"]["slo_goodput_req_s"] or 0 for c in cells if c["system"] == s and c["trace"] == t), 0)
            for t in traces
        ]
        axes[1].bar(xs, good, w, label=s)
    for ax, title in zip(axes, ("fleet prefix-cache hit rate", "goodput (req/s, CPU SLO)"), strict=True):
        ax.set_xticks([i + 0.4 - w / 2 for i in range(len(traces))], traces)
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True
