"""The CPU robustness matrix without servers: system names, cell workloads, capacity estimates and the goals
on a fabricated result."""

import json

import pytest

from kvloop.engine.bench import matrix_report as R
from kvloop.engine.bench.matrix_cpu import _split_systems
from kvloop.engine.bench.matrix_systems import parse_system
from kvloop.engine.bench.matrix_traces import TraceOptions, build_cell, offered_rate


def test_system_names_carry_flags_and_sidecar_settings():
    s = parse_system("codesign[--queue-order=work,--max-num-batched-tokens 2048]+law=goodput+law2.kind=x")
    assert s.base == "codesign" and s.with_sidecar
    assert s.serve_flags == ("--queue-order=work", "--max-num-batched-tokens", "2048")
    assert s.sidecar == {"law": "goodput", "law2": {"kind": "x"}}
    lru = parse_system("continuous+lru")
    assert lru.base == "continuous+lru" and not lru.with_sidecar and not lru.is_vllm
    assert parse_system("vllm-cpu-f32").is_vllm and not parse_system("codesign+sidecar=off").with_sidecar
    with pytest.raises(ValueError):
        parse_system("continuous+lru+law=goodput")  # no sidecar beside it
    with pytest.raises(ValueError):
        parse_system("nonsense")
    names = ["codesign[--a=1,--b=2]", "continuous+lru"]
    assert _split_systems(",".join(names)) == names


@pytest.mark.parametrize("trace", ["w1", "w2", "w5-cpu", "mooncake"])
def test_cells_are_fresh_per_seed_and_scale_with_the_knob(trace, tmp_path):
    rows = tmp_path / "trace.jsonl"
    rows.write_text("\n".join(json.dumps({"timestamp": 500 * i, "input_length": 1024 + 300000 * (i == 3),
                                          "output_length": 64, "hash_ids": [0, 1, i + 2]})
                              for i in range(40)))
    opts = TraceOptions(traffic_s=20.0, smoke=True, mooncake_path=rows, context=8192)
    a, b = build_cell(trace, 1.0, 1, opts), build_cell(trace, 1.0, 2, opts)
    first = (a.requests or [None])[0] or a.sessions[0]
    other = (b.requests or [None])[0] or b.sessions[0]
    def text(x):
        return getattr(x, "prompt", None) or x.system

    assert text(first) != text(other)
    low, high = offered_rate(build_cell(trace, 0.5, 1, opts), 20.0), offered_rate(build_cell(trace, 2.0, 1,
                                                                                               opts), 20.0)
    assert high > 2 * low > 0
    if trace == "mooncake":
        assert max(r.arrival_s for r in a.requests) == pytest.approx(20.0)  # 20 rows at 1 req/s
        assert a.requests[0].prompt[:32] == a.requests[1].prompt[:32]  # equal hash ids, equal blocks
        assert build_cell(trace, 1.0, 1, TraceOptions(traffic_s=20.0, mooncake_path=rows)).params[
            "too_long"] == ["m3"]  # reported, not dropped


def test_capacity_from_loads():
    crossing = 1.0 + 0.5 * 0.02 / 0.47
    assert R.capacity_from_loads([(0.5, 1.0), (1.0, 0.97), (1.5, 0.5)]) == (pytest.approx(crossing), False)
    assert R.capacity_from_loads([(0.5, 1.0), (1.0, 1.0), (1.5, 0.96)]) == (1.5, True)  # a lower bound
    assert R.capacity_from_loads([(0.5, 0.85)]) == (pytest.approx(0.5 * 0.05 / 0.15), False)
    assert R.capacity_from_loads([]) == (None, False)


def _cell(system, trace, load, share, goodput, p50, p99):
    return {"system": system, "trace": trace, "load": load,
            "m": {"slo_good_share": share, "slo_goodput_req_s": goodput, "ttft_p50_s": p50,
                  "ttft_p99_s": p99}}


