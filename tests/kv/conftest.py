"""Fixtures for KV tests: the embedded model once per session in fp32 (a small copy of the idea in
tests/engine/conftest.py), and engines with a chosen KV config over it."""

from __future__ import annotations

import pytest
import torch

from kvloop.engine.config import EngineConfig
from kvloop.engine.engine_core import EngineCore
from kvloop.engine.kv.config import KVConfig
from kvloop.engine.scheduler.scheduler import SchedulerConfig

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def make_engine(fp32_model, tokenizer, checkpoint):
    """An fp32 engine with a small pool; `kv` keywords go to KVConfig (host tier off unless given)."""

    def make(kv_cache_tokens: int = 2048, fingerprint: str | None = None, **kv) -> EngineCore:
        kv.setdefault("host_cache_tokens", 0)
        cfg = EngineConfig(dtype="float32", progress=False, kv_cache_tokens=kv_cache_tokens,
                           scheduler=SchedulerConfig(max_num_batched_tokens=1024), kv=KVConfig(**kv))
        return EngineCore(cfg, model=fp32_model, tokenizer=tokenizer,
                          fingerprint=checkpoint.fingerprint if fingerprint is None else fingerprint,
                          model_name=checkpoint.name)

    return make
