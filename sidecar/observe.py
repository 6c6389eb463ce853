"""Turns the engine's snapshots over one period into the law's Observation (pure)."""

from __future__ import annotations

import math

from kvloop.sidecar.law import Observation

TIERS = ("device", "host", "disk")


def _finite(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else x


class PeriodWindow:
    """Samples of one period: means of the gauges, deltas of the cumulative counters."""

    def __init__(self, first: dict | None = None):
        self.first = first  # the baseline for counter deltas (last sample of the previous period)
        self.last: dict | None = None
        self.n = 0
        self.sums = {"num_waiting": 0.0, "num_running": 0.0, "kv_use_device": 0.0}
        self.kv_max = 0.0
        self.running_max = 0.0

    def add(self, snap: dict) -> None:
        if self.first is None:
            self.first = snap
        self.last = snap
        self.n += 1
        for key in self.sums:
            self.sums[key] += float(snap[key])
        self.kv_max = max(self.kv_max, float(snap["kv_use_device"]))
        self.running_max = max(self.running_max, float(snap["num_running"]))

    def next(self) -> PeriodWindow:
        return PeriodWindow(self.last)

    def delta(self, key: str) -> int:
        if self.first is None or self.last is None:
            return 0
        return max(0, int(self.last[key]) - int(self.first[key]))

    def hit_rate(self) -> float | None:
        queries = self.delta("prefix_queries_device")
        if queries <= 0:
            return None
        return min(1.0, sum(self.delta(f"prefix_hits_{t}") for t in TIERS) / queries)

    def observation(self) -> Observation | None:
        if not self.n or self.last is None:
            return None
        return Observation(
            queue_depth=self.sums["num_waiting"] / self.n,
            running=self.sums["num_running"] / self.n,
            running_max=self.running_max,
            kv_use=self.sums["kv_use_device"] / self.n,
            preemptions=self.delta("preemptions"),
            rejections=self.delta("rejections"),
            oom_events=self.delta("oom_events"),
            hit_rate=self.hit_rate(),
            ttft_p99_s=_finite(self.last.get("ttft_p99_s")),
        )
