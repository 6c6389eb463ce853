import pytest

from kvloop.engine.bench import workloads as bw
from kvloop.engine.sim.modes import Sizing
from kvloop.engine.sim.profiles import get_profile
from kvloop.engine.sim.simulator import SimConfig, Simulator
from kvloop.engine.sim.workload import BenchWorkload

SMOKE_SIZING = Sizing(kv_cache_tokens=3072, host_cache_tokens=8192, disk_cache_tokens=32768, max_num_seqs=16,
                      max_num_batched_tokens=256, static_batch=4)


@pytest.fixture
def smoke_sizing() -> Sizing:
    """The sizing `simulate` runs at unless given another (for tests that change one field of it)."""
    return SMOKE_SIZING


@pytest.fixture
def simulate():
    def run(mode="codesign", seed=0, wl=None, **cfg):
        cfg.setdefault("sizing", SMOKE_SIZING)
        workload = BenchWorkload(wl if wl is not None else bw.w1_smoke(seed=seed))
        profile = cfg.pop("profile", None) or get_profile("cpu", calibration="/nonexistent")
        sim = Simulator(profile, workload, SimConfig(mode=mode, **cfg))
        return sim, sim.run()
    return run
