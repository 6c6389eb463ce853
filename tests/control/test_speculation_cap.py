"""The speculation cap as a live knob (issue 56, part 3): a target written to the control block reaches the
scheduler's knobs and the speculator's live cap, never past the configured --speculation-max-tokens; stale
targets fall back to the configured value; `kvloop control set --speculation-max-tokens N` writes it."""

from __future__ import annotations

import types

from kvloop.engine.cli import main as kvloop_main
from kvloop.engine.control.hook import EngineControl
from kvloop.engine.control.link import SidecarLink
from kvloop.engine.kv.config import KVConfig
from kvloop.engine.kv.manager import KVCacheManager
from kvloop.engine.scheduler.scheduler import Scheduler, SchedulerConfig
from kvloop.engine.scheduler.snapshot import build_snapshot


def engine_with_speculation(max_tokens: int = 4):
    """The real scheduler (its knobs and speculator) behind the hook's duck-typed engine."""
    kv = KVCacheManager(64, 16, KVConfig())
    sched = Scheduler(SchedulerConfig(speculation="ngram", speculation_max_tokens=max_tokens), kv)
    return types.SimpleNamespace(scheduler=sched, snapshot=lambda: build_snapshot(sched, kv, num_steps=0))


def test_a_written_cap_reaches_the_speculator_and_never_raises_it(tmp_path):
    engine = engine_with_speculation(4)
    spec = engine.scheduler.speculator
    hook = EngineControl.attach(engine, tmp_path / "c.bin")
    assert hook.link.defaults.speculation_max_tokens == 4
    side = SidecarLink(tmp_path / "c.bin")
    side.write_targets(speculation_max_tokens=2)
    hook.after_step(engine, [])
    assert engine.scheduler.knobs.speculation_max_tokens == spec.max_tokens == 2 and spec.active
    side.write_targets(speculation_max_tokens=0)  # off, live
    hook.after_step(engine, [])
    assert spec.max_tokens == 0 and not spec.active
    side.write_targets(speculation_max_tokens=64)  # within the knob's range, above the configured 4
    hook.after_step(engine, [])
    assert spec.max_tokens == 4
    side.write_targets(batch_cap=3)  # no opinion on the cap: it keeps its value
    hook.after_step(engine, [])
    assert (engine.scheduler.knobs.batch_cap, spec.max_tokens) == (3, 4)


def test_a_cap_outside_the_knobs_range_is_refused(tmp_path):
    engine = engine_with_speculation(4)
    hook = EngineControl.attach(engine, tmp_path / "c.bin")
    SidecarLink(tmp_path / "c.bin").write_targets(speculation_max_tokens=65)
    hook.after_step(engine, [])
    assert hook.link.counters["out_of_range"] == 1 and engine.scheduler.speculator.max_tokens == 4


def test_a_stale_cap_falls_back_to_the_configured_value(tmp_path):
    engine = engine_with_speculation(6)
    now = [10**18]
    hook = EngineControl.attach(engine, tmp_path / "c.bin", stale_after_s=30)
    hook.link.clock = lambda: now[0]
    hook.link.start_ns = now[0]
    SidecarLink(tmp_path / "c.bin", clock=lambda: now[0]).write_targets(speculation_max_tokens=1)
    hook.after_step(engine, [])
    assert engine.scheduler.speculator.max_tokens == 1
    now[0] += 31 * 10**9
    hook.after_step(engine, [])
    assert engine.scheduler.speculator.max_tokens == 6


def test_kvloop_control_set_writes_the_cap(tmp_path, capsys):
    engine = engine_with_speculation(4)
    hook = EngineControl.attach(engine, tmp_path / "c.bin")
    assert kvloop_main(["control", "set", "--control", str(tmp_path / "c.bin"),
                        "--speculation-max-tokens", "3"]) == 0
    assert "speculation_max_tokens=3" in capsys.readouterr().out
    hook.after_step(engine, [])
    assert engine.scheduler.speculator.max_tokens == 3
    assert SidecarLink(tmp_path / "c.bin").read_targets().values() == (None, None, None, 3)

    assert kvloop_main(["control", "set", "--control", str(tmp_path / "c.bin"),
                        "--speculation_max_tokens", "1"]) == 0  # the knob's own spelling too
    hook.after_step(engine, [])
    assert engine.scheduler.speculator.max_tokens == 1
