"""bench/api.py's pure half: issue 54's goals from a fabricated result's raw runs, and the report (no
server)."""

import copy
import json

import pytest

from .scripts import load_script


@pytest.fixture(scope="module")
def api():
    return load_script("api")


def fabricated() -> dict:
    health = [1.0] * 98 + [15.0, 40.0]  # P99 (nearest rank) is the 99th of 100: 15 ms; the max is 40
    return {
        "goals": [], "shipped_backend": "process", "backends_measured": ["thread", "process"],
        "throughput": {
            "64": {"offline": {"tok_s_runs": [100.0, 200.0, 100.0]},
                   "backends": {"thread": {"tok_s_runs": [60.0, 120.0, 60.0]},
                                "process": {"tok_s_runs": [96.0, 200.0, 90.0]}}},  # rounds 0.96, 1.0, 0.9
            "256": {"offline": {"tok_s_runs": [300.0, 300.0, 300.0]},
                    "backends": {"thread": {"tok_s_runs": [150.0, 150.0, 150.0]},
                                 "process": {"tok_s_runs": [270.0, 279.0, 285.0]}}},  # 0.9, 0.93, 0.95
        },
        "latency": {"offline": {"ttft_s_runs": [0.050, 0.051, 0.049]},
                    "backends": {"thread": {"ttft_s_runs": [0.060], "during_long_prefill": {
                                     "prompt_tokens": 2000, "prefill_s_runs": [5.0],
                                     "health_ms": [3.0, 9.0]}},
                                 "process": {"ttft_s_runs": [0.0515, 0.0505, 0.052], "during_long_prefill": {
                                     "prompt_tokens": 2000, "prefill_s_runs": [4.0], "health_ms": health}}}},
        "structured": {"backend": "process", "clients": 32,
                       "tok_s_runs": {"0%": [100.0, 100.0, 100.0], "50%": [95.0, 95.0, 95.0],
                                      "100%": [92.0, 88.0, 91.0]}},
        "stalled": {"backend": "process", "header_timeout_s": 5.0, "connections": 3, "opened": 3,
                    "open_errors": [], "open_s": 0.01, "held_s": [5.01, 5.2, 5.9],
                    "closed_how": {"eof": 3}, "first_line_seen": {"HTTP/1.1 408 Request Timeout": 3},
                    "last_close_s": 5.91, "normal": [{"kind": "health", "status": 200, "ms": 1.0},
                                                     {"kind": "chat", "status": 200, "ms": 90.0}],
                    "fds": {"idle": 40, "peak": 43, "after": 41, "after_wait_s": 0.0}},
        "fuzz": {"file": "bench/results/fuzz_api.json", "modified": "2026-12-07T18:00:00+00:00",
                 "duration_s": 240.0, "cases": 4000, "statuses": {"200": 10, "400": 3990}, "server_errors": 0,
                 "engine_stops": 0, "greedy_unchanged": True},
        "offline_dtype": "bfloat16",
        "workload": {"clients": [64, 256], "prompt_tokens": 32, "max_tokens": 64, "repeats": 3,
                     "ttft_samples": 3, "probe_repeats": 1, "header_timeout_s": 5.0, "stalled": 3},
        "quietness": {"before": {}, "after": {}},
        "machine": {"cpus": 2, "python": "3.11",
                    "cpu": {"model": "cpu", "flags": ["avx2"], "native_bf16": False}},
    }


def by_name(goals: list[dict]) -> dict[str, dict]:
    return {g["name"]: g for g in goals}


