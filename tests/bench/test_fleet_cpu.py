"""bench/fleet_cpu.py: goals from a hand-made raw result (fast), and a live smoke of its store step (two
pods, redis-server, vllm-router; a minute or more on 2 cores: runs only with KVLOOP_SLOW_TESTS=1)."""

import importlib.util
import os
from pathlib import Path

import pytest

from kvloop.engine.bench import fleet_cpu_report as R
from kvloop.engine.bench.fleet_cpu_fleet import missing_tools, prom_sum

ROOT = Path(__file__).resolve().parents[2]


def _cell(system: str, trace: str, hit: float) -> dict:
    m = dict.fromkeys(R_KEYS, 0.1) | {"slo_good": 9, "slo_sent": 10}
    return {"system": system, "trace": trace, "hit_rate": hit, "m": m}


R_KEYS = (
    "slo_good_share",
    "slo_goodput_req_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p90_s",
    "tpot_p99_s",
)


def raw() -> dict:
    hits = {
        "one_pod": 0.6,
        "cache_aware": 0.57,
        "round_robin": 0.3,
        "round_robin+store": 0.5,
        "kv_aware": 0.3,
    }
    return {
        "hit_rates": [_cell(s, "w1", h) for s, h in hits.items()],
        "store": {
            "doc_tokens": 2000,
            "docs": 3,
            "warm_ttft_p50_s": 0.3,
            "cold_ttft_p50_s": 1.0,
            "store_killed": {"failed": 0, "sent": 3, "remote_hit_tokens_during": 0, "remote_errors": 2},
        },
        "pod_kill": {
            "failed": 2,
            "in_flight_at_kill": 2,
            "failed_sent_before_kill": 2,
            "sent": 20,
            "kill_at_s": 10.0,
            "last_routed_after_kill_s": 1.2,
            "router_last_routed_after_kill_s": 1.2,
            "client_last_failure_sent_after_kill_s": 0.0,
            "failures": [{"id": "a", "sent_s": 9.0, "error": "error: RemoteProtocolError"}],
        },
    }


def by_name(goals: list[dict]) -> dict[str, dict]:
    return {g["name"]: g for g in goals}


def test_goals_follow_from_the_raw_numbers():
    g = by_name(R.goals(raw()))
    pa_one = g["w1: prefix-aware (cache_aware) fleet hit rate / one pod's"]
    assert pa_one["value"] == pytest.approx(0.95) and pa_one["met"] and pa_one["op"] == ">="
    assert g["w1: prefix-aware fleet hit rate / round robin's"]["value"] == pytest.approx(1.9)
    store_one = g["w1: round robin + shared store fleet hit rate / one pod's"]
    assert store_one["value"] == pytest.approx(0.5 / 0.6) and store_one["met"]
    ttft = next(v for k, v in g.items() if "asked on pod B" in k)
    assert ttft["value"] == pytest.approx(0.3) and ttft["met"]
    assert g["store killed mid-run: failed requests"]["met"]
    assert g["pod SIGKILLed: failed requests beyond those in flight on it"]["value"] == 0
    assert g["pod SIGKILLed: seconds from the kill to the last request routed to it"]["met"]


def test_goals_miss_where_the_numbers_do():
    r = raw()
    r["hit_rates"][1]["hit_rate"] = 0.35  # cache_aware barely above round robin
    r["pod_kill"] |= {"failed": 5, "last_routed_after_kill_s": 7.0}
    r["store"]["store_killed"]["failed"] = 1
    g = by_name(R.goals(r))
    assert not g["w1: prefix-aware fleet hit rate / round robin's"]["met"]
    assert not g["w1: prefix-aware (cache_aware) fleet hit rate / one pod's"]["met"]
    assert g["pod SIGKILLed: failed requests beyond those in flight on it"]["value"] == 3
    assert not g["pod SIGKILLed: seconds from the kill to the last request routed to it"]["met"]
    assert not g["store killed mid-run: failed requests"]["met"]


def test_a_missing_number_is_a_missed_goal_not_a_crash():
    r = raw()
    r["hit_rates"][0]["hit_rate"] = None  # one pod measured nothing
    g = by_name(R.goals(r))
    assert g["w1: prefix-aware (cache_aware) fleet hit rate / one pod's"]["value"] is None
    assert not g["w1: prefix-aware (cache_aware) fleet hit rate / one pod's"]["met"]


def test_markdown_and_goal_shape():
    r = raw() | {
        "meta": {
            "date": "d",
            "command": "c",
            "commit": "x",
            "elapsed_s": 1.0,
            "machine": {"model": "cpu"},
            "router_args": "a",
        }
    }
    r["goals"] = R.goals(r)
    assert all({"name", "value", "op", "bound"} <= g.keys() and g["op"] in (">=", "<=") for g in r["goals"])
    md = R.markdown(r)
    assert "| w1 | cache_aware | 0.570 |" in md and "A pod killed" in md


def test_prom_sum_adds_series_by_name_and_label():
    m = {
        'kvloop:prefix_cache_hits_total{tier="device"}': 5.0,
        'kvloop:prefix_cache_hits_total{tier="remote"}': 2.0,
        "kvloop:prefix_cache_hits_created": 9.0,
    }
    assert prom_sum(m, "kvloop:prefix_cache_hits_total") == 7.0
    assert prom_sum(m, "kvloop:prefix_cache_hits_total", 'tier="remote"') == 2.0


def test_estimate_prints_without_starting_anything(capsys):
    fleet_cpu = _load_cli()
    assert fleet_cpu.main(["--estimate"]) is None
    assert "estimated wall time" in capsys.readouterr().out


def _load_cli():
    spec = importlib.util.spec_from_file_location("fleet_cpu_cli", ROOT / "bench" / "fleet_cpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(
    not os.environ.get("KVLOOP_SLOW_TESTS"), reason="a live 2-pod fleet: set KVLOOP_SLOW_TESTS=1"
)
@pytest.mark.skipif(missing_tools() is not None, reason=str(missing_tools()))
def test_smoke_store_step_live(tmp_path):
    raw = _load_cli().main(["--smoke", "--steps", "store", "--out", str(tmp_path)])
    s = raw["store"]
    assert all(r["error"] is None for r in s["warm"] + s["cold"])
    assert all(r["cached_tokens"] > 0 for r in s["warm"])  # pod B served the document from the store
    assert s["store_killed"]["failed"] == 0  # the store gone: recompute, no failure
    assert (tmp_path / "fleet_cpu.json").exists() and (tmp_path / "fleet_cpu.md").exists()


def test_a_round_robin_that_hit_nothing_leaves_the_ratio_unbounded_and_met():
    r = raw()
    r["hit_rates"][2]["hit_rate"] = 0.0
    g = by_name(R.goals(r))["w1: prefix-aware fleet hit rate / round robin's"]
    assert g["value"] is None and g["met"] and "unbounded" in g["note"]


def test_router_rises_finds_the_last_growth_after_the_kill():
    from kvloop.engine.bench.fleet_cpu_steps import _router_rises

    seen = [(1.0, {"a": 1.0}), (2.0, {"a": 2.0}), (3.0, {"a": 2.0, "b": 1.0}), (4.0, {"a": 2.0, "b": 1.0})]
    assert _router_rises(seen, 2.5) == (3.0, ["b"])
    assert _router_rises(seen, 3.5) == (None, [])
