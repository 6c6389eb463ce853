"""The speed probe (engine/bench/speed_probe.py) in the noise guard: the guard times it at its first sample
and then every probe_every_s; the report summarises the probes (median, min, max, spread) per kind."""

import pytest

from kvloop.engine.bench import speed_probe
from kvloop.engine.bench.guard import NoiseGuard


def test_a_probe_takes_cpu_time_of_both_pieces_of_work():
    compute, memory = speed_probe.probe_ms()
    assert compute > 0 and memory > 0


def test_summary_per_kind():
    s = speed_probe.summary([(1.0, 4.0), (1.2, 4.0), (1.1, 5.0)])
    assert s["samples"] == 3
    assert s["compute"] == {"median_ms": 1.1, "min_ms": 1.0, "max_ms": 1.2, "spread": pytest.approx(0.2)}
    assert s["memory"]["median_ms"] == 4.0 and s["memory"]["spread"] == pytest.approx(0.25)
    assert speed_probe.summary([]) == {}


def test_the_guard_probes_at_its_first_sample_and_then_every_period():
    guard = NoiseGuard(max_other_cores=1e9, probe_every_s=3600.0)
    guard.begin()
    for _ in range(3):
        guard.sample()
    report = guard.report()
    assert report.samples == 3 and report.speed["samples"] == 1  # the next is an hour away
    assert report.as_dict()["speed"]["compute"]["median_ms"] > 0
    every = NoiseGuard(max_other_cores=1e9, probe_every_s=0.0)
    every.begin()
    every.sample()
    every.sample()
    assert every.report().speed["samples"] == 2


def test_the_w5_report_shows_the_machine_of_each_real_run():
    from kvloop.engine.bench.w5_report import _machine_rows

    speed = speed_probe.summary([(0.66, 2.0), (0.70, 2.2)])
    rows = _machine_rows({"a": {"noise": {"other_cores_mean": 0.02, "speed": speed}},
                          "b": {"noise": {"other_cores_mean": 0.03}}})
    assert rows[-2] == "| a | 0.02 | 0.68 (0.06) | 2.10 (0.10) |"
    assert rows[-1] == "| b | 0.03 | — | — |"
    assert _machine_rows({"sim": {"whole": {}}}) == []
