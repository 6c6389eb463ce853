"""Golden runs: digests of whole simulated runs (every request's timings, every sample, every coordinator
decision), so that a change meant to keep behaviour (a refactor, a speed path) shows it kept it bit for bit.
A change meant to alter behaviour updates a digest here and says why in its commit."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import pytest

from kvloop.engine.bench import workloads as bw
from kvloop.engine.sim import scenarios
from kvloop.engine.sim.profiles import get_profile
from kvloop.engine.sim.simulator import SimConfig, Simulator
from kvloop.engine.sim.workload import BenchWorkload
from kvloop.sidecar.settings import Bounds, Settings

COORD = replace(Settings(period_s=2.0), tpot_p50_s=1e-4, step_token_budget=Bounds(16, 4096, 64, None),
                batch_cap=Bounds(1, 64, 8, 2))


def _cpu():
    return get_profile("cpu", calibration="/nonexistent")


def _h200():
    return get_profile("h200")


# name -> (mode, workload, profile, SimConfig fields (gpu: the profile's sizing, else the smoke one), digest)
RUNS = {
    "smoke-static": ("static", lambda: bw.w1_smoke(seed=0), _cpu, {}, "228cc78d4b3fe68d"),
    "smoke-continuous": ("continuous", lambda: bw.w1_smoke(seed=0), _cpu, {}, "51d7f1fcf6106f6b"),
    "smoke-continuous+lru": ("continuous+lru", lambda: bw.w1_smoke(seed=0), _cpu, {}, "e0dc2e361d6a9771"),
    "smoke-codesign": ("codesign", lambda: bw.w1_smoke(seed=0), _cpu, {}, "ddd483fa789d742c"),
    "smoke-codesign-tight": ("codesign", lambda: bw.w1_smoke(seed=1), _cpu,
                             {"kv_cache_tokens": 1024}, "1afe5db476317394"),
    "smoke-codesign-coord": ("codesign", lambda: bw.w1_smoke(seed=2), _cpu, {"feedback": COORD},
                             "388108993ad3d0ce"),
    "gpu80-continuous+lru": ("continuous+lru", lambda: scenarios.gpu_w1(80.0, duration_s=20.0), _h200,
                             {"gpu": True}, "cfce5922959550e9"),
    "gpu80-codesign": ("codesign", lambda: scenarios.gpu_w1(80.0, duration_s=20.0), _h200, {"gpu": True},
                       "d8509dfe88ee5a77"),
    "gpu-phased-coord": ("codesign", lambda: scenarios.phased_w1([20.0, 80.0], 10.0), _h200,
                         {"gpu": True, "feedback": Settings(period_s=5.0)}, "a5669b746994f858"),
}


def digest(result: dict) -> str:
    return hashlib.sha256(json.dumps(result, sort_keys=True, default=str).encode()).hexdigest()[:16]


@pytest.mark.parametrize("name", RUNS)
def test_golden_run(name, smoke_sizing):
    mode, workload, profile_of, fields, expected = RUNS[name]
    profile, fields = profile_of(), dict(fields)
    sizing = scenarios.gpu_sizing(profile) if fields.pop("gpu", False) else smoke_sizing
    if "kv_cache_tokens" in fields:
        sizing = replace(sizing, kv_cache_tokens=fields.pop("kv_cache_tokens"))
    fields["sizing"] = sizing
    result = Simulator(profile, BenchWorkload(workload()), SimConfig(mode=mode, **fields)).run()
    assert digest(result) == expected
