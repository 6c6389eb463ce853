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
