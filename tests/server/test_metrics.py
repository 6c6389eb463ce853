"""/metrics parses with prometheus_client's own parser and carries the kvloop: names and vLLM aliases."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvloop.engine.server.metrics import build_registry

VLLM = ["vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions",
        "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds", "vllm:prompt_tokens", "vllm:generation_tokens",
        "vllm:request_success"]
KVLOOP = ["kvloop:num_requests_waiting", "kvloop:num_requests_running", "kvloop:kv_cache_usage_perc",
          "kvloop:prefix_cache_queries", "kvloop:prefix_cache_hits", "kvloop:prefix_cache_tier_queries",
          "kvloop:num_preemptions", "kvloop:requests_rejected", "kvloop:oom_events",
          "kvloop:time_to_first_token_seconds",
          "kvloop:inter_token_latency_seconds", "kvloop:e2e_request_latency_seconds",
          "kvloop:request_queue_time_seconds", "kvloop:batch_cap", "kvloop:retention_watermark",
          "kvloop:cache_evictions", "kvloop:cache_demotions", "kvloop:cache_promotions",
          "kvloop:cache_admissions_refused", "kvloop:cache_host_copies_refused",
          "kvloop:cache_host_copies_skipped",
          "kvloop:cache_lower_tier_recomputed", "kvloop:eviction_regret", "kvloop:tpot_target_seconds",
          "kvloop:decode_step_seconds",
          "kvloop:admission_tpot_holds", "kvloop:slo_good", "kvloop:slo_missed", "kvloop:cache_config_info"]
HISTOGRAMS = ["time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
              "request_queue_time_seconds"]


def scrape(http) -> dict:
    resp = http.get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(resp.text)}


def value(family, **labels) -> float:
    return sum(s.value for s in family.samples
               if s.name.endswith(("_total", "_count")) or s.name == family.name
               if all(s.labels.get(k) == v for k, v in labels.items()))


def test_names_present_and_moving(http, server):
    before = scrape(http)
    assert set(VLLM + KVLOOP) <= set(before), sorted(set(VLLM + KVLOOP) - set(before))
    for name in HISTOGRAMS:
        assert before[f"vllm:{name}"].type == "histogram" and before[f"kvloop:{name}"].type == "histogram"
    assert before["vllm:prompt_tokens"].type == "counter"
    assert {s.labels["tier"] for s in before["kvloop:kv_cache_usage_perc"].samples} >= {"device"}
    assert value(before["kvloop:batch_cap"]) == server.engine.scheduler.batch_cap
    info = before["kvloop:cache_config_info"].samples[0].labels
    assert info["block_size"] == str(server.engine.config.block_size)

    resp = http.post("/v1/completions", json={"model": "default", "prompt": "Hello there", "max_tokens": 3,
                                              "temperature": 0})
    assert resp.status_code == 200
    http.post("/v1/completions", json={"model": "nope", "prompt": "x"})
    after = scrape(http)
    assert value(after["vllm:request_success"], finished_reason="length") >= \
        value(before["vllm:request_success"], finished_reason="length") + 1
    assert value(after["vllm:generation_tokens"]) >= value(before["vllm:generation_tokens"]) + 3
    assert value(after["vllm:prompt_tokens"]) > value(before["vllm:prompt_tokens"])
    ttft = [s for s in after["vllm:time_to_first_token_seconds"].samples if s.name.endswith("_count")]
    assert ttft and ttft[0].value >= 1
    itl = [s for s in after["kvloop:inter_token_latency_seconds"].samples if s.name.endswith("_count")]
    assert itl[0].value >= 2


def test_build_registry_lists_every_name():
    names = {f.name for f in text_string_to_metric_families(generate_latest(build_registry()).decode())}
    assert set(VLLM + KVLOOP) <= names


def test_metrics_read_the_engine_snapshot():
    """Every engine-state family comes from one typed field of the engine snapshot."""
    from kvloop.engine.core.kv_stats import KVStats
    from kvloop.engine.core.snapshot import EngineSnapshot
    from kvloop.engine.server.metrics import EngineMetrics

    stats = KVStats(query_tokens_device=100, query_tokens_host=60, query_tokens_disk=50, hit_tokens_device=40,
                    hit_tokens_host=10, evictions=7, demotions_host=4, promotions_disk=2,
                    admissions_refused=5,
                    host_copies_refused=6, host_copies_skipped=8, eviction_regret=1)
    snap = EngineSnapshot(num_waiting=2, kv_usage=0.5, kv_host_blocks_used=16, kv_host_blocks_total=64,
                          num_preemptions=3, num_preemptions_by_kind={"swap": 1, "recompute": 2},
                          watermark=0.3,
                          kv_mode="codesign", step_failures=1, kv_stats=stats, tpot_target_s=0.08,
                          decode_step_s=0.095, tpot_holds=4, slo_good=9, slo_missed={"ttft": 2, "failed": 1})
    reg = EngineMetrics("m", lambda: snap).registry
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    assert value(fams["vllm:prefix_cache_queries"]) == 100
    assert value(fams["vllm:prefix_cache_hits"]) == 50
    assert value(fams["kvloop:prefix_cache_hits"], tier="host") == 10
    assert value(fams["kvloop:prefix_cache_tier_queries"], tier="host") == 60
    assert value(fams["kvloop:prefix_cache_tier_queries"], tier="disk") == 50
    assert value(fams["kvloop:step_failures"]) == 1
    assert value(fams["vllm:num_preemptions"]) == 3
    assert value(fams["kvloop:num_preemptions"], kind="swap") == 1
    assert value(fams["kvloop:kv_cache_usage_perc"], tier="host") == 0.25
    assert value(fams["vllm:kv_cache_usage_perc"]) == 0.5
    assert value(fams["kvloop:retention_watermark"]) == 0.3
    assert value(fams["kvloop:cache_evictions"], tier="device") == 7
    assert value(fams["kvloop:cache_demotions"], tier="host") == 4
    assert value(fams["kvloop:cache_promotions"], tier="disk") == 2
    assert value(fams["kvloop:cache_admissions_refused"]) == 5
    assert value(fams["kvloop:cache_host_copies_refused"]) == 6
    assert value(fams["kvloop:cache_host_copies_skipped"]) == 8
    assert value(fams["kvloop:eviction_regret"]) == 1
    assert value(fams["kvloop:tpot_target_seconds"]) == 0.08
    assert value(fams["kvloop:decode_step_seconds"]) == 0.095
    assert value(fams["kvloop:admission_tpot_holds"]) == 4
    assert value(fams["kvloop:slo_good"]) == 9
    # every reason is exported, zero where none missed, so rate() has a baseline
    assert {s.labels["reason"]: s.value for s in fams["kvloop:slo_missed"].samples} == \
        {"ttft": 2, "tpot": 0, "failed": 1}
    assert fams["kvloop:cache_config_info"].samples[0].labels["mode"] == "codesign"
