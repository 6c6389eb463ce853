"""W5 across step token budgets (bench/w5.py budget, engine/bench/w5_budget.py): ratios at the same budget and
at each system's best budget, from the numbers in the file, and the command runs every
system at each budget."""

import json
from pathlib import Path

import pytest

from kvloop.engine.bench import w5_budget

BENCH = Path(__file__).resolve().parents[2] / "bench"


def row(tok_s: float, ttft_p50: float, ttft_p99: float) -> dict:
    return {"output_throughput_tok_s": tok_s, "ttft_p50_s": ttft_p50, "ttft_p99_s": ttft_p99}


def entry(budget: int, lru: dict, codesign: dict) -> dict:
    return {"budget": budget, "systems": {"continuous+lru": lru, "codesign": codesign}}


def test_goals_at_the_default_budget_and_at_each_systems_best():
    """continuous+lru gains most from a smaller budget: codesign's lead at the default budget (1.5x) shrinks
    when each system runs at its own best budget (600 / 500 = 1.2x), and the file says
    which budgets those were."""
    entries = [entry(2048, row(400, 30, 200), row(600, 0.8, 40)),
               entry(256, row(500, 1.0, 20), row(580, 0.5, 8)),
               entry(512, row(450, 9, 100), row(590, 0.6, 30))]
    meta = {"systems": ["continuous+lru", "codesign"], "default_budget": 2048}
    rep = w5_budget.build(entries, meta, "gpu")
    assert [e["budget"] for e in rep["budgets"]] == [256, 512, 2048]
    assert rep["best_budget"] == {"continuous+lru": 256, "codesign": 2048}
    assert rep["budgets"][2]["past_capacity"] == ["continuous+lru"]
    same_thr, best_thr, same_p99, best_p99 = rep["goals"]
    assert same_thr["value"] == pytest.approx(1.5) and same_thr["met"] and "budget 2048" in same_thr["name"]
    assert best_thr["value"] == pytest.approx(1.2) and not best_thr["met"] and best_thr["bound"] == 1.3
    assert best_thr["budgets"] == {"codesign": 2048, "continuous+lru": 256}
    assert same_p99["value"] == pytest.approx(0.2) and same_p99["met"]
    assert best_p99["value"] == pytest.approx(40 / 20) and not best_p99["met"]


def test_no_run_at_the_default_budget_is_said_not_run():
    rep = w5_budget.build([entry(256, row(500, 1, 20), row(550, 0.5, 8))],
                          {"systems": ["continuous+lru", "codesign"], "default_budget": 2048}, "gpu")
    same = [g for g in rep["goals"] if "budget 2048" in g["name"]]
    assert len(same) == 2 and all(g["value"] is None and not g["met"] and g["status"] == "not run"
                                  for g in same)


def test_the_command_runs_every_system_at_each_budget(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import w5

    assert w5.main(["budget", "--scale", "cpu", "--duration", "20", "--phase", "10", "--phase-rates",
                    "0.4,0.2",
                    "--budgets", "512,64", "--out", str(tmp_path), "--name", "budget"]) == 0
    rep = json.loads((tmp_path / "budget.json").read_text())
    assert [e["budget"] for e in rep["budgets"]] == [64, 512] and rep["meta"]["budgets"] == [64, 512]
    for e in rep["budgets"]:
        assert set(e["systems"]) == {"continuous+lru", "codesign"}
        assert all(r["completed"] > 0 for r in e["systems"].values())
    # the budget reached the scheduler: a smaller chunk makes the same prompts take
    # longer to their first token
    small, large = (e["systems"]["continuous+lru"]["ttft_p50_s"] for e in rep["budgets"])
    assert small > large
    assert len(rep["goals"]) == 4 and (tmp_path / "budget.png").exists()
    (tmp_path / "budget.md").unlink()
    assert w5.main(["report", str(tmp_path / "budget.json")]) == 0  # re-rendered from the file
    assert "| budget |" in (tmp_path / "budget.md").read_text()
