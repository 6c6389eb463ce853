"""A real fp32 engine over the embedded model (the shared session fixtures of tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def make_engine(checkpoint, fp32_model, tokenizer):
    from kvloop.engine.config import EngineConfig
    from kvloop.engine.engine_core import EngineCore
    from kvloop.engine.scheduler.scheduler import SchedulerConfig

    ckpt, model, tok = checkpoint, fp32_model, tokenizer

    def make(**kwargs) -> EngineCore:
        sched = SchedulerConfig(**{k: kwargs.pop(k) for k in list(kwargs)
                                   if k in SchedulerConfig.__dataclass_fields__})
        cfg = EngineConfig(dtype="float32", progress=False, scheduler=sched, kv_cache_tokens=2048, **kwargs)
        return EngineCore(cfg, model=model, tokenizer=tok, fingerprint=ckpt.fingerprint, model_name=ckpt.name)

    return make
