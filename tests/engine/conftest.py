"""Engines over the suite's shared fp32 model (tests/conftest.py loads the checkpoint once)."""

from __future__ import annotations

import pytest
import torch

from kvloop.engine.config import EngineConfig
from kvloop.engine.engine_core import EngineCore
from kvloop.engine.scheduler.scheduler import SchedulerConfig

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def make_engine(fp32_model, tokenizer, checkpoint):
    """Builds an fp32 engine over the shared model; keyword arguments go to EngineConfig/SchedulerConfig."""

    def make(**kwargs) -> EngineCore:
        sched = SchedulerConfig(**{k: kwargs.pop(k) for k in list(kwargs)
                                   if k in SchedulerConfig.__dataclass_fields__})
        cfg = EngineConfig(dtype="float32", progress=False, scheduler=sched, **kwargs)
        return EngineCore(cfg, model=fp32_model, tokenizer=tokenizer, fingerprint=checkpoint.fingerprint,
                          model_name=checkpoint.name)

    return make
