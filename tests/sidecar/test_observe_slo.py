"""The Observation's SLO outcomes and arrivals from ControlRecords: deltas of the cumulative counters, also
across a new engine start (the counters start over); and the steering's choice of law."""

from __future__ import annotations

import pytest

from kvloop.engine.control.records import control_record
from kvloop.engine.core.snapshot import EngineSnapshot
from kvloop.sidecar.bandit import BanditLaw
from kvloop.sidecar.goodput import GoodputLaw
from kvloop.sidecar.law import ControlLaw
from kvloop.sidecar.observe import PeriodWindow
from kvloop.sidecar.settings import Settings
from kvloop.sidecar.steering import Steering


def record(good: int, missed: dict, slack_sum: float, slack_n: int, finished: int, waiting: int = 0,
           running: int = 0, refused: int = 0, start_id: int = 1, t: float = 0.0):
    snap = EngineSnapshot(slo_good=good, slo_missed=missed, slo_slack_sum=slack_sum, slo_slack_count=slack_n,
                          requests_finished=finished, num_waiting=waiting, num_running=running,
                          num_rejections=refused)
    return control_record(snap, start_id=start_id, time_ns=int(t * 1e9))


def test_slo_deltas_between_two_records():
    window = PeriodWindow(record(10, {"ttft": 2, "tpot": 1, "failed": 0}, 5.0, 12, 14, waiting=3, running=4))
    window.add(record(25, {"ttft": 7, "tpot": 1, "failed": 1}, 11.0, 32, 35, waiting=1, running=8, refused=2,
                      t=10.0))
    o = window.observation()
    assert o.slo_good == 15 and o.slo_missed == {"ttft": 5, "tpot": 0, "failed": 1} and o.slo_judged == 21
    assert o.slo_slack_count == 20 and o.slo_slack_mean == pytest.approx(6.0 / 20)
    # arrivals: 21 finished + 2 refused + 2 more in the engine (9 from 7)
    assert o.requests_arrived == 25 and o.requests_finished == 21 and o.seconds == 10.0


def test_slo_deltas_across_a_new_engine_start():
    before = record(500, {"ttft": 40, "tpot": 9, "failed": 1}, 300.0, 549, 560, waiting=5, running=6)
    window = PeriodWindow(before)
    # a new start: its counters began at zero, so what they hold now is the period's
    window.add(record(4, {"ttft": 1, "tpot": 0, "failed": 0}, 2.5, 5, 5, waiting=2, running=3, start_id=2))
    o = window.observation()
    assert (o.slo_good, o.slo_missed, o.slo_judged) == (4, {"ttft": 1, "tpot": 0, "failed": 0}, 5)
    assert o.slo_slack_count == 5 and o.slo_slack_mean == pytest.approx(0.5)
    assert o.requests_finished == 5 and o.requests_arrived == 10  # 5 finished + 5 in the engine now
    # a counter that went down (a restart the start id missed) reads the same way
    window = PeriodWindow(before)
    window.add(record(4, {"ttft": 1, "tpot": 0, "failed": 0}, 2.5, 5, 5))
    assert window.observation().slo_good == 4


def test_no_finished_requests_no_slack():
    rec = record(3, {"ttft": 1}, 1.0, 4, 4)
    window = PeriodWindow(rec)
    window.add(rec)
    o = window.observation()
    assert o.slo_judged == 0 and o.slo_slack_mean is None and o.requests_arrived == 0


@pytest.mark.parametrize("kind,cls", [("rules", ControlLaw), ("goodput", GoodputLaw), ("bandit", BanditLaw)])
def test_steering_runs_the_law_the_settings_name(kind, cls):
    steer = Steering(Settings(law_kind=kind))
    assert type(steer.law) is cls
    rec = control_record(EngineSnapshot(batch_cap=8, watermark=0.2, step_token_budget=512,
                                        step_token_budget_max=2048, kv_blocks_total=1000, block_size=16,
                                        max_model_len=1024), start_id=1)
    ds = steer.start(rec, first=True)
    assert [d.new for d in ds] == [14, 0.2, 512]  # the same start for every law: the pool at max context
    steer.sample(rec, 0.0)
    assert len(steer.tick()) == 3


def test_switching_the_law_keeps_the_targets():
    steer = Steering(Settings())
    rec = control_record(EngineSnapshot(batch_cap=8, watermark=0.2, step_token_budget=512,
                                        step_token_budget_max=2048, kv_blocks_total=1000, block_size=16,
                                        max_model_len=1024), start_id=1)
    steer.start(rec, first=True)
    steer.law.batch_cap = 20
    steer.update_settings(Settings(law_kind="goodput"))
    assert isinstance(steer.law, GoodputLaw) and steer.law.targets() == (20, 0.2, 512)
    assert steer.law.budget_ceiling == 2048
