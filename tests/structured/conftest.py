"""Engines over the shared fp32 model and the real tokenizer (tests/conftest.py loads both once). Shared
values (the schema the tests use) are in structured_helpers.py: a conftest is not imported by name."""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def make_engine(fp32_model, tokenizer, checkpoint):
    from kvloop.engine.config import EngineConfig
    from kvloop.engine.engine_core import EngineCore
    from kvloop.engine.scheduler.scheduler import SchedulerConfig

    def make(**kwargs) -> EngineCore:
        sched_keys = set(SchedulerConfig.__dataclass_fields__) - {"mode"}
        sched = SchedulerConfig(**{k: kwargs.pop(k) for k in list(kwargs) if k in sched_keys})
        cfg = EngineConfig(dtype="float32", progress=False, scheduler=sched, **kwargs)
        return EngineCore(cfg, model=fp32_model, tokenizer=tokenizer, fingerprint=checkpoint.fingerprint,
                          model_name=checkpoint.name)

    return make


@pytest.fixture(scope="session")
def compiler(tokenizer):
    from kvloop.engine.structured.compiler import GrammarCompiler

    return GrammarCompiler(tokenizer)