def test_goals_from_the_raw_runs_of_the_shipped_backend(api):
    g = by_name(api.compute_goals(fabricated()))
    assert list(g) == ["http_vs_offline_64_clients", "http_vs_offline_256_clients", "ttft_added_ms",
                       "health_p99_ms_during_long_prefill", "structured_overhead",
                       "stalled_closed_within_timeout", "normal_requests_ok", "fds_back_to_idle",
                       "fuzz_server_errors", "fuzz_engine_stops", "fuzz_greedy_unchanged"]
    assert g["http_vs_offline_64_clients"]["value"] == 0.96 and g["http_vs_offline_64_clients"]["met"]
    assert g["http_vs_offline_256_clients"]["value"] == 0.93 and not g["http_vs_offline_256_clients"]["met"]
    assert g["ttft_added_ms"]["value"] == 1.5 and g["ttft_added_ms"]["met"]  # 51.5 - 50 ms, medians
    assert g["health_p99_ms_during_long_prefill"]["value"] == 15.0  # nearest rank, not the 40 ms max
    assert g["structured_overhead"]["value"] == 0.91 and g["structured_overhead"]["met"]
    stalled = g["stalled_closed_within_timeout"]
    assert stalled["value"] == 5.9 and stalled["bound"] == 6.0 and stalled["op"] == "<=" and stalled["met"]
    assert g["normal_requests_ok"]["value"] == 1.0 and g["normal_requests_ok"]["met"]
    assert g["fds_back_to_idle"]["value"] == 1 and g["fds_back_to_idle"]["met"]
    fuzz = ("fuzz_server_errors", "fuzz_engine_stops", "fuzz_greedy_unchanged")
    assert [g[k]["value"] for k in fuzz] == [0, 0, 1]
    assert all(x["op"] in (">=", "<=") and {"name", "value", "op", "bound"} <= x.keys() for x in g.values())


def test_missing_or_failed_phases_are_missed_not_met(api):
    r = fabricated()
    r["stalled"]["opened"] = 2  # one connect failed: the 3 were not all tested
    r["stalled"]["normal"].append({"kind": "chat", "status": "ReadTimeout", "ms": 60000.0})
    r["stalled"]["fds"]["after"] = 45
    r["fuzz"] = None
    r["backends_measured"] = ["thread"]
    for tp in r["throughput"].values():
        del tp["backends"]["process"]
    g = by_name(api.compute_goals(r))
    stalled = g["stalled_closed_within_timeout"]
    assert stalled["value"] is None and not stalled["met"]
    assert g["normal_requests_ok"]["value"] == 0.667 and not g["normal_requests_ok"]["met"]
    assert g["fds_back_to_idle"]["value"] == 5 and not g["fds_back_to_idle"]["met"]
    assert g["fuzz_engine_stops"]["value"] is None and not g["fuzz_engine_stops"]["met"]
    assert g["http_vs_offline_64_clients"]["value"] is None  # the shipped backend was not measured
    r["stalled"] = {"connections": 500, "error": "OSError(24, 'Too many open files')"}
    assert not by_name(api.compute_goals(r))["normal_requests_ok"]["met"]


def test_write_renders_json_and_markdown(api, tmp_path):
    out = tmp_path / "api.json"
    api.write(copy.deepcopy(fabricated()), out)
    saved = json.loads(out.read_text())
    assert saved["http_vs_offline"] == {"64": 0.96, "256": 0.93}
    assert saved["latency"]["backends"]["process"]["during_long_prefill"]["health_p99_ms"] == 15.0
    assert saved["goals"] == api.compute_goals(saved)  # the goals are those of the file's own raw numbers
    md = out.with_suffix(".md").read_text()
    assert "| `http_vs_offline_256_clients`" in md and "**no**" in md
    assert "1 / 15 / 40" in md  # p50 / P99 / max
    assert "HTTP/1.1 408" in md and "4000 cases" in md


def test_percentile_is_a_measured_value(api):
    assert api.percentile([], 99) is None
    assert api.percentile([3.0], 99) == 3.0
    assert api.percentile(list(range(1, 201)), 99) == 198
    assert api.percentile([5.0, 1.0, 9.0, 2.0], 50) == 2.0


def test_only_engine_flags_reach_the_servers(api):
    own = {"--clients": True, "--stalled": True, "--out": True, "--render-only": False}
    argv = ["--clients", "2,4", "--threads", "2", "--stalled=20", "--render-only", "--dtype", "bfloat16",
            "--out", "/tmp/x.json"]
    assert api._engine_only(argv, own) == ["--threads", "2", "--dtype", "bfloat16"]


def test_read_fuzz_copies_the_figures_and_the_date(api, tmp_path):
    assert api.read_fuzz(tmp_path / "none.json") is None
    f = tmp_path / "fuzz_api.json"
    f.write_text(json.dumps({"duration_s": 241.3, "cases": 7, "statuses": {"400": 7}, "server_errors": 0,
                             "engine_stops": 0, "greedy_unchanged": True, "server_error_examples": []}))
    fuzz = api.read_fuzz(f)
    assert fuzz["duration_s"] == 241.3 and fuzz["greedy_unchanged"] is True and "modified" in fuzz
    assert "server_error_examples" not in fuzz
