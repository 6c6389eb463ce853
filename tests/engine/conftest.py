"""Session-scoped model fixtures: the embedded checkpoint is loaded once; fp32 for exactness tests."""

from __future__ import annotations

import pytest
import torch
from kvloop.engine.config import EngineConfig
from kvloop.engine.engine_core import EngineCore
from kvloop.engine.model.locate import embedded_model_path
from kvloop.engine.scheduler.scheduler import SchedulerConfig

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def make_engine(fp32_model, tokenizer, checkpoint):
    """Builds an fp32 engine over the shared model; keyword arguments go to EngineConfig/SchedulerConfig."""

    def make(**kwargs) -> EngineCore:
        sched = SchedulerConfig(**{k: kwargs.pop(k) for k in list(kwargs) if k in SchedulerConfig.__dataclass_fields__})
        cfg = EngineConfig(dtype="float32", progress=False, scheduler=sched, **kwargs)
        return EngineCore(cfg, model=fp32_model, tokenizer=tokenizer, fingerprint=checkpoint.fingerprint,
                          model_name=checkpoint.name)

    return make


@pytest.fixture(scope="session")
def hf_model():
    """transformers' own loading of the same GGUF: the reference for logits."""
    transformers = pytest.importorskip("transformers")
    path = embedded_model_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              dtype=torch.float32)
    model.eval()
    return model
