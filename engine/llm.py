"""Offline API: `LLM(...).generate(prompts, SamplingParams)` runs requests to completion in-process."""

from __future__ import annotations

import itertools

import torch

from kvloop.engine.config import EngineConfig
from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.engine_core import EngineCore
from kvloop.engine.model.config import ModelConfig
from kvloop.engine.model.llama import LlamaModel
from kvloop.engine.output_processor import RequestOutput
from kvloop.engine.scheduler.scheduler import SchedulerConfig

Prompt = str | list[int]


class LLM:
    def __init__(self, model: str | None = None, engine: EngineCore | None = None, **kwargs):
        if engine is None:
            sched_keys = set(SchedulerConfig.__dataclass_fields__)
            sched = SchedulerConfig(**{k: kwargs.pop(k) for k in list(kwargs) if k in sched_keys})
            engine = EngineCore(EngineConfig(model=model, scheduler=sched, **kwargs))
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self._ids = itertools.count()

    @classmethod
    def from_random(cls, config: ModelConfig, dtype: torch.dtype = torch.float32, device: str = "cpu",
                    num_blocks: int = 1024, block_size: int = 16, seed: int = 0, **kwargs) -> LLM:
        """A model of the given shape with random weights (benchmarks and kernel checks; no tokenizer)."""
        from kvloop.engine.model.random_weights import random_weights

        model = LlamaModel(config, random_weights(config, seed), dtype, device,
                           kwargs.pop("attention_backend", "auto"))
        sched = SchedulerConfig(**{k: kwargs.pop(k) for k in list(kwargs)
                                   if k in SchedulerConfig.__dataclass_fields__})
        engine_cfg = EngineConfig(dtype=str(dtype).removeprefix("torch."), device=device,
                                  block_size=block_size,
                                  kv_cache_tokens=num_blocks * block_size, scheduler=sched, **kwargs)
        return cls(engine=EngineCore(engine_cfg, model=model))

    def encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this engine has no tokenizer: give token ids")
            return self.tokenizer.encode(prompt)
        return list(prompt)

    def generate(self, prompts: Prompt | list[Prompt],
                 params: SamplingParams | None = None) -> list[RequestOutput]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = params or SamplingParams()
        order = []
        for prompt in prompts:
            rid = f"offline-{next(self._ids)}"
            self.engine.add_request(rid, self.encode(prompt), params)
            order.append(rid)
        final = self.engine.drain()
        return [final[rid] for rid in order]

    def chat(self, messages: list[dict], params: SamplingParams | None = None) -> RequestOutput:
        """The chat template's control tokens only: special-token text inside a message stays text."""
        if self.tokenizer is None:
            raise ValueError("this engine has no tokenizer: chat needs one")
        return self.generate(self.tokenizer.encode_chat(messages, add_generation_prompt=True), params)[0]
