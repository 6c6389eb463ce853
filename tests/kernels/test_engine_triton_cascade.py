"""The engine gives the same greedy tokens through the Triton cascade kernels (interpreter) as through the
torch path without cascade. Rows share pages through the prefix cache: a system prompt shared by all, and
two documents each shared by two rows (nested groups), with decodes beside chunked prefills (mixed steps).
The runner builds the plans (cascade="always": every shared prefix of two or more rows, no cost gate).
With fp32 and with bf16 KV storage under the fp32 model."""

from __future__ import annotations

import pytest
import torch
from test_engine_triton_path import TINY

from kvloop.engine.cascade.plan import CascadePlan
from kvloop.engine.config import EngineConfig
from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.engine_core import EngineCore
from kvloop.engine.kernels import triton as tk
from kvloop.engine.model.llama import LlamaModel
from kvloop.engine.model.random_weights import random_weights
from kvloop.engine.scheduler.scheduler import SchedulerConfig

SYSTEM = list(range(40, 60))  # 20 tokens: one full shared block, then the documents start mid-block
DOC_A = [(7 * i) % 90 + 3 for i in range(40)]
DOC_B = [(11 * i) % 90 + 5 for i in range(37)]
FIRST = {"a1": SYSTEM + DOC_A + [1, 2, 3], "b1": SYSTEM + DOC_B + [4]}
THEN = {"a2": SYSTEM + DOC_A + [9, 8], "b2": SYSTEM + DOC_B + [6, 6, 6], "s": SYSTEM + [77, 78],
        "x": [5, 6, 7]}


def record_plans(engine: EngineCore, plans: list[CascadePlan]) -> None:
    """Keeps every plan the runner's planner hands out (the plans themselves are untouched)."""
    plan = engine.runner.planner.plan

    def recorded(*args):
        result = plan(*args)
        if result is not None:
            plans.append(result)
        return result

    engine.runner.planner.plan = recorded


def greedy(backend: str, cascade: str, kv_dtype: str, plans: list[CascadePlan]) -> dict[str, list[int]]:
    model = LlamaModel(TINY, random_weights(TINY, seed=3, std=0.3), torch.float32, attention_backend=backend)
    engine = EngineCore(EngineConfig(dtype="float32", kv_dtype=kv_dtype, progress=False, block_size=16,
                                     kv_cache_tokens=2048, cascade=cascade,
                                     scheduler=SchedulerConfig(max_num_batched_tokens=64)), model=model)
    assert engine.runner.kv_cache.dtype == getattr(torch, kv_dtype)
    record_plans(engine, plans)
    # The first rows decode long enough to overlap the later ones (groups of 5 need all of them).
    for rid, ids in FIRST.items():
        engine.add_request(rid, ids, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
    final = {}
    for _ in range(3):  # the first prompts' blocks enter the prefix cache; the next ones then share them
        final.update({out.request_id: out for out in engine.step() if out.finished})
    for rid, ids in THEN.items():
        engine.add_request(rid, ids, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    final.update(engine.drain(max_steps=200))
    engine.kv.check_integrity([])  # raises on a leaked or miscounted block
    tokens = {rid: out.token_ids for rid, out in final.items()}
    assert len(tokens) == len(FIRST) + len(THEN)
    return tokens


@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16"])  # bf16: the fp32 model over a 16-bit KV cache
def test_cascade_greedy_tokens_equal_torch_path(kv_dtype):
    no_plans: list[CascadePlan] = []
    torch_tokens = greedy("torch", "off", kv_dtype, no_plans)
    assert not no_plans
    before = tk.LAUNCHES["cascade_shared"]
    plans: list[CascadePlan] = []
    triton_tokens = greedy("triton", "always", kv_dtype, plans)
    assert tk.LAUNCHES["cascade_shared"] > before  # the cascade kernels really ran
    assert triton_tokens == torch_tokens
    assert any(len(set(t)) > 3 for t in torch_tokens.values())  # the outputs are not one repeated token
    # The case is what it claims: groups of 2 and of 5 rows, nested (a row in two groups at once).
    sizes = {len(g.rows) for p in plans for g in p.groups}
    assert {2, 5} <= sizes, sizes
    assert any(len(p.row_groups(r)) == 2 for p in plans for r in range(p.num_rows))
