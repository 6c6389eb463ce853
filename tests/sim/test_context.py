"""The simulator takes the model's context (issue 57): `kvloop simulate` serves a row past the engine's
default context up to the profile model's own (Llama-3.1-8B: 131,072 tokens), refuses a longer one with its
reason, and accounts for every trace row (read, left out past --limit, refused)."""

from __future__ import annotations

import json

import pytest

from kvloop.engine.bench.workloads import RequestSpec, Workload
from kvloop.engine.sim import scenarios
from kvloop.engine.sim.profiles import get_profile
from kvloop.engine.sim.systems import run_system

LONG, TOO_LONG = 40_000, 140_000  # past the engine's default context / past the model's


def test_the_gpu_profiles_carry_the_models_context():
    assert get_profile("h200").model.context == 131072
    assert get_profile("h200-70b-fp8").model.context == 131072


def test_a_long_row_is_served_and_a_row_past_the_context_refused():
    profile = get_profile("h200")
    wl = Workload("ctx", [RequestSpec("long", "trace", 0.0, [1000 + i % 7 for i in range(LONG)], 8),
                          RequestSpec("too-long", "trace", 0.1, [2000] * TOO_LONG, 8)])
    run = run_system("continuous+lru", profile, wl, scenarios.gpu_sizing(profile))
    slo = run["slo"]
    assert run["client"]["completed"] == 1
    assert slo["rejections"] == {"too_long": 1} and slo["failures"] == {}
    assert slo["slo_good"] + sum(slo["slo_missed"].values()) == 2  # the refusal is counted, as a miss
    assert slo["slo_missed"]["failed"] == 1


def _row(ts_ms: int, n_in: int, ids: list[int]) -> str:
    return json.dumps({"timestamp": ts_ms, "input_length": n_in, "output_length": 4, "hash_ids": ids})


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "trace.jsonl"
    rows = [_row(0, 9000, list(range(18))), _row(100, 600, [0, 99]),
            _row(200, TOO_LONG, list(range(100, 100 + TOO_LONG // 512 + 1))), _row(300, 700, [0, 1])]
    path.write_text("\n".join(rows) + "\n\n")  # a blank line is no row
    return path


def test_simulate_reports_refusals_and_every_trace_row(trace, tmp_path, capsys):
    from kvloop.engine.cli import main

    out = tmp_path / "run.json"
    assert main(["simulate", "--workload", "mooncake", "--trace", str(trace), "--profile", "h200",
                 "--modes", "continuous+lru", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["max_model_len"] == 131072
    assert data["trace"]["rows"] == 4 and data["trace"]["read"] == 4 and data["trace"]["left_out"] == {}
    slo = data["runs"][0]["slo"]
    assert slo["rejections"] == {"too_long": 1} and slo["slo_sent"] == 4
    assert data["runs"][0]["client"]["completed"] == 3  # the 9,000-token row among them
    err = capsys.readouterr().err
    assert "refused: too_long 1" in err and "goodput" in err

    assert main(["simulate", "--workload", "mooncake", "--trace", str(trace), "--profile", "h200",
                 "--modes", "continuous+lru", "--limit", "2", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["trace"]["read"] == 2 and data["trace"]["left_out"] == {"limit": 2}
    assert data["runs"][0]["slo"]["rejections"] == {}


def test_max_model_len_flag_overrides_the_models_context(trace, tmp_path):
    from kvloop.engine.cli import main

    out = tmp_path / "run.json"
    assert main(["simulate", "--workload", "mooncake", "--trace", str(trace), "--profile", "h200",
                 "--modes", "continuous+lru", "--max-model-len", "4096", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["max_model_len"] == 4096
    assert data["runs"][0]["slo"]["rejections"] == {"too_long": 2}
