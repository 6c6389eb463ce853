"""EngineControl against a small fake engine: snapshot published, targets applied to the scheduler
and to the KV manager's watermark setter, TTFT percentiles over the window."""

from __future__ import annotations

import types

from kvloop.engine.control.hook import EngineControl
from kvloop.engine.control.link import SidecarLink
from kvloop.engine.snapshot import EngineSnapshot


class FakeKV:
    def __init__(self):
        self.watermark = 0.2

    def set_watermark(self, w: float) -> None:
        self.watermark = w


class FakeEngine:
    def __init__(self):
        self.scheduler = types.SimpleNamespace(config=types.SimpleNamespace(max_num_seqs=16))
        self.kv = FakeKV()

    def snapshot(self) -> EngineSnapshot:
        return EngineSnapshot(num_waiting=2, batch_cap=self.scheduler.config.max_num_seqs,
                              watermark=self.kv.watermark, kv_usage=0.4)


def out(ttft: float, n: int = 1):
    return types.SimpleNamespace(num_output_tokens=n, first_token_time=10.0 + ttft, arrival_time=10.0)


def test_hook_publishes_and_applies(tmp_path):
    engine = FakeEngine()
    hook = EngineControl.attach(engine, tmp_path / "c.bin", stale_after_s=30)
    assert hook.link.defaults.batch_cap == 16 and hook.link.defaults.watermark == 0.2
    side = SidecarLink(tmp_path / "c.bin")
    hook.after_step(engine, [out(0.1), out(0.3), out(9.0, n=2)])  # n=2: not a first token
    snap = side.read_snapshot()
    assert snap.num_waiting == 2 and snap.watermark == 0.2
    assert abs(snap.ttft_p50_s - 0.1) < 1e-9 and abs(snap.ttft_p99_s - 0.3) < 1e-9
    side.write_targets(24, 0.6)
    hook.after_step(engine, [])
    assert engine.scheduler.config.max_num_seqs == 24 and engine.kv.watermark == 0.6
    side.write_targets(24, None)  # watermark left alone
    hook.after_step(engine, [])
    assert engine.kv.watermark == 0.6


def test_scheduler_setter_preferred(tmp_path):
    engine = FakeEngine()
    calls = []
    engine.scheduler.set_batch_cap = calls.append
    hook = EngineControl.attach(engine, tmp_path / "c.bin")
    SidecarLink(tmp_path / "c.bin").write_targets(7, None)
    hook.after_step(engine, [])
    assert calls == [7]

