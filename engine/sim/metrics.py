"""Run metrics in the benchmark's shape: throughput, latency percentiles, memory events, hit rate
per tier, KV use over time. Latencies are exact per request; inter-token latencies, which run to
tens of millions at GPU scale, go into a log-spaced histogram (bins 1% wide)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

TIERS = ("device", "host", "disk")


def percentiles(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    s = sorted(xs)
    n = len(s)

    def q(p: float) -> float:  # nearest rank, as the engine's own TTFT summary
        return s[min(n - 1, max(0, math.ceil(p * n) - 1))]

    return {"mean": sum(s) / n, "p50": q(0.5), "p90": q(0.9), "p99": q(0.99)}


class LogHistogram:
    """Positive values in bins of ratio 1.01 from 1 µs."""

    BASE = 1e-6
    RATIO = math.log(1.01)

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.n = 0
        self.total = 0.0

    def add(self, x: float, count: int = 1) -> None:
        b = int(math.log(max(x, self.BASE) / self.BASE) / self.RATIO)
        self.counts[b] = self.counts.get(b, 0) + count
        self.n += count
        self.total += x * count

    def summary(self) -> dict[str, float | None]:
        if not self.n:
            return percentiles([])
        out: dict[str, float | None] = {"mean": self.total / self.n}
        keys = sorted(self.counts)
        for name, p in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
            rank, acc = max(1, math.ceil(p * self.n)), 0
            for b in keys:
                acc += self.counts[b]
                if acc >= rank:
                    out[name] = self.BASE * math.exp((b + 0.5) * self.RATIO)
                    break
        return out


@dataclass
class RequestRecord:
    request_id: str
    kind: str
    arrival: float
    prompt_tokens: int
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None
    output_tokens: int = 0
    cached_tokens: int = 0


@dataclass
class RunMetrics:
    records: dict[str, RequestRecord] = field(default_factory=dict)
    itl: LogHistogram = field(default_factory=LogHistogram)
    kv_series: list[tuple[float, float, int]] = field(default_factory=list)  # (t, device use, waiting)
    rejections: int = 0
    start: float = 0.0

    def summary(self, end: float, kv_stats: dict, preemptions: int, oom_events: int) -> dict:
        done = [r for r in self.records.values() if r.finished is not None]
        makespan = max(end - self.start, 1e-9)
        out_tok = sum(r.output_tokens for r in done)
        ttft = [r.first_token - r.arrival for r in done if r.first_token is not None]
        e2e = [r.finished - r.arrival for r in done]
        tpot = [(r.last_token - r.first_token) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
        q = max(kv_stats.get("query_tokens", 0), 1)
        hits = {t: kv_stats.get(f"hit_tokens_{t}", 0) / q for t in TIERS}
        hits["total"] = sum(hits.values())
        uses = [u for _, u, _ in self.kv_series]
        busy = [u for _, u, w in self.kv_series if w > 0]
        return {
            "requests": len(self.records), "completed": len(done), "duration_s": makespan,
            "throughput": {"output_tok_s": out_tok / makespan, "req_s": len(done) / makespan,
                           "total_tok_s": (out_tok + sum(r.prompt_tokens for r in done)) / makespan},
            "ttft_s": percentiles(ttft), "tpot_s": percentiles(tpot), "itl_s": self.itl.summary(),
            "e2e_s": percentiles(e2e),
            "oom_events": oom_events, "preemptions": preemptions, "rejections": self.rejections,
            "hit_rate": hits,
            "kv_use": {"mean": sum(uses) / len(uses) if uses else None, "max": max(uses, default=None),
                       "mean_while_waiting": sum(busy) / len(busy) if busy else None,
                       "series": [[round(t, 3), round(u, 4), w] for t, u, w in self.kv_series]},
            "kv_counters": kv_stats,
        }
