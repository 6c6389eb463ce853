"""The decode-attention cost model per attention backend and KV dtype (cascade/cost.py): which entry
each backend gets, the CPU kernel's entry against its measured decisions, every entry consistent with
itself, the runner asking for the backend its model runs, and the CPU calibration's fit recovering known
coefficients (bench/calibrate_cascade.py)."""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from kvloop.engine.cascade.cost import (
    AMX_TILES,
    BLOCKED_BF16,
    COSTS,
    STAND_INS,
    AttentionCost,
    cost_for,
)

ROOT = Path(__file__).resolve().parents[2]
# the CPU kernel's calibrations: its one-query routine (AVX2 machines), its blocked bf16 routine
# (AVX512-BF16), the latter with AMX tiles for stacked rows
VARIANTS = (BLOCKED_BF16, AMX_TILES)
CPU_RESULTS = [ROOT / "bench" / "results" / f"cascade_calibration_{stem}.json"
               for stem in ("cpu", *(f"cpu_{v}" for v in VARIANTS))]
ENTRIES = [(backend, dtype) for backend, by_dtype in COSTS.items() for dtype in by_dtype]


def test_torch_is_the_default_and_keeps_its_roofline():
    """The simulator and the scheduler's default price with the torch path's entries, unchanged: no per-stack
    token cost and no per-group cost, so a group's gain is the formula it always was."""
    assert cost_for("bfloat16") is COSTS["torch"]["bfloat16"] is cost_for("torch.bfloat16", "torch")
    assert cost_for("float16") is cost_for("bfloat16")
    for dtype, c in COSTS["torch"].items():
        assert (c.token_stack_us, c.group_us) == (0.0, 0.0), dtype
        for members, tokens in [(2, 64), (4, 1888), (16, 1888), (32, 96)]:
            before = (members * tokens * max(c.token_us, c.token_row_us)
                      - (c.call_us + c.row_us * members + tokens * max(c.token_us, c.token_row_us * members)
                         + c.merge_us * members))
            assert c.group_gain_us(members, tokens) == before


def test_each_backend_gets_its_own_entry_or_a_named_stand_in():
    for dtype in ("bfloat16", "float16", "float32"):
        assert cost_for(dtype, "cpu") is COSTS["cpu"][dtype] is not COSTS["torch"][dtype]
        assert cost_for(f"torch.{dtype}", "cpu") is COSTS["cpu"][dtype]
        assert cost_for(dtype, "triton") is COSTS[STAND_INS["triton"]][dtype]
    with pytest.raises(ValueError, match="no attention cost model for backend 'decode-only'"):
        cost_for("bfloat16", "decode-only")


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_kernel_variant_prices_its_own_dtypes_and_its_backends_others(variant: str):
    """The blocked bf16 routine (and the tile routine beside it) reads bf16 K/V only: its cost name gets its
    own bf16 entry, and the cpu backend's entries for the dtypes it leaves to the other routine. A variant
    nobody measured is an error."""
    name = f"cpu/{variant}"
    assert cost_for("bfloat16", name) is COSTS[name]["bfloat16"] is not COSTS["cpu"]["bfloat16"]
    assert cost_for("torch.bfloat16", name) is COSTS[name]["bfloat16"]
    for dtype in ("float16", "float32"):
        assert cost_for(dtype, name) is COSTS["cpu"][dtype]
    with pytest.raises(ValueError, match="no attention cost model for backend 'cpu/avx9'"):
        cost_for("bfloat16", "cpu/avx9")


def test_cpu_kernel_cascades_sixteen_sharers_of_a_document():
    for dtype in ("bfloat16", "float32"):
        for name in ("cpu", *(f"cpu/{v}" for v in VARIANTS)):
            assert cost_for(dtype, name).worth(16, 1888), (name, dtype)


def test_cpu_entry_never_cascades_where_its_calibration_measured_it_slower():
    """The contract the runner relies on: cascade only where it is not slower. On every held-out point of the
    calibration that produced the entry, the model never picks cascade where it measured slower (beyond
    the tie margin), and it does pick it for 16 sharers of a 1,888-token document. A conservative miss
    (plain where cascade was faster, as at 4 sharers with 2 threads) costs speed, not correctness."""
    results = [json.loads(path.read_text()) for path in CPU_RESULTS if path.exists()]
    if not results:
        pytest.skip("no CPU calibration results (bench/calibrate_cascade.py --backend cpu)")
    for result in results:
        check_against_its_calibration(result)


