"""Per-phase split of a run (pure Python), for the real engine's records (bench.driver) and the simulator's
(sim.results.Recorder) alike: both give RequestRecords and periodic Samples of the engine snapshot.

- A request belongs to the phase it was sent in (TTFT, TPOT, E2E by phase of arrival); requests sent after
  the plan's end (closed-loop turns of sessions still running) belong to the last phase.
- A phase's served throughput (`served_tok_s`, the one the W5 goals compare) is the output tokens of the
  requests sent in it over the time from the phase's start until the last of them finished (at least the
  phase): how fast the phase's own traffic was delivered. A system that falls behind is charged in the phase
  whose requests waited, not in the one where its backlog drained.
- A phase's window throughput (`throughput_tok_s`) is the output tokens of the requests that finished inside
  its window, over the window (the last window runs to the run's last finish): the engine's output rate there,
  backlog of earlier phases included. Past capacity it says where a backlog drained,
  not how a phase was served.
- Server counters (preemptions, hit rate per tier, OOM, KV use) are deltas over the window, from the last
  sample at or before its start to the last sample inside it.
- `by_kind` pools every phase of one kind (all chat phases, all RAG phases).
- `timeline` is the knobs and KV use over time: batch cap, watermark, step token budget (None where the
  snapshot has no such field), KV use, waiting and running requests."""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence

from kvloop.engine.bench.metrics import SLO, RequestRecord, Sample, client_metrics, server_metrics
from kvloop.engine.bench.w5_workload import Phase

LATENCY = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p50_s", "e2e_p99_s")
SERVER = ("preemptions", "oom_events", "server_rejections", "hit_rate_device", "hit_rate_host",
          "hit_rate_disk",
          "hit_rate_total", "kv_use_mean", "kv_use_max")


def phase_index(phases: Sequence[Phase], t: float) -> int:
    """The phase a time falls in (before the first: the first; after the last: the last)."""
    i = bisect.bisect_right([p.start_s for p in phases], t) - 1
    return min(max(i, 0), len(phases) - 1)


def _windows(phases: Sequence[Phase], end_s: float) -> list[tuple[float, float]]:
    out = [(p.start_s, p.end_s) for p in phases]
    out[-1] = (out[-1][0], max(out[-1][1], end_s))
    return out


def _finished_tokens(recs: list[RequestRecord], phases: Sequence[Phase], indices: Iterable[int]) -> int:
    """Output tokens of the requests that finished in the windows of these phases."""
    idx = set(indices)
    return sum(r.output_tokens for r in recs if r.ok and phase_index(phases, r.end_s) in idx)


def _sent_by_phase(recs: Iterable[RequestRecord], phases: Sequence[Phase]) -> list[list[RequestRecord]]:
    """The requests grouped by the phase they were sent in (the phase list's order)."""
    out: list[list[RequestRecord]] = [[] for _ in phases]
    for r in recs:
        out[phase_index(phases, r.send_s)].append(r)
    return out


def _served(recs: Iterable[RequestRecord], phase: Phase) -> tuple[int, float]:
    """(output tokens, span): the successful requests' tokens, and the time from the phase's start until the
    last request finished (at least the phase's length)."""
    tokens, last = 0, phase.end_s
    for r in recs:
        if r.ok:
            tokens += r.output_tokens
            last = max(last, r.end_s)
    return tokens, last - phase.start_s


def _window_samples(samples: Sequence[Sample], start: float, end: float) -> list[Sample]:
    """The last sample at or before `start` (the baseline of the counters) and every one in (start, end]."""
    before = [s for s in samples if s.t <= start]
    inside = [s for s in samples if start < s.t <= end]
    return before[-1:] + inside


