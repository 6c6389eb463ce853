"""vllm-bench-style metrics on hand-made records and server snapshots."""

import math

from kvloop.engine.bench.metrics import (
    SLO,
    RequestRecord,
    Sample,
    capacity,
    client_metrics,
    percentile,
    server_metrics,
)
from kvloop.engine.core.kv_stats import KVStats
from kvloop.engine.core.snapshot import EngineSnapshot


def rec(rid, send, first, end, n, chunks=None, error=None, prompt=100, cached=0):
    return RequestRecord(rid, "doc", send, first, end, chunks or [], prompt, n, cached, error)


def test_percentile_matches_numpy_linear():
    xs = [1.0, 2.0, 3.0, 4.0]
    assert percentile(xs,
                      50) == 2.5 and abs(percentile(xs, 99) - 3.97) < 1e-12 and math.isnan(percentile([], 50))


def test_client_metrics():
    rs = [rec("a", 0.0, 0.5, 2.5, 5, [0.5, 1.0, 1.5, 2.0, 2.5], cached=50),
          rec("b", 1.0, 4.0, 5.0, 3, [4.0, 4.5, 5.0]),
          rec("c", 2.0, None, None, 0, error="rejected: too_long")]
    m = client_metrics(rs, SLO(ttft_s=2.0, tpot_s=0.6))
    assert m["completed"] == 2 and m["failed"] == 1 and m["rejections"] == 1
    assert m["duration_s"] == 5.0 and m["output_throughput_tok_s"] == 8 / 5
    assert m["ttft_mean_s"] == (0.5 + 3.0) / 2 and m["tpot_p50_s"] == 0.5
    assert m["itl_mean_s"] == 0.5 and m["e2e_p50_s"] == 3.25
    assert m["goodput_req_s"] == 1 / 5  # b misses the TTFT SLO
    assert m["cached_prompt_share"] == 0.25 and m["meets_slo"] is False


def test_server_metrics_and_capacity():
    s0 = EngineSnapshot(kv_usage=0.1, num_waiting=0, num_preemptions=1,
                        kv_stats=KVStats(query_tokens_device=100, hit_tokens_device=10))
    s1 = EngineSnapshot(kv_usage=0.5, num_waiting=2, num_preemptions=3, num_rejections=1,
                        kv_stats=KVStats(query_tokens_device=1100, hit_tokens_device=510,
                                         hit_tokens_host=100))
    m = server_metrics([Sample(0.0, s0), Sample(1.0, s1)])
    assert m["hit_rate_device"] == 0.5 and m["hit_rate_host"] == 0.1 and m["hit_rate_disk"] == 0.0
    assert m["hit_rate_total"] == 0.6 and m["server_rejections"] == 1.0
    assert m["preemptions"] == 2 and m["oom_events"] == 0
    no_lookups = server_metrics([Sample(0.0, s0), Sample(1.0, s0)])
    assert no_lookups["hit_rate_device"] is None and no_lookups["hit_rate_total"] is None  # e.g. static mode
    assert m["kv_use_mean"] == 0.3 and m["kv_use_mean_while_waiting"] == 0.5
    assert m["kv_use_series"] == [[0.0, 0.1], [1.0, 0.5]]
    assert server_metrics([]) == {"available": False}
    assert capacity([(0.5, {"meets_slo": True}), (1.0, {"meets_slo": True}),
                     (2.0, {"meets_slo": False})]) == 1.0
    assert capacity([(1.0, {"meets_slo": False})]) is None


def test_slo_metrics_per_request_bound_and_reasons():
    # CPU_SLO: TTFT <= 2 s + 1 s per 1,000 prompt tokens, mean TPOT <= 250 ms
    rs = [rec("long", 0.0, 4.0, 5.0, 5, prompt=3000, cached=0),  # TTFT 4 s within 5 s: good
          rec("short", 0.0, 4.0, 5.0, 5, prompt=100, cached=None),  # 4 s > 2.1 s: ttft; cache unknown
          rec("slow", 1.0, 1.5, 6.5, 11, prompt=100, cached=80),  # TPOT 0.5 s: tpot
          rec("one", 2.0, 2.5, 2.5, 1, prompt=100, cached=0),  # one token: no TPOT to judge: good
          rec("refused", 3.0, None, None, 0, error="rejected: too_long")]
    m = client_metrics(rs)
    assert m["slo_good"] == 2 and m["slo_missed"] == {"ttft": 1, "tpot": 1, "failed": 1}
    assert m["slo_sent"] == 5 and m["slo_good_share"] == 0.4
    assert m["slo_span_s"] == 6.5 and m["slo_goodput_req_s"] == 2 / 6.5
    # no-hit class: known cached == 0 only ("short" did not say)
    assert m["slo_nohit_count"] == 2 and m["slo_cache_reported"] == 3
    assert m["slo_nohit_ttft_p99_s"] == percentile([4.0, 0.5], 99)
    assert m["cached_prompt_share"] == 80 / 3300
    unknown = client_metrics([rec("u", 0.0, 0.1, 0.2, 2, cached=None)])
    assert unknown["slo_nohit_ttft_p99_s"] is None and unknown["slo_cache_reported"] == 0


def test_slo_capacity_is_the_highest_rate_with_95_percent_good():
    from kvloop.engine.bench.metrics import slo_capacity

    assert slo_capacity([(0.5, 1.0), (1.0, 0.96), (1.5, 0.7), (2.0, 0.95)]) == 2.0
    assert slo_capacity([(0.5, 0.9), (1.0, None)]) is None
