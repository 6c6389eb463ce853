"""A simulated run judged by the SLO of its profile's scale (engine/core/slo.py; ../shared/WORKLOADS.md "The
SLO, goodput and capacity"): the benchmark's slo_metrics (good, missed by reason, goodput over the span,
TTFT P99 of requests with no cache hit) under that SLO, TTFT and TPOT P50/P99, and every request that did
not finish, by reason. Kept apart from Simulator.run()'s result, whose shape the golden runs pin."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from kvloop.engine.bench.metrics import RequestRecord, percentile, slo_metrics
from kvloop.engine.core.slo import CPU_SLO, GPU_SLO, Slo

REJECTED = "rejected: "  # how the simulator's records name a refusal: "rejected: <reason>: <message>"


def slo_for(profile_name: str) -> Slo:
    """The SLO of a profile's scale: the CPU's for the CPU profile, the GPU's for every other."""
    return CPU_SLO if profile_name == "cpu" else GPU_SLO


def rejection_reason(error: str) -> str | None:
    """A refused request's reason as the scheduler gave it (too_long, queue_full, ...); None: not refused."""
    if not error.startswith(REJECTED):
        return None
    return error[len(REJECTED):].split(":", 1)[0].strip()


def failures(records: Iterable[RequestRecord]) -> tuple[dict[str, int], dict[str, int]]:
    """Requests that did not finish: (refusals by the scheduler's reason, other failures by the error's first
    word: 'unfinished' when the run stopped first, ...)."""
    refused: Counter[str] = Counter()
    other: Counter[str] = Counter()
    for r in records:
        if r.error is None:
            continue
        reason = rejection_reason(r.error)
        if reason is not None:
            refused[reason] += 1
        else:
            other[r.error.split(":", 1)[0].strip() or "error"] += 1
    return dict(sorted(refused.items())), dict(sorted(other.items()))


def _p(xs: list[float], q: float) -> float | None:
    return percentile(xs, q) if xs else None


def slo_report(records: Iterable[RequestRecord], slo: Slo) -> dict:
    """slo_metrics under `slo`, the offered rate (requests over the span of their sends), TTFT and TPOT
    P50/P99 of the finished requests, refusals by reason ("rejections") and other failures ("failures")."""
    recs = list(records)
    ok = [r for r in recs if r.ok]
    ttfts = [r.ttft for r in ok]
    tpots = [t for r in ok if (t := r.tpot) is not None]
    refused, failed = failures(recs)
    sends = [r.send_s for r in recs]
    window = max(sends) - min(sends) if sends else 0.0
    return {**slo_metrics(recs, slo), "offered_req_s": len(recs) / window if window > 0 else None,
            "ttft_p50_s": _p(ttfts, 50), "ttft_p99_s": _p(ttfts, 99),
            "tpot_p50_s": _p(tpots, 50), "tpot_p99_s": _p(tpots, 99),
            "rejections": refused, "failures": failed}
