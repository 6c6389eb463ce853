"""The H200 matrix: goals computed from a fabricated result's raw numbers, the capacity sweep's bracketing,
and a tiny run end to end (a four-row trace, two systems) that writes the JSON, the markdown and the heat
map."""

from __future__ import annotations

import json

import pytest

from kvloop.engine.sim import matrix, matrix_report
from kvloop.engine.sim.matrix_sweep import sweep

SYSTEMS = ["codesign", "codesign+coord", "continuous+lru", "static"]
TRACES = ["W1-gpu", "W5-gpu", "mooncake"]
LOADS = [0.5, 1.0, 1.5]


def run(system, trace, rate, goodput, too_long=0, beyond=0, load=None):
    out = {"system": system, "trace": trace, "rate": rate, "goodput_req_s": goodput, "good_share": 1.0,
           "rejections": {"too_long": too_long} if too_long else {}, "rows_beyond_context": beyond}
    return out if load is None else {**out, "load": load}


def fabricated() -> dict:
    cells = []
    for t in TRACES:
        for x in LOADS:
            for s in SYSTEMS:
                g = {"codesign": 10.0, "codesign+coord": 9.9, "continuous+lru": 8.0, "static": 4.0}[s] * x
                if (s, t, x) == ("codesign+coord", "W5-gpu", 1.5):
                    g = 0.9 * 15.0  # 0.9x codesign's: harm
                cells.append(run(s, t, x, g, load=x))
    caps = {"W1-gpu": (60.0, 66.0), "W5-gpu": (2.0, 2.5), "mooncake": (0.5, 0.6)}  # codesign, +coord
    capacity = {t: {"continuous+lru": {"capacity_req_s": 1.0, "rates_tried": []},
                    "codesign": {"capacity_req_s": c, "rates_tried": [run("codesign", t, c, c)]},
                    "codesign+coord": {"capacity_req_s": k, "rates_tried": []}}
                for t, (c, k) in caps.items()}
    # a sweep run that refused 3 rows for length, 1 of them past the model's context
    refused = run("continuous+lru", "mooncake", 0.7, 0.5, too_long=3, beyond=1)
    capacity["mooncake"]["continuous+lru"]["rates_tried"] = [refused]
    return {"systems": SYSTEMS, "traces_run": TRACES, "loads": LOADS, "cells": cells, "capacity": capacity}


def test_goals_from_the_raw_numbers():
    goals = {g["name"]: g for g in matrix_report.goals(fabricated())}
    cell_goals = [g for n, g in goals.items() if "goodput / codesign's" in n]
    assert len(cell_goals) == 9 and all(g["op"] == ">=" and g["bound"] == 0.98 for g in cell_goals)
    missed = [g["name"] for g in cell_goals if not g["met"]]
    assert missed == ["codesign+coord goodput / codesign's, W5-gpu at 1.5x"]
    assert goals["codesign+coord goodput / codesign's, W1-gpu at 1x"]["value"] == pytest.approx(0.99)
    cap = goals["codesign+coord capacity / codesign's on the median trace"]
    assert cap["per_trace"] == pytest.approx({"W1-gpu": 1.1, "W5-gpu": 1.25, "mooncake": 1.2})
    assert cap["value"] == pytest.approx(1.2) and cap["met"] and cap["bound"] == 1.15
    length = goals["trace rows within the model's context refused for length (every run)"]
    assert length["value"] == 2 and not length["met"] and length["rows_beyond_context_refused"] == 1


def test_a_refusal_only_past_the_context_meets_the_length_goal_and_no_coordinator_no_coordinator_goals():
    result = fabricated()
    result["capacity"]["mooncake"]["continuous+lru"]["rates_tried"][0]["rows_beyond_context"] = 3
    result["systems"] = [s for s in SYSTEMS if s != "codesign+coord"]
    goals = matrix_report.goals(result)
    assert len(goals) == 1 and goals[0]["value"] == 0 and goals[0]["met"]


def test_heat_map_grid_is_goodput_over_the_reference():
    rows, cols, grid = matrix_report.goodput_ratio_grid(fabricated())
    assert rows == ["codesign", "codesign+coord", "static"] and cols[0] == "W1-gpu\n0.5x" and len(cols) == 9
    assert grid[0][0] == pytest.approx(10 / 8) and grid[2][4] == pytest.approx(0.5)


class FakeRunner:
    """Good share 1 up to a knee, 0.5 above it."""

    def __init__(self, knee: float):
        self.knee, self.rates = knee, []

    def run(self, system, trace, rate):
        self.rates.append(rate)
        return {"rate": rate, "good_share": 1.0 if rate <= self.knee else 0.5}


def test_sweep_brackets_then_bisects():
    r = FakeRunner(3.0)
    out = sweep(r, "s", "t", 1.0, step=2.0, refine=2)
    assert r.rates[:3] == [1.0, 2.0, 4.0]
    assert r.rates[3] == pytest.approx(8 ** 0.5) and r.rates[4] == pytest.approx((8 ** 0.5 * 4) ** 0.5)
    assert out["capacity_req_s"] == pytest.approx(8 ** 0.5) and out["bracketed"]
    assert [x["rate"] for x in out["rates_tried"]] == r.rates


def test_sweep_steps_down_and_reports_no_capacity():
    out = sweep(FakeRunner(0.0), "s", "t", 1.0, step=2.0, refine=2, max_steps=2)
    assert [x["rate"] for x in out["rates_tried"]] == [1.0, 0.5, 0.25] and out["capacity_req_s"] is None


def test_a_tiny_matrix_end_to_end(tmp_path):
    trace = tmp_path / "trace.jsonl"
    rows = [{"timestamp": 1000 * i, "input_length": 600 + 100 * i, "output_length": 4, "hash_ids": [0, 1 + i]}
            for i in range(4)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    assert matrix.main(["--traces", "mooncake", "--mooncake", str(trace), "--mooncake-s", "4",
                        "--systems", "continuous+lru,codesign", "--refine", "0", "--max-steps", "1",
                        "--out-dir", str(out), "--stem", "m"]) == 0
    data = json.loads((out / "m.json").read_text())
    assert {"command", "git_commit", "host_cpu", "date", "wall_s", "windows_s"} <= set(data["meta"])
    assert data["traces"]["mooncake"]["rows"] == 4
    assert data["capacity"]["mooncake"]["continuous+lru"]["rates_tried"]
    assert all({"name", "value", "op", "bound", "met"} <= set(g) for g in data["goals"])
    assert data["capacity"]["mooncake"]["continuous+lru"]["capacity_req_s"] is not None  # light: it keeps up
    assert len(data["cells"]) == 6 and {c["load"] for c in data["cells"]} == {0.5, 1.0, 1.5}
    assert all("rows_left_out_by_window" in c for c in data["cells"])
    assert (out / "m.md").read_text().startswith("# Robustness matrix, H200 simulator")
    assert (out / "m.png").exists()
