"""EngineControl against a small fake engine: snapshot published, targets applied to the engine's live
knobs, TTFT and TPOT percentiles over the window; apply_targets against the real scheduler sets the step
token budget within its clamp, and the KV manager reads the same knobs."""

from __future__ import annotations

import types

from kvloop.engine.control.hook import EngineControl
from kvloop.engine.control.link import SidecarLink
from kvloop.engine.core.knobs import Knobs, KnobValues
from kvloop.engine.core.snapshot import EngineSnapshot


class FakeEngine:
    def __init__(self):
        self.scheduler = types.SimpleNamespace(knobs=Knobs(16, 0.2, 512))

    @property
    def knobs(self) -> Knobs:
        return self.scheduler.knobs

    def snapshot(self) -> EngineSnapshot:
        return EngineSnapshot(num_waiting=2, batch_cap=self.knobs.batch_cap, watermark=self.knobs.watermark,
                              kv_usage=0.4)


def out(ttft: float, n: int = 1, finished_after: float | None = None, reason: str = "length"):
    """A request's output at its n-th token; finished_after: seconds from its first token to its finish."""
    first = 10.0 + ttft
    done = finished_after is not None
    return types.SimpleNamespace(num_output_tokens=n, first_token_time=first, arrival_time=10.0,
                                 finished=done,
                                 finish_reason=reason if done else None,
                                 finished_time=first + finished_after if done else None)


def test_hook_publishes_and_applies(tmp_path):
    engine = FakeEngine()
    hook = EngineControl.attach(engine, tmp_path / "c.bin", stale_after_s=30)
    assert hook.link.defaults.batch_cap == 16 and hook.link.defaults.watermark == 0.2
    assert hook.link.defaults.step_token_budget == 512
    side = SidecarLink(tmp_path / "c.bin")
    hook.after_step(engine, [out(0.1), out(0.3), out(9.0, n=2)])  # n=2: not a first token
    snap = side.read_snapshot()
    assert snap.num_waiting == 2 and snap.watermark == 0.2
    assert abs(snap.ttft_p50_s - 0.1) < 1e-9 and abs(snap.ttft_p99_s - 0.3) < 1e-9
    assert snap.tpot_p50_s != snap.tpot_p50_s  # NaN: nobody finished yet
    side.write_targets(24, 0.6)
    hook.after_step(engine, [])
    assert (engine.knobs.batch_cap, engine.knobs.watermark) == (24, 0.6)
    side.write_targets(24, None)  # watermark left alone
    hook.after_step(engine, [])
    assert engine.knobs.watermark == 0.6


def test_stale_targets_give_way_to_the_configured_values(tmp_path):
    engine = FakeEngine()
    now = [10**18]
    hook = EngineControl.attach(engine, tmp_path / "c.bin", stale_after_s=30)
    hook.link.clock = lambda: now[0]
    hook.link.start_ns = now[0]
    SidecarLink(tmp_path / "c.bin", clock=lambda: now[0]).write_targets(7, 0.5, 64)
    hook.after_step(engine, [])
    assert engine.knobs.values() == KnobValues(7, 0.5, 64)
    now[0] += 31 * 10**9
    hook.after_step(engine, [])
    assert engine.knobs.values() == KnobValues(16, 0.2, 512)


def test_tpot_of_finished_requests(tmp_path):
    engine = FakeEngine()
    hook = EngineControl.attach(engine, tmp_path / "c.bin")
    side = SidecarLink(tmp_path / "c.bin")
    hook.after_step(engine, [out(0.1, n=11, finished_after=1.0),  # 10 tokens after the first in 1 s: 0.1 s
                             out(0.1, n=5, finished_after=2.0),  # 0.5 s
                             out(0.1, n=1, finished_after=0.0),  # one token: no TPOT
                             out(0.1, n=9, finished_after=0.1, reason="error")])  # failed: not counted
    snap = side.read_snapshot()
    assert abs(snap.tpot_p50_s - 0.1) < 1e-9 and abs(snap.tpot_p99_s - 0.5) < 1e-9


def test_step_token_budget_applied_through_the_block(tmp_path):
    engine = FakeEngine()
    hook = EngineControl.attach(engine, tmp_path / "c.bin")
    SidecarLink(tmp_path / "c.bin").write_targets(None, None, 128)
    hook.after_step(engine, [])
    assert (engine.knobs.step_token_budget, engine.knobs.batch_cap) == (128, 16)


def test_apply_targets_sets_the_schedulers_budget_within_its_clamp():
    from kvloop.engine.control.hook import apply_targets
    from kvloop.engine.control.records import Targets
    from kvloop.engine.kv.config import KVConfig
    from kvloop.engine.kv.manager import KVCacheManager
    from kvloop.engine.scheduler.scheduler import Scheduler, SchedulerConfig
    from kvloop.engine.scheduler.snapshot import build_snapshot

    kv = KVCacheManager(64, 16, KVConfig(watermark=0.1))
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=1024), kv)
    engine = types.SimpleNamespace(scheduler=sched)
    apply_targets(engine, Targets(step_token_budget=256, watermark=0.4))
    assert sched.step_token_budget == 256 and sched.config.max_num_batched_tokens == 1024  # the config stays
    assert kv.knobs is sched.knobs and kv.watermark == 0.4 and kv.config.watermark == 0.1
    snap = build_snapshot(sched, kv, num_steps=0)
    assert (snap.step_token_budget, snap.step_token_budget_max, snap.block_size) == (256, 1024, 16)
    apply_targets(engine, Targets(step_token_budget=1 << 20))
    assert sched.step_token_budget == 1024  # never above the configured budget
    apply_targets(engine, Targets(step_token_budget=3))
    assert sched.step_token_budget == 16  # nor below a block (at least 16 tokens)


def test_snapshot_counts_decoding_rows_and_the_prompt_blocks_still_to_prefill():
    from kvloop.engine.core.batch import StepResult
    from kvloop.engine.core.sampling import SamplingParams
    from kvloop.engine.core.sequence import Sequence
    from kvloop.engine.kv.config import KVConfig
    from kvloop.engine.kv.manager import KVCacheManager
    from kvloop.engine.scheduler.scheduler import Scheduler, SchedulerConfig
    from kvloop.engine.scheduler.snapshot import build_snapshot

    kv = KVCacheManager(64, 16, KVConfig())
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=48, idle_step_tokens=0, max_model_len=2048,
                                      queue_order="arrival"), kv)  # r0 first, as it came
    for i, n in enumerate((80, 8)):
        sched.add(Sequence(f"r{i}", list(range(100 + i, 100 + i + n)),
                           SamplingParams(max_tokens=4, ignore_eos=True)))

    def step():
        batch = sched.schedule()
        sched.update_from_output(batch,
                                 StepResult({it.seq.request_id: 7 for it in batch.items if it.samples}))
        return build_snapshot(sched, kv, num_steps=0)

    snap = step()  # r0 prefilled 48 of 80 tokens (3 blocks of 5); r1 waits for budget
    assert (snap.num_running, snap.num_decoding, snap.kv_blocks_pending) == (1, 0, 2)
    assert (snap.max_model_len, snap.block_size) == (2048, 16)
    snap = step()  # r0's last 32 prompt tokens, r1's 8: both decode next
    assert (snap.num_running, snap.num_decoding, snap.kv_blocks_pending) == (2, 2, 0)
