"""The coordinator against a real control block (a ControlLink plays the engine): modes, holding on
stale snapshots, starting over on a new engine start id, the memory-derived start, the event path,
decisions recorded with reasons and inputs."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kvloop.engine.control.link import ControlLink
from kvloop.engine.control.records import Targets
from kvloop.engine.core.kv_stats import KVStats
from kvloop.engine.core.snapshot import EngineSnapshot
from kvloop.sidecar.coordinator import Coordinator
from kvloop.sidecar.settings import SettingsWatcher

HEAVY = EngineSnapshot(num_waiting=20, num_running=8, batch_cap=8, kv_usage=0.3)


class Clock:
    def __init__(self):
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture()
def setup(tmp_path):
    def make(mode="enforce", **extra):
        cfg = tmp_path / "sidecar.json"
        law = extra.pop("law", {})  # these tests follow the rules law's decisions
        extra["law"] = {"kind": "rules", **law} if isinstance(law, dict) else law
        cfg.write_text(json.dumps({"mode": mode, "period_s": 1, "snapshot_stale_s": 5,
                                   "batch_cap": {"min": 1, "max": 64, "max_step": 8, "initial": 8},
                                   "watermark": {"min": 0, "max": 0.9, "max_step": 0.1, "initial": 0.3},
                                   **extra}))
        clock = Clock()
        engine = ControlLink(tmp_path / "c.bin", Targets(8, 0.3), clock=lambda: int(clock() * 1e9))
        coord = Coordinator(SettingsWatcher(cfg), control_path=str(tmp_path / "c.bin"), clock=clock)
        return engine, coord, clock

    return make


def period(engine, coord, clock, snap, hits=(0, 0)):
    """One period: the engine publishes (its running requests fill the cap), the coordinator samples
    twice and ticks."""
    queries, hit = hits
    for _ in range(2):
        st = snap.kv_stats
        snap = replace(snap, num_running=coord.law.batch_cap,
                       kv_stats=KVStats(query_tokens_device=st.query_tokens_device + queries // 2,
                                        hit_tokens_device=st.hit_tokens_device + hit // 2))
        engine.publish(snap)
        coord.sample()
        clock.t += 0.5
    return coord.tick(), snap


def test_enforce_raises_and_engine_sees_the_targets(setup):
    engine, coord, clock = setup()
    snap = HEAVY
    for _ in range(4):
        decisions, snap = period(engine, coord, clock, snap, hits=(1000, 800))
    t = engine.poll_targets()
    assert t.batch_cap > 8 and t.watermark > 0.3
    st = coord.status()
    assert st["mode"] == "enforce" and st["batch_cap"] == t.batch_cap
    reasons = {d["reason"] for d in st["decisions"]}
    assert {"hysteresis", "queued_kv_headroom", "heavy_load_good_hits"} <= reasons
    assert coord.decisions_total[("batch_cap", "queued_kv_headroom")] == 4  # additive, every period (no cut)
    assert all(d["inputs"] for d in st["decisions"] if d["trigger"] == "period")
    ann = coord.annotation()
    assert ann["batchCap"] == t.batch_cap and ann["hitRate"] == 0.8
    assert ann["lastDecision"]["reason"] in reasons
    assert ann["stepTokenBudget"] == t.step_token_budget and ann["lastDecision"]["inputs"]


def test_observe_decides_but_never_writes(setup):
    engine, coord, clock = setup(mode="observe")
    for _ in range(4):
        decisions, _ = period(engine, coord, clock, HEAVY)
    assert coord.law.batch_cap > 8 and coord.writes == 0
    assert engine.poll_targets() is None
    assert all(not d["applied"] for d in coord.status()["decisions"])


def test_off_makes_no_decisions(setup):
    engine, coord, clock = setup(mode="off")
    decisions, _ = period(engine, coord, clock, HEAVY)
    assert decisions == [] and coord.writes == 0


def test_holds_on_stale_snapshot(setup):
    engine, coord, clock = setup()
    period(engine, coord, clock, HEAVY)
    clock.t += 10  # the engine stops publishing
    coord.sample()
    decisions = coord.tick()
    assert [d.reason for d in decisions] == ["stale_snapshot"] * 3
    assert all(not d.changed for d in decisions) and coord.stale_reads == 1 and coord.status()["stale"]


def test_no_control_file_yet_is_a_stale_read(tmp_path):
    coord = Coordinator(SettingsWatcher(None), control_path=str(tmp_path / "missing.bin"))
    assert coord.sample() is None and coord.stale_reads == 1
    assert [d.reason for d in coord.tick()] == ["stale_snapshot"] * 3


def test_new_start_id_starts_over(setup, tmp_path):
    engine, coord, clock = setup()
    snap = HEAVY
    for _ in range(4):
        _, snap = period(engine, coord, clock, snap)
    assert coord.law.batch_cap > 8
    engine.close()
    restarted = ControlLink(tmp_path / "c.bin", Targets(8, 0.3), clock=lambda: int(clock() * 1e9))
    restarted.publish(HEAVY)
    coord.sample()
    assert coord.law.batch_cap == 8 and coord.start_id == restarted.start_id
    assert coord.status()["decisions"][-1]["reason"] == "engine_restart"
    assert restarted.poll_targets().batch_cap == 8  # the initial targets, written for the new run


def test_settings_change_reclamps(setup, tmp_path):
    engine, coord, clock = setup()
    snap = HEAVY
    for _ in range(6):
        _, snap = period(engine, coord, clock, snap)
    assert coord.law.batch_cap > 12
    cfg = tmp_path / "sidecar.json"
    raw = json.loads(cfg.read_text())
    raw["batch_cap"]["max"] = 12
    cfg.write_text(json.dumps(raw))
    import os
    os.utime(cfg, ns=(1, 10**18))
    coord.sample()
    assert coord.law.batch_cap == 12 and coord.settings.batch_cap.max == 12


def test_initial_targets_from_the_engine_when_settings_have_none(tmp_path):
    engine = ControlLink(tmp_path / "c.bin", Targets(8, 0.3))
    coord = Coordinator(SettingsWatcher(None), control_path=str(tmp_path / "c.bin"))
    engine.publish(EngineSnapshot(batch_cap=100, watermark=0.45, step_token_budget=384,
                                  step_token_budget_max=512))
    coord.sample()
    # the engine's own cap raises the default bound (64) to it: a bound never cuts the engine's configured cap
    assert coord.law.batch_cap == 100 and coord.law.settings.batch_cap.max == 100
    assert coord.law.watermark == 0.45
    assert coord.law.step_token_budget == 384
    assert [d["reason"] for d in coord.status()["decisions"]] == ["engine_start"] * 3


def test_a_block_of_another_layout_version_is_refused_and_reported(tmp_path):
    import struct

    from kvloop.engine.control import layout as L

    path = tmp_path / "c.bin"
    ControlLink(path, Targets(8, 0.3)).close()
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 8, L.LAYOUT_VERSION + 1)  # an engine of a newer layout
    path.write_bytes(bytes(data))
    coord = Coordinator(SettingsWatcher(None), control_path=str(path))
    assert coord.sample() is None and coord.stale_reads == 1
    error = coord.status()["control_error"]
    assert f"layout version {L.LAYOUT_VERSION + 1}" in error and f"reads version {L.LAYOUT_VERSION}" in error


def test_observation_per_tier_hit_rates_and_finished_work():
    from kvloop.engine.control.records import control_record
    from kvloop.sidecar.observe import PeriodWindow

    def record(queries: tuple[int, int, int], hits: tuple[int, int, int], finished: int, generated: int):
        stats = KVStats(**{f"query_tokens_{t}": q for t, q in zip(("device", "host", "disk"), queries,
                                                                  strict=True)},
                        **{f"hit_tokens_{t}": h for t, h in zip(("device", "host", "disk"), hits,
                                                                strict=True)})
        snap = EngineSnapshot(requests_finished=finished, tokens_generated=generated, kv_stats=stats)
        return control_record(snap)

    window = PeriodWindow(record((100, 80, 40), (20, 40, 10), 1, 10))
    window.add(record((1100, 680, 340), (420, 340, 160), 5, 90))
    obs = window.observation()
    # 1000 tokens looked up; the device served 400 of them, the host 300 of the 600 asked of it, the disk
    # 150 of the 300 asked of it
    assert obs.hit_rate == 0.85 and obs.tier_hit_rates == {"device": 0.4, "host": 0.5, "disk": 0.5}
    assert (obs.requests_finished, obs.tokens_generated) == (4, 80)


# ---- the memory-derived start and the event path -------------------------------------------------
def loaded(running: int, waiting: int = 0, preemptions: int = 0, held: int = 0, pending: int = 0,
           **extra) -> EngineSnapshot:
    """A pool of 1,000 blocks of 16 tokens, max context 1,024 tokens (64 blocks)."""
    return EngineSnapshot(num_running=running, num_waiting=waiting, num_preemptions=preemptions, batch_cap=8,
                          kv_blocks_total=1000, kv_blocks_free=1000 - held, kv_blocks_pending=pending,
                          kv_usage=held / 1000, block_size=16, max_model_len=1024, watermark=0.3, **extra)


def test_cap_starts_from_the_pool_then_the_first_request_places_it_within_a_second(tmp_path):
    clock = Clock()
    engine = ControlLink(tmp_path / "c.bin", Targets(8, 0.3), clock=lambda: int(clock() * 1e9))
    watcher = SettingsWatcher(None, {"period_s": 30.0, "snapshot_stale_s": 60.0, "law_kind": "rules"})
    coord = Coordinator(watcher, control_path=str(tmp_path / "c.bin"), clock=clock)
    engine.publish(loaded(0))
    coord.sample()
    assert coord.law.batch_cap == 14  # 0.9 x 1000 blocks / 64 blocks at the max context
    assert engine.poll_targets().batch_cap == 14
    clock.t += 1.0
    # 15 blocks a request: the prompts' rest counts
    engine.publish(loaded(2, waiting=30, held=20, pending=10))
    coord.sample()  # between periods: the event path places the cap
    last = coord.status()["decisions"][-1]
    assert (last["reason"], last["trigger"], last["new"]) == ("memory_derived_start", "event", 60)
    assert last["inputs"]["footprint_blocks"] == 15.0 and coord.status()["memory_max_batch_cap"] == 60
    assert engine.poll_targets().batch_cap == 60 == coord.law.batch_cap
    assert coord.annotation()["memoryMaxBatchCap"] == 60


def test_event_path_reacts_to_a_preemption_burst_within_a_second(tmp_path):
    clock = Clock()
    engine = ControlLink(tmp_path / "c.bin", Targets(8, 0.3), clock=lambda: int(clock() * 1e9))
    watcher = SettingsWatcher(None, {"period_s": 30.0, "snapshot_stale_s": 60.0, "law_kind": "rules"})
    coord = Coordinator(watcher, control_path=str(tmp_path / "c.bin"), clock=clock)
    sample_every = min(1.0, coord.settings.period_s / 4)
    engine.publish(loaded(0))
    coord.sample()
    engine.publish(loaded(40, held=600))
    clock.t += sample_every
    coord.sample()
    cap = coord.law.batch_cap
    assert cap == 60  # placed (15 blocks a request)
    burst_at = clock.t + 0.3
    engine.publish(loaded(40, held=990, preemptions=6))  # memory ran out: a burst
    clock.t += sample_every  # the next sample, at most a second later
    coord.sample()
    last = coord.status()["decisions"][-1]
    assert (last["reason"], last["trigger"], last["old"], last["new"]) == ("preemption_burst", "event", cap,
                                                                           45)
    assert last["inputs"]["preemptions"] == 6 and clock.t - burst_at <= 1.0
    assert engine.poll_targets().batch_cap == 45  # written like any other decision
    assert coord.decisions_total[("batch_cap", "preemption_burst")] == 1
    engine.publish(loaded(40, held=990, preemptions=12))  # still bursting: rate-limited, no thrash
    clock.t += sample_every
    coord.sample()
    assert coord.law.batch_cap == 45
    assert clock.t - coord.period_start < coord.settings.period_s  # all between periodic decisions


def test_a_request_running_at_the_engine_start_places_the_cap_at_once(tmp_path):
    """The server's own warm-up request may be running when the sidecar first reads the block."""
    engine = ControlLink(tmp_path / "c.bin", Targets(8, 0.3))
    coord = Coordinator(SettingsWatcher(None), control_path=str(tmp_path / "c.bin"))
    engine.publish(loaded(1, held=10))
    coord.sample()
    reasons = [(d["knob"], d["reason"], d["trigger"]) for d in coord.status()["decisions"]]
    assert reasons[-1] == ("batch_cap", "memory_derived_start", "event") and coord.law.batch_cap == 64


