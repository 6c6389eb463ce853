"""The compiled step (runner/compiled_step.py) against eager on a tiny random Llama in fp32: the same greedy
tokens and logits within float rounding over a mixed schedule (chunked prefill, decode batches of 1 to 6 rows,
prefill and decode in one step, a shared prefix decoded as a cascade group), with no step needing a second graph
after warm-up, and a request's tokens the same alone as among the others (batch invariance). One compile of a
small model, so this stays a few seconds with a warm cache."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from kvloop.engine.config import EngineConfig
from kvloop.engine.engine_core import EngineCore
from kvloop.engine.model.config import ModelConfig
from kvloop.engine.model.llama import LlamaModel
from kvloop.engine.model.random_weights import random_weights
from kvloop.engine.runner import compiled_step
from kvloop.engine.sampling import SamplingParams
from kvloop.engine.scheduler.scheduler import SchedulerConfig

TINY = ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=16, max_position=512)
SHARED = [random.Random(1).randrange(512) for _ in range(70)]  # 4 blocks and a bit: past min_prefix_tokens


def schedule() -> dict[int, list[tuple[str, list[int], int]]]:
    """step -> requests (id, prompt, max_tokens) that arrive before it."""
    rng = random.Random(0)

    def prompt(n: int) -> list[int]:
        return [rng.randrange(512) for _ in range(n)]

    return {0: [("a", prompt(5), 9)], 1: [("b", prompt(40), 6)], 2: [("c", SHARED + prompt(3), 7)],
            3: [("d", SHARED + prompt(9), 7), ("e", prompt(1), 5)], 6: [("f", prompt(23), 4)]}


def engine(model: LlamaModel, compile: str) -> EngineCore:
    cfg = EngineConfig(dtype="float32", compile=compile, cascade="always", kv_cache_tokens=1024, progress=False,
                       scheduler=SchedulerConfig(max_num_batched_tokens=24))
    return EngineCore(cfg, model=model)


def run(eng: EngineCore, plan: dict[int, list[tuple[str, list[int], int]]]) -> tuple[dict, list[torch.Tensor]]:
    eng.runner.keep_all_logits = True
    final, logits = {}, []
    for step in range(200):
        for rid, ids, n in plan.get(step, []):
            eng.add_request(rid, ids, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
        final.update({o.request_id: o.token_ids for o in eng.step() if o.finished})
        logits.append(eng.runner.last_logits)
        if step > max(plan) and not eng.has_unfinished():
            return final, logits
    raise AssertionError("the schedule did not finish")


@pytest.mark.skipif(compiled_step.compiler_missing() is not None, reason="no C++ compiler for inductor")
@torch._dynamo.config.patch(disable=False)  # the suite turns torch.compile off for every other test (conftest)
def test_compiled_step_equals_eager():
    model = LlamaModel(TINY, random_weights(TINY, seed=3, std=0.2), torch.float32)
    compiled = engine(model, "on")
    step = compiled.runner.compiled
    assert step is not None and step.warm, "compiling the tiny model failed (see the log)"
    step.stance_when_warm = "fail_on_recompile"  # any step needing a second graph fails the test
    try:
        got, got_logits = run(compiled, schedule())
        alone, _ = run(engine(model, "on"), {0: [("alone", SHARED + [7, 7, 7], 7)]})
        among, _ = run(engine(model, "on"), {**schedule(), 4: [("alone", SHARED + [7, 7, 7], 7)]})
    finally:
        step.stance_when_warm = "eager_on_recompile"
    expected, expected_logits = run(engine(model, "off"), schedule())
    assert got == expected
    assert all(len(v) == n for reqs in schedule().values() for rid, _, n in reqs for v in [got[rid]])
    for a, b in zip(got_logits, expected_logits, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
    assert alone["alone"] == among["alone"]
    assert compiled.runner.cascade_group_sizes, "no step decoded the shared prefix as a group"


@pytest.mark.skipif(compiled_step.compiler_missing() is not None, reason="no C++ compiler for inductor")
@torch._dynamo.config.patch(disable=False)
def test_two_models_in_one_process_run_their_own_graphs():
    """The step keeps no guards on the model (compiled_step.keep_guard): each CompiledStep compiles its own
    copy of the step's code, so a second model of another shape runs its own graph, not the first one's."""
    other_cfg = dataclasses.replace(TINY, hidden_size=32, intermediate_size=48, num_layers=3, num_heads=2,
                                    num_kv_heads=1)
    models = [LlamaModel(cfg, random_weights(cfg, seed=5, std=0.2), torch.float32) for cfg in (TINY, other_cfg)]
    plan = {0: [("x", [3, 1, 4, 1, 5, 9, 2, 6], 6)], 1: [("y", [2, 7, 1, 8], 5)]}
    compiled = [engine(m, "on") for m in models]
    for eng in compiled:
        assert eng.runner.compiled is not None and eng.runner.compiled.warm
        eng.runner.compiled.stance_when_warm = "fail_on_recompile"
    try:
        for model, eng in zip(models, compiled, strict=True):
            got, _ = run(eng, plan)
            expected, _ = run(engine(model, "off"), plan)
            assert got == expected
    finally:
        for eng in compiled:
            eng.runner.compiled.stance_when_warm = "eager_on_recompile"
