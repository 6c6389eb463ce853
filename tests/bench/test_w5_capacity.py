"""bench/w5.py's capacity search, over a stand-in probe (TTFT as a function of the rate): it brackets and
bisects a load-bound capacity, and stops, with the reason, where a bound is out of reach at any rate."""

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
ARGS = SimpleNamespace(ttft_pct=50, ttft_bound=2.0)


@pytest.fixture
def w5(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import w5

    return w5


def with_ttft(w5, monkeypatch, ttft) -> list[float]:
    """probe() answered by ttft(rate); returns the rates probed."""
    asked: list[float] = []

    def probe(kind, rate, args):
        asked.append(rate)
        t = ttft(rate)
        return {"rate": rate, "meets": w5._le(t, args.ttft_bound), "ttft_p50_s": t}

    monkeypatch.setattr(w5, "probe", probe)
    return asked


def test_a_load_bound_capacity_is_bracketed_and_bisected(w5, monkeypatch):
    with_ttft(w5, monkeypatch, lambda r: 0.5 if r <= 0.6 else 10.0)
    found = w5.capacity_search("chat", 0.4, 3, ARGS)
    assert found["unattainable"] is None
    assert 0.55 <= found["capacity_req_s"] <= 0.6 < found["first_miss_req_s"]


def test_a_bound_no_rate_meets_stops_halving_and_says_why(w5, monkeypatch):
    """A lone request takes 5 s: halving the load no longer lowers the TTFT, so the search stops there instead
    of probing ever smaller rates down to an empty workload."""
    asked = with_ttft(w5, monkeypatch, lambda r: 5.0 + 20 * max(0.0, r - 0.1))
    found = w5.capacity_search("rag", 0.4, 3, ARGS)
    assert found["capacity_req_s"] is None and "out of reach" in found["unattainable"]
    assert len(asked) <= 4 and min(asked) >= 0.04


def test_an_empty_probe_stops_the_search(w5, monkeypatch):
    with_ttft(w5, monkeypatch, lambda r: 50.0 if r > 0.3 else math.nan)
    found = w5.capacity_search("rag", 0.4, 3, ARGS)
    assert found["capacity_req_s"] is None and found["unattainable"]


def test_a_budget_reaches_the_probes_sizing(w5, monkeypatch):
    """capacity --budget N: each simulator probe runs with the profile's sizing at that step token budget (and
    without it, with the profile's own sizing)."""
    seen = []

    def sim_one(name, scale, rates, kw, profile, calibration=None, sample_every_s=1.0, base_sizing=None,
                coord_tpot_s=None):
        seen.append((base_sizing, coord_tpot_s))
        return {"whole": {"failed": 0, "ttft_p50_s": 0.5, "ttft_p99_s": 1.0, "tpot_p99_s": 0.1,
                          "output_throughput_tok_s": 1.0, "request_throughput_req_s": 1.0, "preemptions": 0,
                          "kv_use_mean": 0.1}}

    monkeypatch.setattr(w5, "sim_one", sim_one)
    args = SimpleNamespace(seed=0, duration=None, phase=60.0, probe_duration=30.0, scale="gpu", engine="sim",
                           system="codesign", profile=None, calibration=None, ttft_pct=50, ttft_bound=2.0,
                           tpot_bound=None, budget=256, coord_tpot=0.04)
    assert w5.probe("chat", 1.0, args)["meets"]
    args.budget = None
    w5.probe("chat", 1.0, args)
    assert seen[0][0].max_num_batched_tokens == 256 and seen[1][0] is None
    assert seen[0][1] == 0.04  # --coord-tpot reaches the probe's coordinator
    with pytest.raises(SystemExit):
        w5.main(["capacity", "--engine", "real", "--budget", "256"])
