"""A real fp32 engine over the embedded model, loaded once per session (pattern of tests/engine)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def make_engine():
    torch = pytest.importorskip("torch")
    from kvloop.engine.config import EngineConfig
    from kvloop.engine.engine_core import EngineCore
    from kvloop.engine.model.checkpoint import load_checkpoint
    from kvloop.engine.model.llama import LlamaModel
    from kvloop.engine.model.locate import embedded_model_path
    from kvloop.engine.scheduler.scheduler import SchedulerConfig
    from kvloop.engine.tokenizer.tokenizer import Tokenizer

    torch.set_num_threads(1)
    ckpt = load_checkpoint(embedded_model_path(), progress=False)
    model = LlamaModel(ckpt.config, ckpt.weights, torch.float32)
    tok = Tokenizer.from_source(ckpt.tokenizer_source)

    def make(**kwargs) -> EngineCore:
        sched = SchedulerConfig(**{k: kwargs.pop(k) for k in list(kwargs) if k in SchedulerConfig.__dataclass_fields__})
        cfg = EngineConfig(dtype="float32", progress=False, scheduler=sched, kv_cache_tokens=2048, **kwargs)
        return EngineCore(cfg, model=model, tokenizer=tok, fingerprint=ckpt.fingerprint, model_name=ckpt.name)

    return make