def test_event_path_can_be_switched_off(tmp_path):
    clock = Clock()
    engine = ControlLink(tmp_path / "c.bin", Targets(8, 0.3), clock=lambda: int(clock() * 1e9))
    watcher = SettingsWatcher(None, {"period_s": 30.0, "snapshot_stale_s": 60.0, "event_path": False,
                                    "law_kind": "rules"})
    coord = Coordinator(watcher, control_path=str(tmp_path / "c.bin"), clock=clock)
    for preemptions in (0, 0, 9):
        engine.publish(loaded(40, held=600, preemptions=preemptions))
        clock.t += 1.0
        coord.sample()
    # the period decides, not the samples
    assert {d["trigger"] for d in coord.status()["decisions"]} == {"start"}
    decisions = coord.tick()
    assert decisions[0].reason == "memory_derived_start"


def test_the_engines_cap_widens_the_bound_across_settings_reloads():
    from kvloop.sidecar.law import ControlLaw
    from kvloop.sidecar.settings import Settings

    law = ControlLaw(Settings())
    law.reset(engine_cap=256)
    assert law.batch_cap == 256 and law.settings.batch_cap.max == 256
    law.update_settings(Settings())  # a reload of the defaults does not cut it back to 64
    assert law.batch_cap == 256 and law.settings.batch_cap.max == 256
    law.reset(engine_cap=16)  # a lower engine cap leaves the settings' bound as it is
    assert law.settings.batch_cap.max == 64 and law.batch_cap == 16


@pytest.mark.parametrize("extra, cap", [({}, None), ({"speculation_cap": 2}, 2), ({"speculation_cap": 0}, 0)])
def test_the_speculation_cap_is_written_as_the_settings_fix_it(setup, extra, cap):
    """No law steers it: unset, every write carries no opinion on it (the engine keeps its own); set, every
    write carries it, beside the steered knobs."""
    engine, coord, clock = setup(**extra)
    period(engine, coord, clock, HEAVY)
    t = engine.poll_targets()
    assert t.speculation_max_tokens == cap and t.batch_cap == coord.law.batch_cap
    assert t.step_token_budget == coord.law.step_token_budget and coord.status()["speculation_cap"] == cap
