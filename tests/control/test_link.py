"""ControlLink validation: garbled, out-of-range, old and stale targets are ignored and counted; stale
targets give way to the defaults; every start gets a new start id."""

from __future__ import annotations

import pytest

from kvloop.engine.control import layout as L
from kvloop.engine.control.link import ControlLink, SidecarLink
from kvloop.engine.control.records import Targets, pack_targets
from kvloop.engine.core.snapshot import EngineSnapshot

SEC = 1_000_000_000


class Clock:
    def __init__(self):
        self.ns = 1_700_000_000 * SEC

    def __call__(self) -> int:
        return self.ns

    def advance(self, s: float) -> None:
        self.ns += int(s * SEC)


@pytest.fixture()
def pair(tmp_path):
    clock = Clock()
    engine = ControlLink(tmp_path / "c.bin", Targets(32, 0.3), stale_after_s=10, clock=clock)
    sidecar = SidecarLink(tmp_path / "c.bin", clock=clock)
    yield engine, sidecar, clock
    engine.close()
    sidecar.close()


def test_publish_and_read_snapshot(pair):
    engine, sidecar, clock = pair
    assert sidecar.read_snapshot() is None
    engine.publish(EngineSnapshot(num_waiting=5, kv_usage=0.25, step_token_budget=256), ttft=(0.1, 0.5),
                   tpot=(0.02, 0.07))
    clock.advance(2)
    snap = sidecar.read_snapshot()
    assert snap.num_waiting == 5 and snap.kv_use_device == 0.25 and snap.ttft_p99_s == 0.5
    assert (snap.tpot_p50_s, snap.tpot_p99_s, snap.step_token_budget) == (0.02, 0.07, 256)
    assert snap.start_id == engine.start_id and snap.step == 1 and snap.age_s == pytest.approx(2)


def test_valid_targets_accepted_then_stale_fall_back_to_defaults(pair):
    engine, sidecar, clock = pair
    assert engine.poll_targets() is None  # nothing written: the engine keeps its configuration
    sidecar.write_targets(8, 0.5)
    t = engine.poll_targets()
    assert (t.batch_cap, t.watermark, t.source) == (8, 0.5, "sidecar")
    clock.advance(9)  # the sidecar died: the last targets hold until the staleness limit ...
    assert engine.poll_targets().batch_cap == 8
    clock.advance(2)  # ... then the defaults
    t = engine.poll_targets()
    assert (t.batch_cap, t.watermark, t.source) == (32, 0.3, "default")
    assert engine.counters["stale"] == 1
    engine.poll_targets()
    assert engine.counters["stale"] == 1  # counted once per stale episode, not per step
    sidecar.write_targets(12, 0.4)  # a sidecar that comes back is obeyed again
    assert engine.poll_targets().batch_cap == 12


def test_garbled_targets_ignored_and_counted(pair):
    engine, sidecar, clock = pair
    sidecar.write_targets(8, 0.5)
    engine.poll_targets()
    sidecar.write_targets(99, 0.1)
    engine.block.mm[L.TARGETS_OFFSET + L.RECORD_HEAD.size + 30] ^= 0x55  # corrupt the new record
    t = engine.poll_targets()
    assert (t.batch_cap, t.watermark) == (8, 0.5)
    assert engine.counters["garbled"] == 1
    engine.poll_targets()
    assert engine.counters["garbled"] == 1  # the same bad record is judged once


@pytest.mark.parametrize("cap,mark", [(0, 0.5), (10**6, 0.5), (8, 1.0), (8, -0.1), (8, float("nan")),
                                      (None, None)])
def test_out_of_range_targets_ignored_and_counted(pair, cap, mark):
    engine, sidecar, clock = pair
    sidecar.write_targets(8, 0.5)
    engine.poll_targets()
    sidecar.write_targets(cap, mark)
    assert engine.poll_targets().batch_cap == 8
    assert engine.counters["out_of_range"] == 1


def test_future_timestamp_out_of_range(pair):
    engine, _, clock = pair
    t = Targets(8, 0.5, version=1, time_ns=clock() + 3600 * SEC)
    engine.block.write(L.TARGETS_OFFSET, pack_targets(t))
    assert engine.poll_targets() is None and engine.counters["out_of_range"] == 1


def test_old_version_ignored_and_stale_on_arrival_counted(pair):
    engine, _, clock = pair
    engine.block.write(L.TARGETS_OFFSET, pack_targets(Targets(8, 0.5, version=5, time_ns=clock())))
    assert engine.poll_targets().batch_cap == 8
    engine.block.write(L.TARGETS_OFFSET, pack_targets(Targets(4, 0.5, version=4, time_ns=clock())))
    assert engine.poll_targets().batch_cap == 8 and engine.counters["old_version"] == 1
    engine.block.write(L.TARGETS_OFFSET, pack_targets(Targets(4, 0.5, version=6, time_ns=clock() - 60 * SEC)))
    assert engine.poll_targets().batch_cap == 8 and engine.counters["stale"] == 1


def test_targets_from_before_the_engine_started_are_not_applied(tmp_path):
    clock = Clock()
    first = ControlLink(tmp_path / "c.bin", Targets(32, 0.3), stale_after_s=10, clock=clock)
    SidecarLink(tmp_path / "c.bin", clock=clock).write_targets(8, 0.5)
    first.close()
    clock.advance(5)  # the engine restarts; the old targets are not yet stale but belong to the old run
    second = ControlLink(tmp_path / "c.bin", Targets(32, 0.3), stale_after_s=10, clock=clock)
    assert second.start_id != first.start_id
    assert second.poll_targets() is None and second.counters["stale"] == 1


def test_writer_continues_the_version(pair):
    _, sidecar, _ = pair
    assert sidecar.write_targets(8, 0.5).version == 1
    other = SidecarLink(sidecar.path)  # e.g. `kvloop control set`, or a restarted sidecar
    assert other.write_targets(9, 0.5).version == 2
    assert sidecar.write_targets(10, 0.5).version == 3
    other.close()