def check_against_its_calibration(result: dict) -> None:
    for dtype, measured in result["dtypes"].items():
        cost = cost_for(dtype, result.get("cost_name", "cpu"))
        assert cost is COSTS[result.get("cost_name", "cpu")][dtype]  # the entry this calibration measured
        assert cost.worth(16, 1888), dtype
        for point in measured["held_out"]:
            if cost.worth(point["members"], point["shared_tokens"]) and not point["tie"]:
                assert point["cascade_us"] < point["plain_us"], (dtype, point)


@pytest.mark.parametrize(("backend", "dtype"), ENTRIES)
def test_every_entry_is_consistent_with_itself(backend: str, dtype: str):
    cost = COSTS[backend][dtype]
    lens = [700, 1888, 2000, 33]
    for members in (1, 2, 3, 4, 8, 16, 32):
        for tokens in (0, 16, 96, 400, 1888, 4096):
            gain = cost.group_gain_us(members, tokens)
            margin = cost.min_gain * members * tokens * cost.token_cost_us(1)
            assert cost.worth(members, tokens) == (members > 1 and tokens > 0 and gain > margin)
            assert cost.step_us(lens, [(members, tokens)]) == pytest.approx(cost.plain_us(lens) - gain)
    assert cost.plain_us(lens) == pytest.approx(sum(cost.span_us(1, n) for n in lens))
    # stacking rows costs less per token than reading alone, so longer shared prefixes only gain more
    for members in (2, 4, 16):
        assert cost.token_cost_us(members) < members * cost.token_cost_us(1)
        assert cost.group_gain_us(members, 2048) > cost.group_gain_us(members, 1024)


@pytest.mark.parametrize(("backend", "head_dim", "dtype"),
                         [("torch", 16, torch.float32), ("cpu", 16, torch.float32),
                                                           ("cpu", 64, torch.bfloat16)])
def test_runner_prices_with_the_backend_its_model_runs(backend: str, head_dim: int, dtype: torch.dtype):
    """The runner prices with the entry of the path its model's decodes take: on the cpu backend that depends
    on the model's head_dim and dtype too (the AMX tile routine takes bf16 queries of head_dim 64 only)."""
    from kvloop.engine.kernels.backend import available_backends
    from kvloop.engine.model.config import ModelConfig
    from kvloop.engine.model.llama import LlamaModel
    from kvloop.engine.model.random_weights import random_weights
    from kvloop.engine.runner.model_runner import ModelRunner

    if backend not in available_backends("cpu"):
        pytest.skip(f"the {backend} backend cannot run here")
    cfg = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=4,
                      num_kv_heads=2, head_dim=head_dim, rope_theta=10000.0, max_position=64)
    model = LlamaModel(cfg, random_weights(cfg, seed=0), dtype, attention_backend=backend)
    runner = ModelRunner(model, num_blocks=4, block_size=16, kv_dtype=torch.bfloat16)
    name = backend
    if backend == "cpu":
        from kvloop.engine.kernels.cpu import amx, build

        tiles = amx.available() and head_dim == 64 and dtype == torch.bfloat16
        # bf16 K/V take the blocked routine where built, a group's stacked rows the tile
        # routine where it applies
        name = "cpu" if not build.blocked_bf16() else f"cpu/{AMX_TILES if tiles else BLOCKED_BF16}"
    assert runner.attention_cost_name == name
    assert runner.attention_cost is COSTS[name]["bfloat16"]


