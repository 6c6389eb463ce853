"""Collects a run in the benchmark's metrics shape (engine.bench.metrics: client_metrics over request
records, server_metrics over snapshots). Inter-token latencies, which run to tens of millions at GPU
scale, go into a log-spaced histogram instead of per-chunk lists; its percentiles replace itl_*."""

from __future__ import annotations

import math

from kvloop.engine.bench.metrics import RequestRecord, Sample, client_metrics, server_metrics
from kvloop.engine.core.snapshot import EngineSnapshot
from kvloop.engine.sim.workload import RequestSpec


class LogHistogram:
    """Positive values in bins of ratio 1.01 from 1 µs (percentiles good to 0.5%)."""

    BASE = 1e-6
    LOG_RATIO = math.log(1.01)

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.n = 0
        self.total = 0.0

    def add(self, x: float, count: int = 1) -> None:
        b = int(math.log(max(x, self.BASE) / self.BASE) / self.LOG_RATIO)
        self.counts[b] = self.counts.get(b, 0) + count
        self.n += count
        self.total += x * count

    def quantile(self, q: float) -> float:
        if not self.n:
            return math.nan
        rank, acc = max(1, math.ceil(q * self.n)), 0
        for b in sorted(self.counts):
            acc += self.counts[b]
            if acc >= rank:
                return self.BASE * math.exp((b + 0.5) * self.LOG_RATIO)
        return math.nan

    def stats(self, prefix: str) -> dict[str, float]:
        out = {f"{prefix}_mean_s": self.total / self.n if self.n else math.nan}
        for q in (50, 90, 99):
            out[f"{prefix}_p{q}_s"] = self.quantile(q / 100)
        return out


class Recorder:
    def __init__(self) -> None:
        self.records: dict[str, RequestRecord] = {}
        self.samples: list[Sample] = []
        self.itl = LogHistogram()

    def sent(self, spec: RequestSpec) -> None:
        self.records[spec.request_id] = RequestRecord(spec.request_id, spec.kind, spec.arrival,
                                                      prompt_tokens=len(spec.prompt))

    def first_token(self, rid: str, t: float) -> None:
        self.records[rid].first_token_s = t

    def finished(self, rid: str, t: float, output_tokens: int, cached_tokens: int) -> None:
        r = self.records[rid]
        r.end_s, r.output_tokens, r.cached_tokens = t, output_tokens, cached_tokens

    def failed(self, rid: str, error: str, t: float) -> None:
        r = self.records[rid]
        r.end_s, r.error = t, error

    def sample(self, t: float, snap: EngineSnapshot) -> None:
        self.samples.append(Sample(t, snap))

    def phase_report(self, phases, timeline_every_s: float = 5.0) -> dict:
        """Per-phase split, phases pooled by kind, and the knobs over time (engine.bench.phases, which
        serves the real engine's runs too); {} for a workload without phases."""
        from kvloop.engine.bench.phases import report

        return report(self.records.values(), self.samples, phases, timeline_every_s=timeline_every_s)

    def summary(self, end: float) -> dict:
        recs = list(self.records.values())
        for r in recs:
            if r.end_s is None and r.error is None:
                r.error = "unfinished"
        client = client_metrics(recs)
        client.update(self.itl.stats("itl"))
        return {"client": client, "server": server_metrics(self.samples)}