def fabricated() -> dict:
    traces, loads = ["w1", "w2", "w5-cpu", "mooncake"], [0.5, 1.0, 1.5]
    cells = []
    for t in traces:
        for x in loads:
            lru_share = {0.5: 1.0, 1.0: 0.96, 1.5: 0.6}[x]
            cd_share = {0.5: 1.0, 1.0: 1.0, 1.5: 0.8 if t != "w2" else 0.6}[x]
            cells.append(_cell("continuous+lru", t, x, lru_share, x * lru_share, 0.5, 2.0))
            cells.append(_cell("codesign", t, x, cd_share, x * cd_share, 0.4, 2.1))
            cells.append(_cell("vllm-cpu", t, x, lru_share, x * lru_share, 0.45, 1.5))
    return {"meta": {}, "systems": ["codesign", "continuous+lru", "vllm-cpu"], "traces": traces,
            "loads": loads, "cells": cells}


def test_goals_from_a_fabricated_result(tmp_path):
    result = fabricated()
    g = {x["name"]: x for x in R.goals(result)}
    # lru: 1.0 + 0.5 * 0.01 / 0.36; codesign: 1.0 + 0.5 * 0.05 / 0.2 = 1.125 on w1/w5/mooncake
    lru = 1.0 + 0.5 * 0.01 / 0.36
    median = g["capacity codesign / continuous+lru, median of w1/w5-cpu/mooncake"]
    assert median["value"] == pytest.approx(1.125 / lru) and not median["met"]  # < 1.3
    assert g["capacity codesign / continuous+lru on w1"]["met"]  # >= 0.97
    w2 = g["capacity codesign / continuous+lru on w2 (no reuse)"]
    assert w2["value"] == pytest.approx((1.0 + 0.5 * 0.05 / 0.4) / lru) and w2["met"]
    vllm = g["capacity codesign / vllm-cpu, median of w1/w5-cpu/mooncake"]
    assert vllm["value"] == pytest.approx(1.125 / lru)
    cell = g["goodput codesign / continuous+lru at w1 1.5x"]
    assert cell["value"] == pytest.approx(0.8 / 0.6) and cell["met"]
    ttft = g["TTFT P99 codesign / continuous+lru at w1 0.5x"]
    assert ttft["value"] == pytest.approx(1.05) and ttft["met"]
    assert g["TTFT P50 codesign / vllm-cpu at mooncake 1x"]["value"] == pytest.approx(0.4 / 0.45)
    assert len(g) == 2 + 3 + 1 + 4 * (2 * 3 + 1)
    result["cells"].remove(R.cell(result, "vllm-cpu", "mooncake", 1.0))  # missing: not met, never skipped
    assert not {x["name"]: x for x in R.goals(result)}["TTFT P50 codesign / vllm-cpu at mooncake 1x"]["met"]
    result["plots"] = R.heatmaps(result, tmp_path, "m")
    assert result["plots"] == ["m_vs_lru.png", "m_vs_vllm.png"]
    result["goals"] = R.goals(result)
    assert "## Goals (" in R.markdown(result)


def test_w5_and_mooncake_lengths_scale(tmp_path):
    rows = tmp_path / "trace.jsonl"
    rows.write_text("\n".join(json.dumps({"timestamp": 500 * i, "input_length": 1024, "output_length": 64,
                                          "hash_ids": [0, 1]}) for i in range(10)))
    full = build_cell("mooncake", 1.0, 1, TraceOptions(traffic_s=10.0, mooncake_path=rows))
    quarter = build_cell("mooncake", 1.0, 1,
                         TraceOptions(traffic_s=10.0, mooncake_path=rows, mooncake_scale=0.25))
    assert [len(r.prompt) for r in full.requests] == [64] * 10  # 1,024 tokens at 1/16
    assert [len(r.prompt) for r in quarter.requests] == [16] * 10
    assert quarter.params["block_tokens"] == 8  # 8 tokens per hash id
    full_w5 = build_cell("w5-cpu", 1.0, 1, TraceOptions()).params
    quarter_w5 = build_cell("w5-cpu", 1.0, 1, TraceOptions(w5_scale=0.25)).params
    for key in ("doc_tokens", "system_tokens", "question_tokens", "answer_tokens", "reply_tokens"):
        assert quarter_w5[key] == round(full_w5[key] * 0.25)
