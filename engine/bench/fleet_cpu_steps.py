"""`bench/fleet_cpu.py`'s three measurements on live fleets (scripts/serve_fleet.sh):
1. fleet prefix-cache hit rate, goodput and latency per routing policy (and one pod alone) on W1 and the
   Mooncake replay; 2. a document prefilled on pod A, asked on pod B through the shared store, then the store
   killed mid-run; 3. a pod SIGKILLed while traffic flows through the router."""

from __future__ import annotations

import os
import random
import signal
import statistics
import threading
import time
from dataclasses import dataclass

from kvloop.engine.bench.driver import run_workload
from kvloop.engine.bench.fleet_cpu_fleet import Fleet, prom_sum
from kvloop.engine.bench.matrix_traces import TraceOptions, build_cell, offered_rate
from kvloop.engine.bench.metrics import client_metrics
from kvloop.engine.bench.targets.http import HTTPTarget

# (label, pods, router policy, shared store)
SYSTEMS = (
    ("one_pod", 1, "round_robin", False),
    ("cache_aware", 3, "cache_aware", False),
    ("round_robin", 3, "round_robin", False),
    ("round_robin+store", 3, "round_robin", True),
    ("kv_aware", 3, "kv_aware", False),
)
KEEP = (
    "slo_good",
    "slo_sent",
    "slo_good_share",
    "slo_goodput_req_s",
    "completed",
    "failed",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p90_s",
    "tpot_p99_s",
    "cached_prompt_share",
)
VOCAB = (1000, 40000)  # token ids drawn for the documents: ordinary ones, clear of the special tokens


@dataclass(frozen=True)
class Plan:
    traffic_s: float = 40.0
    drain_s: float = 20.0
    length_scale: float = 0.25  # W1's and Mooncake's token lengths (W1: w1_scale; Mooncake: mooncake_scale)
    rates: tuple[tuple[str, float], ...] = (("w1", 0.3), ("mooncake", 0.5))
    doc_tokens: int = 2000
    docs: int = 3
    kill_traffic_s: float = 30.0
    kill_at_s: float = 12.0
    kill_rate: float = 0.6
    smoke: bool = False
    seed: int = 0
    serve_args: tuple[str, ...] = ("--threads", "1")


def _target(url: str, name: str) -> HTTPTarget:
    t = HTTPTarget(url, name, scrape_metrics=False)
    t.start()
    return t


def _hit_delta(before: list, after: list) -> dict:
    pairs = [(a[0] - b[0], a[1] - b[1]) for b, a in zip(before, after, strict=True) if a and b]
    hits, queries = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    return {
        "hit_tokens": hits,
        "query_tokens": queries,
        "hit_rate": hits / queries if queries else None,
        "per_pod_hit_rate": [p[0] / p[1] if p[1] else None for p in pairs],
    }


def step_hit_rates(plan: Plan, log, systems=SYSTEMS) -> list[dict]:
    opts = TraceOptions(
        traffic_s=plan.traffic_s,
        w1_scale=plan.length_scale,
        smoke=plan.smoke,
        mooncake_scale=plan.length_scale,
    )
    cells = []
    for label, pods, policy, store in systems:
        fleet = Fleet(pods, policy, store, list(plan.serve_args)).start()
        try:
            for i, (trace, rate) in enumerate(plan.rates):
                wl = build_cell(trace, rate, plan.seed + i, opts)  # the same traffic for every system
                before = fleet.hits_queries()
                res = run_workload(
                    wl,
                    _target(fleet.router_url, label),
                    timeout_s=plan.traffic_s + plan.drain_s,
                    last_send_s=plan.traffic_s,
                )
                hit = _hit_delta(before, fleet.hits_queries())
                m = client_metrics(res.records)
                cells.append(
                    {
                        "system": label,
                        "pods": pods,
                        "policy": policy,
                        "store": store,
                        "trace": trace,
                        "rate_req_s": rate,
                        "offered_req_s": offered_rate(wl, plan.traffic_s),
                        **hit,
                        "m": {k: m.get(k) for k in KEEP},
                    }
                )
                log(
                    f"{label} {trace}: hit rate {hit['hit_rate'] or 0:.3f}, good "
                    f"{m['slo_good']}/{m['slo_sent']}, TTFT p50 {m['ttft_p50_s']:.2f} s"
                )
        finally:
            fleet.close()
    return cells


def _doc(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(*VOCAB) for _ in range(n)]


