"""W5 under rising load (bench/w5.py load, engine/bench/w5_load.py): the goals are read at the sweep's lowest
load where both systems fell behind; every load's ratio comes from the numbers in the file; the
command runs the simulator at each multiple of the base rates and writes the JSON, markdown and plot."""

import json
from pathlib import Path

import pytest

from kvloop.engine.bench import w5_load

BENCH = Path(__file__).resolve().parents[2] / "bench"


def row(tok_s: float, ttft_p50: float, ttft_p99: float) -> dict:
    return {"output_throughput_tok_s": tok_s, "ttft_p50_s": ttft_p50, "ttft_p99_s": ttft_p99}


def entry(factor: float, lru: dict, codesign: dict) -> dict:
    return {"factor": factor, "rates": {"chat": factor, "rag": factor / 2},
            "systems": {"continuous+lru": lru, "codesign": codesign}}


def test_goals_at_the_lowest_load_where_both_fell_behind():
    """x1: both keep up (a tie, shown); x1.5: only continuous+lru fell behind; x2: both did, and the goals
    read there; x3: both queues full (its ratios are shown, not read)."""
    loads = [entry(3.0, row(480, 500, 700), row(650, 400, 490)),
             entry(2.0, row(500, 90, 400), row(700, 40, 120)),
             entry(1.0, row(400, 0.5, 3), row(410, 0.3, 2)), entry(1.5, row(500, 30, 200), row(600, 0.8, 5))]
    rep = w5_load.build(loads, {})
    assert [e["factor"] for e in rep["loads"]] == [1.0, 1.5, 2.0, 3.0]
    assert rep["loads"][0]["ratios"]["throughput"] == pytest.approx(410 / 400)
    assert rep["loads"][1]["past_capacity"] == ["continuous+lru"]
    thr, ttft = rep["goals"]
    assert thr["value"] == pytest.approx(700 / 500) and thr["met"] and thr["factor"] == 2.0
    assert ttft["value"] == pytest.approx(120 / 400) and ttft["met"]


def test_no_goal_value_while_a_system_still_keeps_up():
    """Below codesign's capacity its throughput is the offered load: a ratio there says
    how far the load went."""
    rep = w5_load.build([entry(1.5, row(500, 30, 200), row(650, 0.8, 5))], {})
    for g in rep["goals"]:
        assert g["value"] is None and not g["met"] and g["status"] == "not saturated"
        assert "kept up" in g["why"]


def test_the_command_sweeps_the_rates_and_writes_its_files(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import w5

    assert w5.main(["load", "--scale", "cpu", "--duration", "20", "--phase", "10", "--phase-rates", "0.4,0.2",
                    "--factors", "2,1", "--systems", "continuous+lru,codesign", "--out", str(tmp_path),
                    "--name", "load"]) == 0
    rep = json.loads((tmp_path / "load.json").read_text())
    assert [e["factor"] for e in rep["loads"]] == [1.0, 2.0]
    assert rep["loads"][1]["rates"] == pytest.approx({"chat": 0.8, "rag": 0.4})
    for e in rep["loads"]:
        assert set(e["systems"]) == {"continuous+lru", "codesign"}
        assert all(r["completed"] > 0 for r in e["systems"].values())
    assert len(rep["goals"]) == 2 and (tmp_path / "load.md").exists() and (tmp_path / "load.png").exists()
    (tmp_path / "load.md").unlink()
    assert w5.main(["report", str(tmp_path / "load.json")]) == 0  # re-rendered from the file alone
    assert json.loads((tmp_path / "load.json").read_text())["goals"] == rep["goals"]
    assert (tmp_path / "load.md").exists()


@pytest.mark.parametrize("factors", ["0,1", "x", "-1"])
def test_bad_factors_stop_with_a_message(tmp_path, monkeypatch, factors):
    monkeypatch.syspath_prepend(str(BENCH))
    import w5

    with pytest.raises(SystemExit, match="--factors"):
        w5.main(["load", "--scale", "cpu", "--factors", factors, "--out", str(tmp_path)])
    assert not list(tmp_path.iterdir())


def test_one_run_at_a_multiple_of_the_rates_records_it(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import w5

    assert w5.main(["sim", "--scale", "cpu", "--duration", "20", "--phase", "10", "--phase-rates", "0.4,0.2",
                    "--load", "1.5", "--systems", "continuous+lru,codesign", "--out", str(tmp_path),
                    "--name", "x"]) == 0
    meta = json.loads((tmp_path / "x.json").read_text())["meta"]
    assert meta["load"] == 1.5 and meta["phase_rates"] == pytest.approx({"chat": 0.6, "rag": 0.3})
    assert meta["rates_how"].startswith("1.5 x W5's rates (0.4/0.2 req/s")


@pytest.mark.parametrize("load", ["0", "x", "1,2"])
def test_a_bad_load_stops_with_a_message(tmp_path, monkeypatch, load):
    monkeypatch.syspath_prepend(str(BENCH))
    import w5

    with pytest.raises(SystemExit, match="--load"):
        w5.main(["sim", "--scale", "cpu", "--phase-rates", "0.4,0.2", "--load", load, "--out", str(tmp_path)])
    assert not list(tmp_path.iterdir())
