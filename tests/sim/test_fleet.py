"""The simulated fleet (engine/sim/fleet.py): one replica is the single-replica simulator exactly; the router
policies place requests as they say; the shared tier serves one replica's prefix to another; runs repeat."""

from __future__ import annotations

import json

import pytest

from kvloop.engine.bench.workloads import RequestSpec, Workload
from kvloop.engine.sim.fleet import Fleet, FleetConfig
from kvloop.engine.sim.fleet_router import POLICIES
from kvloop.engine.sim.profiles import get_profile
from kvloop.engine.sim.scenarios import gpu_w1, sizing_for
from kvloop.engine.sim.simulator import SimConfig, Simulator
from kvloop.engine.sim.workload import BenchWorkload

PROFILE = get_profile("h200")
SIZING = sizing_for(PROFILE)


def _sim_config() -> SimConfig:
    return SimConfig(mode="codesign", sizing=SIZING, max_model_len=PROFILE.model.context)


def _fleet(wl, replicas: int, policy: str, shared: bool = False, **kw) -> Fleet:
    return Fleet(PROFILE, BenchWorkload(wl), FleetConfig(replicas, policy, shared, sim=_sim_config(), **kw))


def _dump(x) -> str:
    return json.dumps(x, sort_keys=True, default=str)


def _records(fleet: Fleet) -> str:
    return _dump([sorted(vars(r).items()) for r in sorted(fleet.records(), key=lambda r: r.request_id)])


@pytest.fixture(scope="module")
def single() -> dict:
    return Simulator(PROFILE, BenchWorkload(gpu_w1(40, 3)), _sim_config()).run()


@pytest.mark.parametrize("policy", POLICIES)
def test_one_replica_is_the_simulator(single, policy):
    fleet = _fleet(gpu_w1(40, 3), 1, policy)
    fleet.run()
    assert _dump(fleet.replica_results[0]) == _dump(single)


def test_one_replica_with_scrapes_differs_only_in_summed_busy_time(single):
    """Scrapes split the replica's fast-forward windows: every request and step is the same; the runner's
    busy time is summed in other chunks (the last bits of a float)."""
    fleet = _fleet(gpu_w1(40, 3), 1, "least_load", scrape_s=0.05)
    fleet.run()
    got = fleet.replica_results[0]
    assert got["sim"].pop("runner_busy_s") == pytest.approx(single["sim"]["runner_busy_s"], rel=1e-12)
    want = {**single, "sim": {k: v for k, v in single["sim"].items() if k != "runner_busy_s"}}
    assert _dump(got) == _dump(want)


def test_round_robin_spreads_evenly():
    fleet = _fleet(gpu_w1(40, 3), 4, "round_robin")
    res = fleet.run()
    picks = res["fleet"]["picks"]
    assert sum(picks) == res["slo"]["slo_sent"] and max(picks) - min(picks) <= 1
    assert [r["requests"] for r in res["replicas"]] == picks


def test_prefix_aware_keeps_a_conversation_on_one_replica():
    wl = gpu_w1(40, 4)
    fleet = _fleet(wl, 4, "prefix_aware")
    res = fleet.run()
    assert res["slo"]["slo_sent"] == wl.num_requests
    where = {rid: r.index for r in fleet.replicas for rid in r.rec.records}
    for s in wl.sessions:
        assert len({where[s.turn_id(k)] for k in range(s.num_turns)}) == 1, s.session_id
    assert min(res["fleet"]["picks"]) > 0  # the queue and KV scorers still spread the sessions


def _doc_twice(gap_s: float = 1.0) -> Workload:
    """One 2,000-token document asked twice: round robin sends the asks to two replicas."""
    doc = [1000 + (i * 7919) % 100000 for i in range(2000)]
    reqs = [RequestSpec(f"q{i}", "doc", i * gap_s, doc + [200 + i] * 16, 32, "d0") for i in range(2)]
    return Workload("doc-twice", reqs)


@pytest.mark.parametrize("shared", [False, True])
def test_shared_tier_serves_another_replicas_prefix(shared):
    fleet = _fleet(_doc_twice(), 2, "round_robin", shared)
    res = fleet.run()
    recs = {r.request_id: r for r in fleet.records()}
    assert res["fleet"]["picks"] == [1, 1] and recs["q0"].cached_tokens == 0
    if shared:  # the document's blocks (all but the last token's) come from the tier through the host
        assert recs["q1"].cached_tokens == 2000 // 16 * 16
        assert res["shared_tier"]["fetched_prompt_tokens"] == 2000 // 16 * 16
        assert fleet.replicas[1].kv.stats.promotions_host == 2000 // 16
        # its TTFT counts the read: the client sent it at 1 s
        assert recs["q1"].send_s == 1.0 and recs["q1"].ttft > res["shared_tier"]["link"]["latency_s"]
    else:
        assert recs["q1"].cached_tokens == 0


def test_shared_tier_read_waits_for_the_write():
    """Asked before the first replica's blocks are written (its prefill not yet done): a miss."""
    fleet = _fleet(_doc_twice(gap_s=0.001), 2, "round_robin", True)
    fleet.run()
    recs = {r.request_id: r for r in fleet.records()}
    assert recs["q1"].cached_tokens == 0


def test_runs_repeat():
    def run() -> tuple[str, str]:
        fleet = _fleet(gpu_w1(60, 3), 3, "prefix_aware+signals", True)
        return _dump(fleet.run()), _records(fleet)

    assert run() == run()