def _one(t: HTTPTarget, rid: str, prompt: list[int], max_tokens: int = 4) -> dict:
    """One request to one pod, timed: TTFT, cached tokens, error."""
    t0 = time.monotonic()
    t.submit(rid, prompt, max_tokens)
    first = None
    while True:
        for ev in t.poll(1.0):
            if ev.num_new_tokens and first is None:
                first = ev.t - t0
            if ev.done:
                return {"ttft_s": first, "cached_tokens": ev.cached_tokens, "error": ev.error}


def _await_writes(fleet: Fleet, pod: int, limit_s: float = 20.0) -> None:
    """Until pod's remote writes stop growing (its write queue has drained to the store)."""
    last, t0 = -1.0, time.monotonic()
    while time.monotonic() - t0 < limit_s:
        m = fleet.pod_metrics(pod) or {}
        now = prom_sum(m, "kvloop:kv_remote_writes_total")
        if now == last and now > 0:
            return
        last = now
        time.sleep(0.5)


def step_store(plan: Plan, log) -> dict:
    rng = random.Random(plan.seed + 100)
    fleet = Fleet(2, "round_robin", True, list(plan.serve_args)).start()
    try:
        a, b = _target(fleet.pod_url(0), "pod-a"), _target(fleet.pod_url(1), "pod-b")
        question = [rng.randrange(*VOCAB) for _ in range(16)]
        _one(b, "warmup", _doc(rng, 32))  # first-request costs out of the cold timings
        warm, cold = [], []
        for d in range(plan.docs):
            doc = _doc(rng, plan.doc_tokens)
            _one(a, f"a{d}", doc + question)
            _await_writes(fleet, 0)
            warm.append(_one(b, f"b{d}", doc + question[::-1]))
            cold.append(_one(b, f"c{d}", _doc(rng, plan.doc_tokens) + question))
            log(
                f"store: doc {d}: pod B warm TTFT {warm[-1]['ttft_s']:.3f} s "
                f"({warm[-1]['cached_tokens']} cached), cold {cold[-1]['ttft_s']:.3f} s"
            )
        # the store killed while requests for documents pod A prefilled flow to pod B
        docs = [_doc(rng, plan.doc_tokens) for _ in range(plan.docs)]
        for d, doc in enumerate(docs):
            _one(a, f"ka{d}", doc + question)
        _await_writes(fleet, 0)
        before = fleet.pod_metrics(1) or {}
        results: list[dict] = []
        runner = threading.Thread(
            target=lambda: results.extend(
                _one(b, f"kb{d}", doc + question[::-1]) for d, doc in enumerate(docs)
            )
        )
        runner.start()
        # killed once pod B has answered the first: the next request is then on its way, the rest follow
        deadline = time.monotonic() + 120
        while not results and runner.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        killed_after = len(results)
        os.kill(fleet.store_pid(), signal.SIGKILL)
        runner.join()
        after = fleet.pod_metrics(1) or {}
        failed = [r for r in results if r["error"]]
        remote_hits = prom_sum(after, "kvloop:prefix_cache_hits_total", 'tier="remote"') - prom_sum(
            before, "kvloop:prefix_cache_hits_total", 'tier="remote"'
        )
        log(f"store killed: {len(failed)} of {len(results)} failed, remote hit tokens {remote_hits:g}")
        ttft = lambda rows: statistics.median(r["ttft_s"] for r in rows if r["ttft_s"] is not None)  # noqa: E731
        return {
            "doc_tokens": plan.doc_tokens,
            "docs": plan.docs,
            "warm": warm,
            "cold": cold,
            "warm_ttft_p50_s": ttft(warm),
            "cold_ttft_p50_s": ttft(cold),
            "store_killed": {
                "killed_after_requests": killed_after,
                "cached_after_kill": [r["cached_tokens"] for r in results[killed_after:]],
                "sent": len(results),
                "failed": len(failed),
                "errors": [r["error"] for r in failed],
                "results": results,
                "remote_hit_tokens_during": remote_hits,
                "remote_up_after": prom_sum(after, "kvloop:kv_remote_up"),
                "remote_errors": prom_sum(after, "kvloop:kv_remote_errors_total"),
            },
        }
    finally:
        fleet.close()


