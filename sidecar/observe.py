"""Turns the engine's snapshots over one period into the law's Observation (pure)."""

from __future__ import annotations

import math

from kvloop.engine.control.records import ControlRecord
from kvloop.sidecar.law import Observation

TIERS = ("device", "host", "disk")


def _finite(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else x


class PeriodWindow:
    """Samples of one period: means of the gauges, deltas of the cumulative counters."""

    def __init__(self, first: ControlRecord | None = None):
        self.first = first  # the baseline for counter deltas (last sample of the previous period)
        self.last: ControlRecord | None = None
        self.n = 0
        self.waiting_sum = self.running_sum = self.kv_sum = 0.0
        self.kv_max = 0.0
        self.running_max = 0.0

    def add(self, rec: ControlRecord) -> None:
        if self.first is None:
            self.first = rec
        self.last = rec
        self.n += 1
        self.waiting_sum += rec.num_waiting
        self.running_sum += rec.num_running
        self.kv_sum += rec.kv_use_device
        self.kv_max = max(self.kv_max, rec.kv_use_device)
        self.running_max = max(self.running_max, float(rec.num_running))

    def next(self) -> PeriodWindow:
        return PeriodWindow(self.last)

    def delta(self, name: str) -> int:
        """How much a cumulative counter of the record grew over the period."""
        if self.first is None or self.last is None:
            return 0
        return max(0, int(getattr(self.last, name)) - int(getattr(self.first, name)))

    def hit_rate(self) -> float | None:
        """All tiers' hits over the tokens looked up (every lookup asks the device first)."""
        queries = self.delta("prefix_queries_device")
        if queries <= 0:
            return None
        return min(1.0, sum(self.delta(f"prefix_hits_{t}") for t in TIERS) / queries)

    def tier_hit_rates(self) -> dict[str, float]:
        """Each tier's own hit rate: its hits over the tokens asked of it; tiers asked nothing are left out."""
        rates = {}
        for tier in TIERS:
            queries = self.delta(f"prefix_queries_{tier}")
            if queries > 0:
                rates[tier] = min(1.0, self.delta(f"prefix_hits_{tier}") / queries)
        return rates

    def observation(self) -> Observation | None:
        if not self.n or self.last is None:
            return None
        return Observation(
            queue_depth=self.waiting_sum / self.n,
            running=self.running_sum / self.n,
            running_max=self.running_max,
            kv_use=self.kv_sum / self.n,
            preemptions=self.delta("preemptions"),
            rejections=self.delta("rejections"),
            oom_events=self.delta("oom_events"),
            hit_rate=self.hit_rate(),
            tier_hit_rates=self.tier_hit_rates(),
            requests_finished=self.delta("requests_finished"),
            tokens_generated=self.delta("tokens_generated"),
            ttft_p99_s=_finite(self.last.ttft_p99_s),
        )
