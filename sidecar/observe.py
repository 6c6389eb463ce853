"""Turns the engine's snapshots over one period (or between two samples, for the event path) into the law's
Observation, and a record into the cap the pool holds at the engine's max context (pure)."""

from __future__ import annotations

import math

from kvloop.engine.control.records import ControlRecord
from kvloop.engine.core.kv_stats import TIERS
from kvloop.engine.core.slo import MISS_REASONS
from kvloop.sidecar.law import Observation, memory_cap


def _finite(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else x


def start_cap(rec: ControlRecord, fill: float) -> int | None:
    """The cap the pool holds when every request runs to the engine's max context (None: not reported)."""
    if not (rec.kv_blocks_total and rec.block_size and rec.max_model_len):
        return None
    return memory_cap(rec.kv_blocks_total, -(-rec.max_model_len // rec.block_size), fill)


class PeriodWindow:
    """Samples of one period: means of the gauges, deltas of the cumulative counters."""

    def __init__(self, first: ControlRecord | None = None):
        self.first = first  # the baseline for counter deltas (last sample of the previous period)
        self.last: ControlRecord | None = None
        self.n = 0
        self.waiting_sum = self.running_sum = self.kv_sum = self.decoding_sum = 0.0
        self.kv_max = 0.0
        self.running_max = self.decoding_max = 0.0
        # the footprint of a request: blocks held by (plus still needed for the prompts of) running requests,
        # over the running requests, summed over the samples with any
        self.footprint_blocks_sum = self.footprint_running_sum = 0.0

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
        self.decoding_sum += rec.num_decoding
        self.decoding_max = max(self.decoding_max, float(rec.num_decoding))
        if rec.num_running > 0:
            self.footprint_blocks_sum += max(0,
                                             rec.kv_blocks_total - rec.kv_blocks_free) + rec.kv_blocks_pending
            self.footprint_running_sum += rec.num_running

    def next(self) -> PeriodWindow:
        return PeriodWindow(self.last or self.first)

    def delta(self, name: str) -> int:
        """How much a cumulative counter of the record grew over the period."""
        return int(round(self.fdelta(name)))

    def fdelta(self, name: str) -> float:
        """The growth of a cumulative counter; across a new engine start (another start_id, or a counter that
        went down) the counters began at zero, so the growth is the last value."""
        if self.first is None or self.last is None:
            return 0.0
        now, before = getattr(self.last, name), getattr(self.first, name)
        if self.last.start_id != self.first.start_id or now < before:
            return now
        return now - before

    def arrived(self) -> int:
        """Requests that arrived over the period: those finished or refused, plus the growth of those in the
        engine (waiting or running); across a new start, those in it now."""
        first, last = self.first, self.last
        if first is None or last is None:
            return 0
        inside = last.num_waiting + last.num_running
        if last.start_id == first.start_id and last.requests_finished >= first.requests_finished:
            inside -= first.num_waiting + first.num_running
        return max(0, self.delta("requests_finished") + self.delta("rejections") + inside)

    def hit_rate(self) -> float | None:
        """All tiers' hits over the tokens looked up (every lookup asks the device first)."""
        queries = self.delta("prefix_queries_device")
        if queries <= 0:
            return None
        return min(1.0, sum(self.delta(f"prefix_hits_{t}") for t in TIERS) / queries)

    def tier_hit_rates(self) -> dict[str, float]:
        """Each tier's own hit rate: its hits over the tokens asked of it; tiers asked
        nothing are left out."""
        rates = {}
        for tier in TIERS:
            queries = self.delta(f"prefix_queries_{tier}")
            if queries > 0:
                rates[tier] = min(1.0, self.delta(f"prefix_hits_{tier}") / queries)
        return rates

    def observation(self) -> Observation | None:
        if not self.n or self.last is None:
            return None
        first, last = self.first or self.last, self.last
        slack_n = self.delta("slo_slack_count")
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
            ttft_p99_s=_finite(last.ttft_p99_s),
            footprint_blocks=(self.footprint_blocks_sum / self.footprint_running_sum
                              if self.footprint_running_sum else None),
            pool_blocks=last.kv_blocks_total,
            num_decoding=self.decoding_sum / self.n,
            decoding_max=self.decoding_max,
            tpot_p50_s=_finite(last.tpot_p50_s),
            tpot_p99_s=_finite(last.tpot_p99_s),
            step_token_budget_max=last.step_token_budget_max,
            queue_growth=float(last.num_waiting - first.num_waiting),
            seconds=max(0.0, (last.time_ns - first.time_ns) / 1e9),
            slo_good=self.delta("slo_good"),
            slo_missed={r: self.delta(f"slo_missed_{r}") for r in MISS_REASONS},
            slo_slack_count=slack_n,
            slo_slack_mean=self.fdelta("slo_slack_sum") / slack_n if slack_n else None,
            requests_arrived=self.arrived(),
        )
