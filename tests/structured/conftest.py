"""Engines over the shared fp32 model and the real tokenizer (tests/conftest.py loads both once)."""

from __future__ import annotations

import json

import pytest
import torch

from kvloop.engine.structured.spec import GrammarSpec

torch.set_num_threads(1)

# Small enough that its JSON completes in a few dozen tokens, strict enough to check.
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "city": {"enum": ["Paris", "Rome", "Oslo"]}},
          "required": ["name", "age", "city"], "additionalProperties": False}
PERSON_SPEC = GrammarSpec("json_schema", json.dumps(PERSON, separators=(",", ":")))


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