def load_calibration():
    path = ROOT / "bench" / "calibrate_cascade.py"
    spec = importlib.util.spec_from_file_location("kvloop_bench_calibrate_cascade", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_cpu_fit_recovers_the_coefficients_it_was_given():
    """Samples made from a known model (plus the kernel call's fixed cost) give that model back."""
    cc = load_calibration()
    true = AttentionCost(call_us=0.5, row_us=0.4, token_us=0.1, token_row_us=0.05, merge_us=1.5,
                         group_us=60.0,
                         token_stack_us=0.03)
    fixed = 9.0
    rows, tokens = [1, 2, 4, 8, 16, 32], [64, 256, 1024, 2048]
    stacked = [(m, s, fixed + true.span_us(m, s)) for m in rows for s in tokens]
    plain = [(m, s, fixed + true.plain_us([s] * m)) for m in rows for s in tokens]
    merges = [(m, true.group_us + true.merge_us * m) for m in rows if m > 1]
    cost, fixed_us, worst = cc.fit_cpu(stacked, plain, merges)
    for field, value in true.__dict__.items():
        assert getattr(cost, field) == pytest.approx(value, rel=1e-3, abs=1e-3), field
    assert fixed_us == pytest.approx(fixed, abs=1e-3)
    assert worst < 1e-3
    pasted = cc.paste_line("_CPU_BF16", cost)
    assert eval(pasted.split(" = ", 1)[1], {"AttentionCost": AttentionCost}) == cost
    assert max(len(line) for line in pasted.splitlines()) <= 110


def test_a_margin_refuses_groups_whose_modelled_gain_is_small():
    base = AttentionCost(call_us=2.0, row_us=0.5, token_us=0.07, token_row_us=0.05, merge_us=2.0,
                         group_us=5.0,
                         token_stack_us=0.014)
    share = base.group_gain_us(4, 400) / (4 * 400 * base.token_cost_us(1))  # the share of plain reading saved
    assert 0 < share < 1 and base.worth(4, 400)
    assert replace(base, min_gain=share - 0.01).worth(4, 400)
    assert not replace(base, min_gain=share + 0.01).worth(4, 400)
    assert replace(base, min_gain=share + 0.01).worth(16, 1888)  # large groups save far more


def test_the_fitted_margin_excludes_every_decode_measured_slower_and_no_more():
    cc = load_calibration()
    cost = AttentionCost(call_us=2.0, row_us=0.5, token_us=0.07, token_row_us=0.05, merge_us=2.0,
                         group_us=5.0,
                         token_stack_us=0.014)
    faster, slower, close = (16, 1888, 900.0, 300.0), (4, 400, 100.0, 104.0), (3, 96, 50.0, 49.0)
    assert cc.fit_margin(cost, [faster, close]) == 0.0  # nothing measured slower: no margin
    margin = cc.fit_margin(cost, [faster, slower, close])
    fitted = replace(cost, min_gain=margin)
    assert cost.worth(4, 400) and not fitted.worth(4, 400)
    assert fitted.worth(16, 1888)
    assert replace(cost, min_gain=margin - 0.01).worth(4, 400)  # the smallest such step


def test_decode_fit_recovers_the_cascade_terms_and_keeps_the_plain_ones():
    """Whole decodes made from a known model give its cascade-only terms back; the plain terms (which price
    every plain row) are the segments' fit, untouched."""
    cc = load_calibration()
    true = AttentionCost(call_us=0.5, row_us=0.4, token_us=0.1, token_row_us=0.03, merge_us=1.5, group_us=6.0,
                         token_stack_us=0.02)
    segments = replace(true, token_row_us=0.08, token_stack_us=0.0, group_us=80.0, merge_us=0.0)  # overpriced
    decodes = []
    for m, s in [(m, s) for m in (2, 5, 8, 16) for s in (96, 272, 608, 1248)]:
        plain = 20.0 + true.plain_us([s + 112] * m)
        decodes.append((m, s, plain, plain - true.group_gain_us(m, s)))
    fitted, worst = cc.fit_on_decodes(segments, decodes)
    for field in ("token_row_us", "token_stack_us", "group_us", "merge_us"):
        assert getattr(fitted, field) == pytest.approx(getattr(true, field), rel=1e-2, abs=1e-3), field
    for field in ("call_us", "row_us", "token_us"):
        assert getattr(fitted, field) == getattr(segments, field), field
    assert worst < 1e-3
    # a term the decodes push below zero is held at zero, and the rest still fit
    noisy = [(m, s, p, c + (40.0 if m == 2 else 0.0)) for m, s, p, c in decodes]
    refit, _ = cc.fit_on_decodes(segments, noisy)
    assert min(refit.token_stack_us, refit.token_row_us, refit.group_us, refit.merge_us) >= 0
    assert refit.token_stack_us + refit.token_row_us <= refit.token_us
