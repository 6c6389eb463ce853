"""Prometheus metrics: `kvloop:` names plus vLLM-named aliases, so routers, KEDA and dashboards built for
vLLM work unchanged.

Two sources feed one registry: engine state (queue depth, KV use, cache counters) is read from the
latest engine snapshot at scrape time by a custom collector, and per-request latencies and token counts
are observed by the API layer when outputs arrive. Every family is exported from the start (zeros until
the engine's first snapshot), so rate() has a baseline."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from kvloop.engine.core.kv_stats import TIERS
from kvloop.engine.core.slo import MISS_REASONS
from kvloop.engine.core.snapshot import EngineSnapshot

# vLLM's buckets, so that dashboards and SLO rules built for vLLM read the same.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)
FINISH_REASONS = ("stop", "length", "abort")

SnapshotSource = Callable[[], "EngineSnapshot | None"]


class SnapshotCollector(Collector):
    """Engine-state families, built from the latest snapshot on every scrape (zeros before the first)."""

    def __init__(self, snapshot: SnapshotSource, model_name: str, cache_config: Mapping[str, object]):
        self._snapshot = snapshot
        self._model = model_name
        self._cache_config = {k: str(v) for k, v in cache_config.items()}

    def _gauge(self, name: str, doc: str, value: float, labels: dict[str, str] | None = None):
        labels = {"model_name": self._model, **(labels or {})}
        g = GaugeMetricFamily(name, doc, labels=list(labels))
        g.add_metric(list(labels.values()), value)
        return g

    def _counter(self, name: str, doc: str, value: float):
        c = CounterMetricFamily(name, doc, labels=["model_name"])
        c.add_metric([self._model], value)
        return c

    def _split(self, name: str, doc: str, values: Mapping[str, float], label: str):
        c = CounterMetricFamily(name, doc, labels=["model_name", label])
        for key, v in values.items():
            c.add_metric([self._model, key], v)
        return c

    def collect(self):
        s = self._snapshot() or EngineSnapshot()
        st = s.kv_stats
        hits = {t: s.prefix_hits(t) for t in TIERS}
        # a remote KV tier is configured: its client reports the store up, or has failed to reach it
        remote = bool(st.remote_connected or st.remote_errors)
        if remote:
            hits["remote"] = st.hit_tokens_remote
        for prefix in ("kvloop", "vllm"):
            yield self._gauge(f"{prefix}:num_requests_waiting", "Requests waiting to be scheduled.",
                              s.num_waiting)
            yield self._gauge(f"{prefix}:num_requests_running", "Requests in the running batch.",
                              s.num_running)
            yield self._counter(f"{prefix}:prefix_cache_queries",
                                "Prompt tokens looked up in the prefix cache.",
                                s.prefix_queries("device"))
        yield self._gauge("vllm:kv_cache_usage_perc", "Device KV-cache use, 0..1.", s.kv_usage)
        # vLLM's name before 0.10, still the default KV metric of older Gateway API Inference Extension EPPs
        yield self._gauge("vllm:gpu_cache_usage_perc", "Device KV-cache use, 0..1 (vLLM's older name).",
                          s.kv_usage)
        yield from self._gateway_metrics()
        kv = GaugeMetricFamily("kvloop:kv_cache_usage_perc", "KV-cache use per tier, 0..1.",
                               labels=["model_name", "tier"])
        for tier, v in s.kv_use_by_tier().items():
            kv.add_metric([self._model, tier], v)
        yield kv
        yield self._counter("vllm:prefix_cache_hits", "Prompt tokens served from the prefix cache.",
                            sum(hits.values()))
        yield self._split("kvloop:prefix_cache_hits", "Prompt tokens served from the prefix cache, per tier.",
                          hits, "tier")
        yield self._split("kvloop:prefix_cache_tier_queries",
                          "Prompt tokens asked of each tier: the device is asked "
                          "for every token looked up, a lower tier for those the tiers above it did not "
                          "serve.",
                          {t: s.prefix_queries(t) for t in TIERS + (("remote",) if remote else ())}, "tier")
        yield self._counter("vllm:num_preemptions", "Preemptions.", s.num_preemptions)
        yield self._split("kvloop:num_preemptions", "Preemptions by kind (swap or recompute).",
                          s.num_preemptions_by_kind, "kind")
        # speculative decoding, vLLM v1's spec_decode counters (vllm/v1/spec_decode/metrics.py)
        yield self._counter("vllm:spec_decode_num_drafts", "Rows that verified proposed tokens, per step.",
                            s.spec_num_drafts)
        yield self._counter("vllm:spec_decode_num_draft_tokens", "Proposed (draft) tokens verified.",
                            s.spec_num_draft_tokens)
        yield self._counter("vllm:spec_decode_num_accepted_tokens", "Proposed tokens accepted.",
                            s.spec_num_accepted_tokens)
        yield self._split("vllm:spec_decode_num_accepted_tokens_per_pos",
                          "Proposed tokens accepted, by their position in the proposal (0: the first).",
                          {str(i): n for i, n in enumerate(s.spec_accepted_per_pos)}, "position")
        yield self._counter("kvloop:oom_events",
                            "Out-of-memory events (static-mode reservations that failed).",
                            s.num_oom_events)
        yield self._counter("kvloop:step_failures", "Engine steps whose model forward raised (their requests "
                            "failed, the engine went on).", s.step_failures)
        # every finished request judged against the engine's SLO (--slo-ttft-s, --slo-ttft-per-1k-s,
        # --slo-tpot-s); client aborts are not judged. Goodput: rate(kvloop:slo_good_total)
        yield self._counter("kvloop:slo_good", "Finished requests that met the SLO: TTFT within its bound "
                            "for the prompt's length and mean TPOT within its bound.", s.slo_good)
        yield self._split("kvloop:slo_missed", "Finished requests that missed the SLO, by the first reason: "
                          "ttft, tpot, or failed (the engine failed it or no token came).",
                          {r: s.slo_missed.get(r, 0) for r in MISS_REASONS}, "reason")
        yield self._gauge("kvloop:batch_cap", "Live upper bound on running requests.", s.batch_cap)
        yield self._gauge("kvloop:step_token_budget",
                          "Live token budget of one step (the prefill chunk size).",
                          s.step_token_budget)
        yield self._gauge("kvloop:tpot_target_seconds", "TPOT target admission holds the decode step time to "
                          "(0: none).", s.tpot_target_s)
        yield self._gauge("kvloop:decode_step_seconds",
                          "Recent length of the steps in which rows decode, as the "
                          "TPOT target's gate sees it (0: no target).", s.decode_step_s)
        yield self._counter("kvloop:admission_tpot_holds",
                            "Admission attempts that waited for the decode step "
                            "time to come back under the TPOT target.", s.tpot_holds)
        yield self._gauge("kvloop:retention_watermark", "Share of the device pool kept for cached blocks.",
                          s.watermark)
        yield self._split("kvloop:cache_evictions", "Cached blocks evicted, per tier.",
                          {"device": st.evictions, "host": st.host_evictions, "disk": st.disk_evictions},
                          "tier")
        yield self._split("kvloop:cache_demotions", "Blocks demoted, per destination tier.",
                          {"host": st.demotions_host, "disk": st.demotions_disk}, "tier")
        yield self._split("kvloop:cache_promotions", "Blocks promoted, per source tier.",
                          {"host": st.promotions_host, "disk": st.promotions_disk}, "tier")
        yield self._counter("kvloop:cache_admissions_refused",
                            "Device blocks evicted before earning their place (used by fewer distinct "
                            "requests than the gate asks).", st.admissions_refused)
        yield self._counter("kvloop:cache_host_copies_refused",
                            "Device-evicted blocks the host tier did not take: not yet offered by enough "
                            "distinct requests, and every host slot held by blocks that were.",
                            st.host_copies_refused)
        yield self._counter("kvloop:cache_host_copies_skipped",
                            "Device-evicted blocks not copied to the host: too few blocks like them are "
                            "asked for again for the copy to pay (measured).", st.host_copies_skipped)
        yield self._counter("kvloop:cache_lower_tier_recomputed",
                            "Host/disk blocks matched but recomputed (measured cheaper than loading them).",
                            st.lower_tier_recomputed)
        yield self._counter("kvloop:eviction_regret",
                            "Evicted blocks asked for again within the regret window.",
                            st.eviction_regret)
        yield from self._remote_metrics(st, remote)
        yield self._counter("kvloop:kv_events_dropped", "KV events (--kv-events-endpoint) lost to a full "
                            "buffer; the routers are then sent an all-cleared.", st.kv_events_dropped)
        info = InfoMetricFamily("kvloop:cache_config", "KV-cache configuration.")
        mode = {"mode": s.kv_mode} if s.kv_mode else {}
        info.add_metric([], {"model_name": self._model, **self._cache_config, **mode})
        yield info


    def _gateway_metrics(self):
        """What the Gateway API Inference Extension's endpoint picker reads beyond queue and KV use (its
        model server protocol, docs/proposals/003-model-server-protocol): vllm:lora_requests_info (a gauge
        whose value is the last update's time; no adapters here, max_lora 0) and vllm:cache_config_info,
        whose block_size and num_gpu_blocks labels size the prefix-cache scorer when it tunes itself."""
        lora = GaugeMetricFamily("vllm:lora_requests_info", "LoRA adapters running and waiting (none here).",
                                 labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters"])
        lora.add_metric(["0", "", ""], time.time())
        yield lora
        if "block_size" in self._cache_config:
            info = InfoMetricFamily("vllm:cache_config", "KV-cache configuration, in vLLM's label names.")
            info.add_metric([], {"block_size": self._cache_config["block_size"],
                                 "num_gpu_blocks": self._cache_config.get("num_blocks", ""),
                                 "cache_dtype": self._cache_config.get("dtype", ""),
                                 "enable_prefix_caching": "True"})
            yield info


    def _remote_metrics(self, st, remote: bool):
        """The remote KV tier (engine/kv/remote_client.py); zeros where there is none, and no up gauge."""
        if remote:
            yield self._gauge("kvloop:kv_remote_up", "Whether the remote KV store answers (1), or is down "
                              "(0: its reads are misses and writes dropped until it answers again).",
                              st.remote_connected)
        yield self._counter("kvloop:kv_remote_errors", "Failed calls to the remote KV store (refused, timed "
                            "out past --kv-remote-timeout-ms, error replies); while it is down it is not "
                            "called, so not counted.", st.remote_errors)
        yield self._counter("kvloop:kv_remote_hits", "Blocks loaded from the remote KV tier.",
                            st.promotions_remote)
        yield self._counter("kvloop:kv_remote_misses", "Blocks asked of the remote KV tier and not served: "
                            "absent, gone when read, or a value that failed its checks.", st.remote_misses)
        yield self._counter("kvloop:kv_remote_bad_values", "Remote KV values that failed their checks "
                            "(corrupt, truncated, another block's or model's): misses.",
                            st.remote_bad_values)
        yield self._counter("kvloop:kv_remote_writes", "Blocks written to the remote KV tier.",
                            st.remote_writes)
        yield self._counter("kvloop:kv_remote_writes_dropped", "Remote KV writes dropped: the write queue "
                            "full or the store down.", st.remote_writes_dropped)
        yield self._split("kvloop:kv_remote_bytes", "Bytes over the link to the remote KV store.",
                          {"read": st.remote_bytes_read, "write": st.remote_bytes_written}, "direction")


class EngineMetrics:
    """The server's registry. `snapshot` returns the engine's latest snapshot (called at scrape time)."""

    def __init__(self, model_name: str = "default", snapshot: SnapshotSource = lambda: None,
                 cache_config: Mapping[str, object] | None = None, registry: CollectorRegistry | None = None):
        prometheus_client.disable_created_metrics()  # vLLM does the same: no *_created series
        self.registry = registry or CollectorRegistry()
        self.model_name = model_name
        self.registry.register(SnapshotCollector(snapshot, model_name, cache_config or {}))
        r, m = self.registry, ["model_name"]
        self.ttft, self.itl, self.e2e, self.queue = ([], [], [], [])
        for prefix in ("kvloop", "vllm"):
            self.ttft.append(Histogram(f"{prefix}:time_to_first_token_seconds", "Time to first token.", m,
                                       buckets=TTFT_BUCKETS, registry=r).labels(model_name))
            self.itl.append(Histogram(f"{prefix}:inter_token_latency_seconds", "Time between output tokens.",
                                      m,
                                      buckets=ITL_BUCKETS, registry=r).labels(model_name))
            self.e2e.append(Histogram(f"{prefix}:e2e_request_latency_seconds", "Arrival to finish.", m,
                                      buckets=REQUEST_BUCKETS, registry=r).labels(model_name))
            self.queue.append(Histogram(f"{prefix}:request_queue_time_seconds",
                                        "Arrival to first scheduling.", m,
                                        buckets=REQUEST_BUCKETS, registry=r).labels(model_name))
        self.prompt_tokens = [Counter(f"{p}:prompt_tokens", "Prompt tokens processed.", m,
                                      registry=r).labels(model_name)
                              for p in ("kvloop", "vllm")]
        self.generation_tokens = [Counter(f"{p}:generation_tokens", "Tokens generated.", m, registry=r)
                                  .labels(model_name) for p in ("kvloop", "vllm")]
        self.success = [Counter(f"{p}:request_success", "Finished requests by finish reason.",
                                ["model_name", "finished_reason"], registry=r) for p in ("kvloop", "vllm")]
        self.rejected = Counter("kvloop:requests_rejected", "Requests refused before running, by reason.",
                                ["model_name", "reason"], registry=r)
        for reason in FINISH_REASONS:  # present from the start, so rate() has a baseline
            for c in self.success:
                c.labels(model_name, reason)
        self.rejected.labels(model_name, "queue_full")
        # requests the engine failed alone, by stage (sampling, logit_bias, penalties, output, step, add)
        self.request_failures = Counter("kvloop:request_failures",
                                        "Requests failed alone inside the engine, by "
                                        "stage; every other request went on.", ["model_name", "stage"],
                                        registry=r)
        self.engine_deaths = Counter("kvloop:engine_deaths",
                                     "Engine thread deaths (the process exits after one).",
                                     m, registry=r).labels(model_name)

    def observe_token_gap(self, seconds: float) -> None:
        for h in self.itl:
            h.observe(seconds)

    def observe_first_token(self, seconds: float) -> None:
        for h in self.ttft:
            h.observe(seconds)

    def observe_finished(self, reason: str, prompt_tokens: int, output_tokens: int, e2e_s: float,
                         queue_s: float | None) -> None:
        for i in range(2):
            self.success[i].labels(self.model_name, reason).inc()
            self.prompt_tokens[i].inc(prompt_tokens)
            self.generation_tokens[i].inc(output_tokens)
            self.e2e[i].observe(e2e_s)
            if queue_s is not None:
                self.queue[i].observe(queue_s)

    def observe_rejected(self, reason: str) -> None:
        self.rejected.labels(self.model_name, reason).inc()

    def observe_request_failure(self, stage: str) -> None:
        self.request_failures.labels(self.model_name, stage).inc()

    def observe_engine_death(self) -> None:
        self.engine_deaths.inc()


def build_registry() -> CollectorRegistry:
    """A registry with every exported family (engine-free; the dashboard test lists names from it)."""
    return EngineMetrics().registry
