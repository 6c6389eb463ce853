"""bench/sim_calibrate.py's fit: steps priced by a hidden cost model of a CPU faster than the nominal profile
are fitted closely, which a grid stopping at the nominal figures cannot do (the engine runs
are the benchmark's)."""

from dataclasses import replace
from pathlib import Path

import pytest

from kvloop.engine.cascade.cost import cost_for
from kvloop.engine.sim.cost import CostModel, Efficiency
from kvloop.engine.sim.profiles import SMOLLM2_135M, THIS_CPU

BENCH = Path(__file__).resolve().parents[2] / "bench"
BACKEND = "cpu/avx512bf16"


@pytest.fixture
def calibrate(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import sim_calibrate

    monkeypatch.setattr(sim_calibrate, "GRID_POINTS", 16)  # 256 grid points: fast, fine enough for this check
    return sim_calibrate


def steps(eff: Efficiency) -> list[dict]:
    """Decode batches over short and long contexts, cold and cached prefill chunks, mixed steps: rows as
    StepTimer records them, timed by a cost model with these efficiencies."""
    hidden = CostModel(SMOLLM2_135M, THIS_CPU, eff, cost_for("bfloat16", BACKEND))
    shapes = [[(ctx, 1, 1)] * rows for rows in (1, 4, 16, 32) for ctx in (64, 1024)]
    shapes += [[(start, n, 1)] for start in (0, 1024) for n in (64, 256, 512)]
    shapes += [[(300, 1, 1)] * rows + [(512, 256, 0)] for rows in (2, 8)]
    return [{"items": items, "seconds": hidden.step_for(items).seconds} for items in shapes]


FASTER = Efficiency(bw=2.0, flops=2.5, step_overhead_s=0.002, seq_overhead_s=1e-4, kv_bw=1.0, attn_flops=0.7)


def test_a_cpu_faster_than_the_nominal_profile_is_fitted_above_it(calibrate):
    fit = calibrate.fit(steps(FASTER), replace(SMOLLM2_135M, dtype_bytes=2), "bfloat16", BACKEND)
    assert fit["rms_rel_error"] < 0.03
    assert fit["flops"] > 1.0


def test_a_grid_stopping_at_the_nominal_figures_misfits_it(calibrate, monkeypatch):
    monkeypatch.setattr(calibrate, "GRID_TOP", 1.0)
    fit = calibrate.fit(steps(FASTER), replace(SMOLLM2_135M, dtype_bytes=2), "bfloat16", BACKEND)
    assert fit["rms_rel_error"] > 0.05
