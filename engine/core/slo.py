"""The service-level objective every part of kvloop judges by (../shared/WORKLOADS.md, "The SLO"):
a request is good when its TTFT is within a base allowance plus a per-1,000-prompt-token allowance and its
mean TPOT (decode time / (output tokens - 1)) within a bound; a failed, refused or aborted request is not.
Goodput is good requests per second of a run. The engine counts outcomes (scheduler/slo_ledger.py), the
coordinator steers on them, the benchmarks and the simulator report them."""

from __future__ import annotations

from dataclasses import dataclass

from kvloop.engine.core import defaults as D

MISS_REASONS = ("ttft", "tpot", "failed")  # why a request missed, in the order a miss is named


@dataclass(frozen=True)
class Slo:
    ttft_base_s: float = D.SLO_TTFT_BASE_S.value
    ttft_per_1k_s: float = D.SLO_TTFT_PER_1K_S.value
    tpot_s: float = D.SLO_TPOT_S.value

    def __post_init__(self) -> None:
        if self.ttft_base_s <= 0 or self.ttft_per_1k_s < 0 or self.tpot_s <= 0:
            raise ValueError("SLO: ttft_base_s and tpot_s must be > 0, ttft_per_1k_s >= 0")

    def ttft_bound(self, prompt_tokens: int) -> float:
        """The TTFT a request of this prompt length may take: a long fresh prompt cannot start sooner."""
        return self.ttft_base_s + self.ttft_per_1k_s * prompt_tokens / 1000.0

    def miss(self, ttft_s: float | None, prompt_tokens: int, tpot_s: float | None,
             failed: bool = False) -> str | None:
        """None when the request is good, else the first reason it is not (MISS_REASONS). `tpot_s` None: one
        output token, no decode time to judge; `ttft_s` None: no token came (a miss unless failed says so)."""
        if failed or ttft_s is None:
            return "failed"
        if ttft_s > self.ttft_bound(prompt_tokens):
            return "ttft"
        if tpot_s is not None and tpot_s > self.tpot_s:
            return "tpot"
        return None

    def slack(self, ttft_s: float, prompt_tokens: int, tpot_s: float | None) -> float:
        """How far inside the SLO a request finished, as the smaller of its two margins (1: instant, 0: at the
        bound, < 0: missed): the coordinator's proxy when too few requests finished to count."""
        m = 1.0 - ttft_s / self.ttft_bound(prompt_tokens)
        if tpot_s is not None:
            m = min(m, 1.0 - tpot_s / self.tpot_s)
        return m


CPU_SLO = Slo()
GPU_SLO = Slo(D.GPU_SLO_TTFT_BASE_S.value, D.GPU_SLO_TTFT_PER_1K_S.value, D.GPU_SLO_TPOT_S.value)


def request_tpot(first_token_time: float | None, finished_time: float | None,
                 num_output_tokens: int) -> float | None:
    """Seconds per output token after the first; None when there is no second token (or no times)."""
    if first_token_time is None or finished_time is None or num_output_tokens < 2:
        return None
    return max(0.0, finished_time - first_token_time) / (num_output_tokens - 1)
