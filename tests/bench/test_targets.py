"""Static-batch gate and /metrics parsing, on fakes (no model)."""

import time

from kvloop.engine.bench.targets.base import Event, Target
from kvloop.engine.bench.targets.http import kvloop_snapshot, parse_prometheus
from kvloop.engine.bench.targets.static_gate import StaticBatchGate
from kvloop.engine.core.kv_stats import KVStats
from kvloop.engine.core.snapshot import EngineSnapshot


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


def test_prometheus_to_snapshot_through_the_servers_own_metrics():
    """What kvloop's /metrics exports of a snapshot comes back as the fields the benchmark reads."""
    from prometheus_client import generate_latest

    from kvloop.engine.server.metrics import EngineMetrics

    stats = KVStats(query_tokens_device=1000, query_tokens_host=600, query_tokens_disk=500,
                    hit_tokens_device=400,
                    hit_tokens_host=100, hit_tokens_disk=7)
    snap = EngineSnapshot(num_waiting=2, num_running=3, batch_cap=8, num_preemptions=3,
                          num_preemptions_by_kind={"swap": 1, "recompute": 2}, num_oom_events=4,
                          watermark=0.2,
                          kv_usage=0.25, kv_stats=stats)
    text = generate_latest(EngineMetrics("m", lambda: snap).registry).decode()
    got = kvloop_snapshot(parse_prometheus(text))
    assert got == EngineSnapshot(num_waiting=2, num_running=3, batch_cap=8, num_preemptions=3,
                                 num_preemptions_by_kind={"swap": 1, "recompute": 2}, num_oom_events=4,
                                 watermark=0.2, kv_usage=0.25, kv_stats=stats)
    vllm = 'vllm:num_requests_waiting{model_name="m"} 2.0\nvllm:kv_cache_usage_perc{model_name="m"} 0.25\n'
    assert kvloop_snapshot(parse_prometheus(vllm)) is None  # another server: no made-up zeros


def test_gate_counts_its_held_requests_as_waiting():
    inner = FakeTarget()
    inner.snapshot = lambda: EngineSnapshot(num_waiting=1)
    gate = StaticBatchGate(inner, batch_size=4, fill_timeout_s=60.0)
    gate.submit("a", [1], 1)
    gate.submit("b", [1], 1)
    assert gate.snapshot().num_waiting == 3
