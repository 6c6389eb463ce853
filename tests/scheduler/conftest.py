"""An fp32 engine over the suite's shared session model (tests/conftest.py: checkpoint, fp32_model), for
the real-model scheduler tests. Pure-Python tests here never touch it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def make_engine(fp32_model, checkpoint):
    """Builds an fp32 engine over the shared model; SchedulerConfig fields go to the scheduler, the rest
    (mode included) to EngineConfig."""
    from kvloop.engine.config import EngineConfig
    from kvloop.engine.engine_core import EngineCore
    from kvloop.engine.scheduler.scheduler import SchedulerConfig

    def make(**kwargs):
        sched_keys = set(SchedulerConfig.__dataclass_fields__) - {"mode"}
        sched = SchedulerConfig(**{k: kwargs.pop(k) for k in list(kwargs) if k in sched_keys})
        cfg = EngineConfig(dtype="float32", progress=False, scheduler=sched, **kwargs)
        return EngineCore(cfg, model=fp32_model, fingerprint=checkpoint.fingerprint,
                          model_name=checkpoint.name)

    return make
