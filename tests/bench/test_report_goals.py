"""W1 report goals: a peer family's goal is taken against its strongest variant in the run."""

from kvloop.engine.bench import report


def _sys(tok_s: float, ttft: float = 1.0, tpot: float = 0.1) -> dict:
    return {"throughput_tok_s": tok_s, "ttft_p99_s": ttft, "tpot_p50_s": tpot, "oom_events": 0}


def test_vllm_goal_uses_the_faster_variant():
    systems = {"codesign": _sys(120.0), "vllm-cpu-bf16": _sys(50.0), "vllm-cpu-f32": _sys(80.0, tpot=0.2)}
    assert report.strongest_variant("vllm-cpu", systems) == "vllm-cpu-f32"
    out = {g["name"]: g for g in report.goals(systems, report.ratios(systems), {})}
    g = out["codesign throughput / vllm-cpu-f32"]
    assert g["value"] == 1.5 and g["met"]
    assert out["codesign tpot_p50 / vllm-cpu-f32"]["value"] == 0.5
    assert "codesign throughput / vllm-cpu-bf16" not in out


def test_missing_family_is_reported_not_run_with_its_reason():
    systems = {"codesign": _sys(120.0)}
    out = {g["name"]: g for g in report.goals(systems, report.ratios(systems),
                                              {"vllm-cpu-bf16": "vLLM CPU backend not installed"})}
    g = out["codesign throughput / vllm-cpu-bf16"]
    assert g["status"] == "not run" and "not installed" in g["why"]


def test_static_goals_cover_ttft_and_issue_16s_tpot():
    systems = {"codesign": _sys(120.0, ttft=2.0, tpot=0.05), "static": _sys(60.0, ttft=10.0, tpot=0.04)}
    out = {g["name"]: g for g in report.goals(systems, report.ratios(systems), {})}
    assert out["codesign ttft_p99 / static"]["value"] == 0.2 and out["codesign ttft_p99 / static"]["met"]
    tpot = out["codesign tpot_p50 / static"]
    assert tpot["bound"] == 1.2 and tpot["op"] == "<="
    assert abs(tpot["value"] - 1.25) < 1e-12 and not tpot["met"]


def test_markdown_names_the_machine_when_recorded():
    machine = {"model": "Some Xeon", "cores": 2, "native_bf16": True, "flags": ["amx_bf16", "avx512_bf16"],
               "torch": "2.13.0"}
    assert report.machine_lines(None) == []
    line = report.machine_lines(machine)[0]
    assert "Some Xeon" in line and "native bf16: yes" in line and "amx_bf16 avx512_bf16" in line
