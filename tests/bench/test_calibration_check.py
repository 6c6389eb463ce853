"""bench/calibration_check.py: steps are told apart by their prefill chunks, and real against predicted
seconds are summed per kind and in all from the recorded rows (the engine run itself is the benchmark's)."""

from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def check(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import calibration_check

    return calibration_check


def test_step_kinds(check):
    assert check.step_kind([(40, 1, True), (90, 1, True)]) == "decode"
    assert check.step_kind([(40, 1, True), (512, 300, True)]) == "prefill after a cached prefix"
    assert check.step_kind([(40, 1, True), (0, 512, False)]) == "cold prefill"
    assert check.step_kind([(0, 512, False), (16, 64, True)]) == "prefill after a cached prefix"


class TokensCost:
    """A cost model that charges 1 ms per scheduled token (and records the groups it was given)."""

    def __init__(self):
        self.groups = []

    def step_for(self, items, groups=()):
        self.groups.append(list(groups))
        return SimpleNamespace(seconds=1e-3 * sum(n for _, n, _ in items))


def test_compare_sums_per_kind_and_in_all(check):
    rows = [{"items": [[10, 1, True], [20, 1, True]], "groups": [[2, 16]], "seconds": 0.004},
            {"items": [[10, 1, True], [0, 100, True]], "groups": [], "seconds": 0.1},
            {"items": [[11, 1, True], [64, 50, True]], "seconds": 0.05}]
    cost = TokensCost()
    table = check.compare(rows, cost)
    k = table["kinds"]
    assert k["decode"] == {"steps": 1, "real_s": 0.004, "predicted_s": pytest.approx(0.002),
                           "ratio": pytest.approx(0.5)}
    assert k["cold prefill"]["predicted_s"] == pytest.approx(0.101)
    assert k["prefill after a cached prefix"]["steps"] == 1
    assert table["total"]["steps"] == 3 and table["total"]["ratio"] == pytest.approx(0.154 / 0.154)
    assert cost.groups[0] == [(2, 16)]  # the runner's cascade groups are priced as recorded
    (g,) = check.goals(table, None)
    assert g["value"] == pytest.approx(0.0) and g["met"]
    assert not check.goals(check.compare(rows[:1], cost), {"other_cores_mean": 0.5})[1]["met"]


def test_the_report_sets_the_run_s_speed_probe_beside_the_calibration_s(check):
    from kvloop.engine.bench import speed_probe

    table = check.compare([{"items": [[10, 1, True]], "seconds": 0.001}], TokensCost())
    meta = {"system": "codesign", "seconds": 10.0, "rates": {}, "seed": 0, "calibration": "c.json",
            "threads": 2,
            "command": "x", "calibration_speed": speed_probe.summary([(0.8, 3.0)])}
    md = check.markdown({"meta": meta, "table": table, "goals": [],
                         "noise": {"speed": speed_probe.summary([(0.66, 2.0)])}})
    assert ("Speed probe during this run (thread CPU ms, median and spread): compute 0.66 (0.00), "
            "memory 2.00 (0.00)") in md
    assert "Speed probe during the calibration's runs" in md and "compute 0.80" in md
