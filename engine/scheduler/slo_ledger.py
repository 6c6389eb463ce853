"""Counts each finished request against the SLO (core/slo.py) on the scheduler's clock, for the engine and the
simulator alike: the snapshot carries the counts, Prometheus exports them, the coordinator steers on them."""

from __future__ import annotations

from collections import Counter

from kvloop.engine.core.sequence import Sequence
from kvloop.engine.core.slo import MISS_REASONS, Slo, request_tpot

# finish reasons that are the client's choice, not an outcome of service: neither good nor missed
NOT_JUDGED = frozenset({"abort"})


class SloLedger:
    def __init__(self, slo: Slo):
        self.slo = slo
        self.good = 0
        self.missed: Counter[str] = Counter({r: 0 for r in MISS_REASONS})
        self.slack_sum = 0.0  # sum of judged requests' slack (Slo.slack), the proxy at low traffic
        self.slack_count = 0

    def record(self, seq: Sequence, reason: str, now: float) -> None:
        if reason in NOT_JUDGED:
            return
        ttft = None if seq.first_token_time is None else seq.first_token_time - seq.arrival_time
        tpot = request_tpot(seq.first_token_time, now, seq.num_output_tokens)
        miss = self.slo.miss(ttft, seq.num_prompt_tokens, tpot, failed=reason == "error")
        if miss is None:
            self.good += 1
        else:
            self.missed[miss] += 1
        if ttft is not None and miss != "failed":
            self.slack_sum += self.slo.slack(ttft, seq.num_prompt_tokens, tpot)
            self.slack_count += 1
