"""W5 in the simulator, seconds long: the Llama-3.1-70B-FP8-on-H200 profile's sizing, phases reported per
phase and per kind with the knobs over time, a fixed cap that holds, the coordinator variant, the report's
goals; and `kvloop simulate --workload w5-gpu`."""

import json

import pytest

from kvloop.engine.bench import w5_report
from kvloop.engine.bench.w5_variants import coordinator_base, coordinator_settings, parse_variant, sized
from kvloop.engine.bench.w5_workload import W5_GPU, w5
from kvloop.engine.sim.profiles import get_profile
from kvloop.engine.sim.scenarios import sizing_for
from kvloop.engine.sim.simulator import SimConfig, Simulator
from kvloop.engine.sim.workload import BenchWorkload

SHORT = {"duration_s": 40.0, "phase_s": 20.0, "seed": 0}
RATES = (1.0, 0.5)


def test_profile_sizes_the_70b_fp8_pool_and_tiers():
    prof = get_profile("h200-70b-fp8")
    assert prof.model.kv_bytes_per_token == 320 * 1024  # bf16 KV
    assert 160_000 <= prof.kv_pool_tokens <= 175_000  # ~55 GB of KV next to ~70 GB of FP8 weights
    sizing = sizing_for(prof)
    assert sizing.host_cache_tokens == 256 * 2**30 // (320 * 1024) // 16 * 16
    assert sizing.disk_cache_tokens == int(2e12 // (320 * 1024)) // 16 * 16 and sizing.disk_dir
    h200 = sizing_for(get_profile("h200"))  # the 8B profile keeps its sizing
    assert h200.host_cache_tokens == 128 * 2**30 // (128 * 1024) and not h200.disk_dir


def run(name: str, tpot_objective_s: float = 0):
    wl = w5("w5-gpu", RATES, **SHORT)
    prof = get_profile("h200-70b-fp8")
    v = parse_variant(name)
    fb, events = coordinator_settings(v, coordinator_base("gpu", tpot_objective_s), cap_max=512)
    sim = Simulator(prof, BenchWorkload(wl),
                    SimConfig(mode=v.mode, sizing=sized(v, sizing_for(prof)), feedback=fb))
    res = sim.run()
    from kvloop.engine.bench.w5_workload import phases_of

    return w5_report.run_summary(name, res["client"], res["server"], sim.rec.phase_report(phases_of(wl)),
                                 feedback=res.get("feedback"), event_path=events if fb else None), wl


@pytest.fixture(scope="module")
def runs():
    return {n: run(n)[0] for n in ("continuous+lru", "codesign", "codesign@cap16",
                                   "codesign+coord@5s+events")}


def test_w5_runs_with_phases(runs):
    wl = w5("w5-gpu", RATES, **SHORT)
    for name, r in runs.items():
        assert r["whole"]["completed"] == wl.num_requests and r["whole"]["failed"] == 0, name
        assert [p["kind"] for p in r["phases"]] == ["chat", "rag"]
        assert sum(p["requests"] for p in r["phases"]) == wl.num_requests
        assert set(r["by_kind"]) == {"chat", "rag"}
        assert r["by_kind"]["chat"]["throughput_tok_s"] > 0
        tl = r["timeline"]
        assert len(tl["t"]) == len(tl["batch_cap"]) == len(tl["kv_use"]) > 3
    # the fixed cap holds (no coordinator)
    assert set(runs["codesign@cap16"]["timeline"]["batch_cap"]) == {16}
    assert runs["codesign+coord@5s+events"]["feedback"]["period_s"] == 5.0


def test_a_tpot_objective_steers_the_step_budget():
    """The coordinator's TPOT objective moves the step token budget in the simulator: one below the
    weight-read floor (no step is that fast) cuts it to the decode floor, never under it; without
    one the budget holds."""
    steered = run("codesign+coord:rules@5s+events", tpot_objective_s=0.005)[0]
    budget = [b for b in steered["timeline"]["step_token_budget"] if b is not None]
    cuts = [d for d in steered["feedback"]["changes"]
            if d["knob"] == "step_token_budget" and d["reason"] == "tpot_objective"]
    assert budget[0] == 2048 and min(budget) < 2048 and cuts
    assert all(d["new"] >= d["inputs"]["decode_floor"] and d["inputs"]["tpot_p50_s"] > 0.005 for d in cuts)
    assert steered["whole"]["failed"] == 0
    md = w5_report.markdown(w5_report.build({"codesign+coord:rules@5s+events": steered}, {}, "gpu"), [])
    # the report shows the knob
    assert f"| {min(budget):g} / " in md and "step budget min / median / max" in md
    held = run("codesign+coord:rules@5s+events")[0]
    assert {b for b in held["timeline"]["step_token_budget"] if b is not None} == {2048}


def test_report_goals_and_markdown(runs):
    report = w5_report.build(runs, {"title": "W5 smoke", "phases": runs["codesign"]["phases"]}, "gpu")
    assert report["best_fixed_cap"]["whole"]["system"] == "codesign@cap16"
    goals = {g["name"]: g for g in report["goals"]}
    g = goals["codesign output throughput / continuous+lru"]
    assert g["value"] == pytest.approx(runs["codesign"]["whole"]["output_throughput_tok_s"]
                                       / runs["continuous+lru"]["whole"]["output_throughput_tok_s"])
    coord = goals["codesign+coord output throughput / best fixed cap (whole run)"]  # the variant stands in
    assert coord["systems"] == ["codesign+coord@5s+events", "codesign@cap16"] and coord["value"] is not None
    assert goals["OOM events, every run"]["value"] == 0
    assert all({"name", "value", "op", "bound", "met"} <= set(x) for x in report["goals"])
    md = w5_report.markdown(report, [])
    assert "Fixed caps through the same phases" in md and "codesign@cap16" in md
    json.dumps(report, default=str)


def test_simulate_cli_w5(tmp_path, capsys):
    from kvloop.engine.cli import main

    out = tmp_path / "w5.json"
    assert main(["simulate", "--workload", "w5-gpu", "--profile", "h200-70b-fp8", "--duration", "20",
                 "--phase", "10",
                 "--phase-rates", "1,0.5", "--modes", "continuous+lru,codesign@cap32", "--out",
                 str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["system"] for r in data["runs"]] == ["continuous+lru", "codesign@cap32"]
    assert all(len(r["phases"]) == 2 and "by_kind" in r and "timeline" in r for r in data["runs"])
    assert W5_GPU.phase_s == 300  # the CLI's --phase did not change the preset


def test_a_cap_that_fell_behind_is_not_a_phase_best():
    """A cap whose median request waited past the SLO is not a phase's best while another cap kept up, even
    where its throughput there is higher."""
    def fixed(tput: float, rag_tput: float, rag_p50: float) -> dict:
        phase = {"kind": "rag", "index": 0, "served_tok_s": rag_tput, "ttft_p99_s": 3 * rag_p50,
                 "ttft_p50_s": rag_p50}
        return {"whole": {"output_throughput_tok_s": tput, "ttft_p99_s": 5.0, "ttft_p50_s": 0.5},
                "by_kind": {"rag": {k: v for k, v in phase.items() if k not in ("kind", "index")}},
                "phases": [phase]}

    runs = {"codesign@cap16": fixed(470.0, 477.0, 115.0), "codesign@cap64": fixed(521.0, 354.0, 0.6)}
    assert w5_report.best_fixed(runs)["rag"]["system"] == "codesign@cap64"
    assert w5_report.best_fixed_per_phase(runs)[0]["system"] == "codesign@cap64"
    runs["codesign@cap64"] = fixed(521.0, 354.0, 40.0)  # nobody kept up: all compete, the highest wins
    assert w5_report.best_fixed(runs)["rag"]["system"] == "codesign@cap16"


def test_the_plain_mode_counts_as_its_default_cap():
    """`codesign` with the coordinator off is `codesign@cap64` where 64 is its recorded max_num_seqs: the
    sweep counts it as that cap instead of running the same engine twice; a run at that
    cap takes precedence."""
    def run(tput: float, cap: int | None = None) -> dict:
        return {"whole": {"output_throughput_tok_s": tput, "ttft_p99_s": 5.0, "ttft_p50_s": 0.5},
                **({"sizing": {"max_num_seqs": cap}} if cap else {})}

    runs = {"continuous+lru": run(90.0, 64), "codesign": run(120.0, 64), "codesign@cap16": run(100.0, 16),
            "codesign+coord@5s+events": run(110.0, 9)}
    assert w5_report.fixed_caps(runs) == {"codesign@cap16": 16, "codesign": 64}
    assert w5_report.best_fixed(runs)["whole"] == {"system": "codesign", "cap": 64, "throughput_tok_s": 120.0}
    runs["codesign@cap64"] = run(119.0, 64)
    assert w5_report.fixed_caps(runs) == {"codesign@cap16": 16, "codesign@cap64": 64}
    del runs["codesign"]["sizing"]  # not recorded (older files): not a fixed cap
    del runs["codesign@cap64"]
    assert w5_report.fixed_caps(runs) == {"codesign@cap16": 16}


def test_capacity_goals():
    rates = {"chat": 2.7, "rag": 1.09}
    base = w5_report.capacity_goals("continuous+lru", {"chat": 3.0, "rag": 1.2}, rates, None)
    assert [(g["value"], g["op"], g["bound"], g["met"]) for g in base] == [(0.9, "<=", 1.0, True),
                                                                           (pytest.approx(1.09 / 1.2), "<=",
                                                                            1.0, True)]
    other = w5_report.capacity_goals("codesign", {"chat": 3.9, "rag": 1.3}, rates, {"chat": 3.0, "rag": 1.2})
    assert [g["met"] for g in other] == [True, False] and other[0]["value"] == pytest.approx(1.3)
    # no baseline file
    assert w5_report.capacity_goals("codesign", {"chat": 3.9}, rates, None)[0]["value"] is None


def test_a_coordinator_variant_stands_for_the_coordinator_in_the_goals():
    """A run with only codesign+coord@5s+events (no default-settings run) is still judged against the caps."""
    def run(tput: float, cap: int | None = None) -> dict:
        return {"whole": {"output_throughput_tok_s": tput, "ttft_p99_s": 5.0, "ttft_p50_s": 0.5},
                "by_kind": {"chat": {"served_tok_s": tput, "ttft_p99_s": 5.0, "ttft_p50_s": 0.5},
                            "rag": {"served_tok_s": tput / 2, "ttft_p99_s": 5.0, "ttft_p50_s": 0.5}},
                **({"sizing": {"max_num_seqs": cap}} if cap else {})}

    runs = {"codesign": run(100.0, 64), "codesign@cap8": run(80.0, 8),
            "codesign+coord@5s+events": run(95.0, 9)}
    assert w5_report.coordinator_run(runs) == "codesign+coord@5s+events"
    chat = next(g for g in w5_report.goals(runs, "cpu") if g["name"].startswith("codesign+coord chat"))
    assert chat["systems"] == ["codesign+coord@5s+events",
                               "codesign"] and chat["value"] == pytest.approx(0.95)
    runs["codesign+coord"] = run(90.0)
    assert w5_report.coordinator_run(runs) == "codesign+coord"
