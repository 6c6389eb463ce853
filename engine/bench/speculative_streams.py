"""Closed-loop streams for the speculation benchmark: `concurrency` clients, each sending its next request
when its last one ends, so a cell measures TPOT at a fixed number of concurrent streams (1, 4) rather than
at an arrival rate. Also the server's speculation counters (vLLM's metric names, which kvloop serve and vLLM
both export) as a delta over a cell, and one non-streamed completion for the identity check."""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx

from kvloop.engine.bench.guard import NoiseGuard, NoiseReport
from kvloop.engine.bench.metrics import RequestRecord
from kvloop.engine.bench.targets.base import Target
from kvloop.engine.bench.targets.http import parse_prometheus
from kvloop.engine.bench.workloads import RequestSpec

# vLLM's speculative-decoding counters (vllm/v1/spec_decode/metrics.py); kvloop serve exports the same names
SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)


@dataclass
class StreamsResult:
    records: list[RequestRecord]
    wall_s: float
    noise: NoiseReport | None


def run_streams(
    requests: list[RequestSpec],
    target: Target,
    concurrency: int,
    timeout_s: float,
    guard: NoiseGuard | None = None,
) -> StreamsResult:
    """Sends `requests` in order over `concurrency` closed-loop streams; unfinished ones after `timeout_s`
    are recorded as failed ('timeout')."""
    pending = list(reversed(requests))
    records: dict[str, RequestRecord] = {}
    live = 0
    guard = guard or NoiseGuard()
    target.start()
    with guard:
        t0 = time.monotonic()
        while pending or live:
            now = time.monotonic() - t0
            if now > timeout_s:
                break
            while pending and live < concurrency:
                r = pending.pop()
                records[r.request_id] = RequestRecord(r.request_id, r.kind, now, prompt_tokens=len(r.prompt))
                target.submit(r.request_id, r.prompt, r.max_tokens)
                live += 1
            for ev in target.poll(0.05):
                rec = records.get(ev.request_id)
                if rec is None:
                    continue
                t = ev.t - t0
                if ev.num_new_tokens:
                    rec.first_token_s = t if rec.first_token_s is None else rec.first_token_s
                    rec.chunk_times.append(t)
                if ev.done:
                    rec.end_s, rec.error = t, ev.error
                    rec.prompt_tokens = ev.prompt_tokens or rec.prompt_tokens
                    rec.cached_tokens = ev.cached_tokens
                    rec.output_tokens = ev.output_tokens
                    live -= 1
        wall = time.monotonic() - t0
    for rec in records.values():
        if rec.end_s is None and rec.error is None:
            rec.error = "timeout"
    return StreamsResult(list(records.values()), wall, guard.report())


def spec_counters(base_url: str) -> dict[str, float]:
    """The speculation counters the server exports now (summed over label sets; absent ones omitted)."""
    try:
        text = httpx.get(base_url + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return {}
    return spec_counters_of(text)


def spec_counters_of(metrics_text: str) -> dict[str, float]:
    """SPEC_COUNTERS from a Prometheus exposition, each summed over its label sets (engine, model)."""
    out: dict[str, float] = {}
    for key, v in parse_prometheus(metrics_text).items():
        name = key.split("{")[0].removesuffix("_total")
        if name in SPEC_COUNTERS:
            out[name] = out.get(name, 0.0) + v
    return out


def spec_delta(before: dict[str, float], after: dict[str, float]) -> dict:
    """Drafts, draft tokens, accepted tokens over a cell and the acceptance rate (accepted / drafted: vLLM's
    spec_decode acceptance rate); None where the server exports no counters."""
    if not after:
        return {"drafts": None, "draft_tokens": None, "accepted_tokens": None, "acceptance_rate": None}
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in SPEC_COUNTERS}
    drafted = d["vllm:spec_decode_num_draft_tokens"]
    accepted = d["vllm:spec_decode_num_accepted_tokens"]
    return {
        "drafts": d["vllm:spec_decode_num_drafts"],
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance_rate": accepted / drafted if drafted else None,
    }


def complete(
    client: httpx.Client,
    base_url: str,
    prompt: list[int],
    max_tokens: int,
    logprobs: bool = False,
    model: str = "default",
) -> dict:
    """One greedy, non-streamed completion of exactly `max_tokens` tokens: {text, tokens (the per-token
    texts when `logprobs`), completion_tokens} or {error}."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    if logprobs:
        body["logprobs"] = 0
    try:
        r = client.post(base_url + "/v1/completions", json=body)
        if r.status_code != 200:
            return {"error": f"{r.status_code} {r.text[:200]}"}
        obj = r.json()
    except (httpx.HTTPError, ValueError) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    choice = obj["choices"][0]
    return {
        "text": choice.get("text", ""),
        "completion_tokens": (obj.get("usage") or {}).get("completion_tokens"),
        "tokens": (choice.get("logprobs") or {}).get("tokens") if logprobs else None,
    }