def _rate(tokens: float, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else math.nan


def _summary(records: list[RequestRecord], phase: Phase, window_s: float, finished_tokens: int,
             samples: list[Sample], slo: SLO) -> dict:
    c = client_metrics(records, slo)
    served, span = _served(records, phase)
    out = {"requests": len(records), "completed": c["completed"], "failed": c["failed"],
           "output_tokens": served, "served_span_s": span, "served_tok_s": _rate(served, span),
           "output_tokens_finished": finished_tokens, "window_s": window_s,
           "throughput_tok_s": _rate(finished_tokens, window_s),
           **{k: c[k] for k in LATENCY}}
    srv = server_metrics(samples) if len(samples) >= 2 else {"available": False}
    out.update({k: srv.get(k) for k in SERVER})
    return out


def split(records: Iterable[RequestRecord], samples: Sequence[Sample], phases: Sequence[Phase],
          slo: SLO | None = None) -> list[dict]:
    """One summary per phase (see the module doc)."""
    if not phases:
        return []
    slo = slo or SLO()
    recs = list(records)
    end = max((r.end_s for r in recs if r.end_s is not None), default=phases[-1].end_s)
    windows = _windows(phases, end)
    by_phase = _sent_by_phase(recs, phases)
    out = []
    for i, (p, (a, b), rs) in enumerate(zip(phases, windows, by_phase, strict=True)):
        tokens = _finished_tokens(recs, phases, [i])
        out.append({"index": p.index, "kind": p.kind, "start_s": a, "end_s": b, "rate": p.rate,
                    **_summary(rs, p, b - a, tokens, _window_samples(samples, a, b), slo)})
    return out


def by_kind(records: Iterable[RequestRecord], samples: Sequence[Sample], phases: Sequence[Phase],
            slo: SLO | None = None) -> dict[str, dict]:
    """Every phase of one kind pooled: latencies over their requests, served throughput as their tokens over
    the sum of their served spans, window throughput over their windows, server counters summed over their
    windows (hit rates weighted by the tokens looked up)."""
    if not phases:
        return {}
    slo = slo or SLO()
    recs = list(records)
    end = max((r.end_s for r in recs if r.end_s is not None), default=phases[-1].end_s)
    windows = _windows(phases, end)
    by_phase = _sent_by_phase(recs, phases)
    out: dict[str, dict] = {}
    for kind in dict.fromkeys(p.kind for p in phases):
        idx = [i for i, p in enumerate(phases) if p.kind == kind]
        rs = [r for i in idx for r in by_phase[i]]
        served = [_served(by_phase[i], phases[i]) for i in idx]
        served_tokens, served_span = sum(t for t, _ in served), sum(s for _, s in served)
        span = sum(windows[i][1] - windows[i][0] for i in idx)
        tokens = _finished_tokens(recs, phases, idx)
        c = client_metrics(rs, slo)
        d = {"phases": len(idx), "requests": len(rs), "completed": c["completed"], "failed": c["failed"],
             "output_tokens": served_tokens, "served_span_s": served_span,
             "served_tok_s": _rate(served_tokens, served_span), "output_tokens_finished": tokens,
             "window_s": span,
             "throughput_tok_s": _rate(tokens, span), **{k: c[k] for k in LATENCY}}
        d.update(_pooled_server([_window_samples(samples, *windows[i]) for i in idx]))
        out[kind] = d
    return out


def _pooled_server(windows: list[list[Sample]]) -> dict:
    """Counters summed over several windows; hit rates as pooled hits over pooled lookups."""
    pre = oom = rej = 0.0
    hits = {t: 0.0 for t in ("device", "host", "disk")}
    queries = 0.0
    use: list[float] = []
    for ws in windows:
        if len(ws) < 2:
            continue
        a, b = ws[0].snapshot, ws[-1].snapshot
        pre += b.num_preemptions - a.num_preemptions
        oom += b.num_oom_events - a.num_oom_events
        rej += b.num_rejections - a.num_rejections
        queries += b.prefix_queries("device") - a.prefix_queries("device")
        for t in hits:
            hits[t] += b.prefix_hits(t) - a.prefix_hits(t)
        use += [float(s.snapshot.kv_usage) for s in ws[1:]]
    out = {"preemptions": pre, "oom_events": oom, "server_rejections": rej}
    for t, h in hits.items():
        out[f"hit_rate_{t}"] = h / queries if queries else None
    out["hit_rate_total"] = sum(hits.values()) / queries if queries else None
    out["kv_use_mean"] = sum(use) / len(use) if use else None
    out["kv_use_max"] = max(use) if use else None
    return out


def timeline(samples: Sequence[Sample], every_s: float = 0.0) -> dict[str, list]:
    """Columns over time (at most one sample per `every_s`): t, batch_cap, watermark, step_token_budget,
    kv_use, waiting, running."""
    cols: dict[str, list] = {k: [] for k in ("t", "batch_cap", "watermark", "step_token_budget", "kv_use",
                                             "waiting", "running")}
    last = -math.inf
    for s in samples:
        if s.t - last < every_s:
            continue
        last = s.t
        snap = s.snapshot
        budget = getattr(snap, "step_token_budget", None)  # a field the engine snapshot may not have yet
        cols["t"].append(round(s.t, 3))
        cols["batch_cap"].append(snap.batch_cap)
        cols["watermark"].append(round(float(snap.watermark), 4))
        cols["step_token_budget"].append(budget)
        cols["kv_use"].append(round(float(snap.kv_usage), 4))
        cols["waiting"].append(snap.num_waiting)
        cols["running"].append(snap.num_running)
    return cols


def report(records: Iterable[RequestRecord], samples: Sequence[Sample], phases: Sequence[Phase],
           slo: SLO | None = None, timeline_every_s: float = 5.0) -> dict:
    """{phases: per phase, by_kind: pooled by kind, timeline: knobs over time}; {} without phases."""
    if not phases:
        return {}
    recs = list(records)
    return {"phases": split(recs, samples, phases, slo), "by_kind": by_kind(recs, samples, phases, slo),
            "timeline": timeline(samples, timeline_every_s)}
