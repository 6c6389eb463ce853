"""W5 over seeds (bench/w5.py seeds, engine/bench/w5_seeds.py): per-seed ratios from the numbers in the file,
the goals read on their median, and the command runs each seed's own workload."""

import json
import statistics
from pathlib import Path

import pytest

from kvloop.engine.bench import w5_seeds

BENCH = Path(__file__).resolve().parents[2] / "bench"


def row(tok_s: float, ttft_p50: float, ttft_p99: float) -> dict:
    return {"output_throughput_tok_s": tok_s, "ttft_p50_s": ttft_p50, "ttft_p99_s": ttft_p99}


def entry(seed: int, lru: dict, codesign: dict) -> dict:
    return {"seed": seed, "systems": {"continuous+lru": lru, "codesign": codesign}}


def test_goals_read_on_the_median_of_per_seed_ratios():
    """Three seeds: a tie (both keep up), a clear win (continuous+lru fell behind) and one between: the median
    is the middle seed's ratio, the spread and the seeds meeting each bound are beside it."""
    entries = [entry(2, row(400, 30, 200), row(500, 0.8, 40)), entry(0, row(400, 0.5, 3), row(404, 0.3, 2.5)),
               entry(1, row(400, 9, 100), row(460, 0.9, 50))]
    rep = w5_seeds.build(entries, {}, "cpu")
    assert [e["seed"] for e in rep["seeds"]] == [0, 1, 2]
    assert rep["seeds"][0]["past_capacity"] == [] and rep["seeds"][2]["past_capacity"] == ["continuous+lru"]
    thr, ttft = rep["goals"]
    assert thr["value"] == pytest.approx(460 / 400) and not thr["met"] and thr["bound"] == 1.2
    assert thr["min"] == pytest.approx(1.01) and thr["max"] == pytest.approx(1.25)
    assert thr["seeds"] == 3 and thr["seeds_meeting"] == 1
    assert ttft["value"] == pytest.approx(0.5) and ttft["met"] and ttft["seeds_meeting"] == 2
    assert rep["summary"]["throughput"]["median"] == thr["value"]


def test_a_seed_without_a_system_adds_no_ratio():
    rep = w5_seeds.build([entry(0, row(400, 0.5, 3), row(480, 0.3, 1)),
                          {"seed": 1, "systems": {"codesign": row(500, 0.3, 1)}}], {}, "gpu")
    assert rep["seeds"][1]["ratios"]["throughput"] is None
    thr = rep["goals"][0]
    assert thr["seeds"] == 1 and thr["value"] == pytest.approx(1.2) and thr["bound"] == 1.3 and not thr["met"]


def test_seed_lists_and_ranges(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import w5

    assert w5.seed_list("0-3") == [0, 1, 2, 3]
    assert w5.seed_list("5,0,2-3,2") == [0, 2, 3, 5]
    for bad in ("a", "1-x", ""):
        with pytest.raises(SystemExit):
            w5.seed_list(bad)


def test_the_command_runs_each_seed_and_writes_its_files(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import w5

    assert w5.main(["seeds", "--scale", "cpu", "--duration", "20", "--phase", "10", "--phase-rates",
                    "0.4,0.2",
                    "--seeds", "1,0", "--out", str(tmp_path), "--name", "seeds"]) == 0
    rep = json.loads((tmp_path / "seeds.json").read_text())
    assert [e["seed"] for e in rep["seeds"]] == [0, 1] and rep["meta"]["seeds"] == [0, 1]
    for e in rep["seeds"]:
        assert set(e["systems"]) == {"continuous+lru", "codesign"}
        assert all(r["completed"] > 0 for r in e["systems"].values())
    # each seed drew its own workload
    a, b = (e["systems"]["codesign"] for e in rep["seeds"])
    assert (a["completed"], a["duration_s"]) != (b["completed"], b["duration_s"])
    assert len(rep["goals"]) == 2 and (tmp_path / "seeds.png").exists()
    (tmp_path / "seeds.md").unlink()
    assert w5.main(["report", str(tmp_path / "seeds.json")]) == 0  # re-rendered from the file
    assert "| seed | throughput x | TTFT P99 x |" in (tmp_path / "seeds.md").read_text()


def test_the_coordinator_is_read_against_each_seeds_best_fixed_cap():
    """Where the coordinator ran beside fixed caps, each seed names its best fixed cap (among those that kept
    up, else all: w5_report.best_fixed) and the coordinator's whole-run goal is read on the median ratio."""
    def run(tok_s, p50, p99, cap=None):
        return {"whole": row(tok_s, p50, p99), "by_kind": {}, "sizing": {"max_num_seqs": cap or 256}}

    seeds = [(0, {"continuous+lru": run(400, 30, 90), "codesign": run(500, 20, 80),
                  "codesign@cap32": run(450, 40, 99),
                  "codesign+coord": run(600, 1.0, 20)}),  # nobody fixed kept up: the best by throughput
             (1, {"continuous+lru": run(400, 30, 90), "codesign": run(500, 20, 80),
                  "codesign@cap32": run(450, 1.5, 9),
                  "codesign+coord": run(540, 1.0, 20)})]  # cap 32 alone kept up: it is the reference
    entries = [w5_seeds.seed_entry(s, runs) for s, runs in seeds]
    assert [e["coordinator"]["best_fixed_cap"] for e in entries] == ["codesign", "codesign@cap32"]
    rep = w5_seeds.build(entries, {}, "gpu")
    coord = next(g for g in rep["goals"] if g["name"].startswith("codesign+coord output throughput"))
    assert coord["value"] == pytest.approx(statistics.median([600 / 500,
                                                              540 / 450])) and coord["bound"] == 1.15
    assert coord["seeds"] == 2 and coord["seeds_meeting"] == 2 and coord["met"]
    md = w5_seeds.markdown(rep, [])
    assert "| 1 | codesign+coord | codesign@cap32 | 1.20 |" in md
    plain = w5_seeds.build([entry(0, row(400, 0.5, 3), row(480, 0.3, 1))], {}, "gpu")
    assert len(plain["goals"]) == 2 and "coordinator_throughput" not in plain["summary"]  # no coordinator ran
