"""Session-scoped model fixtures (the pattern of tests/engine/conftest.py): the embedded checkpoint is
loaded once; fp32 for exactness tests. Pure-Python tests here never touch them."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def checkpoint():
    from kvloop.engine.model.checkpoint import load_checkpoint
    from kvloop.engine.model.locate import embedded_model_path

    return load_checkpoint(embedded_model_path(), progress=False)


@pytest.fixture(scope="session")
def fp32_model(checkpoint):
    import torch
    from kvloop.engine.model.llama import LlamaModel

    torch.set_num_threads(1)
    return LlamaModel(checkpoint.config, checkpoint.weights, torch.float32)


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
        return EngineCore(cfg, model=fp32_model, fingerprint=checkpoint.fingerprint, model_name=checkpoint.name)

    return make