def _watch_router(fleet: Fleet, port: int, stop: threading.Event, out: list) -> None:
    """(t, {series: value}) of the router's counters for the worker on `port` (its URL in their labels;
    health checks left out), every 0.2 s."""
    key = f"127.0.0.1:{port}"
    while not stop.is_set():
        m = fleet.router_metrics()
        out.append(
            (
                time.monotonic(),
                {
                    k: v
                    for k, v in m.items()
                    if key in k and "health" not in k and k.split("{")[0].endswith("_total")
                },
            )
        )
        stop.wait(0.2)


def _router_rises(seen: list, since: float) -> tuple[float | None, list[str]]:
    """The last time after `since` that any of the worker's counters grew, and the series that did."""
    last, names = None, set()
    for (t, now), (_, before) in zip(seen[1:], seen, strict=False):
        grew = [k for k, v in now.items() if v > before.get(k, 0.0)]
        if grew and t >= since:
            last = t
            names.update(grew)
    return last, sorted(names)


def step_pod_kill(plan: Plan, log) -> dict:
    fleet = Fleet(3, "round_robin", False, list(plan.serve_args)).start()
    opts = TraceOptions(traffic_s=plan.kill_traffic_s, w1_scale=plan.length_scale, smoke=plan.smoke)
    victim = 2
    try:
        wl = build_cell("w1", plan.kill_rate, plan.seed + 200, opts)
        target = _target(fleet.router_url, "router")
        seen: list = []
        stop = threading.Event()
        watcher = threading.Thread(target=_watch_router, args=(fleet, fleet.base_port + victim, stop, seen))
        watcher.start()
        kill: dict = {}

        def killer(t0: float) -> None:
            time.sleep(plan.kill_at_s)
            m = fleet.pod_metrics(victim) or {}
            kill["in_flight"] = prom_sum(m, "kvloop:num_requests_running") + prom_sum(
                m, "kvloop:num_requests_waiting"
            )
            kill["t"] = time.monotonic()
            kill["s"] = kill["t"] - t0
            os.kill(fleet.engine_pid(victim), signal.SIGKILL)

        t0 = time.monotonic()  # run_workload's own clock starts here (its target is already started)
        th = threading.Thread(target=killer, args=(t0,))
        th.start()
        res = run_workload(
            wl, target, timeout_s=plan.kill_traffic_s + plan.drain_s, last_send_s=plan.kill_traffic_s
        )
        th.join()
        stop.set()
        watcher.join()
        kill_s = kill["s"]
        failed = [r for r in res.records if not r.ok]
        last, grew = _router_rises(seen, kill["t"])
        router_last_s = (last - kill["t"]) if last is not None else 0.0
        client_last_s = max((r.send_s - kill_s for r in failed if r.send_s >= kill_s), default=0.0)
        m = client_metrics(res.records)
        log(
            f"pod kill at {kill_s:.1f} s: {len(failed)} failed ({kill['in_flight']:g} in flight there), "
            f"last routed there +{max(router_last_s, client_last_s):.2f} s"
        )
        return {
            "kill_at_s": kill_s,
            "in_flight_at_kill": kill["in_flight"],
            "sent": len(res.records),
            "failed": len(failed),
            "failures": [{"id": r.request_id, "sent_s": r.send_s, "error": r.error} for r in failed],
            "failed_sent_before_kill": sum(1 for r in failed if r.send_s < kill_s),
            "router_last_routed_after_kill_s": router_last_s,
            "client_last_failure_sent_after_kill_s": client_last_s,
            "last_routed_after_kill_s": max(router_last_s, client_last_s),
            "router_scrapes": len(seen),
            "router_worker_series": sorted({k for _, d in seen for k in d}),
            "router_series_grown_after_kill": grew,
            "m": {k: m.get(k) for k in KEEP},
        }
    finally:
        fleet.close()


def estimate_s(
    plan: Plan, steps=("hits", "store", "kill"), systems: int = len(SYSTEMS), startup_s: float = 45.0
) -> float:
    """Wall seconds of a run: a fleet's start-up and stop (three pods loading on a shared 2-core box: about
    35 s measured, one pod 12 s) per fleet, each cell's window and half its drain, step 2's requests (about
    4 s per 2,000-token prefill, 9 per document)."""
    total = 0.0
    if "hits" in steps:
        total += systems * (startup_s + len(plan.rates) * (plan.traffic_s + plan.drain_s * 0.5))
    if "store" in steps:
        total += startup_s + plan.docs * 9 * 4.0 * plan.doc_tokens / 2000
    if "kill" in steps:
        total += startup_s + plan.kill_traffic_s + plan.drain_s * 0.5
    return total
