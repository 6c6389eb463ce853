"""Static-batch gate and /metrics parsing, on fakes (no model)."""

import time

from kvloop.engine.bench.targets.base import Event, Target
from kvloop.engine.bench.targets.http import kvloop_snapshot, parse_prometheus
from kvloop.engine.bench.targets.static_gate import StaticBatchGate


class FakeTarget(Target):
    """Finishes everything submitted on the next poll."""

    def __init__(self):
        self.live: list[str] = []
        self.batches: list[list[str]] = []

    def submit(self, request_id, prompt, max_tokens):
        self.live.append(request_id)

    def poll(self, timeout):
        if self.live:
            self.batches.append(self.live)
        out = [Event(r, time.monotonic(), [1], 1, done=True) for r in self.live]
        self.live = []
        return out

    def idle(self):
        return not self.live


def test_gate_fills_batches_then_times_out():
    inner = FakeTarget()
    gate = StaticBatchGate(inner, batch_size=3, fill_timeout_s=0.05)
    for i in range(4):
        gate.submit(f"r{i}", [1], 1)
    assert len(gate.poll(0)) == 3 and inner.batches == [["r0", "r1", "r2"]]
    assert gate.poll(0) == [] and not gate.idle()  # r3 waits for the fill timeout
    time.sleep(0.06)
    assert [e.request_id for e in gate.poll(0)] == ["r3"] and gate.idle() and gate.batches == [3, 1]


def test_gate_waits_for_the_running_batch():
    inner = FakeTarget()
    gate = StaticBatchGate(inner, batch_size=2, fill_timeout_s=0.0)
    inner.live = ["busy"]
    gate.submit("a", [1], 1)
    gate._release()
    assert inner.live == ["busy"]  # not admitted while a batch runs


def test_prometheus_to_snapshot():
    text = """# HELP x
vllm:num_preemptions_total{model_name="m"} 3.0
kvloop:num_requests_waiting{model_name="m"} 2.0
vllm:kv_cache_usage_perc{model_name="m"} 0.25
kvloop:prefix_cache_queries_total{model_name="m"} 1000.0
kvloop:prefix_cache_hits_total{model_name="m",tier="device"} 400.0
kvloop:prefix_cache_hits_total{model_name="m",tier="host"} 100.0
kvloop:oom_events_total{model_name="m"} 0.0
"""
    snap = kvloop_snapshot(parse_prometheus(text))
    assert snap == {"num_waiting": 2.0, "kv_query_tokens": 1000.0, "num_preemptions": 3.0, "num_oom_events": 0.0,
                    "kv_usage": 0.25, "kv_hit_tokens_device": 400.0, "kv_hit_tokens_host": 100.0}
