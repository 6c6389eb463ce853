"""The engine gives the same greedy tokens through the Triton kernels (interpreter) as
through the torch path."""

from __future__ import annotations

import torch

from kvloop.engine.config import EngineConfig
from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.engine_core import EngineCore
from kvloop.engine.kernels import triton as tk
from kvloop.engine.kernels.triton import is_interpreted
from kvloop.engine.model.config import ModelConfig
from kvloop.engine.model.llama import LlamaModel
from kvloop.engine.model.random_weights import random_weights
from kvloop.engine.scheduler.scheduler import SchedulerConfig

TINY = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=6,
                   num_kv_heads=2,
                   head_dim=16 * 2, rope_theta=10000.0, max_position=256)
PROMPTS = [[5, 17, 3, 88, 41, 9, 60, 2, 33], [70, 1, 1, 4], list(range(10, 47)), [91]]


def greedy(backend: str) -> dict[str, list[int]]:
    # large weights keep the random model's logits spread out, so greedy choices are not degenerate
    model = LlamaModel(TINY, random_weights(TINY, seed=3, std=0.3), torch.float32, attention_backend=backend)
    engine = EngineCore(EngineConfig(dtype="float32", progress=False, block_size=16, kv_cache_tokens=512,
                                     scheduler=SchedulerConfig(max_num_batched_tokens=24)), model=model)
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    for i, ids in enumerate(PROMPTS):  # mixed steps: chunked prefills beside decodes
        engine.add_request(str(i), ids, params)
    return {rid: out.token_ids for rid, out in engine.drain(max_steps=200).items()}


def test_triton_and_torch_paths_agree():
    assert is_interpreted()
    before = dict(tk.LAUNCHES)
    torch_tokens = greedy("torch")
    assert dict(tk.LAUNCHES) == before  # the torch path launches no Triton kernel
    triton_tokens = greedy("triton")
    assert sum(tk.LAUNCHES.values()) > sum(before.values())  # and the Triton path really ran the kernels
    assert triton_tokens == torch_tokens
    assert any(len(set(t)) > 3 for t in torch_tokens.values())  # the outputs are not one repeated token
