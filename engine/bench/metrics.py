"""Metrics as `vllm bench serve` reports them, plus server-side ones (pure Python).

Client side, per request: TTFT (send to first token), TPOT ((E2E - TTFT) / (output tokens - 1)), ITL (gaps
between streamed chunks), E2E. Run level: request and token throughput over the makespan (first send to
last finish), mean/P50/P90/P99 of each latency, the run-level SLO (`SLO`: fixed TTFT/TPOT bounds at P99,
and `goodput_req_s` against them, as earlier reports carry it), and the project's per-request SLO
(engine/core/slo.py: `slo_metrics`, keys slo_*: good count, misses by reason, goodput, TTFT P99 of the
requests with no cache hit). Server side from periodic snapshots of
the engine's counters: hit rate per tier, KV use over time, preemptions, rejections, out-of-memory events."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from kvloop.engine.core.kv_stats import TIERS
from kvloop.engine.core.slo import CPU_SLO, MISS_REASONS, Slo, request_tpot
from kvloop.engine.core.snapshot import EngineSnapshot

PERCENTILES = (50, 90, 99)


@dataclass
class SLO:
    ttft_s: float = 2.0
    tpot_s: float = 0.100


@dataclass
class RequestRecord:
    """What a client saw of one request. Times are seconds on one clock (the driver's)."""

    request_id: str
    kind: str = ""
    send_s: float = 0.0
    first_token_s: float | None = None
    end_s: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # arrival of each streamed chunk with tokens
    prompt_tokens: int = 0
    output_tokens: int = 0
    # prompt tokens the server reported as served from cache; None: the server did not say (no usage detail)
    cached_tokens: int | None = 0
    error: str | None = None  # None: success; "rejected: ...", "oom: ...", other text: failure

    @property
    def ok(self) -> bool:
        return self.error is None and self.end_s is not None and self.first_token_s is not None

    @property
    def ttft(self) -> float:
        return self.first_token_s - self.send_s

    @property
    def e2e(self) -> float:
        return self.end_s - self.send_s

    @property
    def tpot(self) -> float | None:
        return request_tpot(self.first_token_s, self.end_s, self.output_tokens)

    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:], strict=False)]

    def compact(self) -> dict:
        """This record without its chunk times, times to the millisecond: what a results file keeps so that
        per-request measures can be recomputed later (`RequestRecord(**d)` reads it back)."""
        def ms(t: float | None) -> float | None:
            return None if t is None else round(t, 3)

        return {"request_id": self.request_id, "kind": self.kind, "send_s": ms(self.send_s),
                "first_token_s": ms(self.first_token_s), "end_s": ms(self.end_s),
                "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens, "cached_tokens": self.cached_tokens, "error": self.error}


def percentile(xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not xs:
        return math.nan
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _stats(prefix: str, xs: list[float]) -> dict[str, float]:
    out = {f"{prefix}_mean_s": sum(xs) / len(xs) if xs else math.nan}
    for q in PERCENTILES:
        out[f"{prefix}_p{q}_s"] = percentile(xs, q)
    return out


def run_span(records: list[RequestRecord]) -> tuple[float, float]:
    """(first send, last successful finish) of a run: its makespan's ends (the start
    where nothing finished)."""
    start = min((r.send_s for r in records), default=0.0)
    return start, max((r.end_s for r in records if r.ok), default=start)


def client_metrics(records: list[RequestRecord], slo: SLO | None = None) -> dict:
    """The `vllm bench serve` summary of one run."""
    slo = slo or SLO()
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    start, end = run_span(records)
    duration = max(end - start, 1e-9)
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    tpots = [t for r in ok if (t := r.tpot) is not None]
    good = [r for r in ok if r.ttft <= slo.ttft_s and (r.tpot is None or r.tpot <= slo.tpot_s)]
    m = {
        "completed": len(ok),
        "failed": len(failed),
        "rejections": sum(1 for r in failed if (r.error or "").startswith("rejected")),
        "client_oom_errors": sum(1 for r in failed if "oom" in (r.error or "").lower()
                                 or "out of memory" in (r.error or "").lower()),
        "duration_s": duration,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput_req_s": len(ok) / duration,
        "output_throughput_tok_s": out_tokens / duration,
        "total_token_throughput_tok_s": (in_tokens + out_tokens) / duration,
        "goodput_req_s": len(good) / duration,
        "cached_prompt_share": (sum(r.cached_tokens or 0 for r in ok) / in_tokens) if in_tokens else 0.0,
    }
    m.update(_stats("ttft", [r.ttft for r in ok]))
    m.update(_stats("tpot", tpots))
    m.update(_stats("itl", [x for r in ok for x in r.itls()]))
    m.update(_stats("e2e", [r.e2e for r in ok]))
    m["meets_slo"] = bool(ok) and not failed and m["ttft_p99_s"] <= slo.ttft_s and (
        not tpots or m["tpot_p99_s"] <= slo.tpot_s)
    m.update(slo_metrics(records))
    return m


def slo_miss(r: RequestRecord, slo: Slo = CPU_SLO) -> str | None:
    """None when the request met the per-request SLO, else why not (MISS_REASONS): a failed, refused or
    timed-out request is 'failed'. The TTFT bound grows with the prompt the client sent."""
    if not r.ok:
        return "failed"
    return slo.miss(r.ttft, r.prompt_tokens, r.tpot)


def slo_metrics(records: list[RequestRecord], slo: Slo = CPU_SLO) -> dict:
    """The per-request SLO over a run (../shared/WORKLOADS.md, "The SLO, goodput and capacity"): good count,
    misses by reason, goodput (good / the run's span, first send to last finish), the good share of the
    requests sent, and TTFT P99 of the successful requests with no cache hit (cached_tokens == 0). Requests
    whose server did not report cached tokens (cached_tokens None) are in no class: where none reported,
    slo_nohit_ttft_p99_s is None, never a guess."""
    start, end = run_span(records)
    span = max(end - start, 1e-9)
    missed = dict.fromkeys(MISS_REASONS, 0)
    good = 0
    for r in records:
        why = slo_miss(r, slo)
        if why is None:
            good += 1
        else:
            missed[why] += 1
    ok = [r for r in records if r.ok]
    nohit = [r.ttft for r in ok if r.cached_tokens == 0]
    reported = sum(1 for r in ok if r.cached_tokens is not None)
    return {"slo_good": good, "slo_missed": missed, "slo_sent": len(records),
            "slo_good_share": good / len(records) if records else None,
            "slo_goodput_req_s": good / span if records else 0.0, "slo_span_s": span if records else 0.0,
            "slo_nohit_count": len(nohit), "slo_cache_reported": reported,
            "slo_nohit_ttft_p99_s": percentile(nohit, 99) if nohit else None,
            "slo": {"ttft_base_s": slo.ttft_base_s, "ttft_per_1k_s": slo.ttft_per_1k_s, "tpot_s": slo.tpot_s}}


@dataclass
class Sample:
    """The server's snapshot at time t (same clock as the records)."""

    t: float
    snapshot: EngineSnapshot


def server_metrics(samples: list[Sample]) -> dict:
    """Hit rate per tier (over all tokens looked up), KV use over time (and its mean while requests wait),
    preemptions, rejections, out-of-memory events, from the engine's snapshots over the run."""
    if not samples:
        return {"available": False}
    first, last = samples[0].snapshot, samples[-1].snapshot

    def delta(counter: Callable[[EngineSnapshot], int]) -> float:
        return float(counter(last) - counter(first))

    query = delta(lambda s: s.prefix_queries("device"))  # every lookup asks the device first
    out: dict = {"available": True}
    for tier in TIERS:
        out[f"hit_rate_{tier}"] = delta(lambda s, t=tier: s.prefix_hits(t)) / query if query else None
    known = [out[f"hit_rate_{t}"] for t in TIERS if out[f"hit_rate_{t}"] is not None]
    out["hit_rate_total"] = sum(known) if known else None
    out["preemptions"] = delta(lambda s: s.num_preemptions)
    out["oom_events"] = delta(lambda s: s.num_oom_events)
    out["server_rejections"] = delta(lambda s: s.num_rejections)
    t0 = samples[0].t
    use = [(s.t - t0, float(s.snapshot.kv_usage)) for s in samples]
    out["kv_use_series"] = [[round(t, 3), round(u, 4)] for t, u in use]
    out["kv_use_mean"] = sum(u for _, u in use) / len(use)
    waiting = [float(s.snapshot.kv_usage) for s in samples if s.snapshot.num_waiting > 0]
    out["kv_use_mean_while_waiting"] = sum(waiting) / len(waiting) if waiting else None
    out["kv_use_max"] = max(u for _, u in use)
    return out


GOOD_SHARE_FOR_CAPACITY = 0.95  # WORKLOADS.md: goodput >= 95% of the offered rate


def slo_capacity(sweep: list[tuple[float, float | None]]) -> float | None:
    """Capacity at the per-request SLO: the highest swept rate whose good share (good / sent) is >= 95%, None
    where none is. Good share stands for goodput / offered rate: over a run of tens of seconds the drain after
    the last arrival is a large part of the span and would count as loss in a run where every request met
    the SLO; good / sent is that ratio with the same span on both sides. `sweep`: (rate, good share)."""
    ok = [rate for rate, share in sweep if share is not None and share >= GOOD_SHARE_FOR_CAPACITY]
    return max(ok) if ok else None


def capacity(sweep: list[tuple[float, dict]]) -> float | None:
    """The largest swept request rate whose run met the SLOs (None: none did). `sweep` is (rate, metrics)."""
    ok = [rate for rate, m in sweep if m.get("meets_slo")]
    return max(ok) if ok else None
